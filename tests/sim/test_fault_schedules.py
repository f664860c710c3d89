"""Faults at any moment (issue 17): random fault schedules in the simulator, under every
method, on a toy world (:mod:`tests.sim.toy_world`: real leader, followers, chunk ledger and
batch streams; two tiny tensors trained by NumPy arithmetic).

A schedule kills, hangs, restarts, cuts the control stream of, or makes leave, any learner;
cuts the control stream of, hangs, or kills and restarts from its disk any follower;
replaces or restarts the leader, loses its host (a standby takes over once the lease
lapses) or kills the standby; before any event of the run, several at once or the same
role twice quickly (:mod:`dipsjax.sim.faults`). After each run:

* it ends (bounded), at its token budget, or without one only if every learner left for
  good (nobody is left to train);
* the learners' own token counts balance the leader's books, and the leader's books
  balance: reported = applied + rejected + dropped + outstanding;
* the chunk ledger's invariants hold, no batch enters a decided round (applied or rejected)
  twice in the epoch, and every batch of a chunk the ledger calls complete did;
* every follower applied the tape's applied rounds, each once, in order, versions going up
  by one, and they end at the same version, the tape's number of applied rounds (a killed
  follower's steps counted over its processes: one killed before a round's ``Apply``
  reached it takes that step in its new process, from the round's saved inputs);
* no follower holds shards or a batch of a round that ended;
* where asked, the tape replays to the final parameters (those of a follower that is down
  at the end are what its disk holds).

A follower kill (:class:`~dipsjax.sim.faults.FollowerKill`) makes the run model the
followers' processes (:meth:`~dipsjax.sim.cluster.LocalCluster.model_processes`): their
files, what a restarted one builds from them, and their heartbeats.

Schedules that found bugs are kept as named regression cases at the end of the file.
"""

from __future__ import annotations

import collections
import contextlib
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dipsjax.data import check_invariants, completed_chunks, settled_batches
from dipsjax.sim.engine import Engine
from dipsjax.sim.faults import (
    Crash,
    Cut,
    FaultClock,
    FollowerCut,
    FollowerHang,
    FollowerKill,
    Hang,
    Leave,
    RestartLeader,
    RestoreLeader,
    StandbyKill,
    Takeover,
)
from dipsjax.sim.replay import tree_equal
from dipsjax.syncer.follower import Follower
from dipsjax.syncer.leader import Leader
from tests.sim.toy_world import ToyWorld, push_batches, toy_config, toy_replay

# (method, overlap): every method of the registry the engine runs, with and without overlap.
METHODS = [
    ("dips", False),
    ("dips", True),
    ("sync_diloco", False),
    ("decoupled", False),
    ("decoupled", True),
    ("naive_async", False),
]
LEARNERS = 3
MAX_AT = 260  # about the events of an undisturbed run


@contextlib.contextmanager
def settlements():
    """Every push's outcome as the leader books it (whatever leader object does)."""
    booked: list[tuple[int, object, str]] = []
    original = Leader._settle

    def settle(self, p, outcome, release=True):
        if p.outcome is None:
            booked.append((p.learner, p.meta, outcome))
        return original(self, p, outcome, release)

    with mock.patch.object(Leader, "_settle", settle):
        yield booked


@contextlib.contextmanager
def outer_steps():
    """Every outer step a follower takes, ``(round, version)`` by follower id (whatever
    follower object takes it: a restarted follower is a new one)."""
    steps: collections.defaultdict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    original, original_redo = Follower.apply, Follower.redo
    redoing = set()  # a restarted follower redoing the steps of its dead process: not new

    def apply(self, decision, a):
        before = self.version
        v = original(self, decision, a)
        if v != before and id(self) not in redoing:
            steps[self.follower_id].append((decision.round_id, v))
        return v

    def redo(self, *args, **kw):
        redoing.add(id(self))
        try:
            return original_redo(self, *args, **kw)
        finally:
            redoing.discard(id(self))

    with mock.patch.object(Follower, "apply", apply), mock.patch.object(Follower, "redo", redo):
        yield steps


