"""Hostile input at the leader's core (issue 18 items 3 and 6): a push's counts bounded by
the job's geometry, pushes of strangers never booked, events about unknown peers or rounds
refused and counted, long strings cut before the tape sees them."""

import json

from dipsjax.syncer import Leader, LeaderConfig, NoGrace
from dipsjax.syncer import messages as L

# 2 learners, 1 follower, rounds of at most 16 steps of 8 x 64 tokens.
GEOMETRY = dict(learners=2, max_push_steps=16, step_tokens=8 * 64, token_budget=10_000)


def _leader(**kw):
    leader = Leader(LeaderConfig(penalty=False, **{**GEOMETRY, **kw}), NoGrace())
    leader.handle(L.FollowerJoined(0.0, 0, 0))
    for j in (0, 1):
        leader.handle(L.Join(0.0, j))
        leader.handle(L.PullDone(0.0, j, 0))
    return leader


def _push(j, tokens, steps, t=1.0, base=0):
    return L.PushRequested(t, j, L.PushMeta(tokens, steps, base))


def _books(leader):
    return leader.ledger.totals()


def test_a_push_claiming_more_than_its_steps_could_train_is_refused_and_not_booked():
    leader = _leader()
    before = _books(leader)
    (refusal,) = leader.handle(_push(0, 10**15, 16))
    assert isinstance(refusal, L.Refuse) and refusal.kind == L.RefuseKind.BOUNDS
    assert "tokens 1000000000000000" in refusal.reason and "8192" in refusal.reason
    (refusal,) = leader.handle(_push(0, 512, 17))
    assert refusal.kind == L.RefuseKind.BOUNDS and "steps 17" in refusal.reason
    assert "max_push_steps 16" in refusal.reason
    (refusal,) = leader.handle(_push(0, 513, 1))  # one step trains at most 512 tokens
    assert refusal.kind == L.RefuseKind.BOUNDS and "512" in refusal.reason
    # Nothing moved: no round, no books, no budget, no stop.
    assert _books(leader) == before == {"reported": 0, "applied": 0, "rejected": 0, "dropped": 0}
    assert leader.round is None and leader.waiting == [] and not leader.stopped
    assert leader.budget_tokens() == 0 and leader.refused["bounds"] == 3
    # The learner's own push, within bounds, is taken as usual.
    assert isinstance(leader.handle(_push(0, 8192, 16))[0], L.PushShards)
    assert _books(leader)["reported"] == 8192


def test_a_push_from_a_learner_outside_the_job_is_not_booked_one_of_a_non_member_is_dropped():
    leader = _leader()
    assert leader.handle(_push(9, 10**15, 1)) == []  # no such learner: screened out
    assert leader.refused["unknown_learner"] == 1
    assert _books(leader) == {"reported": 0, "applied": 0, "rejected": 0, "dropped": 0}
    assert 9 not in leader.members and not leader.stopped
    # A learner of the job that is no longer a member (it left, was evicted, or a restart
    # forgot it) counted the tokens it trained: booked, dropped, as it counts them (the
    # simulator's fault schedules found 24 tokens unbalanced when it was not).
    leader.handle(L.Leave(1.0, 1))
    (refusal,) = leader.handle(_push(1, 512, 1))
    assert refusal.kind == L.RefuseKind.UNKNOWN and refusal.kind not in L.UNBOOKED
    assert _books(leader) == {"reported": 512, "applied": 0, "rejected": 0, "dropped": 512}
    assert leader.round is None and not leader.stopped


def test_events_about_unknown_peers_or_rounds_are_refused_and_counted():
    leader = _leader()
    assert leader.screen(L.Heartbeat(0.0, 1)) is None
    bad = leader.screen(L.Join(1.0, 2))
    assert (
        bad.kind == "unknown_learner" and "learner 2" in bad.reason and "2 learners" in bad.reason
    )
    assert leader.handle(L.Join(1.0, 2)) == [] and 2 not in leader.members
    assert leader.handle(L.FollowerHeartbeat(1.0, 5)) == []
    assert leader.handle(L.FollowerNorms(1.0, 0, 7, (1.0,))) == []  # round 7 never opened
    assert leader.screen(L.TransferDone(1.0, 0, 3)).kind == "unknown_round"
    # A round that ended: a late report is refused too, counted apart.
    leader.handle(_push(0, 512, 1))
    leader.handle(_push(1, 512, 1))
    leader.handle(L.TransferDone(1.0, 0, 0))
    leader.handle(L.TransferDone(1.0, 1, 0))
    leader.handle(L.FollowerNorms(1.0, 0, 0, (1.0, 1.0)))
    leader.handle(L.FollowerMerged(1.0, 0, 0, 0.5))
    leader.handle(L.FollowerApplied(1.0, 0, 0, 1))
    leader.handle(L.PullDone(1.0, 0, 1))
    leader.handle(L.PullDone(1.0, 1, 1))
    assert leader.round is None and leader.version == 1
    assert leader.handle(L.FollowerApplied(2.0, 0, 0, 1)) == []
    assert +leader.refused == {
        "unknown_learner": 1,
        "unknown_follower": 1,
        "unknown_round": 1,
        "old_round": 1,
    }
    again = Leader.restore(json.loads(json.dumps(leader.snapshot())))
    assert again.refused == leader.refused and again.config == leader.config


def test_a_long_reason_is_cut_before_the_tape_sees_it():
    leader = _leader()
    leader.handle(L.LearnerFailed(1.0, 0, "x" * (3 << 20)))
    leader.handle(L.FollowerLost(1.0, 0, "y" * 5000))
    (outage,) = [r for r in leader.tape.records if r.get("event") == "outage"]
    assert outage["reason"].startswith("x" * 1024) and len(outage["reason"]) < 1100
    assert outage["reason"].endswith(f"[{(3 << 20) - 1024} more bytes cut]")
    (lost,) = [r for r in leader.tape.records if r.get("event") == "lost"]
    assert len(lost["reason"]) < 1100 and lost["reason"].endswith("[3976 more bytes cut]")
    assert len(json.dumps(leader.tape.records)) < 10_000


def test_a_push_of_an_incarnation_no_process_joined_as_is_refused_and_not_booked():
    # A forged push naming a live learner with a newer incarnation than any that joined:
    # no process counted it, so the books must not either (an older incarnation's push is
    # booked, dropped: the process that sent it counted it).
    leader = _leader()
    (refusal,) = leader.handle(L.PushRequested(1.0, 0, L.PushMeta(512, 1, 0, incarnation=7)))
    assert refusal.kind == L.RefuseKind.GHOST and refusal.kind in L.UNBOOKED
    assert "incarnation 7" in refusal.reason
    assert _books(leader) == {"reported": 0, "applied": 0, "rejected": 0, "dropped": 0}
    leader.handle(L.Join(2.0, 1, 1))  # learner 1 restarts: incarnation 1
    leader.handle(L.PullDone(2.0, 1, 0))
    (refusal,) = leader.handle(L.PushRequested(3.0, 1, L.PushMeta(256, 1, 0, incarnation=0)))
    assert refusal.kind == L.RefuseKind.INCARNATION  # the old process counted it: booked
    assert _books(leader)["reported"] == 256 and _books(leader)["dropped"] == 256
