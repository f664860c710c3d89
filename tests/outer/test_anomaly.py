"""Di-PS anomaly penalty: sec. 8 formulas, sec. 11 worked example, warm-up, NaN, masks."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dipsjax import outer, rules


def _decide(state, g, present=None, **kw):
    g = jnp.asarray(g, jnp.float32)
    present = jnp.ones(g.shape, bool) if present is None else jnp.asarray(present)
    return outer.score_learners(state, g, present, **kw)


def test_worked_example_rejects_c():
    # seed 000 sec. 11: G = (4, 5, 81), mu ~ 4.5, sigma ~ 1, max recent E = 2 -> threshold 6.
    state = outer.init_anomaly_state(mu=4.5, sigma=1.0, recent_scores=(2.0,))
    dec = _decide(state, [4.0, 5.0, 81.0])
    np.testing.assert_allclose(dec.scores, [-0.5, 0.5, 76.5], rtol=0, atol=1e-6)
    assert float(dec.threshold) == pytest.approx(6.0)
    assert dec.accepted.tolist() == [True, True, False]


def test_ema_update_matches_paper_formulas():
    alpha = 0.02
    state = outer.init_anomaly_state(mu=4.5, sigma=1.0, recent_scores=(2.0,))
    g = np.array([4.0, 5.0, 81.0], np.float32)
    dec = _decide(state, g)
    new = outer.fold_history(state, g, dec.scores, dec.accepted, alpha=alpha)
    mu, sigma = 4.5, 1.0
    for gj in (4.0, 5.0):  # C rejected: never enters the history
        mu_new = alpha * gj + (1 - alpha) * mu
        sigma = math.sqrt((1 - alpha) * sigma**2 + alpha * (gj - mu_new) ** 2)
        mu = mu_new
    assert float(new.mu) == pytest.approx(mu, rel=1e-6)
    assert float(new.sigma) == pytest.approx(sigma, rel=1e-6)
    valid = np.asarray(new.recent_scores)[np.asarray(new.recent_valid)]
    np.testing.assert_allclose(sorted(valid), [-0.5, 0.5, 2.0], atol=1e-6)


def test_whole_learner_rejected_from_summed_shard_norms():
    # Learner 2 looks normal on each layer alone, but its whole-model norm is anomalous.
    tx = outer.reject_anomalies(mu0=4.5, sigma0=1.0, recent_scores0=(2.0,))
    layer_a = jnp.array([[2.0], [2.0], [4.0]])  # squared: 4, 4, 16
    layer_b = jnp.array([[0.0], [1.0], [8.0]])  # squared: 0, 1, 64  -> G = 4, 5, 80
    out, _ = tx.update({"a": layer_a, "b": layer_b}, tx.init(None))
    assert out.accepted.tolist() == [True, True, False]


def test_warmup_accepts_then_learns_then_rejects():
    tx = outer.reject_anomalies(warmup=3)
    state = tx.init(None)
    update = jax.jit(tx.update)
    rng = np.random.default_rng(0)
    # During warm-up even a large norm is accepted: there is no history to judge it by.
    out, state = update({"w": jnp.array([[100.0]])}, state)
    assert out.accepted.tolist() == [True]
    for _ in range(30):
        x = 1.0 + 0.05 * rng.standard_normal()
        out, state = update({"w": jnp.array([[x]])}, state)
        assert out.accepted.tolist() == [True]
    # mu started as the running mean (alpha_n = max(alpha, 1/n)), not stuck at 100**2.
    assert float(state.mu) < 10 * 100.0**2 / 31
    # Once warm, an outlier is rejected and does not enter the history.
    before = state
    out, state = update({"w": jnp.array([[1000.0]])}, state)
    assert out.accepted.tolist() == [False]
    assert float(state.mu) == float(before.mu)
    assert int(state.count) == int(before.count)


def test_non_finite_always_rejected_even_when_cold():
    tx = outer.reject_anomalies()
    d = {"w": jnp.array([[1.0, 2.0], [jnp.nan, 0.0], [jnp.inf, 1.0]])}
    out, state = tx.update(d, tx.init(None))
    assert out.accepted.tolist() == [True, False, False]
    assert np.isfinite(float(state.mu)) and np.isfinite(float(state.sigma))


def test_absent_learners_neither_accepted_nor_folded():
    tx = outer.reject_anomalies(mu0=4.5, sigma0=1.0, recent_scores0=(2.0,))
    d = {"w": jnp.array([[2.0], [2.1], [2.2]])}
    mask = jnp.array([True, False, True])
    out, state = tx.update(d, tx.init(None), mask=mask)
    assert out.accepted.tolist() == [True, False, True]
    assert int(state.count) == 1_000_000 + 2


def test_leader_override_is_applied_and_folded():
    tx = outer.reject_anomalies(mu0=4.5, sigma0=1.0, recent_scores0=(2.0,))
    d = {"w": jnp.array([[2.0], [2.0]])}
    out, state = tx.update(d, tx.init(None), accepted=jnp.array([False, True]))
    assert out.accepted.tolist() == [False, True]
    assert int(state.count) == 1_000_000 + 1


def test_threshold_floor_keeps_threshold_positive():
    # All recent scores negative: beta * max(recent E) would be <= 0 and reject the mean.
    state = outer.init_anomaly_state(mu=4.0, sigma=1.0, recent_scores=(-1.0, -0.5))
    dec = _decide(state, [4.5, 6.5, 7.5])
    assert float(dec.threshold) == pytest.approx(3.0)
    assert dec.accepted.tolist() == [True, True, False]


def test_invalid_arguments_name_the_field():
    with pytest.raises(ValueError, match="alpha"):
        outer.reject_anomalies(alpha=0.0)
    with pytest.raises(ValueError, match="beta"):
        outer.reject_anomalies(beta=-1.0)
    tx = outer.reject_anomalies()
    with pytest.raises(ValueError, match="mask"):
        tx.update({"w": jnp.ones((2, 3))}, tx.init(None), mask=jnp.ones(3, bool))
    with pytest.raises(ValueError, match="leading learner axis"):
        tx.update({"w": jnp.ones((2, 3)), "b": jnp.ones((3,))}, tx.init(None))


def _ablation():
    """``benchmarks/anomaly_ablation.py``: the stream whose figures the README quotes."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "anomaly_ablation.py"
    spec = importlib.util.spec_from_file_location("anomaly_ablation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paper_cold_start_lets_an_early_outlier_blind_the_detector():
    # mu = sigma = 0 at the start: the first round scores +inf, the threshold stays +inf until
    # the recent-score stack cycles, and the outlier accepted meanwhile poisons the history.
    ab = _ablation()
    for stream in ab.STREAMS:
        assert ab.run(rules.AnomalyConfig.paper(), stream)["outliers_rejected"] == 0.0
        ours = ab.run(rules.AnomalyConfig(warmup=3), stream)
        assert ours["outliers_rejected"] == 1.0 and ours["normal_rejected"] == 0.0


def test_without_the_max_floor_falling_norms_reject_normal_learners():
    # Norms falling fast make every recent score negative: beta * max(recent E) < 0.
    ab = _ablation()
    no_floor = ab.run(rules.AnomalyConfig(warmup=3, min_max_score=None), "fast_decay")
    assert no_floor["normal_rejected"] > 0.9
    assert ab.run(rules.AnomalyConfig(warmup=3), "fast_decay")["normal_rejected"] == 0.0


def test_numpy_leader_rule_matches_the_jax_transform():
    rng = np.random.default_rng(1)
    cfg = rules.AnomalyConfig(warmup=2)
    st_np = rules.init_history(np, cfg.history)
    st_jx = outer.init_anomaly_state(history=cfg.history)
    for _ in range(20):
        g = rng.lognormal(0, 0.3, 5).astype(np.float32) * 10
        present = rng.random(5) > 0.2
        with np.errstate(over="ignore", divide="ignore"):
            d_np = rules.score(
                np, st_np, g, present, beta=3.0, warmup=2, min_max_score=1.0, min_sigma_ratio=0.0
            )
        d_jx = outer.score_learners(st_jx, g, present, warmup=2)
        assert d_np.accepted.tolist() == np.asarray(d_jx.accepted).tolist()
        np.testing.assert_allclose(d_np.scores, d_jx.scores, rtol=1e-5)
        st_np = rules.fold(np, st_np, g, d_np.scores, d_np.accepted, alpha=0.02, warmup=2)
        st_jx = outer.fold_history(st_jx, g, d_jx.scores, d_jx.accepted, warmup=2)
        np.testing.assert_allclose(st_np.mu, st_jx.mu, rtol=1e-5)
        np.testing.assert_allclose(st_np.sigma, st_jx.sigma, rtol=1e-5)
