"""The learner's protocol core: exact command lists for every case (DESIGN.md sec. 8)."""

import pytest

from dipsjax.syncer import messages as m
from dipsjax.syncer.learner import Checkpoint, LearnerProtocol, State

J = 3


def meta(inc=0, tokens=100, base=0):
    return m.PushMeta(tokens=tokens, steps=2, base_version=base, incarnation=inc)


def plan(round_id, followers=(0, 1)):
    transfers = tuple(m.Transfer(i, f) for i, f in enumerate(followers))
    return m.PushShards(round_id, J, transfers)


def joined(proto, version=0, t=1.0):
    """Start, get the model, pull it: the learner is training."""
    proto.start(0.0)
    proto.on_action(m.SendModel(J, version), t)
    return proto.on_pulled(version, t)


def test_a_round_is_join_pull_train_push_transfer_pull():
    p = LearnerProtocol(J, 2, fingerprint="fp")
    assert p.start(0.0) == [m.Send(m.Join(0.0, J, 2, False, "fp", 1))]
    assert p.on_action(m.SendModel(J, 5), 1.0) == [m.Pull(5, first=True)]
    assert p.on_pulled(5, 2.0) == [m.Send(m.PullDone(2.0, J, 5, -1)), m.Train()]
    assert p.on_trained(meta(2, base=5), 3.0) == [m.Send(m.PushRequested(3.0, J, meta(2, base=5)))]
    assert p.state is State.REQUESTING
    assert p.on_action(plan(7), 3.1) == [m.Push(plan(7))]
    assert p.on_pushed(7, 4.0) == [m.Send(m.TransferDone(4.0, J, 7, 2))]
    assert p.on_action(m.NotifyPull(7, (1, J), 6), 5.0) == [m.Pull(6)]
    assert p.on_pulled(6, 5.5) == [m.Send(m.PullDone(5.5, J, 6, -1)), m.Train()]
    assert p.rounds == 1 and p.version == 6
    assert p.on_action(m.Stop("token budget reached"), 6.0) == [
        m.Exit(m.ExitCode.OK, "the job stopped: token budget reached")
    ]
    assert p.state is State.EXITED and p.on_trained(meta(2), 7.0) == []


def test_checkpoints_a_round_start_once_and_its_push_before_the_pull():
    p = LearnerProtocol(J, checkpoints=True)
    assert joined(p) == [
        m.Send(m.PullDone(1.0, J, 0, -1)),
        m.Save("start", -1, 0, 0),
        m.Train(),
    ]
    assert p.on_trained(None, 1.5) == [m.Train(wait=0.5)]  # no chunk: again, no second save
    p.on_trained(meta(), 2.0)
    p.on_action(plan(0), 2.0)
    assert p.on_pushed(0, 3.0) == [  # checkpointed before it is reported
        m.Save("pushed", 0, 0, 1),
        m.Send(m.TransferDone(3.0, J, 0, 0)),
    ]
    p.on_action(m.NotifyPull(0, (J,), 1), 4.0)
    assert p.on_pulled(1, 4.5) == [
        m.Send(m.PullDone(4.5, J, 1, -1)),
        m.Save("start", -1, 1, 2),
        m.Train(),
    ]
    assert [(c.step, c.kind, c.round_id) for c in p.saved] == [
        (0, "start", -1),
        (1, "pushed", 0),
        (2, "start", -1),
    ]


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        (m.EvictKind.SILENT, m.ExitCode.EVICTED),
        (m.EvictKind.RESTARTED, m.ExitCode.REFUSED),
    ],
)
def test_evicted_this_incarnation_exits_another_incarnations_eviction_is_ignored(kind, code):
    p = LearnerProtocol(J, 4)
    joined(p)
    assert p.on_action(m.Evict(J, "old one", 3, kind), 2.0) == []
    assert p.on_action(m.Evict(J + 1, "someone else", 4, kind), 2.0) == []
    assert p.state is State.TRAINING
    [c] = p.on_action(m.Evict(J, "missed heartbeats", 4, kind), 2.0)
    assert isinstance(c, m.Exit) and c.code == code
    assert p.on_action(m.Evict(J, "again", 4, kind), 2.0) == []  # exited: nothing more


