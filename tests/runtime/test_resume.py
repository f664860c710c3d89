"""Stop every process of a run and ``--resume`` it from the checkpoints (real processes)."""

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from dipsjax.launch.run import final_params, launch, make_spec, resumable
from dipsjax.runtime.checkpoint import Checkpoints
from dipsjax.sim.config import SimConfig
from dipsjax.sim.replay import replay, tree_equal
from dipsjax.syncer.tape import EventTape

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LAUNCH = (
    "import sys; from dipsjax.launch.run import launch; from dipsjax.runtime.spec import "
    "RunSpec; launch(RunSpec.read(sys.argv[1]), progress=False, evaluate=False)"
)


def _stop_at_version(spec, version, tmp_path, after=0.5, phase=None):
    """Runs ``spec`` in a launcher process and Ctrl-C's it once every learner has pushed
    and the leader is at ``version`` (plus ``after`` seconds, to land mid-round). Given
    ``phase``: once the leader's round is in that phase, every process of the run is
    killed at once (SIGKILL: the machine went down), not stopped."""
    spec_path = tmp_path / "spec-for-launcher.json"
    spec.write(spec_path)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH, str(spec_path)])
    status = tmp_path / "run" / "leader" / "status.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            st = json.loads(status.read_text())
            pushed = [v["tokens"] > 0 for v in st["learners"].values()]
            # Any phase, an outer step included: followers save a decided round's inputs
            # before it is applied, and redo it when resumed.
            everyone = len(pushed) == spec.sim.learners and all(pushed)
            if st["version"] >= version and everyone and phase in (None, st["phase"]):
                break
        except (OSError, ValueError):
            pass
    else:
        launcher.kill()
        pytest.fail(f"the run never reached version {version}")
    time.sleep(after)
    if phase is None:
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(60) != 0
        return
    pids = json.loads((tmp_path / "run" / "pids.json").read_text())
    launcher.kill()
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    launcher.wait(60)


def _saved(run):
    """What the stopped run left on disk: the leader's snapshot and every learner's and
    follower's checkpoints (metadata of each step)."""
    snap = json.loads((run / "leader" / "snapshot.json").read_text())
    learners = {}
    for d in sorted(run.glob("learner*")):
        ck = Checkpoints(d / "ckpt")
        learners[d.name] = {s: ck.meta(s) for s in ck.steps()}
        ck.close()
    followers = {}
    for d in sorted(run.glob("follower*")):
        ck = Checkpoints(d / "ckpt")
        followers[d.name] = {s: ck.meta(s)["version"] for s in ck.steps()}
        ck.close()
    return snap, learners, followers


def _check_resumed(run, sim, summary, saved, everyone_back):
    snap, learners, followers = saved
    v = snap["version"]
    # Every follower came back at the leader's version: from its newest checkpoint at or
    # below it, and the steps since redone from its journal (issue 21: a checkpoint is
    # written after its step is reported, every ``checkpoint_every`` versions).
    for name, steps in followers.items():
        log = (run / "logs" / f"{name}.log").read_text()
        got = re.search(
            rf"{name}: resumed at version {v} \(checkpoint of version (\d+), (\d+) steps? redone",
            log,
        )
        assert got, log[-2000:]
        c, redone = int(got[1]), int(got[2])
        assert c == max(s for s in steps if s <= v) and steps[c] == c and c + redone == v
        assert c % sim.checkpoint_every == 0
    tape = EventTape.read(run / "tape.jsonl")
    (resume,) = [r for r in tape.records if r["kind"] == "resume"]
    assert resume["version"] == v
    later = [r for r in tape.records if r.get("t", -1) > resume["t"]]
    members = [r for r in later if r["kind"] == "membership"]
    # Every learner that came back before the budget was reached came back as itself (same
    # incarnation, from its checkpoints), and nobody was evicted or restarted.
    back = sorted(r["learner"] for r in members if r["event"] == "resume")
    assert back == list(range(sim.learners)) if everyone_back else back, members
    assert len(set(back)) == len(back)
    assert not [r for r in members if r["event"] in ("evict", "restart", "join")], members
    pushes = sorted(
        (p for r in tape.round_records() for p in r.participants + r.dropped),
        key=lambda p: p.pushed_at,
    )
    # Every learner picked up at a checkpoint it saved: its first push after the restart
    # (as the leader booked it) starts at that checkpoint's data position, from the resumed
    # version, and trains first the chunks the leader said were still its own.
    checked = 0
    for j, (name, metas) in enumerate(learners.items()):
        if not (run / name / "resumed.json").exists():
            assert j not in back  # never came back before the budget was reached
            continue
        got = json.loads((run / name / "resumed.json").read_text())
        assert got["step"] in metas and got["position"] == metas[got["step"]]["position"]
        newest = metas[max(metas)]
        if newest["kind"] == "pushed":  # rolled back exactly when the restart lost that push
            assert got["step"] == max(metas) - (got["last_outcome"] == "lost")
        mine = [p for p in pushes if p.learner == j and p.pushed_at > resume["t"]]
        if not mine:
            continue  # a slow learner may not push again before the budget is reached
        first, checked = mine[0], checked + 1
        pos = got["position"]
        assert (first.meta.start_chunk, first.meta.start_offset) == (pos["chunk"], pos["offset"])
        # Made from the version its SendModel named: the resumed one (one more when the run
        # stopped in an outer step: that round ends first), or a newer one when the others
        # trained on while this learner was still compiling (Di-PS).
        want = v + ((snap.get("round") or {}).get("phase") == "apply")
        assert got["version"] >= want if not everyone_back else got["version"] == want
        assert first.meta.base_version == got["version"] and first.meta.pulled
        # Then the pieces still leased to it, in the order the leader listed them.
        taken = first.meta.spans[1:] if pos["chunk"] is not None else first.meta.spans
        n = min(len(got["regrant"]), len(taken))
        assert [(sp.chunk, sp.start) for sp in taken[:n]] == [
            (c, s) for c, s, _ in got["regrant"][:n]
        ]
    assert checked >= 1
    # Every batch of a push the followers used was trained once.
    used = [(sp.chunk, b) for r in tape.round_records() if r.applied for p in r.participants
            for sp in p.meta.spans for b in range(sp.start, sp.end)]  # fmt: skip
    assert used and len(used) == len(set(used))
    # Tokens: what the learners reported (counted at the learners, across the restart)
    # equals what the leader booked, and every push ended somewhere.
    tokens = summary["leader_tokens"]
    reported = sum(
        json.loads((run / f"learner{j}" / "stats.json").read_text())["reported"]
        for j in range(sim.learners)
    )
    assert (
        reported == tokens["reported"] == tokens["applied"] + tokens["rejected"] + tokens["dropped"]
    )
    # The resumed run's tape still replays to its parameters.
    version, params = final_params(run)
    assert tree_equal(replay(sim, tape), params)
    return version, params


