"""The leader core under faults at awkward moments (issue 17): a restart or a lost follower
while a round is applied, learners rejoining mid-round, hung followers, evicted learners
resuming, the budget after drops. Exact action lists, as in ``test_leader.py``."""

import json

import pytest

from dipsjax.syncer import Leader, LeaderConfig, NoGrace
from dipsjax.syncer import messages as L
from tests.syncer.test_leader import join_all, kinds, push, spans, totals


def copy_of(leader, t):
    """``leader`` snapshotted, restored and resumed at ``t`` (``--resume``); with what
    :meth:`Leader.resume` returned."""
    copy = Leader.restore(json.loads(json.dumps(leader.snapshot())), tape=leader.tape)
    return copy, copy.resume(t)


def to_phase(leader, phase, t=0.0):
    """Drives a round of learners 0 and 1 (10 and 30 tokens, two followers) to ``phase``:
    ``norms`` (RequestNorms sent), ``merge`` (Decide sent) or ``apply`` (Apply sent)."""
    leader.handle(push(t, 0, 10, 1, leader.version))
    leader.handle(push(t, 1, 30, 1, leader.version))
    rnd = leader.round
    for j in (0, 1):
        leader.handle(L.TransferDone(t, j, rnd.round_id))
    assert leader.phase.value == "norms"
    if phase == "norms":
        return rnd
    for k in (0, 1):
        leader.handle(L.FollowerNorms(t, k, rnd.round_id, (1.0, 1.0)))
    if phase == "merge":
        return rnd
    for k in (0, 1):
        leader.handle(L.FollowerMerged(t, k, rnd.round_id, 2.0))
    assert leader.phase.value == "apply"
    return rnd


def two_followers(**cfg):
    leader = Leader(LeaderConfig(penalty=False, num_followers=2, **cfg), NoGrace())
    join_all(leader, 2)
    for k in (0, 1):
        leader.handle(L.FollowerJoined(0.0, k, 0))
    return leader


# -- item 1: a round the followers were applying ------------------------------------------


def test_a_resumed_leader_finishes_the_round_its_followers_were_applying():
    """The leader dies after ``Apply`` went out, follower 0 having applied it: the resumed
    leader keeps the round (its pushes are not dropped), counts follower 0 back at v + 1 as
    applied, tells follower 1 (back at v, still holding the round's inputs) to apply it
    again, and ends the round once both did. Before, it dropped the round and stopped
    ("follower 0 joined at version 1 but the leader is at version 0")."""
    leader = two_followers()
    rnd = to_phase(leader, "apply", 1.0)
    assert leader.handle(L.FollowerApplied(1.5, 0, rnd.round_id, 1)) == []
    copy, acts = copy_of(leader, 10.0)
    assert acts == []  # nothing dropped, nothing discarded
    assert copy.phase.value == "apply" and copy.round.done == [] and copy.version == 0
    assert totals(copy)["outstanding"] == 40 and totals(copy)["dropped"] == 0
    # A learner back while the round is applied waits for the version it makes.
    assert copy.handle(L.Join(10.5, 0, resume=True)) == []
    assert copy.handle(L.FollowerJoined(11.0, 0, 1)) == []  # applied before the restart
    (again,) = copy.handle(L.FollowerJoined(11.0, 1, 0, rounds=(rnd.round_id,)))
    assert again == L.Apply(rnd.round_id, 1, 0.5, 4.0)
    acts = copy.handle(L.FollowerApplied(12.0, 1, rnd.round_id, 1))
    # Its learners pull through SendModel (they rejoin): the round ends at once. The one
    # back already gets version 1, and that its push was applied.
    assert acts == [
        L.NotifyPull(rnd.round_id, (), 1),
        L.SendModel(0, 1, (), rnd.round_id, "applied", booked=1),
    ]
    assert copy.version == 1 and copy.round is None
    assert totals(copy) == {
        "reported": 40,
        "applied": 40,
        "rejected": 0,
        "dropped": 0,
        "outstanding": 0,
    }
    rec = copy.tape.round_records()[-1]
    assert rec.round_id == rnd.round_id and rec.applied and rec.version == 1
    assert copy.handle(L.Join(12.5, 1, resume=True)) == [
        L.SendModel(1, 1, (), rnd.round_id, "applied", booked=1)
    ]
    assert not copy.stopped