def test_evicted_as_it_left_is_its_own_doing():
    p = LearnerProtocol(J)
    joined(p)
    assert p.on_action(m.Evict(J, "left", 0, m.EvictKind.LEFT), 2.0) == []
    assert p.state is State.TRAINING


@pytest.mark.parametrize(
    ("kind", "expect"),
    [
        (m.RefuseKind.STOPPED, m.ExitCode.OK),
        (m.RefuseKind.UNKNOWN, m.ExitCode.EVICTED),
        (m.RefuseKind.INCARNATION, m.ExitCode.REFUSED),
        (m.RefuseKind.INVALID, m.ExitCode.REFUSED),
        (m.RefuseKind.FINGERPRINT, m.ExitCode.REFUSED),
        (m.RefuseKind.PENDING, None),  # a retried request: its first copy's plan comes
    ],
)
def test_each_refusal_of_a_push_by_its_kind(kind, expect):
    p = LearnerProtocol(J, 1)
    joined(p)
    p.on_trained(meta(1), 2.0)
    out = p.on_action(m.Refuse(J, "some words that mean nothing here", kind, 1), 2.5)
    if expect is None:
        assert out == [] and p.state is State.REQUESTING
        assert p.on_action(plan(4), 3.0) == [m.Push(plan(4))]
    else:
        [c] = out
        assert isinstance(c, m.Exit) and c.code == expect
    assert p.refused[str(kind)] == 1


def test_a_refusal_for_another_incarnation_or_out_of_turn_is_ignored():
    p = LearnerProtocol(J, 2)
    joined(p)
    assert p.on_action(m.Refuse(J, "x", m.RefuseKind.UNKNOWN, 1), 2.0) == []  # older one's
    assert p.on_action(m.Refuse(J, "x", m.RefuseKind.UNKNOWN, 2), 2.0) == []  # not requesting
    assert p.state is State.TRAINING


def test_inactive_push_rejoins_from_checkpoints_or_exits_without():
    p = LearnerProtocol(J, checkpoints=True)
    joined(p)
    p.on_trained(meta(), 2.0)
    assert p.on_action(m.Refuse(J, "pull first", m.RefuseKind.INACTIVE, 0), 2.5) == [
        m.Send(m.Join(2.5, J, 0, True, "", 2))
    ]
    q = LearnerProtocol(J)
    joined(q)
    q.on_trained(meta(), 2.0)
    [c] = q.on_action(m.Refuse(J, "pull first", m.RefuseKind.INACTIVE, 0), 2.5)
    assert c.code == m.ExitCode.EVICTED


def test_join_refused_for_another_model_exits_refused():
    p = LearnerProtocol(J, fingerprint="mine")
    p.start(0.0)
    [c] = p.on_action(m.Refuse(J, "fingerprint", m.RefuseKind.FINGERPRINT, 0), 0.1)
    assert c.code == m.ExitCode.REFUSED


def test_unused_is_counted_for_this_incarnation_only():
    p = LearnerProtocol(J, 1)
    joined(p)
    assert p.on_action(m.Unused(J, 0, "stale", "too old", 1), 2.0) == []
    assert p.on_action(m.Unused(J, 0, "stale", "too old", 0), 2.0) == []
    assert dict(p.unused) == {"stale": 1}


def test_leader_lost_with_and_without_checkpoints():
    p = LearnerProtocol(J)
    joined(p)
    [c] = p.on_leader_lost(3.0, stream=0)
    assert c.code == m.ExitCode.EVICTED
    p = LearnerProtocol(J, 1, checkpoints=True)
    joined(p)
    p.on_trained(meta(1), 2.0)
    p.on_action(plan(0), 2.0)
    assert p.on_leader_lost(3.0, stream=0) == [m.Send(m.Join(3.0, J, 1, True, "", 2))]
    assert p.state is State.JOINING and p.stream == 1
    assert p.on_leader_lost(3.1, stream=0) == []  # the same broken stream, seen again
    # What the dead stream said no longer holds; a plan of the push in flight is stale.
    assert p.on_action(m.SendModel(J, 0), 3.2, stream=0) == []
    assert p.on_pushed(0, 3.3) == []  # the push the lost leader planned: forgotten
    assert p.on_action(m.Stop("budget"), 3.4, stream=0)[0].code == m.ExitCode.OK


