"""The leader state machine: round lifecycle, grace, membership, budget, ledger, tape."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax.syncer import FixedGrace, Leader, LeaderConfig, NoGrace, QuorumGrace
from dipsjax.syncer import leader as L


def kinds(actions):
    return [type(a).__name__ for a in actions]


def join_all(leader, n, t=0.0):
    for j in range(n):
        assert kinds(leader.handle(L.Join(t, j))) == ["SendModel"]
        leader.handle(L.PullDone(t, j, leader.version))


def finish_round(leader, t, norms=None, merged=0.25):
    """Drives a round whose transfers are done through norms, merge, apply and pull."""
    rnd = leader.round
    acts = []
    for p in list(rnd.pushes):
        acts += leader.handle(L.TransferDone(t, p.learner, rnd.round_id))
    req = [a for a in acts if isinstance(a, L.RequestNorms)]
    assert len(req) == 1
    g = norms or tuple(1.0 for _ in req[0].learners)
    (decide,) = leader.handle(L.NormsReported(t, rnd.round_id, g))
    (apply,) = leader.handle(L.MergedNormReported(t, rnd.round_id, merged))
    (notify,) = leader.handle(L.ApplyDone(t, rnd.round_id, apply.version))
    out = []
    for j in notify.learners:
        out += leader.handle(L.PullDone(t, j, apply.version))
    return decide, apply, notify, out


def test_round_lifecycle_with_fixed_grace():
    leader = Leader(LeaderConfig(penalty=False), FixedGrace(5.0))
    join_all(leader, 3)
    a = leader.handle(L.PushRequested(0.0, 0, 100, 4, 0))
    assert a == [L.Schedule(0, 0), L.WakeAt(5.0)]
    # Each arrival re-arms the window (Di-PS sec. 6 pseudo-code): now open until t = 8.
    assert leader.handle(L.PushRequested(3.0, 1, 300, 4, 0)) == [L.Schedule(0, 1), L.WakeAt(8.0)]
    # Transfers land but the window is still open: nothing starts before t = 8.
    assert leader.handle(L.TransferDone(3.5, 0, 0)) == []
    assert leader.handle(L.TransferDone(4.0, 1, 0)) == []
    assert leader.handle(L.Tick(5.0)) == []
    assert kinds(leader.handle(L.Tick(8.0))) == ["RequestNorms"]
    # A push during the update waits for the next round (no barrier across rounds).
    assert leader.handle(L.PushRequested(6.0, 2, 50, 4, 0)) == []
    (decide,) = leader.handle(L.NormsReported(6.0, 0, (1.0, 1.0)))
    assert decide.learners == (0, 1) and decide.accepted == (True, True)
    assert decide.weights == pytest.approx((0.25, 0.75))  # token weighting
    (apply,) = leader.handle(L.MergedNormReported(7.0, 0, 4.0))
    assert apply.version == 1 and apply.clip_factor == pytest.approx(0.5)
    (notify,) = leader.handle(L.ApplyDone(8.0, 0, 1))
    assert notify == L.NotifyPull(0, (0, 1), 1)
    assert leader.handle(L.PullDone(9.0, 0, 1)) == []
    # The last pull ends the round; the waiting push opens round 1 at once.
    assert leader.handle(L.PullDone(9.5, 1, 1)) == [L.Schedule(1, 2), L.WakeAt(14.5)]
    rec = leader.tape.rounds()[0]
    assert rec["accepted"] == [True, True] and rec["clip_factor"] == pytest.approx(0.5)
    assert rec["vector_clock"] == {"0": 1, "1": 1, "2": 0}
    json.dumps(leader.tape.records)


def test_push_during_transfers_joins_the_round_before_its_update():
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    join_all(leader, 3)
    leader.handle(L.PushRequested(0.0, 0, 10, 1, 0))  # window 0: closed, shards in flight
    assert leader.phase.value == "transfers"
    assert leader.handle(L.PushRequested(0.5, 1, 10, 1, 0)) == [L.Schedule(0, 1), L.WakeAt(0.5)]
    leader.handle(L.TransferDone(1.0, 0, 0))
    assert kinds(leader.handle(L.TransferDone(1.5, 1, 0))) == ["RequestNorms"]
    assert leader.round.learners == (0, 1)
    # Once the update started, a push waits for the next round.
    assert leader.handle(L.PushRequested(2.0, 2, 10, 1, 0)) == []
    # Decoupled's quorum policy does not reopen: its window is bounded after the quorum.
    q = Leader(LeaderConfig(penalty=False), QuorumGrace(k=1, grace=False))
    join_all(q, 2)
    q.handle(L.PushRequested(0.0, 0, 10, 1, 0))
    assert q.handle(L.PushRequested(0.5, 1, 10, 1, 0)) == []


def test_window_closes_early_when_everyone_is_in():
    leader = Leader(LeaderConfig(penalty=False), FixedGrace(100.0))
    join_all(leader, 2)
    leader.handle(L.PushRequested(0.0, 0, 10, 1, 0))
    leader.handle(L.TransferDone(0.5, 0, 0))
    leader.handle(L.PushRequested(1.0, 1, 10, 1, 0))
    assert kinds(leader.handle(L.TransferDone(1.5, 1, 0))) == ["RequestNorms"]


def test_quorum_waits_for_k_then_grace():
    leader = Leader(LeaderConfig(penalty=False), QuorumGrace(k=2, grace=False))
    join_all(leader, 3)
    assert kinds(leader.handle(L.PushRequested(0.0, 0, 10, 1, 0))) == ["Schedule"]
    leader.handle(L.TransferDone(0.1, 0, 0))
    assert leader.handle(L.Tick(25.0)) == []  # one push < quorum 2: keep waiting
    acts = leader.handle(L.PushRequested(26.0, 1, 10, 1, 0))
    assert kinds(acts) == ["Schedule", "WakeAt"]
    assert kinds(leader.handle(L.TransferDone(26.1, 1, 0))) == ["RequestNorms"]


def test_max_participants_one_applies_each_push_alone():
    leader = Leader(LeaderConfig(penalty=False, max_participants=1), NoGrace())
    join_all(leader, 2)
    leader.handle(L.PushRequested(0.0, 0, 10, 1, 0))
    assert leader.handle(L.PushRequested(0.1, 1, 10, 1, 0)) == []
    decide, _, _, after = finish_round(leader, 1.0)
    assert decide.learners == (0,)
    assert kinds(after)[:1] == ["Schedule"] and leader.round.pushes[0].learner == 1


def test_missed_heartbeats_evict_without_stopping_others():
    leader = Leader(LeaderConfig(heartbeat_interval=10.0, missed_heartbeats=3, penalty=False))
    join_all(leader, 2)
    leader.handle(L.PushRequested(1.0, 1, 10, 1, 0))  # learner 1 pushes, then goes silent
    for t in (10.0, 20.0, 30.0):
        assert leader.handle(L.Heartbeat(t, 0)) == []
    acts = leader.handle(L.Heartbeat(31.5, 0))
    assert L.Evict(1, "missed heartbeats") in acts
    assert leader.active_members() == [0]
    # Its pending push was dropped, and the ledger says so.
    assert leader.ledger.totals() == {
        "consumed": 10,
        "applied": 0,
        "rejected": 0,
        "dropped": 10,
        "outstanding": 0,
    }
    assert leader.tape.membership()[-1]["event"] == "evict"
    # The survivor keeps going alone.
    leader.handle(L.PushRequested(32.0, 0, 5, 1, 0))
    decide, apply, _, _ = finish_round(leader, 33.0)
    assert decide.learners == (0,) and apply.version == 1


def test_join_pulls_a_model_first_and_pushes_before_are_refused():
    leader = Leader()
    assert leader.handle(L.Join(0.0, 7)) == [L.SendModel(7, 0)]
    assert kinds(leader.handle(L.PushRequested(1.0, 7, 10, 1, 0))) == ["Refuse"]
    leader.handle(L.PullDone(2.0, 7, 0))
    assert kinds(leader.handle(L.PushRequested(3.0, 7, 10, 1, 0))) == ["Schedule", "WakeAt"]
    assert kinds(leader.handle(L.PushRequested(3.5, 7, 10, 1, 0))) == ["Refuse"]
    assert kinds(leader.handle(L.PushRequested(3.6, 99, 10, 1, 0))) == ["Refuse"]


def test_stale_contributions_are_dropped_and_anomalies_rejected():
    cfg = LeaderConfig(penalty=True, warmup=0, max_staleness=1)
    leader = Leader(cfg, FixedGrace(10.0), version=5)
    join_all(leader, 3)
    leader.handle(L.PushRequested(0.0, 0, 10, 1, 5))
    leader.handle(L.PushRequested(0.0, 1, 10, 1, 3))  # two versions old: stale
    leader.handle(L.PushRequested(0.0, 2, 10, 1, 5))
    decide, *_ = finish_round(leader, 1.0, norms=(1.0, 1.0, float("nan")))
    assert decide.accepted == (True, False, False)
    assert leader.ledger.totals() == {
        "consumed": 30,
        "applied": 10,
        "rejected": 10,
        "dropped": 10,
        "outstanding": 0,
    }


def test_token_budget_stops_after_the_round():
    leader = Leader(LeaderConfig(penalty=False, token_budget=25), NoGrace())
    join_all(leader, 2)
    leader.handle(L.PushRequested(0.0, 0, 20, 1, 0))
    leader.handle(L.PushRequested(0.0, 1, 20, 1, 0))
    _, _, _, after = finish_round(leader, 1.0)
    assert after == [L.Stop("token budget 25 reached")]
    assert leader.handle(L.PushRequested(2.0, 0, 1, 1, 1)) == []


def test_duplicate_reports_are_ignored():
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    join_all(leader, 1)
    leader.handle(L.PushRequested(0.0, 0, 10, 1, 0))
    leader.handle(L.TransferDone(0.0, 0, 0))
    assert kinds(leader.handle(L.NormsReported(1.0, 0, (1.0,)))) == ["Decide"]
    assert leader.handle(L.NormsReported(1.1, 0, (1.0,))) == []
    assert kinds(leader.handle(L.MergedNormReported(2.0, 0, 1.0))) == ["Apply"]
    leader.handle(L.ApplyDone(3.0, 0, 1))
    assert leader.handle(L.ApplyDone(3.1, 0, 1)) == []
    assert leader.version == 1


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="weighting"):
        LeaderConfig(weighting="loud")
    with pytest.raises(ValueError, match="missed_heartbeats"):
        LeaderConfig(missed_heartbeats=0)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["push", "silence", "finish", "join"]),
            st.integers(0, 3),
            st.integers(1, 50),
        ),
        max_size=40,
    )
)
def test_token_ledger_balances_under_random_sequences(script):
    leader = Leader(LeaderConfig(penalty=True, warmup=1, heartbeat_interval=5.0), FixedGrace(1.0))
    join_all(leader, 4)
    t = 0.0
    for op, j, tokens in script:
        t += 1.0
        if op == "push" and j in leader.members:
            leader.handle(L.PushRequested(t, j, tokens, 1, leader.version))
        elif op == "join":
            for a in leader.handle(L.Join(t, j)):
                if isinstance(a, L.SendModel):
                    leader.handle(L.PullDone(t, j, leader.version))
        elif op == "silence":
            t += 16.0  # everyone not heard from is evicted
            leader.handle(L.Tick(t))
        elif op == "finish" and leader.round is not None and leader.phase.value == "collecting":
            t += 2.0
            leader.handle(L.Tick(t))
            if leader.round is not None and leader.phase.value == "transfers":
                finish_round(leader, t, norms=tuple(float(tokens) for _ in leader.round.pushes))
        for m in list(leader.members):
            leader.handle(L.Heartbeat(t, m))
        tot = leader.ledger.totals()
        assert (
            tot["consumed"]
            == tot["applied"] + tot["rejected"] + tot["dropped"] + tot["outstanding"]
        )
        assert tot["outstanding"] >= 0
        for j2 in leader.ledger.consumed:
            assert leader.ledger.outstanding(j2) >= 0


def test_a_round_with_nothing_accepted_is_skipped():
    leader = Leader(LeaderConfig(penalty=True, warmup=0), FixedGrace(10.0), version=3)
    join_all(leader, 2)
    leader.handle(L.PushRequested(0.0, 0, 10, 1, 3))
    leader.handle(L.PushRequested(0.0, 1, 10, 1, 3))
    leader.handle(L.TransferDone(0.5, 0, 0))
    leader.handle(L.TransferDone(0.6, 1, 0))
    acts = leader.handle(L.NormsReported(1.0, 0, (float("nan"), float("inf"))))
    assert acts == [L.Discard(0), L.NotifyPull(0, (0, 1), 3)]  # no Decide, no Apply
    leader.handle(L.PullDone(2.0, 0, 3))
    leader.handle(L.PullDone(2.0, 1, 3))
    assert leader.version == 3 and leader.round is None
    rec = leader.tape.rounds()[0]
    assert rec["applied"] is False and rec["version"] == 3 and rec["accepted"] == [False, False]
    assert leader.ledger.totals()["rejected"] == 20