def test_a_follower_without_the_rounds_inputs_stops_the_resumed_leader_with_a_reason():
    leader = two_followers()
    rnd = to_phase(leader, "apply", 1.0)
    copy, _ = copy_of(leader, 10.0)
    (stop,) = copy.handle(L.FollowerJoined(11.0, 1, 0, rounds=()))
    assert stop == L.Stop(
        f"follower 1 came back at version 0 without the inputs of round {rnd.round_id}, "
        "which is being applied as version 1: it cannot apply it"
    )
    assert copy.stopped


def test_a_follower_lost_during_apply_rejoins_and_is_told_to_apply_again():
    """On a live leader: a follower whose stream broke during APPLY is marked down and
    nothing is discarded (it may still hold the round's inputs); back at v with them, it
    gets the round's ``Apply`` again; the round then ends as usual."""
    leader = two_followers()
    rnd = to_phase(leader, "apply", 1.0)
    apply = L.Apply(rnd.round_id, 1, 0.5, 4.0)
    assert leader.handle(L.FollowerApplied(1.5, 0, rnd.round_id, 1)) == []
    assert leader.handle(L.FollowerLost(2.0, 1, "stream broke")) == []
    assert leader.followers_up == {0: True, 1: False} and not leader.stopped
    assert leader.phase.value == "apply" and totals(leader)["outstanding"] == 40
    assert leader.handle(L.FollowerJoined(3.0, 1, 0, rounds=(rnd.round_id,))) == [apply]
    assert leader.handle(L.FollowerApplied(3.5, 1, rnd.round_id, 1)) == [
        L.NotifyPull(rnd.round_id, (0, 1), 1, ("applied", "applied"))
    ]
    leader.handle(L.PullDone(4.0, 0, 1))
    leader.handle(L.PullDone(4.0, 1, 1))
    assert leader.round is None and leader.version == 1 and totals(leader)["applied"] == 40


def test_a_follower_already_applied_that_rejoins_at_v_plus_one_counts_as_applied():
    leader = two_followers()
    rnd = to_phase(leader, "apply", 1.0)
    assert leader.handle(L.FollowerLost(2.0, 0, "stream broke")) == []
    assert leader.handle(L.FollowerJoined(3.0, 0, 1)) == []
    (notify,) = leader.handle(L.FollowerApplied(3.5, 1, rnd.round_id, 1))
    assert notify == L.NotifyPull(rnd.round_id, (0, 1), 1, ("applied", "applied"))
    assert leader.version == 1


def test_resume_discards_a_round_that_had_reached_the_followers():
    """A round dropped by the restart while in NORMS or MERGE: its followers hold its batch
    (and maybe its Decide), so the resumed leader tells them to prune it (``Discard``)."""
    for phase in ("norms", "merge"):
        leader = two_followers()
        rnd = to_phase(leader, phase, 1.0)
        copy, acts = copy_of(leader, 10.0)
        assert acts == [L.Discard(rnd.round_id, "the leader restarted")], phase
        assert copy.round is None and totals(copy)["dropped"] == 40
    leader = two_followers()
    leader.handle(push(1.0, 0, 10, 1, 0))  # in transfers: no norms asked yet
    copy, acts = copy_of(leader, 10.0)
    assert acts == []


def test_a_follower_that_cannot_serve_the_norms_says_lost_then_joined():
    """A follower asked for norms it no longer holds (its stream broke and it dropped what
    it staged) sends ``FollowerLost`` then ``FollowerJoined``: the round is discarded whole,
    its learners pull the unchanged version, and the next round goes on."""
    leader = two_followers()
    rnd = to_phase(leader, "norms", 1.0)
    leader.handle(L.FollowerNorms(1.5, 0, rnd.round_id, (1.0, 1.0)))
    assert leader.handle(L.FollowerLost(2.0, 1, "lost its staged shards")) == [
        L.Discard(rnd.round_id, "follower 1 lost"),
        L.NotifyPull(rnd.round_id, (0, 1), 0, ("discarded", "discarded")),
    ]
    assert leader.handle(push(2.1, 0, 5, 1, 0)) == []  # learner 0 is still pulling
    assert leader.handle(L.FollowerJoined(2.2, 1, 0)) == []
    assert leader.handle(L.PullDone(2.3, 0, 0)) == []
    assert leader.handle(L.PullDone(2.3, 1, 0)) == [
        L.PushShards(rnd.round_id + 1, 0),
        L.WakeAt(2.3),
    ]
    assert not leader.stopped and totals(leader)["dropped"] == 40


