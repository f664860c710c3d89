"""A learner partition spread over two processes (2 x 2 CPU devices, ``jax.distributed``
inside the partition only), run by the local executor with a real leader and followers."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dipsjax.launch import Experiment, Requirements, role_jobs
from dipsjax.runtime.run import launch, make_spec
from dipsjax.sim.config import SimConfig
from dipsjax.syncer.tape import EventTape

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _running(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_partition_spread_over_two_processes_trains_and_only_its_first_talks_to_the_syncer(
    tmp_path,
):
    sim = SimConfig(method="dips", learners=1, followers=2, token_budget=16 * 512 * 3)
    run = tmp_path / "run"
    spec = make_spec(sim, run, heartbeat_interval=1.0)
    spread = Requirements(processes=2, cpu_devices=2)
    exp = Experiment("spread", spec).add(role_jobs(spec, learner=spread))
    summary = launch(spec, experiment=exp, timeout=400, progress=False)
    # It trained to the budget: every round applied, the books balance.
    tokens = summary["leader_tokens"]
    assert tokens["reported"] >= sim.token_budget and summary["applied"] >= 3
    assert summary["tokens"] == tokens["applied"] + tokens["rejected"]
    curve = summary["curve"]
    assert curve[-1]["val_loss"] < curve[0]["val_loss"] - 0.3, curve
    # Two processes, one JAX world of 4 devices, the second serving every computation the
    # first made (counted apart, by each).
    stats = json.loads((run / "learner0" / "stats.json").read_text())
    served = json.loads((run / "learner0" / "process1.json").read_text())
    assert stats["processes"] == 2 and stats["partition_calls"] == served["calls"] >= 4
    assert "process 1 of 2: serving" in (run / "logs" / "learner0.p1.log").read_text()
    # The partition joined the syncer once, as one learner (its first process).
    tape = EventTape.read(run / "tape.jsonl")
    joins = [r for r in tape.membership() if r["event"] == "join"]
    assert [(r["learner"], r["incarnation"]) for r in joins] == [(0, 0)]
    env = dict(os.environ)
    assert "DIPSJAX_NUM_PROCESSES" not in env  # the launcher set it only for the partition
    assert set(summary["pids"]) == {"leader", "follower0", "follower1", "learner0", "learner0.p1"}
    assert [n for n, pid in summary["pids"].items() if _running(pid)] == []
    assert np.isfinite([p["val_loss"] for p in curve]).all()
