"""Epochs as fencing tokens and the leader's lease (issue 22), below the processes: the
claims in ``RUN_DIR/lease``, a standby's view of the lease, the takeover of the run folder,
a deposed leader (it decides nothing, writes nothing the new leader reads, and every answer
of it is refused), and the peers' refusal of an older epoch's messages."""

import threading
import time

import pytest

from dipsjax.runtime import lease
from dipsjax.runtime.client import ControlClient, Delivery, StaleLeader
from dipsjax.runtime.leader import LeaderNode, restored
from dipsjax.syncer import messages as m
from dipsjax.transport.proto import syncer_pb2
from tests.runtime.test_watch_delivery import _Server, _spec


def test_each_epoch_is_claimed_by_one_process_only(tmp_path):
    got = []

    def claimer(i):
        got.append((lease.claim_next(tmp_path, f"p{i}"), i))

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(e for e, _ in got) == list(range(1, 17))  # 16 claims, 16 epochs
    assert lease.newest_epoch(tmp_path) == 16
    assert not lease.claim(tmp_path, 16, "late")  # taken: refused
    assert lease.claim(tmp_path, 17, "next")


def test_a_standby_sees_the_lease_lapse_only_without_renewals(tmp_path):
    follow = lease.Follow(tmp_path, lease_s=0.3)
    assert follow.poll(now=0.0) == "held" and follow.poll(now=10.0) == "lapsed"  # no leader
    held = lease.Lease(tmp_path, lease.claim_next(tmp_path, "a"), "a", "h:1")
    held.renew()
    assert follow.poll(now=10.0) == "held"  # a new epoch: counted from now
    assert follow.poll(now=10.2) == "held"
    held.renew()
    assert follow.poll(now=10.4) == "held"  # renewed at 10.4: lapses after 10.7
    assert follow.poll(now=10.69) == "held"
    assert follow.poll(now=10.71) == "lapsed"
    held.renew(stopped=True)
    assert follow.poll(now=10.72) == "stopped"
    # A newer epoch deposes the holder: it renews nothing more.
    assert lease.claim(tmp_path, held.epoch + 1, "b")
    assert held.deposed() and not held.renew()
    assert lease.read_lease(tmp_path)["epoch"] == held.epoch  # unchanged


def _pushing(node, learner=0):
    """The leader core with a follower up and a learner in, ready for its push."""
    ld = node.leader
    node.carry_out(ld.handle(m.FollowerJoined(0.0, 0, 0)))
    node.carry_out(ld.handle(m.Join(0.0, learner)))
    node.carry_out(ld.handle(m.PullDone(0.0, learner, 0)))


def test_a_leader_deposed_mid_call_refuses_it_and_the_caller_counts_nothing(tmp_path):
    """Seen in ``chaos.py --tiny --standby``: a leader paused with a push request in its
    socket, woken after the takeover, handled the request, found itself deposed and
    answered it with no actions and no refusal: the learner counted the push as booked
    (2048 tokens unbooked in the audit). Now the answer is a refusal (``deposed``) and the
    caller treats it as a lost leader (``StaleLeader``)."""
    spec = _spec(tmp_path)
    server = _Server(spec)
    try:
        node = server.node
        _pushing(node)
        outbox = {k: list(v) for k, v in node.outbox.items()}
        assert lease.claim(spec.run_dir, node.epoch + 1, "standby")  # the takeover
        client = ControlClient(spec, learner=0)
        with pytest.raises(StaleLeader):
            client.call(m.PushRequested(0.0, 0, m.PushMeta(4 * 512, 4, 0)), timeout=10)
        assert client.refused.startswith("deposed")
        assert client.delivery.refused["deposed"] == 1
        assert node.deposed and node.refused["deposed"] >= 1
        assert {k: list(v) for k, v in node.outbox.items()} == outbox  # nothing routed
        client.close()
    finally:
        server.stop()