def run_schedule(method: str, overlap: bool, schedule: tuple, **kw):
    cfg = toy_config(method=method, overlap=overlap, learners=LEARNERS, **kw)
    world = ToyWorld(cfg)
    clock = FaultClock(schedule)
    engine = Engine(cfg, world=world, clock=clock)
    clock.engine = engine
    with settlements() as booked, outer_steps() as steps:
        res = engine.run()
    applies = [steps[k] for k in range(len(engine.cluster.followers))]
    return engine, res, world, booked, applies


def left_for_good(schedule: tuple) -> set[int]:
    return {f.learner for f in schedule if isinstance(f, Leave) and f.back_after is None}


def check(method, overlap, schedule, replay=True, **kw):
    engine, res, world, booked, applies = run_schedule(method, overlap, schedule, **kw)
    leader = engine.leader
    what = f"{method} overlap={overlap} schedule={schedule!r}"
    # Ends at its budget (or nobody is left to train).
    if not leader.budget_reached():
        assert left_for_good(schedule) == set(range(LEARNERS)), (
            f"{what}: stopped short of the budget ({leader.budget_tokens()} of "
            f"{engine.cfg.token_budget}): stopped={leader.stopped} "
            f"reason={leader.stop_reason!r} t={res.virtual_time:.1f}"
        )
    else:
        assert leader.stopped and "budget" in leader.stop_reason, (what, leader.stop_reason)
    # Tokens: the learners' own counts against the leader's books, and the books.
    tok = res.tokens
    assert tok.imbalance() == 0, (what, tok)
    assert tok.reported == tok.applied + tok.rejected + tok.dropped + tok.outstanding, (
        what,
        tok,
    )
    # Data: the ledger, and every batch once per epoch.
    ledger = leader.data
    check_invariants(ledger)
    assert ledger.epochs_completed == 0
    trained = collections.Counter(
        b for _, meta, outcome in booked if outcome != "dropped" for b in push_batches(world, meta)
    )
    twice = {b: n for b, n in trained.items() if n > 1}
    assert not twice, f"{what}: batches (chunk, batch) trained twice: {twice}"
    per_chunk = engine.world.source.batches_per_chunk
    missing = [
        (c, b)
        for c in completed_chunks(ledger, 0)
        for b in range(per_chunk)
        if (c, b) not in trained
    ]
    assert not missing, f"{what}: batches of completed chunks never trained: {missing}"
    # The ledger's own account, batch by batch, against the decided pushes' batches.
    assert settled_batches(ledger, 0) == set(trained), f"{what}: the ledger's batches differ"
    # Versions: applied once each, in order, identically on every follower.
    applied = [(r.round_id, r.version) for r in res.tape.round_records() if r.applied]
    assert [v for _, v in applied] == list(range(1, len(applied) + 1)), (what, applied)
    for k, log in enumerate(applies):
        assert log == applied, f"{what}: follower {k} applied {log}, the tape says {applied}"
    assert {f.version for f in engine.cluster.followers} == {len(applied)}, what
    # Nothing of a round that ended is held (a push for it is a replay, refused).
    ended = {r.round_id for r in res.tape.round_records()}
    for f in engine.cluster.followers:
        held = ({r for r, _ in f._staged} | set(f._batch)) & ended
        assert not held, f"{what}: follower {f.follower_id} holds rounds that ended: {held}"
    # The tape replays to the final model.
    if replay:
        again = toy_replay(engine.cfg, res.tape)
        assert tree_equal(again, res.params), f"{what}: the tape does not replay"
    return engine, res


# -- schedules ------------------------------------------------------------------------------

learner = st.integers(0, LEARNERS - 1)


def fault(at):
    return st.one_of(
        st.builds(
            Crash,
            at=at,
            learner=learner,
            back_after=st.sampled_from([0.0, 0.5, 3.0, 12.0]),
            tell=st.booleans(),
        ),
        st.builds(Hang, at=at, learner=learner, seconds=st.sampled_from([0.5, 3.0, 7.0, 20.0])),
        st.builds(Leave, at=at, learner=learner, back_after=st.sampled_from([None, 1.0, 6.0])),
        st.builds(Cut, at=at, learner=learner),
        st.builds(RestoreLeader, at=at),
        st.builds(RestartLeader, at=at),
        # The standby (issue 22): the active leader's host lost, or the standby's process.
        st.builds(Takeover, at=at, lease=st.sampled_from([0.5, 3.0, 8.0])),
        st.builds(StandbyKill, at=at, back_after=st.sampled_from([0.5, 4.0])),
    )