def test_a_stop_seen_before_the_stream_broke_still_stops():
    p = LearnerProtocol(J, checkpoints=True)
    joined(p)
    p.stopped = "budget"
    [c] = p.on_leader_lost(3.0)
    assert c == m.Exit(m.ExitCode.OK, "the job stopped: budget")


def test_resume_restores_the_newest_checkpoint():
    saved = [Checkpoint(2, "start"), Checkpoint(3, "pushed", 4)]
    p = LearnerProtocol(J, checkpoints=True, saved=saved)
    assert p.start(0.0, resume=True) == [m.Send(m.Join(0.0, J, 0, True, "", 1))]
    send = m.SendModel(J, 9, leases=(11, 12), last_round=4, last_outcome="applied", booked=5)
    assert p.on_action(send, 1.0) == [
        m.Restore(3, (11, 12), 9, 4, "applied", 5),  # the leader's count goes to the driver
        m.Pull(9, first=False),
    ]
    assert p.rounds == 2
    # It tells the leader how many rounds its restored state trained (replay needs it).
    assert p.on_pulled(9, 2.0) == [
        m.Send(m.PullDone(2.0, J, 9, 2)),
        m.Save("start", -1, 9, 4),
        m.Train(),
    ]


def test_resume_after_a_lost_push_goes_back_to_that_rounds_start():
    saved = [Checkpoint(1, "pushed", 0), Checkpoint(2, "start"), Checkpoint(3, "pushed", 4)]
    p = LearnerProtocol(J, checkpoints=True, saved=saved)
    p.start(0.0, resume=True)
    send = m.SendModel(J, 9, leases=(11,), last_round=4, last_outcome="lost")
    assert p.on_action(send, 1.0) == [m.Restore(2, (11,), 9, 4, "lost"), m.Pull(9, first=False)]
    assert [c.step for c in p.saved] == [1, 2]  # what came after is dropped
    # Its start is checkpointed already: it trains the round again without saving.
    assert p.on_pulled(9, 2.0) == [m.Send(m.PullDone(2.0, J, 9, 1)), m.Train()]


def test_resume_without_checkpoints_starts_afresh_on_its_leases():
    p = LearnerProtocol(J, checkpoints=True)
    p.start(0.0, resume=True)
    send = m.SendModel(J, 9, leases=(5,), last_round=-1, last_outcome="")
    assert p.on_action(send, 1.0) == [m.Restore(None, (5,), 9), m.Pull(9, first=False)]
    assert p.on_pulled(9, 2.0)[0] == m.Send(m.PullDone(2.0, J, 9, 0))


def test_a_failed_push_with_its_followers_up_leaves_and_exits_unreachable():
    p = LearnerProtocol(J)
    joined(p)
    p.on_trained(meta(), 2.0)
    p.on_action(plan(3, followers=(0, 1)), 2.0)
    assert p.on_pushed(3, 9.0, failed=True, followers_up={0, 1, 2}) == [
        m.Send(m.Leave(9.0, J)),
        m.Exit(m.ExitCode.UNREACHABLE, "round 3: link down"),
    ]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_push_refused_as_not_finite_leaves_and_exits_for_a_new_incarnation(overlap):
    """A follower's ``refuse_nonfinite`` refused it: no follower will take it again, so the
    learner leaves (the leader drops the push and goes on) whatever followers are up."""
    p = LearnerProtocol(J, overlap=overlap)
    joined(p)
    p.on_trained(meta(), 2.0)
    p.on_action(plan(3, followers=(0, 1)), 2.0)
    assert p.on_pushed(3, 9.0, failed=True, nonfinite=True, followers_up={0}) == [
        m.Send(m.Leave(9.0, J)),
        m.Exit(m.ExitCode.EVICTED, "round 3: push refused as not finite"),
    ]
    assert p.state is State.EXITED


