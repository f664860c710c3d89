"""Faults with real processes: kill -9 a learner, a follower or the leader of a running
``dipsjax run`` launcher; its restart policy brings the role back and the run still
reaches its budget, with its books balanced, its chunks trained once, no round applied
twice, and a tape that replays to the final parameters."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dipsjax.data import ledger as chunks
from dipsjax.launch.run import final_params, make_spec
from dipsjax.runtime.client import model_shapes
from dipsjax.runtime.credentials import push_ticket
from dipsjax.runtime.spec import address
from dipsjax.sim.config import SimConfig
from dipsjax.sim.replay import replay, tree_equal
from dipsjax.syncer.tape import EventTape
from dipsjax.transport.dataplane import DataPlaneClient, TransferError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LAUNCH = (
    "import sys; from dipsjax.launch.run import launch; from dipsjax.runtime.spec import "
    "RunSpec; launch(RunSpec.read(sys.argv[1]), progress=False, evaluate=False)"
)


#: Inner steps a round: few, so that a round is mostly its outer communication (what the
#: faults hit) and the replay in ``_check_run``, which retrains every push, stays short.
INNER_STEPS = 4


def _sim(pushes=16, **kw):
    """The faulted runs' experiment; its budget is ``pushes`` full pushes a learner."""
    base = dict(
        method="dips",
        learners=3,
        followers=2,
        inner_steps=INNER_STEPS,
        speeds=(1, 1.3, 1.6),
    )
    sim = SimConfig(**{**base, **kw})
    return dataclasses.replace(sim, token_budget=sim.full_round_tokens * pushes)


def _start(spec, tmp_path):
    path = tmp_path / "spec-for-launcher.json"
    spec.write(path)
    return subprocess.Popen([sys.executable, "-c", LAUNCH, str(path)])


