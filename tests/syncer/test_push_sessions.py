"""Sessions: a push request sent before its learner's rejoin and delivered after the
rejoin *and* its pull (a paused leader takes its queued calls in any order) was taken as a
new push, so the leader booked one push more than its learner, which had settled that
request as not booked at its rejoin (``SendModel.booked``). Each join now opens a session
(``SendModel.session``), the learner tags its requests with it, and the leader refuses a
request of a session a rejoin ended, unbooked (``RefuseKind.SESSION``). The learner
numbers its joins (``Join.session``), a rejoin names the session it ends (``Join.ends``,
that of the learner's newest model), and the model a join brings echoes its session.

Both sides here are the real cores: :class:`LearnerProtocol` writes every message the
:class:`Leader` reads."""

import pytest

from dipsjax.syncer import Leader, LeaderConfig, NoGrace
from dipsjax.syncer import messages as m
from dipsjax.syncer.learner import LearnerProtocol, State, session_base

J = 1


def meta(tokens=2048, base=0):
    return m.PushMeta(tokens=tokens, steps=4, base_version=base)


def sent(commands, kind):
    """The one message of type ``kind`` among ``commands``' ``Send`` s."""
    (event,) = [c.event for c in commands if isinstance(c, m.Send) and isinstance(c.event, kind)]
    return event


def plans(actions):
    """How many plans (``PushShards``) ``actions`` hold."""
    return sum(isinstance(a, m.PushShards) for a in actions)


def deliver(leader, proto, commands, stream=None):
    """Every ``Send`` of ``commands`` to the leader, and every action for the learner
    back to it; returns the learner's commands that came of them."""
    out = []
    for c in commands:
        if isinstance(c, m.Send):
            for a in leader.handle(c.event):
                out += proto.on_action(a, c.event.t, stream)
    return out


def training(leader, proto, t=0.0):
    """The learner joined, pulled and trains; returns its pull's commands."""
    (send,) = leader.handle(sent(proto.start(t), m.Join))
    pull = proto.on_action(send, t)
    assert pull == [m.Pull(0, first=True)]
    cmds = proto.on_pulled(send.version, t + 0.1)
    deliver(leader, proto, cmds)
    assert proto.state is State.TRAINING and leader.members[J].active
    return cmds


def job():
    leader = Leader(LeaderConfig(penalty=False, num_followers=1), NoGrace())
    leader.handle(m.FollowerJoined(0.0, 0, 0))
    return leader, LearnerProtocol(J, checkpoints=True)


def rejoined(leader, proto, t):
    """The control stream broke: the learner rejoins (resume), takes its model and
    pulls it. Returns the rejoin's ``SendModel``."""
    join = sent(proto.on_leader_lost(t, stream=0), m.Join)
    (send,) = leader.handle(join)
    cmds = proto.on_action(send, t + 0.1, stream=1)
    assert cmds[-1] == m.Pull(send.version, first=False)
    deliver(leader, proto, proto.on_pulled(send.version, t + 0.2), stream=1)
    return send


def test_a_request_delivered_after_its_learners_rejoin_and_pull_is_booked_by_neither():
    leader, proto = job()
    training(leader, proto)
    late = sent(proto.on_trained(meta(), 1.0), m.PushRequested)  # its call fails: in doubt
    send = rejoined(leader, proto, 2.0)
    # The rejoin's word: no push of the incarnation booked; the learner counts none.
    assert send.booked == 0 and leader.members[J].active
    assert late.session == 1 and send.session == 2 == leader.members[J].session == proto.session
    assert leader.members[J].ended == [1]
    (refuse,) = leader.handle(late)  # the request in doubt, late
    assert refuse.kind == m.RefuseKind.SESSION and refuse.incarnation == 0
    assert "session 1 was ended by a rejoin" in refuse.reason
    # Counted independently: the leader's ledger and the member's count against the
    # learner's word (0 booked): nothing booked, nothing dropped, no round opened.
    assert leader.ledger.reported.get(J, 0) == 0 and leader.ledger.totals()["dropped"] == 0
    assert leader.members[J].booked == 0 and leader.round is None and not leader.waiting
    assert leader.refused["session"] == 1
    # The learner's own push of its new session is taken, booked once.
    again = sent(proto.on_trained(meta(base=send.version), 3.0), m.PushRequested)
    assert again.session == 2
    assert plans(leader.handle(again)) == 1 and leader.members[J].booked == 1
    assert leader.ledger.reported[J] == 2048