@pytest.mark.parametrize(("replayed", "up"), [(True, {0, 1}), (False, {0})])
def test_a_failed_push_to_a_follower_down_or_refused_as_replay_waits_for_the_pull(replayed, up):
    p = LearnerProtocol(J)
    joined(p)
    p.on_trained(meta(), 2.0)
    p.on_action(plan(3, followers=(0, 1)), 2.0)
    assert p.on_pushed(3, 9.0, failed=True, replayed=replayed, followers_up=up) == []
    assert p.state is State.WAITING
    assert p.on_action(m.NotifyPull(3, (J,), 0), 10.0) == [m.Pull(0)]


def test_a_round_that_ends_before_its_push_does_is_pulled_after_the_push():
    p = LearnerProtocol(J)
    joined(p)
    p.on_trained(meta(), 2.0)
    p.on_action(plan(3), 2.0)
    assert p.on_action(m.NotifyPull(3, (J,), 0), 2.5) == []  # discarded while pushing
    assert p.on_pushed(3, 3.0) == [m.Send(m.TransferDone(3.0, J, 3, 0)), m.Pull(0)]


def test_pull_notices_of_other_rounds_are_ignored():
    p = LearnerProtocol(J)
    joined(p)
    p.on_trained(meta(), 2.0)
    assert p.on_action(m.NotifyPull(2, (J,), 1), 2.1) == []  # before its plan came
    p.on_action(plan(3), 2.2)
    p.on_pushed(3, 3.0)
    assert p.on_action(m.NotifyPull(2, (J,), 1), 3.1) == []
    assert p.on_action(m.NotifyPull(3, (0, 1), 1), 3.2) == []  # not named
    assert p.state is State.WAITING


def test_overlap_holds_one_push_in_flight():
    p = LearnerProtocol(J, overlap=True)
    p.start(0.0)
    p.on_action(m.SendModel(J, 0), 0.5)
    assert p.on_pulled(0, 1.0) == [m.Send(m.PullDone(1.0, J, 0, -1)), m.Train(adopt=True)]
    # The next round starts at once; the request waits for its plan beside it.
    assert p.on_trained(meta(), 2.0) == [
        m.Train(adopt=True),
        m.Send(m.PushRequested(2.0, J, meta())),
    ]
    assert p.state is State.TRAINING and p.requesting and p.rounds == 1
    assert p.on_action(plan(0), 2.2) == [m.Push(plan(0))]
    assert not p.requesting
    assert p.on_pushed(0, 2.5) == [m.Send(m.TransferDone(2.5, J, 0, 0))]
    assert p.on_trained(meta(tokens=7), 3.0) == []  # held: round 0's result not pulled
    assert p.state is State.HOLDING
    assert p.on_action(m.NotifyPull(0, (J,), 1), 3.5) == [m.Pull(1, background=True)]
    assert p.on_pulled(1, 4.0, background=True) == [
        m.Send(m.PullDone(4.0, J, 1)),
        m.Train(adopt=True),
        m.Send(m.PushRequested(4.0, J, meta(tokens=7))),
    ]
    assert p.on_action(plan(1), 4.1) == [m.Push(plan(1))]
    assert p.rounds == 2