def test_a_caller_that_heard_a_newer_epoch_deposes_the_leader_only_if_it_was_claimed(tmp_path):
    spec = _spec(tmp_path)
    server = _Server(spec)
    try:
        node = server.node
        client = ControlClient(spec, follower=0)
        client.delivery.newest = node.epoch + 5  # never claimed: a made-up number
        with pytest.raises(StaleLeader):  # (to the caller, this leader is older)
            client.call(m.FollowerJoined(0.0, 0, 0), timeout=10)
        assert node.refused["unknown_epoch"] == 1 and not node.deposed
        assert lease.claim(spec.run_dir, node.epoch + 1, "standby")
        client.delivery.newest = node.epoch + 1
        with pytest.raises(StaleLeader):
            client.call(m.FollowerHeartbeat(0.0, 0), timeout=10)
        assert node.deposed
        client.close()
    finally:
        server.stop()


def test_a_peer_refuses_and_counts_an_older_epochs_actions():
    d = Delivery()
    env = lambda epoch, seq: syncer_pb2.Envelope(epoch=epoch, seq=seq)  # noqa: E731
    assert d.take(env(3, 1)) and d.take(env(3, 2)) and not d.take(env(3, 2))
    assert d.acked() == (3, 2)
    assert d.take(env(4, 1))  # a newer leader numbers from 1 again
    with pytest.raises(StaleLeader):
        d.take(env(3, 3))  # the deposed one's
    assert d.refused["old_epoch"] == 1 and d.state == (4, 1)
    assert d.heard(0)  # an unnumbered, unstamped message: no epoch to judge
    assert not d.heard(2) and d.refused["old_epoch"] == 2
    d.heard(5)  # an answer from a newer leader, whose stream this peer has not seen yet
    assert d.acked() == (5, 0)


def test_what_a_deposed_leader_writes_lands_in_its_moved_folder(tmp_path):
    spec = _spec(tmp_path)
    old = LeaderNode(spec)
    _pushing(old)
    tape_before = (tmp_path / "run" / "tape.jsonl").read_text()
    epoch = old.epoch + 1
    assert lease.claim(spec.run_dir, epoch, "standby")
    moved, _ = lease.takeover(spec.run_dir, epoch)
    assert moved.name == f"leader.epoch-{old.epoch:08d}"
    new = LeaderNode(spec, restored(spec), epoch=epoch, address=spec.leader)
    assert new.leader.members.keys() == old.leader.members.keys()
    # The old one goes on as if nothing happened: an event that changes its state.
    t0 = time.monotonic()
    got = old.carry_out(old.leader.handle(m.PushRequested(1.0, 0, m.PushMeta(2048, 4, 0))))
    assert got == [] and old.deposed and time.monotonic() - t0 < 5
    # Its tape records and snapshot went to its own files, not the new leader's.
    assert (tmp_path / "run" / "tape.jsonl").read_text() == tape_before
    snap = (tmp_path / "run" / "leader" / "snapshot.json").read_text()
    new.carry_out([])  # the new leader persists: its state, as restored
    assert (tmp_path / "run" / "leader" / "snapshot.json").read_text() != "" and snap
    assert restored(spec).members.keys() == new.leader.members.keys()
    assert restored(spec).version == new.leader.version
    assert (moved / "snapshot.json").read_text() != snap  # the old one's last write


def test_a_leader_restarted_before_any_epoch_was_claimed_starts_as_the_leader(tmp_path):
    """Found in review: a leader that died before it claimed epoch 1 was started again as a
    standby, and the standby waits for an epoch to lapse: no leader, ever. It starts as
    the leader until an epoch was claimed, and stands by once one was."""
    from dipsjax.launch.entry import start_args

    assert start_args("leader", 0, tmp_path, restart=True, standby=True) == []
    lease.claim_next(tmp_path, "leader")
    assert start_args("leader", 0, tmp_path, restart=True, standby=True) == ["--standby"]
    assert start_args("standby", 0, tmp_path, standby=True)[:1] == ["--standby"]
    assert start_args("leader", 0, tmp_path, restart=True, standby=False) == []  # no snapshot


def test_a_tape_shorter_than_its_snapshot_says_is_refused_by_name(tmp_path):
    """Found in review: a standby on another host may read a tape whose newest records have
    not reached its disk yet; resuming from it would go on after a gap (a tape that no
    longer replays). The leader fsyncs its tape when there is a standby, and a resume
    refuses such a tape, naming it."""
    spec = _spec(tmp_path)
    node = LeaderNode(spec)
    _pushing(node)
    tape = tmp_path / "run" / "tape.jsonl"
    lines = tape.read_text().splitlines(keepends=True)
    assert len(lines) >= 2
    tape.write_text("".join(lines[:-1]))
    with pytest.raises(ValueError, match=r"tape.jsonl holds .* fewer than"):
        restored(spec)


