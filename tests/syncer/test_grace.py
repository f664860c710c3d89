"""Grace policies: Di-PS tau* formula and its online estimates; Decoupled quorum + slack."""

import dataclasses
import math

import numpy as np
import pytest

from dipsjax.syncer import grace


@pytest.mark.parametrize("rate,miss", [(0.5, 10.0), (2.0, 3.0), (0.1, 100.0)])
def test_optimal_grace_minimises_expected_cost(rate, miss):
    tau = grace.optimal_grace(rate, miss)
    assert tau == pytest.approx(math.log(miss * rate) / rate)

    def cost(t):
        return t + miss * math.exp(-rate * t)

    grid = np.linspace(0, 5 * tau + 1, 20001)
    assert cost(tau) <= min(cost(t) for t in grid) + 1e-9
    # First-order condition C'(tau*) = 1 - C_m lambda exp(-lambda tau*) = 0.
    assert 1 - miss * rate * math.exp(-rate * tau) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("rate,miss", [(0.5, 2.0), (1.0, 1.0), (0.0, 5.0), (2.0, 0.0)])
def test_no_wait_when_missing_is_cheap(rate, miss):
    assert grace.optimal_grace(rate, miss) == 0.0


def test_dynamic_grace_estimates_rate_and_miss_cost_online():
    g = grace.DynamicGrace(smoothing=1.0)
    for k in range(5):
        g.observe_push(k % 3, 4.0 * k)  # a push every 4 s from someone
    assert g.rate == pytest.approx(0.25)
    g.observe_round(opened=0.0, quorum_at=0.0, closed=1.0, ended=21.0)
    assert g.miss_cost == pytest.approx(20.0)
    assert g.window(0.0) == pytest.approx(4.0 * math.log(5.0))
    # The EMA with smoothing 0.5 moves halfway toward a new gap.
    h = grace.DynamicGrace(smoothing=0.5)
    for t in (0.0, 2.0, 8.0):
        h.observe_push(0, t)
    assert 1.0 / h.rate == pytest.approx(0.5 * 6.0 + 0.5 * 2.0)


def test_dynamic_grace_is_capped():
    g = grace.DynamicGrace(smoothing=1.0, max_window=3.0)
    g.observe_push(0, 0.0)
    g.observe_push(1, 100.0)
    g.observe_round(opened=0, quorum_at=0, closed=0, ended=1e6)
    assert g.window(0.0) == 3.0


def test_quorum_grace_slack_formula():
    q = grace.QuorumGrace(k=2, gamma=0.5, smoothing=1.0)
    assert q.quorum(members=4) == 2 and q.quorum(members=1) == 1
    q.observe_push(0, 0.0, train_seconds=100.0)  # tau * xi_step as the learner reports it
    q.observe_push(1, 0.0, train_seconds=150.0)  # the next sync is due at the soonest
    q.observe_round(opened=0.0, quorum_at=10.0, closed=10.0, ended=40.0)
    assert q.slack == pytest.approx(100.0 - (10.0 + 30.0))
    assert q.window(0.0) == pytest.approx(0.5 * 60.0)
    assert grace.QuorumGrace(k=2, grace=False).window(0.0) == 0.0
    q.observe_round(opened=0.0, quorum_at=90.0, closed=90.0, ended=200.0)
    assert q.window(0.0) == 0.0  # negative slack: no grace


def test_quorum_grace_window_does_not_feed_on_itself():
    """Bug: the slack was estimated from push intervals. A learner that waits for its pull
    pushes every ``compute + window + sync`` seconds, so the window grew to about
    gamma / (1 - gamma) times the compute (88 s for 10 s of compute at gamma = 0.9)."""
    q = grace.QuorumGrace(k=1, gamma=0.9)
    t, compute, sync = 0.0, 10.0, 1.0
    for _ in range(200):
        q.observe_push(0, t, train_seconds=compute)
        window = q.window(t)
        q.observe_round(opened=t, quorum_at=t, closed=t + window, ended=t + window + sync)
        t += window + sync + compute  # the learner waited for its pull, then trained
    assert q.window(t) == pytest.approx(0.9 * (compute - sync), rel=1e-6)