def test_overlap_holds_a_round_trained_while_its_request_still_waits_for_a_plan():
    """A leader mid-round answers a request later: a round trained meanwhile is held (one
    push in flight, requested or pushed), and goes when the first one's result is pulled."""
    p = LearnerProtocol(J, overlap=True, checkpoints=True)
    joined(p)
    assert p.on_trained(meta(), 2.0) == [
        m.Save("requested", -1, 0, 2),  # trained a round, its push waits for a plan
        m.Train(adopt=True),
        m.Send(m.PushRequested(2.0, J, meta())),
    ]
    assert p.on_trained(meta(tokens=9), 3.0) == []
    assert p.state is State.HOLDING and p.held == meta(tokens=9) and p.rounds == 1
    assert p.on_action(plan(4), 3.5) == [m.Push(plan(4))]  # the plan came meanwhile
    assert p.on_pushed(4, 3.6) == [m.Send(m.TransferDone(3.6, J, 4, 0))]
    assert p.on_action(m.NotifyPull(4, (J,), 1), 4.0) == [m.Pull(1, background=True)]
    assert p.on_pulled(1, 4.5, background=True) == [
        m.Send(m.PullDone(4.5, J, 1)),
        m.Save("requested", -1, 0, 4),
        m.Train(adopt=True),
        m.Send(m.PushRequested(4.5, J, meta(tokens=9))),
    ]
    assert p.rounds == 2 and p.requesting


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (m.RefuseKind.PENDING, []),
        (m.RefuseKind.INACTIVE, [m.Send(m.Join(2.5, J, 0, True, "", 2))]),
        (m.RefuseKind.INVALID, [m.Exit(m.ExitCode.REFUSED, "refused (invalid): no")]),
    ],
)
def test_overlap_a_refused_request_is_handled_while_the_next_round_trains(kind, expected):
    p = LearnerProtocol(J, overlap=True, checkpoints=True)
    joined(p)
    p.on_trained(meta(), 2.0)
    assert p.on_action(m.Refuse(J, "no", kind, 0), 2.5) == expected
    if kind == m.RefuseKind.INACTIVE:  # rejoining: the round in training no longer counts
        assert p.state is State.JOINING and not p.requesting
        assert p.on_trained(meta(), 3.0) == []


@pytest.mark.parametrize(
    "kind", [m.RefuseKind.INACTIVE, m.RefuseKind.PENDING, m.RefuseKind.INVALID]
)
def test_a_push_refusal_that_comes_while_it_rejoins_is_stale(kind):
    """The leader restarted: the push sent to it is refused (``inactive``) while the learner
    is already rejoining from its checkpoints. That refusal is about a push the rejoin
    dropped, not about the join (the fault test saw the learner exit 78 on it, and the
    launcher give up)."""
    p = LearnerProtocol(J, checkpoints=True)
    joined(p)
    p.on_trained(meta(), 2.0)
    p.on_leader_lost(3.0, stream=0)
    assert p.on_action(m.Refuse(J, "pull a model first", kind, 0), 3.5, stream=1) == []
    assert p.state is State.JOINING
    assert p.on_action(m.SendModel(J, 2), 4.0, stream=1) == [
        m.Restore(0, (), 2),
        m.Pull(2, first=False),
    ]


def test_error_feedback_settles_each_push_by_the_word_it_gets():
    """``feedback=True`` (EXTENSION): a push is settled once, by its round's ``NotifyPull``
    outcome (``lost`` if the leader names none), by a rejoin's ``SendModel`` (its
    ``last_outcome`` for ``last_round``, ``dropped`` meaning ``discarded``; ``lost`` for
    the others), or ``lost`` when a new plan comes while it is still unsettled."""
    p = LearnerProtocol(J, feedback=True, overlap=True)
    joined(p)
    p.on_trained(meta(), 2.0)
    assert p.on_action(plan(0), 2.0) == [m.Push(plan(0))]
    notify = m.NotifyPull(0, (1, J), 1, ("applied", "stale"))
    assert p.on_action(notify, 3.0) == [m.Settle(0, "stale"), m.Pull(1, background=True)]
    assert p.on_action(notify, 3.1) == [m.Pull(1, background=True)]  # settled once
    p.on_pulled(1, 3.2, background=True)
    p.on_trained(meta(), 4.0)
    p.on_action(plan(1), 4.0)
    assert p.on_action(m.NotifyPull(1, (J,), 2), 5.0)[0] == m.Settle(1, "lost")  # no word
    p.on_pulled(2, 5.1, background=True)
    p.on_trained(meta(), 6.0)
    p.on_action(plan(2), 6.0)
    p.on_trained(meta(), 6.5)
    p.inflight = None  # (as if round 2's result had been pulled without a word)
    p.on_pulled(3, 6.6, background=True)
    assert p.on_action(plan(3), 7.0)[:2] == [m.Settle(2, "lost"), m.Push(plan(3))]
    # A rejoin: the push of last_round by last_outcome, any other lost.
    p = LearnerProtocol(J, feedback=True, checkpoints=True)
    joined(p)
    p.on_trained(meta(), 2.0)
    p.on_action(plan(3), 2.0)
    p.unsettled.insert(0, 2)  # (as if an older push had had no word)
    p.on_pushed(3, 2.5)
    assert p.on_leader_lost(8.0) == [m.Send(m.Join(8.0, J, 0, True, "", 2))]
    send = m.SendModel(J, 4, last_round=3, last_outcome="dropped")
    assert p.on_action(send, 9.0) == [
        m.Restore(1, (), 4, 3, "dropped"),
        m.Settle(2, "lost"),
        m.Settle(3, "discarded"),
        m.Pull(4),
    ]
    assert p.unsettled == []
    # A restarted process restored pushes in flight from its checkpoint: the same words.
    restore = m.Restore(1, (), 4, 5, "applied")
    assert p.on_restored([4, 5], restore) == [m.Settle(4, "lost"), m.Settle(5, "applied")]
    plain = LearnerProtocol(J)  # without feedback: no Settle ever
    assert plain.on_restored([5], restore) == []
    joined(plain)
    plain.on_trained(meta(), 2.0)
    assert plain.on_action(plan(0), 2.0) == [m.Push(plan(0))]
    plain.on_pushed(0, 2.5)
    assert plain.on_action(m.NotifyPull(0, (J,), 1, ("applied",)), 3.0) == [m.Pull(1)]