# -- item 3: a learner that rejoins while its push is with the followers ------------------


@pytest.mark.parametrize("phase", ["norms", "merge", "apply"])
def test_a_learner_rejoining_mid_round_pulls_through_send_model_and_keeps_no_done_chunks(phase):
    """Learner 0 resumes from its checkpoint (same incarnation) while its push is with the
    followers: the push stays in the round (applied as usual); the learner pulls through
    its ``SendModel``, which lists only the chunks that push did not finish (those complete
    when the push is settled), and the round's pull notice leaves it out, so the round
    ends without a ``PullDone`` it will never send for it. Before, it was put back in
    ``pulling`` (the run deadlocked) and its finished chunk was leased to it again (its
    data trained and applied twice)."""
    from dipsjax.data import completed_chunks, leases_of, new_ledger

    leader = Leader(
        LeaderConfig(penalty=False, num_followers=2),
        NoGrace(),
        data=new_ledger(20, batches_per_chunk=1),
    )
    join_all(leader, 2)
    for k in (0, 1):
        leader.handle(L.FollowerJoined(0.0, k, 0))
    c0, c1 = (leader.handle(L.ChunkRequested(0.0, 0))[0].chunk for _ in range(2))
    leader.handle(push(1.0, 0, 10, 1, 0, spans=(L.Span(c0, 0, 1),)))
    leader.handle(push(1.0, 1, 30, 1, 0))
    rnd = leader.round
    for j in (0, 1):
        leader.handle(L.TransferDone(1.0, j, rnd.round_id))
    steps = [
        [L.FollowerNorms(1.0, k, rnd.round_id, (1.0, 1.0)) for k in (0, 1)],
        [L.FollowerMerged(1.0, k, rnd.round_id, 2.0) for k in (0, 1)],
        [L.FollowerApplied(1.0, k, rnd.round_id, 1) for k in (0, 1)],
    ]
    at = ["norms", "merge", "apply"].index(phase)
    for ev in [e for s in steps[:at] for e in s]:
        leader.handle(ev)
    assert leader.phase.value == phase
    sent = leader.handle(L.Join(2.0, 0, resume=True))
    assert [lease.chunk for lease in leases_of(leader.data, "0")] == [c0, c1]  # c0: its push's
    if phase != "apply":
        assert sent == [L.SendModel(0, 0, spans(c1), -1, "", booked=1)]
        assert leader.handle(L.PullDone(2.5, 0, 0)) == []
    else:  # the outer step is under way: it waits for the version it makes
        assert sent == []
    acts = []
    for ev in [e for s in steps[at:] for e in s]:
        acts += leader.handle(ev)
    notify = L.NotifyPull(rnd.round_id, (1,), 1, ("applied",))
    assert [a for a in acts if isinstance(a, L.NotifyPull)] == [notify]
    if phase == "apply":
        assert [a for a in acts if isinstance(a, L.SendModel)] == [
            L.SendModel(0, 1, spans(c1), rnd.round_id, "applied", booked=1)
        ]
    assert leader.handle(L.PullDone(3.0, 1, 1)) == []
    assert leader.round is None and leader.version == 1
    assert totals(leader)["applied"] == 40
    assert c0 in completed_chunks(leader.data, 0)
    assert [lease.chunk for lease in leases_of(leader.data, "0")] == [c1]


# -- item 5: one Rejoin per lost episode ----------------------------------------------------