def test_the_standby_follows_the_tape_as_it_is_written_and_reads_only_the_rest(tmp_path):
    """Each record is parsed once while standing by (whole lines only: one being written
    waits); the takeover reads only what the copy holds past what was followed, and
    restores the leader a whole read restores."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    f = lease.TapeFollower(path)
    f.poll()
    assert f.records == [{"a": 1}, {"a": 2}]
    with path.open("a") as fh:
        fh.write('3}\n{"a": 4}\n')
    f.poll()
    assert [r["a"] for r in f.records] == [1, 2, 3, 4]
    tmp = tmp_path / "t.tmp"
    tmp.write_text('{"b": 1}\n')
    tmp.replace(path)  # replaced (a cut-back): read again from its start
    f.poll()
    assert f.records == [{"b": 1}]
    path.write_text("")  # cut in place
    f.poll()
    assert f.records == []

    spec = _spec(tmp_path)
    old = LeaderNode(spec)
    follower = lease.TapeFollower(tmp_path / "run" / "tape.jsonl")
    _pushing(old)
    follower.poll()
    seen = len(follower.records)
    assert seen == len(old.leader.tape.records) > 0
    old.carry_out(old.leader.handle(m.Join(1.0, 1)))  # learner 1: a record more
    assert len(old.leader.tape.records) > seen  # written after the standby's last read
    assert lease.claim(spec.run_dir, old.epoch + 1, "standby")
    _, ino = lease.takeover(spec.run_dir, old.epoch + 1)
    records = follower.caught_up(tmp_path / "run" / "tape.jsonl", ino)
    assert records == old.leader.tape.records
    got, whole = restored(spec, records, follower.ends), restored(spec)
    assert got.snapshot() == whole.snapshot() and got.tape.records == whole.tape.records
    other = lease.TapeFollower(tmp_path / "run" / "tape.jsonl")
    assert other.caught_up(tmp_path / "run" / "tape.jsonl", ino) is None  # never followed


def test_a_takeover_cuts_a_line_the_old_leader_was_writing_when_it_died(tmp_path):
    """Found in review: restored from followed records, a tape whose last line was torn
    (the old leader killed mid-write) kept the fragment, and the new leader's first record
    was appended onto it: a line that is not JSON, and a tape no one could read again."""
    spec = _spec(tmp_path)
    old = LeaderNode(spec)
    _pushing(old)
    tape = tmp_path / "run" / "tape.jsonl"
    with tape.open("a") as fh:
        fh.write('{"kind": "membership", "t"')  # torn: the process died here
    follower = lease.TapeFollower(tape)
    follower.poll()
    assert lease.claim(spec.run_dir, old.epoch + 1, "standby")
    _, ino = lease.takeover(spec.run_dir, old.epoch + 1)
    records = follower.caught_up(tape, ino)
    new = LeaderNode(spec, restored(spec, records, follower.ends), epoch=old.epoch + 1)
    new.carry_out(new.leader.handle(m.Join(2.0, 1)))  # the new leader's first records
    read = lease.TapeFollower(tape)
    read.poll()  # every line whole JSON again
    assert read.records == new.leader.tape.records


def test_a_tape_copy_shorter_than_the_snapshot_is_not_taken_over(tmp_path):
    """Found in review: the short tape was refused only after the takeover had replaced
    it with its short copy, and every later standby found the same. Now the takeover reads
    it again (a network filesystem behind), and failing that leaves it as it was."""
    spec = _spec(tmp_path)
    old = LeaderNode(spec)
    _pushing(old)
    tape = tmp_path / "run" / "tape.jsonl"
    full = tape.read_bytes()
    tape.write_bytes(full[: full.rstrip(b"\n").rfind(b"\n") + 1])  # the last record missing
    short = tape.read_bytes()
    assert lease.claim(spec.run_dir, old.epoch + 1, "standby")
    with pytest.raises(ValueError, match=r"fewer than the .* not taken over"):
        lease.takeover(spec.run_dir, old.epoch + 1)
    assert tape.read_bytes() == short and not (tmp_path / "run" / "tape.jsonl.takeover").exists()