def test_a_request_of_the_current_session_is_taken_and_an_untagged_one_is_not_checked():
    leader, proto = job()
    training(leader, proto)
    request = sent(proto.on_trained(meta(), 1.0), m.PushRequested)
    assert request.session == leader.members[J].session == 1
    assert plans(leader.handle(request)) == 1
    # A request with no session (written by hand, or by an older client) is not checked.
    other = Leader(LeaderConfig(penalty=False, num_followers=1), NoGrace())
    other.handle(m.FollowerJoined(0.0, 0, 0))
    other.handle(m.Join(0.0, J))
    other.handle(m.Join(0.5, J, resume=True, session=2))
    other.handle(m.PullDone(0.6, J, 0))
    assert plans(other.handle(m.PushRequested(1.0, J, meta()))) == 1


def test_the_members_session_survives_a_snapshot_and_a_snapshot_from_before_has_none():
    leader, proto = job()
    training(leader, proto)
    late = sent(proto.on_trained(meta(), 1.0), m.PushRequested)
    back = Leader.restore(leader.snapshot())
    assert back.members[J].session == 1 and back.members[J].ended == []
    back.resume(2.0)
    send = rejoined(back, proto, 2.5)
    assert send.session == 2 and back.members[J].active
    (refuse,) = back.handle(late)
    assert refuse.kind == m.RefuseKind.SESSION
    assert back.ledger.reported.get(J, 0) == 0 and back.members[J].booked == 0
    state = leader.snapshot()
    for _, member in state["members"]:
        del member["session"], member["ended"]
    old = Leader.restore(state).members[J]
    assert old.session == 0 and old.ended == []


def test_a_learner_takes_a_model_of_any_of_its_joins_since_its_last_one():
    """A learner whose rejoin's call failed rejoins again; the leader may take the two
    joins in either order (a paused leader takes its queued calls in any order), and
    answers on whichever stream the learner watches then. The learner takes a model of
    any of its joins since its last model, from any stream, and tags its requests with
    that one's session; not another incarnation's (a restart the leader heard of late)."""
    p = LearnerProtocol(J, checkpoints=True, session_base=100)
    assert sent(p.start(0.0), m.Join).session == 101
    p.on_action(m.SendModel(J, 0, session=101), 0.1)
    p.on_pulled(0, 0.2)
    first = sent(p.on_leader_lost(1.0, stream=0), m.Join)
    second = sent(p.on_leader_lost(1.5, stream=1), m.Join)
    assert (first.session, first.ends, second.session, second.ends) == (102, 101, 103, 101)
    assert p.on_action(m.SendModel(J, 0, session=7), 2.0, stream=2) == []  # not its join's
    assert p.on_action(m.SendModel(J, 0, session=102), 2.0, stream=1)[-1] == m.Pull(0)
    assert p.session == 102 and p.asked == set()
    assert p.on_action(m.SendModel(J, 0, session=103), 2.1, stream=2) == []  # has its model
    # A model of no session (a leader from before sessions) is taken; requests go untagged.
    q = LearnerProtocol(J)
    q.start(0.0)
    assert q.on_action(m.SendModel(J, 0), 0.1) == [m.Pull(0, first=True)]
    assert q.session == 0