def test_overlap_a_second_word_of_an_older_pull_does_not_request_a_held_round_twice():
    """Held behind a request still waiting for its plan (the older push pulled already), a
    duplicate background pull must not send the held round's request a second time."""
    p = LearnerProtocol(J, overlap=True)
    joined(p)
    p.on_trained(meta(), 2.0)
    p.on_action(plan(0), 2.1)
    p.on_pushed(0, 2.2)
    p.on_trained(meta(tokens=5), 3.0)  # held: round 0's result not pulled
    p.on_action(m.NotifyPull(0, (J,), 1), 3.1)
    assert p.on_pulled(1, 3.2, background=True)[-1] == m.Send(
        m.PushRequested(3.2, J, meta(tokens=5))
    )
    p.on_trained(meta(tokens=6), 4.0)  # held behind the request that waits for its plan
    assert p.state is State.HOLDING and p.requesting and p.rounds == 2
    assert p.on_pulled(1, 4.1, background=True) == [m.Send(m.PullDone(4.1, J, 1))]
    assert p.state is State.HOLDING and p.held == meta(tokens=6) and p.rounds == 2


@pytest.mark.parametrize(
    ("leases", "restored"),
    [
        ((m.Span(9, 0, 8),), 2),  # its batches are not its own any more: the push was taken
        ((m.Span(4, 6, 8), m.Span(9, 0, 8)), 0),  # still leased: the push never was
        ((), 2),
    ],
)
def test_overlap_restores_a_requested_checkpoint_only_if_the_leader_took_its_push(leases, restored):
    """An overlapping learner checkpoints its next round's start while the push of the
    round before waits for its plan; if the leader never took that push (the request was
    dropped by a rejoin, or never arrived), its batches are still leased to the learner,
    and the learner goes back to that round's start and trains them again."""
    p = LearnerProtocol(J, overlap=True, checkpoints=True)
    joined(p)
    spans = (m.Span(4, 0, 8), m.Span(5, 0, 8))
    trained = m.PushMeta(tokens=100, steps=2, base_version=0, spans=spans)
    assert p.on_trained(trained, 2.0)[0] == m.Save("requested", -1, 0, 2, spans)
    assert [(c.step, c.kind, c.spans) for c in p.saved] == [
        (0, "start", ()),
        (2, "requested", spans),
    ]
    p.on_leader_lost(2.5, stream=0)
    send = m.SendModel(J, 1, leases, last_round=0, last_outcome="applied")
    assert p.on_action(send, 3.0, stream=1)[0] == m.Restore(restored, leases, 1, 0, "applied")
    assert p.rounds == restored // 2