def follower_kill(at):
    return st.builds(
        FollowerKill,
        at=at,
        follower=st.integers(0, 1),
        back_after=st.sampled_from([0.0, 0.5, 3.0, 12.0]),
    )


def follower_fault(at):
    return st.one_of(
        st.builds(FollowerCut, at=at, follower=st.integers(0, 1)),
        st.builds(
            FollowerHang, at=at, follower=st.integers(0, 1), seconds=st.sampled_from([0.5, 5.0])
        ),
        follower_kill(at),
    )


def any_fault(at):
    return st.one_of(fault(at), follower_fault(at))


@st.composite
def schedules(draw, faults=fault):
    """1-4 faults: anywhere in the run, or close together (several at once, the same
    role twice quickly)."""
    first = draw(st.integers(0, MAX_AT))
    near = st.integers(first, first + 3)
    anywhere = st.integers(0, MAX_AT)
    n = draw(st.integers(1, 4))
    return tuple(
        sorted(
            (draw(faults(st.one_of(near, anywhere))) for _ in range(n)),
            key=lambda f: f.at,
        )
    )


@st.composite
def kill_schedules(draw):
    """A follower kill among 0-3 other faults of any role (another kill included), close to
    it or anywhere in the run."""
    kill = draw(follower_kill(st.integers(0, MAX_AT)))
    near = st.integers(max(kill.at - 3, 0), kill.at + 3)
    n = draw(st.integers(0, 3))
    others = [draw(any_fault(st.one_of(near, st.integers(0, MAX_AT)))) for _ in range(n)]
    return tuple(sorted([kill, *others], key=lambda f: f.at))


SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: runs are slow
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("method,overlap", METHODS)
@settings(max_examples=28, **SETTINGS)
@given(schedule=schedules())
def test_random_fault_schedules(method, overlap, schedule):
    check(method, overlap, schedule, replay=False)


@pytest.mark.parametrize("method,overlap", METHODS)
@settings(max_examples=6, **SETTINGS)
@given(schedule=schedules())
def test_random_fault_schedules_replay(method, overlap, schedule):
    """Fewer schedules, each also replayed from its tape (a second run's cost)."""
    check(method, overlap, schedule)


@pytest.mark.parametrize("method,overlap", METHODS)
@settings(max_examples=12, **SETTINGS)
@given(schedule=schedules(faults=any_fault))
def test_random_follower_fault_schedules(method, overlap, schedule):
    """Follower faults (a broken control stream, a stall, a kill) among the others."""
    check(method, overlap, schedule, replay=False)


@pytest.mark.parametrize("method,overlap", METHODS)
@settings(max_examples=7, **SETTINGS)
@given(schedule=kill_schedules())
def test_random_follower_kill_schedules(method, overlap, schedule):
    """A follower killed at any event and restarted from its disk after a drawn delay,
    alone or among faults of any role; each also replayed from its tape."""
    check(method, overlap, schedule)


@pytest.mark.parametrize("method,overlap", [("dips", True), ("sync_diloco", False)])
@settings(max_examples=10, **SETTINGS)
@given(schedule=kill_schedules())
def test_random_follower_kill_schedules_with_checkpoints_every_3_versions(
    method, overlap, schedule
):
    """Issue 21: checkpoints off the critical path. A follower checkpoints every 3rd
    version, after reporting it; killed at any event, it comes back from its newest
    checkpoint and redoes the steps since from its journal. The same invariants hold and
    each run replays from its tape."""
    redone = []
    original = Follower.redo

    def redo(self, *a, **kw):
        redone.append(original(self, *a, **kw))
        return redone[-1]

    with mock.patch.object(Follower, "redo", redo):
        engine, _ = check(method, overlap, schedule, checkpoint_every=3)
    # Each restart redid the steps since the newest multiple of 3 (the sim's checkpoints
    # are written when asked for): no more, no fewer.
    assert redone == [version % 3 for _, _, version, _ in engine.cluster.restored], redone