def test_sync_diloco_resumed_ends_exactly_where_an_uninterrupted_run_ends(tmp_path):
    """Synchronous DiLoCo with dealt chunks: its rounds do not depend on timing, so a run
    stopped mid-round and resumed must end with the same parameters, bit for bit (tolerance
    0: the same inputs go through the same compiled code in the same order on this machine,
    and the leader merges in learner order whatever the arrival order)."""
    sim = SimConfig(
        method="sync_diloco",
        learners=2,
        followers=2,
        inner_steps=12,  # 1.5 chunks a round: rounds start mid-chunk
        token_budget=2 * 12 * 512 * 6,
        speeds=(1.0, 1.5),
        deal_chunks=True,
        checkpoint_every=2,  # a resume redoes a step from the journal: still exact
    )
    ref = launch(make_spec(sim, tmp_path / "ref", 1.0), timeout=400, progress=False, evaluate=False)
    (tmp_path / "b").mkdir()
    spec = make_spec(sim, tmp_path / "b" / "run", heartbeat_interval=1.0)
    # Killed in an outer step, before the followers applied it (each waits 0.6 s before
    # its own; numerics are the same): resumed, they redo it from their saved inputs.
    spec = dataclasses.replace(spec, apply_delay=0.6)
    _stop_at_version(spec, 3, tmp_path / "b", after=0.0, phase="apply")
    run = tmp_path / "b" / "run"
    saved = _saved(run)
    assert 3 <= saved[0]["version"] < ref["version"]  # stopped part way
    summary = launch(resumable(run), timeout=400, progress=False, evaluate=False, resume=True)
    v = saved[0]["version"]
    for k in range(sim.followers):
        log = (run / "logs" / f"follower{k}.log").read_text()
        assert f"follower{k}: holds the inputs of round" in log
        assert f"(decided at version {v})" in log
    # Every round waits for both workers (min_active): both must come back.
    version, params = _check_resumed(run, sim, summary, saved, everyone_back=True)
    ref_version, ref_params = final_params(tmp_path / "ref")
    assert version == ref_version == 6
    assert tree_equal(params, ref_params)


def test_dips_resumed_continues_from_every_checkpoint(tmp_path):
    sim = SimConfig(
        method="dips",
        learners=3,
        followers=2,
        inner_steps=12,
        # 8 full rounds (24 pushes): a run measured was stopped with 12 pushes in (the
        # slowest learner's first came late) and pushed 21 more once resumed (10 rounds).
        token_budget=3 * 12 * 512 * 8,
        speeds=(1, 1.4, 2),
    )
    spec = make_spec(sim, tmp_path / "run", heartbeat_interval=1.0)
    _stop_at_version(spec, 3, tmp_path, after=0.3)
    saved = _saved(tmp_path / "run")
    summary = launch(
        resumable(tmp_path / "run"), timeout=400, progress=False, evaluate=False, resume=True
    )
    # A learner that restarts slower may find the budget reached by the others.
    _check_resumed(tmp_path / "run", sim, summary, saved, everyone_back=False)
    assert summary["leader_tokens"]["reported"] >= sim.token_budget