@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_two_rejoins_taken_in_either_order_end_the_old_session_and_the_learner_goes_on(order):
    """A review found that a leader taking a learner's two rejoins in reverse order during
    an outer step answered with the older one's model, which the learner (waiting for its
    newest) ignored: it waited in its join forever. Now it takes it, its push is taken,
    and the request in doubt of the session both rejoins ended is refused."""
    leader = Leader(LeaderConfig(penalty=False, num_followers=1), NoGrace())
    leader.handle(m.FollowerJoined(0.0, 0, 0))
    proto = LearnerProtocol(J, checkpoints=True)
    training(leader, proto)
    late = sent(proto.on_trained(meta(), 1.0), m.PushRequested)
    joins = [
        sent(proto.on_leader_lost(2.0, stream=0), m.Join),
        sent(proto.on_leader_lost(2.5, stream=1), m.Join),
    ]
    if order == "reversed":
        joins.reverse()
    models = [a for j in joins for a in leader.handle(j) if isinstance(a, m.SendModel)]
    assert [s.session for s in models] == [j.session for j in joins]
    taken = [c for s in models for c in proto.on_action(s, 3.0, stream=2)]
    assert taken[-1] == m.Pull(0) and proto.session == joins[0].session
    deliver(leader, proto, proto.on_pulled(0, 3.1), stream=2)
    assert leader.members[J].active and leader.members[J].ended == [1]
    (refuse,) = leader.handle(late)
    assert refuse.kind == m.RefuseKind.SESSION
    request = sent(proto.on_trained(meta(), 4.0), m.PushRequested)
    assert plans(leader.handle(request)) == 1 and leader.members[J].booked == 1
    assert leader.ledger.reported[J] == 2048


def test_session_bases_are_drawn_at_random():
    bases = {session_base() for _ in range(64)}
    assert len(bases) == 64 and all(1 <= b <= 2**61 for b in bases)


@pytest.mark.parametrize("checkpoints", [True, False])
def test_a_learner_refused_for_its_session_rejoins_or_exits_without_checkpoints(checkpoints):
    """A push refused for its session (the leader says a rejoin ended it): the learner
    rejoins, as for ``inactive``; without checkpoints it cannot, and exits evicted."""
    p = LearnerProtocol(J, checkpoints=checkpoints)
    p.start(0.0)
    p.on_action(m.SendModel(J, 0, session=1), 0.1)
    p.on_pulled(0, 0.2)
    assert sent(p.on_trained(meta(), 1.0), m.PushRequested).session == 1
    refuse = m.Refuse(J, "older session", m.RefuseKind.SESSION, 0)
    if checkpoints:
        assert p.on_action(refuse, 1.5) == [m.Send(m.Join(1.5, J, 0, True, "", 2, 1))]
    else:
        [c] = p.on_action(refuse, 1.5)
        assert c.code == m.ExitCode.EVICTED


def test_two_rejoins_reversed_during_an_outer_step_get_the_learner_its_model():
    """The review's case: the round is applied when both rejoins arrive, reversed; the
    leader answers once, after the step, with the model of the join it took last (the
    older). A learner that waited for its newest join's model ignored it and waited
    forever; now it takes it and pushes again."""
    leader = Leader(LeaderConfig(penalty=False, num_followers=1), NoGrace())
    leader.handle(m.FollowerJoined(0.0, 0, 0))
    proto = LearnerProtocol(J, checkpoints=True)
    training(leader, proto)
    (shards, *_) = leader.handle(sent(proto.on_trained(meta(), 1.0), m.PushRequested))
    proto.on_action(shards, 1.0)
    deliver(leader, proto, proto.on_pushed(shards.round_id, 1.1))
    rnd = leader.round
    leader.handle(m.FollowerNorms(1.2, 0, rnd.round_id, (1.0,)))
    leader.handle(m.FollowerMerged(1.3, 0, rnd.round_id, 1.0))
    assert leader.phase.value == "apply"
    joins = [
        sent(proto.on_leader_lost(2.0, stream=0), m.Join),
        sent(proto.on_leader_lost(2.5, stream=1), m.Join),
    ]
    assert leader.handle(joins[1]) == [] and leader.handle(joins[0]) == []
    acts = leader.handle(m.FollowerApplied(3.0, 0, rnd.round_id, 1))
    (model,) = [a for a in acts if isinstance(a, m.SendModel)]
    assert model.session == joins[0].session  # the older join's, taken last
    assert proto.on_action(model, 3.1, stream=2)[-1] == m.Pull(1)
    deliver(leader, proto, proto.on_pulled(1, 3.2), stream=2)
    request = sent(proto.on_trained(meta(base=1), 4.0), m.PushRequested)
    assert plans(leader.handle(request)) == 1 and leader.members[J].booked == 2