@st.composite
def takeover_schedules(draw):
    """The active leader's host lost at any event (issue 22), among 0-3 faults of any role
    close to it or anywhere: another takeover, the standby killed, the leader restarted."""
    lost = draw(st.builds(Takeover, at=st.integers(0, MAX_AT), lease=st.sampled_from([0.5, 3.0])))
    near = st.integers(max(lost.at - 3, 0), lost.at + 3)
    n = draw(st.integers(0, 3))
    others = [draw(any_fault(st.one_of(near, st.integers(0, MAX_AT)))) for _ in range(n)]
    return tuple(sorted([lost, *others], key=lambda f: f.at))


@pytest.mark.parametrize("method,overlap", METHODS)
@settings(max_examples=6, **SETTINGS)
@given(schedule=takeover_schedules())
def test_random_takeover_schedules(method, overlap, schedule):
    """A standby takes over at any event, alone or among faults of any role (the standby
    itself included); the run keeps every invariant and replays from its tape, written by
    both leaders in turn."""
    engine, _ = check(method, overlap, schedule)
    cluster = engine.cluster
    resumes = [r["t"] for r in engine.leader.tape.records if r["kind"] == "resume"]
    # Every loss of the leader's host ended in a takeover, which resumed (in the tape).
    assert len(cluster.takeovers) == len(cluster.leader_losses), (cluster.leader_losses,)
    assert all(t in resumes for t in cluster.takeovers), (cluster.takeovers, resumes)
    for lost, took in zip(cluster.leader_losses, cluster.takeovers, strict=True):
        assert took >= lost + 0.5 - 1e-9  # not before the lease lapsed


def test_a_takeover_waits_for_a_standby_that_is_down():
    """The standby killed just before the leader's host is lost: no leader listens until
    the standby is back and the lease lapsed; what was sent meanwhile reaches the new one."""
    schedule = (StandbyKill(at=100, back_after=4.0), Takeover(at=101, lease=3.0))
    engine, _ = check("dips", False, schedule)
    (killed, _), (lost, _) = [(t, f) for _, t, f in engine.clock.struck]
    (resume,) = [r["t"] for r in engine.leader.tape.records if r["kind"] == "resume"]
    assert resume == pytest.approx(killed + 4.0 + 3.0) and resume - lost > 3.0


def test_kills_between_checkpoints_redo_the_steps_since():
    """Kills at several moments of one run (``checkpoint_every=3``): some land 1 or 2
    versions past a checkpoint, and those restarts redo the steps, then the run keeps
    every invariant and replays from its tape."""
    got = []
    for at in (60, 90, 120, 150, 180):
        kill = (FollowerKill(at=at, follower=1, back_after=0.5),)
        engine, _ = check("sync_diloco", False, kill, checkpoint_every=3)
        got += [version for _, _, version, _ in engine.cluster.restored]
    assert any(v % 3 for v in got), got


@pytest.mark.parametrize("method,overlap", METHODS)
def test_no_faults(method, overlap):
    _, res = check(method, overlap, ())
    assert res.tokens.dropped == 0 or overlap  # (with overlap, stale pushes are dropped)


# -- regression cases: schedules that found bugs --------------------------------------------


def test_regression_leader_restart_trains_a_batch_twice():
    """dips, the leader restarted (``Leader.resume``) while round 0 is applied: learner 0's
    push (chunk 133 and batch 0 of chunk 202) is applied; learner 0 has no checkpoint, exits
    and rejoins as incarnation 1. The ledger counted chunk ids: the restart released chunk
    202 whole, and learner 0 leased it again and trained (202, 0) a second time (issue 17
    item 6; seen failing before the ledger counted batches)."""
    engine, res = check("dips", False, (RestartLeader(at=14),))
    assert len(engine.clock.struck) == 1
    assert any(r["kind"] == "resume" for r in res.tape.records)