def test_a_targeted_quorum_window_waits_only_for_learners_expected_within_it():
    """EXTENSION (``targeted``): learner j is expected at its last pull plus its reported
    training time; the window ends ``margin`` times that training time after the last
    arrival expected inside the bound ``gamma * slack`` (or within that margin past it), at
    once when none is, and is never longer than the bound."""
    q = grace.QuorumGrace(k=1, gamma=0.5, targeted=True, margin=0.1, smoothing=1.0)
    for j, train in ((0, 100.0), (1, 120.0), (2, 130.0)):
        q.observe_push(j, 0.0, train_seconds=train)
    q.observe_round(opened=0.0, quorum_at=0.0, closed=0.0, ended=20.0)
    bound = 0.5 * (100.0 - 20.0)  # gamma * (the shortest report - the sync): 40 s
    q.observe_start(1, 900.0)  # due at 1020
    q.observe_start(2, 950.0)  # due at 1080
    assert q.window(1000.0, absent=[1, 2]) == pytest.approx(20.0 + 0.1 * 120.0)  # 1 only
    assert q.window(1000.0, absent=[2]) == 0.0  # 2 is due past the bound: close at once
    # 5 s past the bound, within its margin of 13 s: it may come early, the whole window
    assert q.window(1035.0, absent=[2]) == pytest.approx(bound)
    assert q.window(1030.0, absent=[1]) == pytest.approx(0.1 * 120.0)  # overdue: a margin
    assert q.window(1000.0, absent=[1, 3]) == pytest.approx(bound)  # 3: nothing to go by
    assert q.window(1000.0, absent=[]) == 0.0
    q.observe_start(1, 990.0)  # due at 1110, the margin would pass the bound: the bound
    assert q.window(1000.0 + 110.0 - bound + 1.0, absent=[1]) == pytest.approx(bound)
    full = dataclasses.replace(q, targeted=False)
    assert full.window(1000.0, absent=[2]) == pytest.approx(bound)  # the default: all of it
    q.forget_learner(1)
    assert q.window(1000.0, absent=[1]) == pytest.approx(bound)
    # Asked again 10 s after the quorum, the bound is what is left of it: 30 s.
    q.observe_start(2, 950.0)  # due at 1080
    assert q.window(1035.0, absent=[2], since=1025.0) == 0.0  # 45 s > 30 + 13
    assert q.window(1035.0, absent=[2]) == pytest.approx(bound)
    assert q.describe() == {
        "policy": "QuorumGrace",
        "k": 1,
        "slack": 80.0,
        "window": bound,
        "targeted": True,
    }
    with pytest.raises(ValueError, match="margin"):
        grace.QuorumGrace(margin=2.0)


def test_a_targeted_window_is_refused_where_it_cannot_hold():
    from dipsjax.sim.config import SimConfig
    from dipsjax.syncer import methods

    with pytest.raises(ValueError, match="overlap"):
        SimConfig(method="decoupled", grace_targeted=True, overlap=True)
    with pytest.raises(ValueError, match="quorum grace policy"):
        methods._grace(methods.MethodSettings(grace_targeted=True), "dynamic")
    assert methods._grace(methods.MethodSettings(grace_targeted=True), "quorum").targeted


def test_a_snapshot_from_before_a_field_loads_with_its_default():
    state = grace.QuorumGrace(k=2).state_dict()
    for name in ("targeted", "margin", "_started"):
        del state["fields"][name]
    assert grace.GracePolicy.from_state_dict(state) == grace.QuorumGrace(k=2)


def test_policy_state_round_trips_through_json():
    import json

    policies = (
        grace.DynamicGrace(),
        grace.QuorumGrace(k=2),
        grace.QuorumGrace(k=2, targeted=True),
        grace.FixedGrace(3.0),
        grace.NoGrace(),
    )
    for p in policies:
        p.observe_push(1, 2.0, train_seconds=5.0)
        p.observe_push(2, 4.0, train_seconds=6.0)
        p.observe_round(opened=0.0, quorum_at=1.0, closed=2.0, ended=9.0)
        p.observe_start(1, 9.0)
        state = json.loads(json.dumps(p.state_dict()))
        q = grace.GracePolicy.from_state_dict(state)
        assert q == p and q.window(10.0, [1]) == p.window(10.0, [1])


def test_policies_validate_and_build_by_name():
    with pytest.raises(ValueError, match="gamma"):
        grace.QuorumGrace(gamma=1.0)
    with pytest.raises(ValueError, match="k"):
        grace.QuorumGrace(k=0)
    with pytest.raises(ValueError, match="seconds"):
        grace.FixedGrace(-1.0)
    with pytest.raises(ValueError, match="grace policy"):
        grace.make_grace("sometimes")
    assert isinstance(grace.make_grace("fixed", seconds=2.0), grace.FixedGrace)