def test_a_hung_follower_gets_one_rejoin_per_lost_episode():
    """A follower found lost by its silence that beats again is asked once to rejoin, not
    at every heartbeat (a late second ``Rejoin`` wiped the next round's staged shards);
    after it rejoined and is lost again, it is asked again."""
    cfg = LeaderConfig(penalty=False, num_followers=2, heartbeat_interval=1.0)
    leader = Leader(cfg, NoGrace())
    join_all(leader, 1)
    for k in (0, 1):
        leader.handle(L.FollowerJoined(0.0, k, 0))
        leader.handle(L.FollowerHeartbeat(0.0, k))
    for t in (2.0, 4.0):  # follower 1 hangs
        leader.handle(L.FollowerHeartbeat(t, 0))
        leader.handle(L.Heartbeat(t, 0))
    assert leader.followers_up == {0: True, 1: False}
    rejoin = L.Rejoin(1, "found lost through missed heartbeats")
    assert leader.handle(L.FollowerHeartbeat(4.5, 1)) == [rejoin]
    assert leader.handle(L.FollowerHeartbeat(5.5, 1)) == []
    assert leader.handle(L.FollowerHeartbeat(6.5, 1)) == []
    leader.handle(L.FollowerJoined(6.6, 1, 0))
    assert leader.followers_up == {0: True, 1: True}
    for t in (8.0, 10.0):  # it hangs again
        leader.handle(L.FollowerHeartbeat(t, 0))
        leader.handle(L.Heartbeat(t, 0))
    assert leader.followers_up == {0: True, 1: False}
    assert leader.handle(L.FollowerHeartbeat(10.5, 1)) == [rejoin]
    assert leader.handle(L.FollowerHeartbeat(11.5, 1)) == []


# -- item 8: an evicted learner resuming ----------------------------------------------------


def test_an_evicted_learner_that_resumes_is_refused_and_starts_a_new_incarnation():
    """A learner evicted (here: silent) that comes back from its checkpoint with
    ``Join(resume=True)`` is no longer a member: it is refused (``unknown``), not taken as
    a fresh join with no leases that trains a chunk re-leased to someone else; as a new
    incarnation it joins as usual."""
    from dipsjax.data import new_ledger

    cfg = LeaderConfig(penalty=False, heartbeat_interval=1.0)
    leader = Leader(cfg, NoGrace(), data=new_ledger(10, batches_per_chunk=1))
    join_all(leader, 2)
    (grant,) = leader.handle(L.ChunkRequested(0.0, 1))
    for t in (1.0, 2.0, 3.0):
        leader.handle(L.Heartbeat(t, 0))
    assert leader.handle(L.Heartbeat(3.5, 0)) == [
        L.Evict(1, "missed heartbeats", 0, L.EvictKind.SILENT)
    ]
    assert leader.handle(L.ChunkRequested(3.6, 0)) == [L.GrantChunk(0, grant.chunk, 0, 1)]
    assert leader.handle(L.Join(4.0, 1, resume=True)) == [
        L.Refuse(
            1,
            "incarnation 0 is not a member (evicted): start a new incarnation",
            L.RefuseKind.UNKNOWN,
            0,
        )
    ]
    assert sorted(leader.members) == [0] and leader.refused["unknown"] == 1
    assert leader.handle(L.Join(5.0, 1, incarnation=1)) == [L.SendModel(1, 0)]


def test_a_learner_resuming_after_a_whole_run_resume_is_still_a_member():
    from dipsjax.data import new_ledger

    leader = Leader(
        LeaderConfig(penalty=False), NoGrace(), data=new_ledger(10, batches_per_chunk=1)
    )
    join_all(leader, 1)
    (grant,) = leader.handle(L.ChunkRequested(0.0, 0))
    copy, _ = copy_of(leader, 5.0)
    assert copy.handle(L.Join(6.0, 0, resume=True)) == [
        L.SendModel(0, 0, (L.Span(grant.chunk, 0, 1),), booked=0)
    ]
    assert copy.refused["unknown"] == 0


# -- item 12: the budget counts tokens that entered a decided round -----------------------


