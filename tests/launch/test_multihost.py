"""A learner partition spread over two processes (2 x 2 CPU devices, ``jax.distributed``
inside the partition only), run by the local executor with a real leader and followers."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from dipsjax.launch import Experiment, Requirements, role_jobs
from dipsjax.launch.run import launch, make_spec
from dipsjax.sim.config import SimConfig
from dipsjax.syncer.tape import EventTape

from .procs import running

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_partition_spread_over_two_processes_trains_and_comes_back_whole_when_one_dies(
    tmp_path,
):
    # Four rounds of H = 4 steps of 8 x 64 tokens: enough to train it (and to kill it) by
    # the checks below; every step is slow, spread over two processes.
    sim = SimConfig(method="dips", learners=1, followers=2, inner_steps=4, token_budget=4 * 512 * 4)
    run = tmp_path / "run"
    spec = make_spec(sim, run, heartbeat_interval=1.0)
    spread = Requirements(processes=2, cpu_devices=2)
    exp = Experiment("spread", spec).add(role_jobs(spec, learner=spread))
    killed = []

    def kill_the_second_process_once_a_version_is_out():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                if json.loads((run / "leader" / "status.json").read_text())["version"] >= 1:
                    break
            except (FileNotFoundError, ValueError, KeyError):
                pass
        pid = json.loads((run / "pids.json").read_text())["learner0.p1"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    threading.Thread(target=kill_the_second_process_once_a_version_is_out, daemon=True).start()
    summary = launch(spec, experiment=exp, timeout=400, progress=False)
    assert killed
    # It trained to the budget: every round applied, the books balance.
    tokens = summary["leader_tokens"]
    assert tokens["reported"] >= sim.token_budget and summary["applied"] >= 3
    assert summary["tokens"] == tokens["applied"] + tokens["rejected"]
    curve = summary["curve"]
    assert np.isfinite([p["val_loss"] for p in curve]).all()
    assert curve[-1]["val_loss"] < curve[0]["val_loss"] - 0.3, curve
    # The partition joined the syncer as one learner (its first process), and came back
    # whole as a new incarnation once its second process was killed: the first lost its
    # JAX world with it, and the launcher started the group again.
    tape = EventTape.read(run / "tape.jsonl")
    events = [(r["event"], r.get("incarnation")) for r in tape.membership() if r["learner"] == 0]
    assert [e for e in events if e[0] == "join"] == [("join", 0), ("join", 1)]
    restarts = [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]
    assert [r["role"] for r in restarts] == ["learner0"]
    rounds = tape.round_records()
    assert any(p.meta.incarnation == 1 for r in rounds for p in r.participants if r.applied)
    # The new second process served every computation the new first one made (counted
    # apart, by each), in a world of two processes.
    stats = json.loads((run / "learner0" / "stats.json").read_text())
    served = json.loads((run / "learner0" / "process1.json").read_text())
    assert stats["processes"] == 2 and stats["partition_calls"] == served["calls"] >= 4
    assert (run / "logs" / "learner0.p1.log").read_text().count("process 1 of 2: serving") == 2
    assert "DIPSJAX_NUM_PROCESSES" not in os.environ  # set for the partition's processes only
    assert set(summary["pids"]) == {"leader", "follower0", "follower1", "learner0", "learner0.p1"}
    assert [n for n, pid in summary["pids"].items() if running(pid)] == []
    assert not running(killed[0])
