"""The runtime with real processes: a leader, 2 followers and 2 learners over gRPC and TCP."""

import json
import os

import pytest

from dipsjax.runtime.run import final_params, launch, make_spec
from dipsjax.sim.config import SimConfig
from dipsjax.sim.replay import replay, tree_equal

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _alive(pids):
    alive = []
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
            alive.append(name)
        except ProcessLookupError:
            pass
    return alive


@pytest.mark.parametrize(
    "method,extra",
    [
        ("dips", {}),
        ("sync_diloco", {}),
        ("decoupled", {"quorum": 1, "overlap": True, "adopt": "delta"}),
    ],
    ids=["dips", "sync_diloco", "decoupled_overlap"],
)
def test_processes_train_to_the_budget_and_the_tape_replays_bit_for_bit(tmp_path, method, extra):
    sim = SimConfig(
        method=method,
        learners=2,
        followers=2,
        token_budget=2 * 16 * 512 * 3,
        speeds=(1.0, 1.5),
        **extra,
    )
    spec = make_spec(sim, tmp_path / "run", heartbeat_interval=1.0)
    summary = launch(spec, timeout=400, progress=False)
    # The leader stopped at its budget (pushes still waiting then were dropped, not merged).
    tokens = summary["leader_tokens"]
    assert tokens["reported"] >= sim.token_budget and summary["applied"] >= 2
    assert summary["tokens"] == tokens["applied"] + tokens["rejected"]
    assert len(summary["pids"]) == 5 and _alive(summary["pids"]) == []  # nothing left running
    version, params = final_params(tmp_path / "run")  # every follower at one version
    assert version == summary["version"]
    # The same core and numerics as the simulator: its replay recomputes the run exactly.
    from dipsjax.syncer.tape import EventTape

    tape = EventTape.read(tmp_path / "run" / "tape.jsonl")
    assert tree_equal(replay(sim, tape), params)
    # Every follower applied the same accepted set, weights and clip factor: the tape's.
    logs = [
        [
            json.loads(line)
            for line in (tmp_path / "run" / f"follower{k}" / "decisions.jsonl")
            .read_text()
            .splitlines()
        ]
        for k in range(2)
    ]
    assert logs[0] == logs[1] and len(logs[0]) == summary["applied"]
    applied = [r for r in tape.round_records() if r.applied]
    for rec, d in zip(applied, logs[0], strict=True):
        assert (d["accepted"], d["weights"], d["clip_factor"]) == (
            rec.accepted,
            rec.weights,
            rec.clip_factor if rec.clip_factor is not None else 1.0,
        )
    if sim.overlap:  # learners trained on while their pushes were in flight
        assert any(not p.meta.pulled for r in tape.round_records() for p in r.participants)


def test_ctrl_c_stops_every_process_within_seconds(tmp_path):
    import json
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dipsjax.cli", "run", "--arg", "ci", "--out", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # wait until the learners have joined
        status = run / "leader" / "status.json"
        if status.exists():
            try:
                if json.loads(status.read_text())["members"]:
                    break
            except ValueError:
                pass
        time.sleep(0.5)
    else:
        launcher.kill()
        pytest.fail("the run never started")
    pids = json.loads((run / "pids.json").read_text())
    t0 = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    out, _ = launcher.communicate(timeout=30)
    assert time.monotonic() - t0 < 15, out
    assert launcher.returncode == 130 and "every process was ended" in out
    assert _alive(pids) == []
