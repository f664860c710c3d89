"""Merges: token weighting (Di-PS and Decoupled), RDA properties, masks and NaN rows."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dipsjax import outer

finite = st.floats(-10.0, 10.0, allow_nan=False, width=32)


def stacked():
    return st.tuples(st.integers(1, 5), st.integers(1, 12)).flatmap(
        lambda s: hnp.arrays(np.float32, s, elements=finite)
    )


def test_worked_example_token_weighted_mean():
    tx = outer.token_weighted_mean()
    d = {"w": jnp.array([[0.2, 0.4], [0.5, 0.1]])}
    out, _ = tx.update(d, tx.init(None), tokens=jnp.array([32_000, 64_000]))
    np.testing.assert_allclose(out["w"], [0.4, 0.2], rtol=1e-6)
    assert float(jnp.linalg.norm(out["w"])) == pytest.approx(0.4472136, rel=1e-6)


def test_decoupled_weights_formula():
    t = jnp.array([100.0, 200.0, 300.0])
    s = jnp.array([10.0, 10.0, 30.0])
    w = outer.learner_weights(jnp.ones(3, bool), weighting="decoupled", tokens=t, steps=s)
    raw = np.array([100 * 10.0, 200 * 20.0, 300 * 10.0])  # c_tok * (c_tok / c_steps)
    np.testing.assert_allclose(w, raw / raw.sum(), rtol=1e-6)
    # More data in fewer steps weighs more.
    assert float(w[1]) > float(w[2])


def test_zero_steps_weigh_nothing_and_no_learner_gives_zero():
    w = outer.learner_weights(
        jnp.ones(2, bool), weighting="decoupled", tokens=jnp.array([5.0, 5.0]), steps=[0, 1]
    )
    assert w.tolist() == [0.0, 1.0]
    w = outer.learner_weights(jnp.zeros(2, bool), weighting="tokens", tokens=[1.0, 2.0])
    assert w.tolist() == [0.0, 0.0]


@given(
    t=hnp.arrays(np.float32, st.integers(1, 6), elements=st.floats(1.0, 1e6, width=32)),
    scale=st.floats(1e-3, 1e3),
    kind=st.sampled_from(["tokens", "decoupled"]),
)
def test_token_weights_invariant_to_scaling_all_tokens(t, scale, kind):
    acc = jnp.ones(t.shape, bool)
    steps = np.arange(1, t.size + 1, dtype=np.float32)
    w1 = outer.learner_weights(acc, weighting=kind, tokens=t, steps=steps)
    w2 = outer.learner_weights(acc, weighting=kind, tokens=t * np.float32(scale), steps=steps)
    np.testing.assert_allclose(w1, w2, rtol=2e-5, atol=1e-7)


def test_rejected_and_absent_rows_are_never_read():
    tx = outer.token_weighted_mean()
    d = {"w": jnp.array([[1.0, 1.0], [jnp.nan, jnp.inf], [3.0, 5.0]])}
    out, _ = tx.update(d, tx.init(None), tokens=[1.0, 1.0, 1.0], mask=[True, False, True])
    np.testing.assert_allclose(out["w"], [2.0, 3.0])


def _rda(x, w):
    acc = jnp.ones((x.shape[0],), bool)
    return outer.rda_merge(jnp.asarray(x), jnp.asarray(w / w.sum(), jnp.float32), acc)


@given(
    x=stacked(),
    w=st.lists(st.floats(0.1, 10.0), min_size=5, max_size=5).map(np.float32),
)
def test_rda_norm_is_weighted_mean_norm(x, w):
    w = w[: x.shape[0]]
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    expected = float((w * norms).sum() / w.sum())
    units = np.where(norms[:, None] > 0, x / np.where(norms > 0, norms, 1)[:, None], 0)
    direction = (w[:, None] * units).sum(0) / w.sum()
    # The theorem holds unless the directions (nearly) cancel.
    assume(np.linalg.norm(direction) > 1e-2)
    got = float(jnp.linalg.norm(_rda(x, w)))
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-5)


@given(
    v=hnp.arrays(np.float32, st.integers(1, 12), elements=finite),
    n=st.integers(1, 5),
    w=st.lists(st.floats(0.1, 10.0), min_size=5, max_size=5).map(np.float32),
)
def test_rda_of_identical_inputs_is_that_input(v, n, w):
    x = np.broadcast_to(v, (n, v.size))
    np.testing.assert_allclose(_rda(x, w[:n]), v, rtol=1e-5, atol=1e-6)


def test_rda_zero_inputs_give_zero():
    out = _rda(np.zeros((3, 4), np.float32), np.ones(3, np.float32))
    assert np.all(np.asarray(out) == 0)


def test_rda_keeps_norm_when_learners_disagree_but_mean_shrinks():
    x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    tx = outer.radial_directional_average(weighting="uniform", plain_mean=None)
    out, _ = tx.update({"w": x}, tx.init(None))
    assert float(jnp.linalg.norm(out["w"])) == pytest.approx(1.0, rel=1e-6)
    mean, _ = outer.mean().update({"w": x}, None)
    assert float(jnp.linalg.norm(mean["w"])) == pytest.approx(np.sqrt(0.5), rel=1e-6)


def test_rda_uses_plain_mean_for_embeddings_by_path():
    x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    tx = outer.radial_directional_average(weighting="uniform")
    out, _ = tx.update({"embed": {"table": x}, "mlp": x}, tx.init(None))
    np.testing.assert_allclose(out["embed"]["table"], [0.5, 0.5])
    np.testing.assert_allclose(out["mlp"], [np.sqrt(0.5), np.sqrt(0.5)], rtol=1e-6)


def test_rda_is_per_tensor():
    # Scaling one tensor of one learner does not change the other tensor's merge.
    a = jnp.array([[1.0, 2.0], [3.0, -1.0]])
    b = jnp.array([[0.5], [2.0]])
    tx = outer.radial_directional_average(weighting="uniform", plain_mean=None)
    out1, _ = tx.update({"a": a, "b": b}, None)
    out2, _ = tx.update({"a": a.at[0].multiply(50.0), "b": b}, None)
    np.testing.assert_allclose(out1["b"], out2["b"])


def test_merge_needs_tokens():
    with pytest.raises(ValueError, match="tokens"):
        outer.token_weighted_mean().update({"w": jnp.ones((2, 2))}, None)
    with pytest.raises(ValueError, match="weighting"):
        outer.token_weighted_mean("nope")


def test_merges_run_under_jit_with_mask():
    for tx in (outer.token_weighted_mean(), outer.radial_directional_average()):
        f = jax.jit(lambda d, t, s, m, tx=tx: tx.update(d, None, tokens=t, steps=s, mask=m)[0])
        d = {"w": jnp.arange(12.0).reshape(3, 4)}
        a = f(d, jnp.ones(3), jnp.ones(3), jnp.array([True, True, False]))
        b = f({"w": d["w"][:2]}, jnp.ones(2), jnp.ones(2), jnp.array([True, True]))
        np.testing.assert_allclose(a["w"], b["w"], rtol=1e-6)


def test_partial_quorum_round_is_scaled_by_its_token_share():
    x = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
    tx = outer.radial_directional_average(weighting="uniform", full_round_tokens=400.0)
    tokens = jnp.array([100.0, 100.0, 100.0, 100.0])
    full, _ = tx.update({"w": x}, None, tokens=tokens)
    plain, _ = outer.radial_directional_average(weighting="uniform").update({"w": x}, None)
    np.testing.assert_allclose(full["w"], plain["w"], rtol=1e-6)  # all four: scale 1
    one, _ = tx.update({"w": x}, None, tokens=tokens, mask=[True, False, False, False])
    np.testing.assert_allclose(one["w"], 0.25 * x[0], rtol=1e-6)  # one of four: 1/4
    assert float(outer.round_token_scale(tokens, jnp.ones(4, bool), 100.0)) == 1.0  # capped
    with pytest.raises(ValueError, match="full_round_tokens"):
        outer.token_weighted_mean(full_round_tokens=0.0)