def _applying(leader, proto, t):
    """The learner's push is in the outer step (APPLY); returns the round."""
    (shards, *_) = leader.handle(sent(proto.on_trained(meta(), t), m.PushRequested))
    proto.on_action(shards, t, stream=proto.stream)
    deliver(leader, proto, proto.on_pushed(shards.round_id, t + 0.1), stream=proto.stream)
    rnd = leader.round
    leader.handle(m.FollowerNorms(t + 0.2, 0, rnd.round_id, (1.0,)))
    leader.handle(m.FollowerMerged(t + 0.3, 0, rnd.round_id, 1.0))
    assert leader.phase.value == "apply"
    return rnd


@pytest.mark.parametrize("where", ["ended since", "pushed since"])
def test_a_rejoin_sent_before_a_newer_model_was_taken_is_ignored(where):
    """The second review's case: a rejoin (J2) stays queued at a paused leader while
    another (J3) is taken and the learner goes on with J3's model. Taken late, J2 made the
    member inactive and answered with its own model, which the learner ignores: during an
    outer step that answer was the only one (``ended since``: the learner had rejoined
    again, J4), or the learner waited for a pull notice that left it out (``pushed
    since``). A rejoin that ends a session older than the newest ended, or than the one
    the learner pushed in since, is now ignored."""
    leader, proto = job()
    training(leader, proto)
    j2 = sent(proto.on_leader_lost(1.0, stream=0), m.Join)  # queued at the paused leader
    j3 = sent(proto.on_leader_lost(1.5, stream=1), m.Join)
    (send3,) = leader.handle(j3)
    proto.on_action(send3, 2.0, stream=2)
    deliver(leader, proto, proto.on_pulled(0, 2.1), stream=2)
    rnd = _applying(leader, proto, 3.0)
    if where == "ended since":
        j4 = sent(proto.on_leader_lost(3.5, stream=2), m.Join)
        assert j4.ends == j3.session and leader.handle(j4) == []  # answered after the step
    assert leader.handle(j2) == []  # late, and ignored
    assert leader.members[J].session == (j4.session if where == "ended since" else j3.session)
    acts = leader.handle(m.FollowerApplied(4.0, 0, rnd.round_id, 1))
    if where == "ended since":
        (model,) = [a for a in acts if isinstance(a, m.SendModel)]
        assert model.session == j4.session
        assert proto.on_action(model, 4.1, stream=3)[-1] == m.Pull(1)
    else:
        (notice,) = [a for a in acts if isinstance(a, m.NotifyPull)]
        assert J in notice.learners and proto.on_action(notice, 4.1, stream=2) == [m.Pull(1)]


def test_a_process_restarted_from_its_checkpoint_ends_its_last_processs_session():
    """A process restarted with ``--resume`` knows no session of its own (its numbers are
    drawn afresh): its first rejoin ends the member's, so the last process's request in
    doubt, delivered after that rejoin and its pull, is refused too."""
    leader, proto = job()
    training(leader, proto)
    late = sent(proto.on_trained(meta(), 1.0), m.PushRequested)  # then the process dies
    again = LearnerProtocol(J, checkpoints=True, session_base=1000)
    join = sent(again.start(2.0, resume=True), m.Join)
    assert (join.session, join.ends) == (1001, 0)
    (send,) = leader.handle(join)
    assert leader.members[J].ended == [late.session] and send.session == 1001
    again.on_action(send, 2.1)
    deliver(leader, again, again.on_pulled(send.version, 2.2))
    (refuse,) = leader.handle(late)
    assert refuse.kind == m.RefuseKind.SESSION and leader.ledger.reported.get(J, 0) == 0