def test_the_budget_counts_tokens_applied_or_rejected_not_pushes_dropped():
    """Pushes dropped (a round discarded because a follower was lost, a push too stale)
    are trained again by someone and must not count towards the budget: it counts the
    tokens that entered a decided round, applied or rejected, from the ledger. Before, a
    run stopped with 753,664 tokens applied of a 786,432 budget after a leader kill."""
    leader = two_followers(token_budget=50, max_staleness=0)
    rnd = to_phase(leader, "norms", 0.0)
    leader.handle(L.FollowerLost(0.5, 1, "restarted"))  # the round is discarded: 40 dropped
    leader.handle(L.FollowerJoined(0.6, 1, 0))
    for j in (0, 1):
        leader.handle(L.PullDone(0.7, j, 0))
    assert leader.round is None and totals(leader)["dropped"] == 40
    leader.handle(push(1.0, 0, 30, 1, 0))
    rnd = leader.round
    leader.handle(L.TransferDone(1.0, 0, rnd.round_id))
    for k in (0, 1):
        leader.handle(L.FollowerNorms(1.0, k, rnd.round_id, (1.0,)))
    for k in (0, 1):
        leader.handle(L.FollowerMerged(1.0, k, rnd.round_id, 0.5))
    for k in (0, 1):
        leader.handle(L.FollowerApplied(1.0, k, rnd.round_id, 1))
    leader.handle(push(1.5, 1, 30, 1, 0))  # made from version 0: stale once it is 1
    assert leader.handle(L.PullDone(2.0, 0, 1)) == [
        L.PushShards(rnd.round_id + 1, 1),
        L.WakeAt(2.0),
    ]
    assert not leader.stopped and leader.budget_tokens() == 30
    stale = leader.round
    acts = leader.handle(L.TransferDone(2.1, 1, stale.round_id))
    assert kinds(acts) == ["Unused", "Discard", "NotifyPull"]
    assert leader.handle(L.PullDone(2.2, 1, 1)) == []
    assert not leader.stopped and leader.budget_tokens() == 30 and totals(leader)["dropped"] == 70
    leader.handle(push(3.0, 1, 30, 1, 1))
    rnd = leader.round
    leader.handle(L.TransferDone(3.0, 1, rnd.round_id))
    for k in (0, 1):
        leader.handle(L.FollowerNorms(3.0, k, rnd.round_id, (1.0,)))
    for k in (0, 1):
        leader.handle(L.FollowerMerged(3.0, k, rnd.round_id, 0.5))
    for k in (0, 1):
        leader.handle(L.FollowerApplied(3.0, k, rnd.round_id, 2))
    assert leader.handle(L.PullDone(3.5, 1, 2)) == [L.Stop("token budget 50 reached")]
    assert leader.budget_tokens() == 60 and leader.stop_reason == "token budget 50 reached"


def _fault_stopped():
    leader = two_followers(token_budget=100)
    leader.handle(push(0.0, 0, 10, 1, 0))
    leader.handle(L.FollowerLost(0.1, 1, "restarted"))
    (stop,) = [a for a in leader.handle(L.FollowerJoined(0.2, 1, 3)) if isinstance(a, L.Stop)]
    assert leader.stopped and leader.stop_reason == stop.reason and not leader.budget_reached()
    return leader


def test_a_run_stopped_by_a_fault_can_be_reopened_by_a_whole_run_resume():
    """A leader stopped short of its budget (a fault) stays stopped when it is merely
    restarted, but a whole-run ``--resume`` reopens it (``resume(reopen=True)``) and rounds
    go on; a leader that reached its budget is never reopened."""
    leader = _fault_stopped()
    copy, acts = copy_of(leader, 1.0)
    assert acts == [] and copy.stopped  # restarted: still stopped
    again = Leader.restore(json.loads(json.dumps(leader.snapshot())), tape=leader.tape)
    assert again.resume(1.0, reopen=True) == []
    assert not again.stopped and again.stop_reason == ""
    assert [r["reopened"] for r in again.tape.records if r["kind"] == "resume"] == [True]
    for k in (0, 1):
        again.handle(L.FollowerJoined(2.0, k, 0))
    for j in (0, 1):
        again.handle(L.Join(2.0, j, resume=True))
        again.handle(L.PullDone(2.0, j, 0))
    assert kinds(again.handle(push(3.0, 0, 10, 1, 0)))[0] == "PushShards"
    done = two_followers(token_budget=10)
    done.handle(push(0.0, 0, 10, 1, 0))
    rnd = done.round
    done.handle(L.TransferDone(0.0, 0, rnd.round_id))
    for evs in (
        [L.FollowerNorms(0.0, k, rnd.round_id, (1.0,)) for k in (0, 1)],
        [L.FollowerMerged(0.0, k, rnd.round_id, 0.5) for k in (0, 1)],
        [L.FollowerApplied(0.0, k, rnd.round_id, 1) for k in (0, 1)],
    ):
        for ev in evs:
            done.handle(ev)
    done.handle(L.PullDone(0.1, 0, 1))
    assert done.stopped and done.budget_reached()
    copy = Leader.restore(json.loads(json.dumps(done.snapshot())))
    assert copy.resume(1.0, reopen=True) == [] and copy.stopped