def _wait(cond, what, launcher, timeout=240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = cond()
        except (OSError, ValueError, KeyError):
            got = None
        if got:
            return got
        if launcher.poll() is not None:
            pytest.fail(f"the launcher ended (rc {launcher.returncode}) before {what}")
        time.sleep(0.05)
    _stop(launcher)
    pytest.fail(f"timed out waiting for {what}")


def _stop(launcher):
    """Ends a launcher and every process it started (SIGTERM: it stops them in order; a
    SIGKILL of the launcher alone would leave its processes running)."""
    launcher.terminate()
    try:
        launcher.wait(60)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()


def _status(run):
    return json.loads((run / "leader" / "status.json").read_text())


def _kill(run, name):
    pid = json.loads((run / "pids.json").read_text())[name]
    os.kill(pid, signal.SIGKILL)
    return pid


def _finish(launcher, run):
    assert launcher.wait(400) == 0, (run / "logs").iterdir()
    return json.loads((run / "summary.json").read_text())


def _check_run(run, sim, summary, reported_before=0, after=0):
    """The invariants every faulted run must keep, each side counted on its own
    (``reported_before``, ``after``: the tokens and version of the snapshot a run was
    started from; its learners' and followers' own records begin there)."""
    tape = EventTape.read(run / "tape.jsonl")
    rounds = tape.round_records()
    applied = [r for r in rounds if r.applied]
    # No round applied twice: versions 1..N, once each, in order.
    assert [r.version for r in applied] == list(range(1, len(applied) + 1))
    # Every batch used by a decided push (accepted, or rejected: its data was used) was
    # trained once...
    used = [
        (sp.chunk, b)
        for r in rounds
        for p, _ in zip(r.participants, r.accepted, strict=False)  # undecided: no flags
        for sp in p.meta.spans
        for b in range(sp.start, sp.end)
    ]
    assert used and len(used) == len(set(used))
    # ...and the leader's chunk ledger has exactly those settled (a dropped push's batches
    # went back to be trained again, never counted as settled).
    snap = json.loads((run / "leader" / "snapshot.json").read_text())
    ledger = chunks.ChunkLedger.from_dict(snap["data"])
    done = set().union(*(chunks.settled_batches(ledger, e) for e in range(ledger.epoch + 1)))
    assert done == set(used)
    # Tokens: what learners reported (their own files, across incarnations) equals what the
    # leader booked, which equals applied + rejected + dropped; the budget was reached.
    tokens = summary["leader_tokens"]
    reported = reported_before + sum(
        json.loads((run / f"learner{j}" / "reported.json").read_text())["tokens"]
        for j in range(sim.learners)
    )
    assert (
        reported == tokens["reported"] == tokens["applied"] + tokens["rejected"] + tokens["dropped"]
    )
    assert tokens["reported"] >= sim.token_budget
    # Every follower applied the same rounds, and the tape replays to the final model.
    logs = [
        [json.loads(x) for x in (run / f"follower{k}" / "decisions.jsonl").read_text().splitlines()]
        for k in range(sim.followers)
    ]
    versions = [r.version for r in applied if r.version > after]
    assert all([d["version"] for d in log] == versions for log in logs)
    version, params = final_params(run)
    assert version == len(applied)
    assert tree_equal(replay(sim, tape), params)
    return tape


def _restarts(run):
    return [json.loads(x) for x in (run / "restarts.jsonl").read_text().splitlines()]


def _only_restart(run, role):
    """The one restart of the run, of ``role`` (any other role that died is a bug: its log
    tail is in the message)."""
    got = _restarts(run)
    tails = {
        r["role"]: (run / "logs" / f"{r['role']}.log").read_text()[-3000:]
        for r in got
        if r["role"] != role
    }
    assert [r["role"] for r in got] == [role], (got, tails)
    assert got[0]["rc"] == -signal.SIGKILL
    return got[0]


def _kill_in_a_pause(tmp_path, pause, says):
    """A run whose learners pause 0.8 s at a point of each push (the fault injection
    ``pause``, a ``RunSpec`` field; each pause logs ``says``), with learner 1 killed in
    one of its pauses after version 2 (its books as the kill came: read just before it,
    as its next incarnation may rewrite them soon after). 12 pushes a learner (36): a run
    measured had 12 in when the new incarnation joined, and it needs one of its own
    before the budget."""
    sim = _sim(pushes=12)
    run = tmp_path / "run"
    launcher = _start(dataclasses.replace(make_spec(sim, run), **{pause: 0.8}), tmp_path)
    log = run / "logs" / "learner1.log"
    _wait(lambda: _status(run)["version"] >= 2, "version 2", launcher)
    seen = log.read_text().count(says)
    _wait(lambda: log.read_text().count(says) > seen, "a new pause", launcher)
    books = json.loads((run / "learner1" / "reported.json").read_text())
    _kill(run, "learner1")
    return sim, run, launcher, log, books


def test_a_learner_killed_mid_push_comes_back_as_a_new_incarnation(tmp_path):
    # Killed within the pause: follower 0 has the shards, follower 1 not.
    sim, run, launcher, log, _ = _kill_in_a_pause(tmp_path, "push_pause", "mid-push pause")
    round_id = int(log.read_text().split("mid-push pause, round ")[-1].split()[0])
    killed_at = _status(run)["t"]
    summary = _finish(launcher, run)
    tape = _check_run(run, sim, summary)
    _only_restart(run, "learner1")
    # No part of the killed push entered any round: follower 0 held its shards, follower 1
    # never got them, and the leader dropped it.
    rounds = {r.round_id: r for r in tape.round_records()}
    # (A round whose only push was the killed one ends with nothing in it and leaves no
    # record: under load the others may still be compiling while learner 1 trains alone.)
    if round_id in rounds:
        assert all(p.learner != 1 for p in rounds[round_id].participants), rounds[round_id]
    else:
        assert max(rounds) > round_id  # the run went on past it
    members = [r for r in tape.records if r["kind"] == "membership" and r["learner"] == 1]
    gone = [r for r in members if r["event"] in ("restart", "evict")]
    assert gone and gone[0]["t"] >= killed_at
    # Incarnation 1 joined, pulled one complete version, then pushed from that version.
    joins = [r for r in members if r["event"] == "join" and r.get("incarnation") == 1]
    assert len(joins) == 1, members
    join = joins[0]
    active = next(r for r in members if r["event"] == "active" and r["t"] >= join["t"])
    pushes = sorted(
        (p for r in tape.round_records() for p in r.participants if p.learner == 1),
        key=lambda p: p.pushed_at,
    )
    later = [p for p in pushes if p.meta.incarnation == 1]
    assert later, "the restarted learner never contributed"
    assert later[0].pushed_at > active["t"]
    assert later[0].meta.base_version == active["pulled_version"] and later[0].meta.pulled
    assert all(p.pushed_at < killed_at for p in pushes if p.meta.incarnation == 0)


def test_a_learner_killed_after_its_push_was_booked_and_before_it_knew_is_counted_once(
    tmp_path,
):
    # benchmarks/hostile.py --tiny once found the books one push apart: a learner killed
    # after the leader booked its push and before it wrote the answer down. The kill lands
    # there (``answer_pause``); the next incarnation asks the leader of that push.
    sim, run, launcher, log, books = _kill_in_a_pause(tmp_path, "answer_pause", "answer pause")
    assert books["incarnation"] == 0 and books["doubt"] > 0  # written down, answer not
    summary = _finish(launcher, run)
    _check_run(run, sim, summary)  # the books balance, each side counted on its own
    _only_restart(run, "learner1")
    assert "incarnation 0's push in doubt was booked" in log.read_text()


def test_a_cut_link_is_retried_while_short_and_ends_the_incarnation_when_longer(tmp_path):
    """Fault injection ``link_cuts``: in each learner's second push its link to follower 1
    is severed 64 KiB into the transfer. Learner 0's comes back after 2.5 s: it sends the
    push again, whole, and the round takes it once. Learner 1's stays cut past
    ``transfer_patience`` (6 s) while the leader still hears from both followers: it
    leaves (the round goes on without the push it could not finish), exits with code 69,
    and the launcher starts a new incarnation on a new link."""
    # A budget long enough that learner 1's next incarnation (compiling for some 15 s)
    # joins before the others reach it.
    sim = _sim(pushes=24)
    run = tmp_path / "run"
    spec = dataclasses.replace(
        make_spec(sim, run), link_cuts=((0, 2.5), (1, 120.0)), transfer_patience=6.0
    )
    launcher = _start(spec, tmp_path)
    summary = _finish(launcher, run)
    tape = _check_run(run, sim, summary)
    assert [(r["role"], r["rc"]) for r in _restarts(run)] == [("learner1", 69)]
    rounds = {r.round_id: r for r in tape.round_records()}
    logs = [(run / "logs" / f"learner{j}.log").read_text() for j in (0, 1)]
    cut = [int(x.split(" s, round ")[1].split()[0]) for x in logs]
    # Learner 0: retried after the cut, the push taken once into its round.
    assert "push to follower 1 failed" in logs[0] and "unreachable" not in logs[0]
    assert [p.learner for p in rounds[cut[0]].participants].count(0) == 1
    # Learner 1: gave up, left; its cut push entered no round; incarnation 1 joined after
    # the leave, pulled, and contributed.
    assert "unreachable" in logs[1]
    r1 = rounds[cut[1]]
    assert all(p.learner != 1 for p in r1.participants + r1.dropped), r1
    members = [r for r in tape.records if r["kind"] == "membership" and r["learner"] == 1]
    (leave,) = [r for r in members if r["event"] == "leave"]
    joins = [r for r in members if r["event"] == "join" and r.get("incarnation") == 1]
    assert len(joins) == 1 and leave["t"] < joins[0]["t"], members
    later = [p for r in rounds.values() for p in r.participants if p.learner == 1]
    assert any(p.meta.incarnation == 1 for p in later), members


def _calm(run, learners):
    """Version 2, every learner in (none still compiling), and no follower applying an
    outer step (each test kills at the moment it is about; the outer step has its own)."""
    st = _status(run)
    pushed = [v["tokens"] > 0 for v in st["learners"].values()]
    return (
        st["version"] >= 2
        and len(pushed) == learners
        and all(pushed)
        and st["phase"] in ("idle", "collecting", "transfers", "pull")
    )


def _start_calm(tmp_path, sim, **spec_fields):
    """A launcher running ``sim``, once it is calm: ``(run, spec, launcher)``."""
    run = tmp_path / "run"
    spec = dataclasses.replace(make_spec(sim, run), **spec_fields)
    launcher = _start(spec, tmp_path)
    _wait(lambda: _calm(run, sim.learners), "version 2, every learner in, calm", launcher)
    return run, spec, launcher


def test_a_follower_killed_is_found_by_heartbeats_and_a_replacement_takes_over(tmp_path):
    """The replacement restarts from the newest checkpoint on a new port (the launcher's
    default, ``move_followers``): it announces its address on joining, and learners that
    cannot reach the old one find it through the leader and push to it."""
    # 10 pushes a learner (30): a run measured at 16 killed the follower at push 4 and had
    # its replacement joined at push 4 (no round is applied without it).
    sim = _sim(pushes=10)
    run, spec, launcher = _start_calm(tmp_path, sim)
    moved = spec.move_followers
    killed_at = _status(run)["t"]
    old = _status(run)["follower_addresses"]["1"]
    _kill(run, "follower1")
    # The replacement refuses a replay of round 0, which ended before it was killed (the
    # rounds that ended are in its checkpoint): the push is not staged.
    back = _wait(
        lambda: (a := _status(run)["follower_addresses"].get("1")) and a != old and a,
        "the replacement follower",
        launcher,
    )
    shapes = list(model_shapes(spec).values())
    mine = [(i, np.zeros(shapes[i][0], np.float32)) for i, k in enumerate(spec.layer_owner) if k]
    replay_client = DataPlaneClient(address(back), ssl_context=spec.ssl_client())
    with pytest.raises(TransferError, match="round 0 has ended") as e:  # its real grant
        replay_client.push(0, 0, 0, 0, mine, codec="fp32", ticket=push_ticket(spec.token, 0, 0, 0))
    assert e.value.refused and e.value.kind == "replayed"
    # Issue 18 item 5: a push for a round the leader never opened (no grant, or another
    # round's) is refused from its first header, before a tensor is read: before, it was
    # acknowledged and kept.
    far = 10**6
    for ticket in (b"", push_ticket(spec.token, 0, 0, 0), push_ticket(spec.token, far, 1, 0)):
        with pytest.raises(TransferError, match=f"did not grant round {far} to learner 0") as e:
            replay_client.push(far, 0, 0, 0, mine, codec="fp32", ticket=ticket)
        assert e.value.refused and e.value.kind == "ticket"
    replay_client.close()
    summary = _finish(launcher, run)
    tape = _check_run(run, sim, summary)
    _only_restart(run, "follower1")
    events = [r for r in tape.records if r["kind"] == "follower" and r["t"] >= killed_at]
    lost = [r for r in events if r["event"] == "lost"]
    joined = [r for r in events if r["event"] == "joined"]
    # Found lost (by heartbeats within 3 intervals, or by its own restart), then back at
    # the version the others serve: the run went on to its budget from there.
    assert lost and lost[0]["follower"] == 1
    assert lost[0]["t"] - killed_at < 3 * spec.heartbeat_interval + 1.0
    assert joined and joined[0]["follower"] == 1 and joined[0]["t"] > lost[0]["t"]
    last = max(r.version for r in tape.round_records() if r.applied)
    assert last > joined[0]["version"]  # rounds were applied after it came back
    # A round open when it died was discarded whole: nothing half applied (the replay and
    # the followers' identical decision logs in _check_run say the same).
    log = (run / "logs" / "follower1.log").read_text()
    assert f"follower1: resumed at version {joined[0]['version']}" in log
    port = _status(run)["follower_addresses"]["1"].rpartition(":")[2]
    assert (port == spec.followers[1].rpartition(":")[2]) == (not moved)
    if moved:  # learners found it, and it served their pushes and pulls from there
        learners = "".join((run / "logs" / f"learner{j}.log").read_text() for j in range(3))
        assert f"follower 1 moved to 127.0.0.1:{port}" in learners
        metrics = json.loads((run / "follower1" / "metrics.json").read_text())
        assert metrics["pushes"] > 0 and metrics["pulls"] > 0


def test_a_follower_killed_while_the_others_apply_the_round_redoes_it_from_its_inputs(tmp_path):
    """Bug (issue 17 item 10): a follower killed between the leader's ``Apply`` and its own
    checkpoint came back at v without the round's inputs while the other follower had
    applied it: the run stopped ("came back at version v without the inputs of round r"),
    far short of its budget. Now it saved the inputs before it reported its merge: its
    restart (from the checkpoint of v) holds them, joins listing the round, is sent the
    ``Apply`` again and applies v + 1; the run reaches its budget and replays exactly.
    ``apply_delay`` holds each follower 0.6 s before its outer step, so the kill lands
    inside it. Issue 21: followers checkpoint every 3rd version, after its report; the
    restart redoes the steps since its newest checkpoint from its journal first."""
    sim = _sim(pushes=8, checkpoint_every=3)
    run, _spec, launcher = _start_calm(tmp_path, sim, apply_delay=0.6)
    st = _wait(lambda: (s := _status(run))["phase"] == "apply" and s, "an outer step", launcher)
    _kill(run, "follower1")
    summary = _finish(launcher, run)
    tape = _check_run(run, sim, summary)
    _only_restart(run, "follower1")
    r, v = st["round"]["id"], st["version"]
    log = (run / "logs" / "follower1.log").read_text()
    got = re.search(
        rf"follower1: resumed at version {v} \(checkpoint of version (\d+), (\d+) steps? redone",
        log,
    )
    assert got, log[-2000:]
    assert int(got[1]) % 3 == 0 and int(got[1]) + int(got[2]) == v
    assert f"follower1: holds the inputs of round {r} (decided at version {v})" in log
    (applied,) = [x for x in tape.round_records() if x.round_id == r]
    assert applied.applied and applied.version == v + 1
    decisions = (run / "follower1" / "decisions.jsonl").read_text().splitlines()
    assert sum(json.loads(x)["round"] == r for x in decisions) == 1  # applied once


def test_the_leader_killed_comes_back_from_its_snapshot_and_everyone_rejoins(tmp_path):
    # 10 pushes a learner (30): a run measured at 16 killed the leader at push 7 and had
    # every learner back at push 11 (no round is decided while the leader is down).
    sim = _sim(pushes=10)
    run, _spec, launcher = _start_calm(tmp_path, sim)
    before = json.loads((run / "pids.json").read_text())
    killed_at = _status(run)["t"]
    _kill(run, "leader")
    summary = _finish(launcher, run)
    tape = _check_run(run, sim, summary)
    _only_restart(run, "leader")
    # Nobody else restarted: every follower and learner reconnected in its own process.
    after = json.loads((run / "pids.json").read_text())
    assert {n: p for n, p in after.items() if n != "leader"} == {
        n: p for n, p in before.items() if n != "leader"
    }
    resumes = [r for r in tape.records if r["kind"] == "resume"]
    assert len(resumes) == 1, resumes
    resume = resumes[0]
    assert resume["t"] >= killed_at
    back = [r for r in tape.records if r["kind"] == "membership" and r["t"] >= resume["t"]]
    rejoined = sorted({r["learner"] for r in back if r["event"] == "resume"})
    assert rejoined == list(range(sim.learners)), back
    assert not [r for r in back if r["event"] in ("evict", "restart")], back
    joined = [r for r in tape.records if r["kind"] == "follower" and r["t"] >= resume["t"]]
    assert sorted(r["follower"] for r in joined if r["event"] == "joined") == [0, 1]
    for name in ("learner0", "follower0"):
        assert "rejoin" in (run / "logs" / f"{name}.log").read_text()


def test_a_hung_follower_and_then_a_hung_learner_are_found_and_come_back(tmp_path):
    """Two hangs (SIGSTOP) in one run, one after the other (one job started, not two: the
    start is most of each run's time on 2 shared cores).

    First a follower: silent for 3 heartbeat intervals, it is found lost and the round that
    needs it is discarded whole. Woken 2 s later, it beats again; the leader answers with
    ``Rejoin`` (before, new rounds waited for it forever) and it joins at its version, which
    is the others' (nothing was applied without it). No process restarts for it.

    Once it is back (and the run calm again), a learner: silent for 3 heartbeat intervals,
    it is evicted (its push dropped, its leases back in the ledger). Woken up, it learns it
    was evicted, exits with code 75, and the launcher starts a new incarnation (a longer
    run: the new incarnation starts and loads its compiled steps before it joins; a run
    measured with the learner's hang alone: 32 of its 108 pushes done when it joined, 7
    when learner 2 was evicted)."""
    sim = _sim(pushes=36)
    run, spec, launcher = _start_calm(tmp_path, sim)
    pids = json.loads((run / "pids.json").read_text())

    # The follower's hang.
    pid = pids["follower1"]
    stopped_at = _status(run)["t"]
    os.kill(pid, signal.SIGSTOP)

    def follower_records():
        return [
            r
            for r in EventTape.read(run / "tape.jsonl").records
            if r["kind"] == "follower" and r.get("follower") == 1 and r["t"] >= stopped_at
        ]

    def lost_records():
        return [r for r in follower_records() if r["event"] == "lost"]

    try:
        lost = _wait(lost_records, "the hung follower found lost", launcher, timeout=60)
        time.sleep(2.0)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert lost[0]["reason"] == "missed heartbeats"
    assert lost[0]["t"] - stopped_at < 3 * spec.heartbeat_interval + 1.5
    # Back before the learner's hang (each fault on its own), the run calm again.
    _wait(
        lambda: [r for r in follower_records() if r["event"] == "joined"],
        "the woken follower joined again",
        launcher,
    )
    _wait(lambda: _calm(run, sim.learners), "calm again", launcher)

    # The learner's hang.
    pid = pids["learner2"]
    learner_stopped_at = _status(run)["t"]
    os.kill(pid, signal.SIGSTOP)
    try:
        evicted = _wait(
            lambda: [
                r
                for r in EventTape.read(run / "tape.jsonl").records
                if r["kind"] == "membership" and r["learner"] == 2 and r["event"] == "evict"
            ],
            "the hung learner's eviction",
            launcher,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert evicted[0]["reason"] == "missed heartbeats"
    assert evicted[0]["t"] - learner_stopped_at < 3 * spec.heartbeat_interval + 1.5

    summary = _finish(launcher, run)
    tape = _check_run(run, sim, summary)
    # The only process restarted is the evicted learner (exit 75): the hung follower was
    # not restarted, it joined again.
    restarts = _restarts(run)
    assert [(r["role"], r["rc"]) for r in restarts] == [("learner2", 75)], restarts
    # The follower.
    events = [r for r in tape.records if r["kind"] == "follower" and r["t"] >= stopped_at]
    joined = [r for r in events if r["event"] == "joined" and r["follower"] == 1]
    assert joined and joined[0]["t"] > lost[0]["t"], events
    assert "joining again" in (run / "logs" / "follower1.log").read_text()
    last = max(r.version for r in tape.round_records() if r.applied)
    assert last > joined[0]["version"]  # rounds were applied after it came back
    # The learner.
    members = [r for r in tape.records if r["kind"] == "membership" and r["learner"] == 2]
    assert [r for r in members if r["event"] == "join" and r.get("incarnation") == 1]
    assert "evicted (missed heartbeats)" in (run / "logs" / "learner2.log").read_text()


def test_a_snapshot_taken_while_training_restarts_in_fresh_processes(tmp_path):
    """``dipsjax snapshot`` copies the leader's metadata and every follower's shard at one
    version while the job trains; a fresh set of processes (new ports, new incarnations
    of the learners) started from it reaches the budget with the books balanced, every
    chunk trained once, versions continuing from the snapshot's, and a tape that replays
    from version 0 to the final parameters: the copied shards agree with the tape."""
    from dipsjax.launch.run import launch, resumable
    from dipsjax.runtime import snapshot

    # 10 pushes a learner (20): a run measured took its snapshot at version 2 (4 pushes),
    # and both fresh learners joined within 0.3 s of each other.
    sim = _sim(pushes=10, learners=2, speeds=(1, 1.3))
    run = tmp_path / "run"
    launcher = _start(make_spec(sim, run), tmp_path)
    # Both learners members (the slower one may still compile at version 2: it would then
    # join the fresh run as its first incarnation, not come back as a new one).
    _wait(
        lambda: (st := _status(run))["version"] >= 2 and len(st["members"]) == 2,
        "version 2 with both learners",
        launcher,
    )
    taken = snapshot.take(run, tmp_path / "snap")
    _finish(launcher, run)  # the original run goes on to its end, undisturbed
    v = taken["version"]
    assert v >= 2 and taken["followers"] == 2
    fresh = tmp_path / "snap"
    summary = launch(resumable(fresh), resume=True, timeout=400, progress=False, evaluate=False)
    tape = _check_run(fresh, sim, summary, taken["tokens"]["reported"], after=v)
    (resumed,) = [r for r in tape.records if r["kind"] == "resume"]
    assert resumed["version"] == v
    for k in range(2):
        assert f"resumed at version {v}" in (fresh / "logs" / f"follower{k}.log").read_text()
    # Every learner came back as a new incarnation, and nobody needed a restart.
    joins = [r for r in tape.records if r["kind"] == "membership" and r["event"] == "join"]
    assert sorted(r["learner"] for r in joins if r["incarnation"] >= 1) == [0, 1]
    assert not (fresh / "restarts.jsonl").exists()
    assert max(r.version for r in tape.round_records() if r.applied) > v
