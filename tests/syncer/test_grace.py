"""Grace policies: Di-PS tau* formula and its online estimates; Decoupled quorum + slack."""

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


def test_policy_state_round_trips_through_json():
    import json

    for p in (grace.DynamicGrace(), grace.QuorumGrace(k=2), grace.FixedGrace(3.0), grace.NoGrace()):
        p.observe_push(1, 2.0, train_seconds=5.0)
        p.observe_push(2, 4.0, train_seconds=6.0)
        p.observe_round(opened=0.0, quorum_at=1.0, closed=2.0, ended=9.0)
        state = json.loads(json.dumps(p.state_dict()))
        q = grace.GracePolicy.from_state_dict(state)
        assert q == p and q.window(10.0) == p.window(10.0)


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