# -- item 6: the ledger counts batches ---------------------------------------------------


def test_a_refused_push_leaves_its_batches_where_they_are():
    """A retried push (its first copy is in the round) is refused as ``pending``; an old
    incarnation's push reaches the leader after its learner restarted. Neither may give the
    push's batches back: the first copy settles them, and the new incarnation holds them
    again. Before the fix both refusals released them, and another learner trained them
    while they were applied (batches twice)."""
    from dipsjax.data import leases_of, new_ledger, settled_batches
    from tests.syncer.test_leader import finish_round

    leader = Leader(LeaderConfig(penalty=False), NoGrace(), data=new_ledger(8, batches_per_chunk=4))
    join_all(leader, 2)
    (grant,) = leader.handle(L.ChunkRequested(0.0, 0))
    first = push(1.0, 0, 10, 3, 0, spans=(L.Span(grant.chunk, 0, 3),))
    leader.handle(first)
    assert kinds(leader.handle(first)) == ["Refuse"]  # the retry: pending
    assert leases_of(leader.data, "0")[0].span == (grant.chunk, 0, 4)
    (other,) = leader.handle(L.ChunkRequested(1.1, 1))
    assert other.chunk != grant.chunk
    finish_round(leader, 2.0)
    assert settled_batches(leader.data, 0) == {(grant.chunk, b) for b in range(3)}
    # Learner 0 restarts; its new incarnation leases its batch 3 again, and then the old
    # incarnation's push of batch 3 arrives.
    leader.handle(L.Join(3.0, 0, incarnation=1))
    leader.handle(L.PullDone(3.0, 0, leader.version))
    (again,) = leader.handle(L.ChunkRequested(3.1, 0))
    assert again.piece == (grant.chunk, 3, 4)
    stale = push(3.2, 0, 10, 1, leader.version, incarnation=0, spans=(L.Span(grant.chunk, 3, 4),))
    assert kinds(leader.handle(stale)) == ["Refuse"]
    assert [lease.span for lease in leases_of(leader.data, "0")] == [(grant.chunk, 3, 4)]


def test_a_learner_rejoining_while_its_round_is_applied_gets_the_version_it_makes():
    """Seen failing (tests/runtime/test_resume.py's synchronous run, killed in an outer
    step, about 1 resume in 4): a learner back before the followers had applied the kept
    round got version v, the other learner v + 1, and the synchronous run was no longer
    the uninterrupted one. Live as after a restart, its model waits for the step."""
    leader = two_followers()
    rnd = to_phase(leader, "apply", 1.0)
    assert leader.handle(L.Join(1.2, 1, resume=True)) == []
    assert leader.handle(L.FollowerApplied(1.5, 0, rnd.round_id, 1)) == []
    acts = leader.handle(L.FollowerApplied(1.6, 1, rnd.round_id, 1))
    assert acts == [
        L.NotifyPull(rnd.round_id, (0,), 1, ("applied",)),
        L.SendModel(1, 1, (), rnd.round_id, "applied", booked=1),
    ]
    # Once, even if it asks again meanwhile; a learner evicted meanwhile gets nothing.
    leader = two_followers()
    rnd = to_phase(leader, "apply", 1.0)
    leader.handle(L.Join(1.2, 1, resume=True))
    leader.handle(L.Join(1.3, 1, resume=True))
    leader.handle(L.Join(1.3, 0, resume=True))
    leader.handle(L.Leave(1.4, 0))
    leader.handle(L.FollowerApplied(1.5, 0, rnd.round_id, 1))
    acts = leader.handle(L.FollowerApplied(1.6, 1, rnd.round_id, 1))
    assert [a for a in acts if isinstance(a, L.SendModel)] == [
        L.SendModel(1, 1, (), rnd.round_id, "applied", booked=1)
    ]


