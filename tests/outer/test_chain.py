"""Whole outer chains: worked example end to end, clipping, Nesterov equivalence, jit+mask."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax import outer


def test_worked_example_full_dips_chain():
    # G = (4, 5, 81) -> C rejected; delta = (0.4, 0.2), |delta| ~ 0.447 < 1 -> no clipping.
    tx = outer.dips(mu0=4.5, sigma0=1.0, recent_scores0=(2.0,))
    params = {"w": jnp.zeros(2)}
    deltas = {"w": jnp.array([[0.2, 0.4], [0.5, 0.1], [9.0, 0.0]])}
    tokens = jnp.array([32_000, 64_000, 10_000])
    g = jnp.array([4.0, 5.0, 81.0])  # the leader's sums over the two shards of the example
    upd, state = tx.update(deltas, tx.init(params), params, tokens=tokens, learner_sq_norms=g)
    np.testing.assert_allclose(state["nesterov"][0].trace["w"], [0.4, 0.2], rtol=1e-6)
    assert float(jnp.sqrt(state["clip"].input_sq_norm)) == pytest.approx(0.4472136, rel=1e-6)
    assert float(state["clip"].clip_factor) == 1.0
    # First Nesterov step from zero momentum: -lr * (g + mu * g).
    np.testing.assert_allclose(upd["w"], -0.7 * 1.8 * np.array([0.4, 0.2]), rtol=1e-6)


@given(
    x=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.integers(1, 16)),
        elements=st.floats(-1e3, 1e3, width=32),
    ),
    c=st.floats(0.01, 10.0),
)
def test_clip_never_exceeds_c(x, c):
    tx = outer.clip_by_global_norm(c)
    out, state = tx.update({"a": x, "b": x[:1] * 2}, tx.init(None))
    norm = float(optax.tree.norm(out))
    assert norm <= c * (1 + 1e-5)
    in_norm = float(optax.tree.norm({"a": x, "b": x[:1] * 2}))
    if in_norm <= c:
        assert float(state.clip_factor) == 1.0
        assert norm == pytest.approx(in_norm, rel=1e-6)
    else:
        assert norm == pytest.approx(c, rel=1e-4)


def test_clip_uses_global_norm_when_given():
    tx = outer.clip_by_global_norm(1.0)
    out, state = tx.update({"w": jnp.array([0.3, 0.4])}, tx.init(None), merged_sq_norm=4.0)
    np.testing.assert_allclose(out["w"], [0.15, 0.2])
    assert float(state.clip_factor) == 0.5


@pytest.mark.parametrize("preset", ["diloco", "dips", "decoupled_plain"])
def test_single_learner_uniform_equals_optax_nesterov(preset):
    lr, mom = 0.7, 0.8
    if preset == "diloco":
        tx = outer.diloco(lr, mom)
    elif preset == "dips":
        tx = outer.dips(lr, mom, max_norm=1e9)
    else:
        tx = outer.decoupled_diloco(lr, mom, rda=False)
    ref = optax.sgd(lr, momentum=mom, nesterov=True)
    params = {"a": jnp.ones((3,)), "b": {"c": jnp.ones((2, 2))}}
    s, r = tx.init(params), ref.init(params)
    p1, p2 = params, params
    rng = np.random.default_rng(0)
    for _ in range(5):
        g = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), params)
        stacked = jax.tree.map(lambda x: x[None], g)
        u1, s = tx.update(stacked, s, p1, tokens=jnp.array([7.0]), steps=jnp.array([3.0]))
        u2, r = ref.update(g, r, p2)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    jax.tree.map(np.testing.assert_array_equal, p1, p2)


def test_single_learner_rda_close_to_optax_nesterov():
    tx, ref = outer.decoupled_diloco(), optax.sgd(0.7, momentum=0.8, nesterov=True)
    params = {"w": jnp.ones((4,))}
    g = {"w": jnp.array([0.3, -1.0, 2.0, 0.5])}
    u1, _ = tx.update(
        jax.tree.map(lambda x: x[None], g), tx.init(params), tokens=[5.0], steps=[5.0]
    )
    u2, _ = ref.update(g, ref.init(params))
    np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-6)


def test_masked_rounds_do_not_recompile_and_match_subset():
    tx = outer.dips()
    params = {"w": jnp.zeros((3,))}
    traces = []

    @jax.jit
    def step(deltas, state, tokens, mask):
        traces.append(1)
        return tx.update(deltas, state, params, tokens=tokens, mask=mask)

    d = {"w": jnp.array([[0.1, 0.2, 0.3], [0.2, 0.1, 0.0], [5.0, 5.0, 5.0]])}
    t = jnp.array([1.0, 2.0, 3.0])
    s0 = tx.init(params)
    u_a, _ = step(d, s0, t, jnp.array([True, True, False]))
    u_b, _ = step(d, s0, t, jnp.array([True, False, True]))
    assert len(traces) == 1
    u_ref, _ = tx.update({"w": d["w"][:2]}, s0, params, tokens=t[:2])
    np.testing.assert_allclose(u_a["w"], u_ref["w"], rtol=1e-6)
    assert not np.allclose(u_a["w"], u_b["w"])


def test_named_chain_state_is_self_describing():
    state = outer.dips().init({"w": jnp.zeros(2)})
    assert set(state) == {"reject", "merge", "clip", "nesterov"}
    assert isinstance(state["reject"], outer.AnomalyState)


def test_preset_arguments_are_validated():
    with pytest.raises(ValueError, match="momentum"):
        outer.dips(momentum=1.5)
    with pytest.raises(ValueError, match="learning_rate"):
        outer.diloco(learning_rate=0.0)
    with pytest.raises(ValueError, match="max_norm"):
        outer.clip_by_global_norm(0.0)