def test_regression_follower_lost_drops_batches_of_a_completed_chunk():
    """sync_diloco: follower 1's stream breaks mid-round, the round is discarded, and the
    learners read on in their chunks. With chunk ids counted, chunks completed without their
    batch 0 ever applied, and a dropped push gave back a chunk whose first batch was
    applied, trained again: (141, 0) twice (issue 17 item 6; seen failing before the ledger
    counted batches). Now the dropped batches alone go back."""
    schedule = (
        Leave(at=91, learner=0, back_after=None),
        FollowerCut(at=117, follower=1),
        FollowerHang(at=127, follower=0, seconds=5.0),
        FollowerCut(at=175, follower=0),
    )
    engine, _ = check("sync_diloco", False, schedule)
    assert len(engine.clock.struck) == len(schedule)
    assert any(r.get("event") == "lost" for r in engine.leader.tape.records)


def test_regression_a_span_across_two_leased_pieces_is_settled():
    """decoupled: learner 0 leaves with batch 0 of chunk 18 in a dropped push and batch 1 on
    its lease: both go back as two pieces, and learner 1 leases them one after the other.
    Its round read them as one span (18, 0, 2), which lies in no single leased piece: the
    leader settled nothing, and after the leader's restart its next incarnation trained
    them again (found by ``test_random_follower_fault_schedules`` while the ledger was made
    to count batches; a span now never covers two pieces)."""
    schedule = (
        Hang(at=33, learner=2, seconds=7.0),
        Leave(at=52, learner=0, back_after=None),
        RestartLeader(at=200),
    )
    engine, _ = check("decoupled", False, schedule)
    assert len(engine.clock.struck) == len(schedule)


def test_regression_a_push_for_a_round_that_ended_while_its_follower_was_down():
    """sync_diloco: follower 0 is killed in round 0 and comes back 12 s later. Meanwhile the
    leader finds it lost by its silence and discards round 0 (the ``Discard`` sent to the
    dead process is lost), and learner 2's push for round 0 waits for it. Sent again to the
    new process, whose checkpoint lists no ended round, the push was staged and held
    forever ("follower 0 holds rounds that ended: {0}", found by
    ``test_random_follower_kill_schedules`` before the fix). Now a follower asked about a
    newer round frees what it holds of older ones and refuses their pushes as replays."""
    schedule = (FollowerKill(at=12, follower=0, back_after=12.0),)
    engine, _ = check("sync_diloco", False, schedule)
    assert engine.cluster.restarts == 1
    lost = [r for r in engine.leader.tape.records if r.get("event") == "lost"]
    assert [(r["follower"], r["reason"]) for r in lost[:2]] == [
        (0, "missed heartbeats"),
        (0, "restarted"),
    ]


def test_regression_restarted_followers_beat():
    """dips with overlap: follower 0 is killed and restarted at once, follower 1 killed and
    back 12 s later. A restarted follower's first heartbeat (``Follower.start``) makes the
    leader watch its silence; the simulator's followers sent no more heartbeats, so the
    leader found follower 0 lost 6 s later, then follower 1, and, with no follower left
    beating to be asked to rejoin, no round ever opened again (the run did not end within
    10000 virtual seconds; found by ``test_random_follower_kill_schedules`` while the kill
    was being written). Followers whose processes are modelled now beat every Tick."""
    schedule = (
        FollowerCut(at=174, follower=1),
        FollowerKill(at=180, follower=0, back_after=0.0),
        Cut(at=182, learner=0),
        FollowerKill(at=183, follower=1, back_after=12.0),
    )
    engine, _ = check("dips", True, schedule)
    assert len(engine.clock.struck) == len(schedule) and engine.cluster.restarts == 2


@pytest.mark.parametrize(
    "at,version,rounds",
    [
        (3, 0, ()),  # before its first checkpoint: the initial shard
        (13, 0, (0,)),  # after its merge of round 0: it applies round 0 from the saved inputs
        (14, 1, ()),  # during its step of round 0: checkpoint written, report never sent
    ],
)
def test_a_killed_follower_restarts_from_what_it_wrote(at, version, rounds):
    """dips: follower 1 killed at chosen moments of round 0 comes back 0.5 s later from
    its disk: its newest checkpoint and the round's inputs if they are of its version. The
    run's invariants hold and the tape replays (the redone step equals the others' bit
    for bit)."""
    engine, _ = check("dips", False, (FollowerKill(at=at, follower=1, back_after=0.5),))
    [(k, _, got_version, got_rounds)] = engine.cluster.restored
    assert (k, got_version, got_rounds) == (1, version, rounds)