# -- detection after a restart of the leader alone ------------------------------------------


def test_a_leader_restarted_alone_gives_a_short_grace_so_a_learner_dead_meanwhile_is_found():
    """Only the leader restarted (``resume(alone=True)``): its peers are up and beat again
    within a heartbeat or two, so it waits ``2 * heartbeat_interval`` before heartbeats
    count, not ``rejoin_grace`` (chaos found learners killed around a leader restart
    evicted only after 60 s)."""
    cfg = LeaderConfig(penalty=False, heartbeat_interval=1.0, rejoin_grace=60.0)
    leader = Leader(cfg, NoGrace())
    join_all(leader, 2)
    back = Leader.restore(json.loads(json.dumps(leader.snapshot())))
    back.resume(100.0, alone=True)
    for t in (100.5, 101.5, 102.5, 103.5, 104.5):  # learner 0 is alive; 1 died meanwhile
        back.handle(L.Heartbeat(t, 0))
    assert back.handle(L.Tick(104.9)) == [] and sorted(back.members) == [0, 1]
    acts = back.handle(L.Tick(105.1))  # 2 s of grace + 3 missed 1 s heartbeats
    assert acts == [L.Evict(1, "missed heartbeats", 0, L.EvictKind.SILENT)]
    assert sorted(back.members) == [0]


def test_a_members_first_contact_after_a_resume_ends_its_grace():
    """A learner that beats once after the resume and then dies is found 3 heartbeats
    after its last beat, not ``rejoin_grace`` after the resume."""
    cfg = LeaderConfig(penalty=False, heartbeat_interval=1.0, rejoin_grace=60.0)
    leader = Leader(cfg, NoGrace())
    join_all(leader, 2)
    back = Leader.restore(json.loads(json.dumps(leader.snapshot())))
    back.resume(100.0)
    for t in (101.0, 102.0):
        back.handle(L.Heartbeat(t, 0))
        back.handle(L.Heartbeat(t, 1))
    back.handle(L.Heartbeat(103.0, 0))  # learner 1 died after its beat at 102
    assert back.handle(L.Tick(104.9)) == []
    acts = back.handle(L.Tick(105.1))
    assert acts == [L.Evict(1, "missed heartbeats", 0, L.EvictKind.SILENT)]
    assert back.handle(L.Tick(105.9)) == [] and sorted(back.members) == [0]


def test_a_follower_dead_before_it_rejoined_a_resumed_leader_is_found_lost():
    """A follower killed while the leader restarted never rejoins: once the grace is over
    its silence counts as for a follower that is up (chaos: found only when its restarted
    process said so, 6-8 s after the kill)."""
    leader = two_followers(heartbeat_interval=1.0, rejoin_grace=60.0)
    back = Leader.restore(json.loads(json.dumps(leader.snapshot())), tape=leader.tape)
    back.resume(100.0, alone=True)
    for t in (100.5, 101.5, 102.5, 103.5, 104.5):
        back.handle(L.FollowerHeartbeat(t, 0))
        back.handle(L.Heartbeat(t, 0))
        back.handle(L.Heartbeat(t, 1))
    back.handle(L.FollowerJoined(100.6, 0, back.version))

    def lost():
        recs = back.tape.records
        return [r["follower"] for r in recs if r["kind"] == "follower" and r["event"] == "lost"]

    back.handle(L.Tick(104.9))
    assert lost() == []
    back.handle(L.Tick(105.1))  # 2 s of grace + 3 missed 1 s heartbeats
    assert lost() == [1] and back.followers_up == {0: True, 1: False}
    back.handle(L.FollowerJoined(106.0, 1, back.version))  # its restart is back
    assert back.followers_up == {0: True, 1: True}
