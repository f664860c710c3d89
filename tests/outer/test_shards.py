"""The shard protocol equals the single-process chain: same subtree, accepted set, clip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax import outer

SHAPES = {
    "embed": {"table": (6, 4)},
    "layer_0": {"attn": (4, 4), "mlp": (4, 8)},
    "layer_1": {"attn": (4, 4), "mlp": (4, 8)},
    "layer_2": {"attn": (4, 4), "mlp": (4, 8)},
    "layer_3": {"attn": (4, 4), "mlp": (4, 8)},
    "norm": (4,),
}


def _tree(rng, lead=()):
    def build(spec):
        if isinstance(spec, dict):
            return {k: build(v) for k, v in spec.items()}
        return jnp.asarray(rng.standard_normal((*lead, *spec)), jnp.float32)

    return build(SHAPES)


def _presets():
    return {
        "dips": lambda: outer.dips(max_norm=1.0, warmup=1),
        "decoupled": lambda: outer.decoupled_diloco(max_norm=2.0),
        "diloco": outer.diloco,
    }


@given(
    num_shards=st.sampled_from([2, 3, 10]),  # 10 = one tensor per follower
    seed=st.integers(0, 2**16),
    preset=st.sampled_from(["dips", "decoupled", "diloco"]),
    assignment=st.sampled_from(["by_layer", "random"]),
)
def test_sharded_round_equals_single_process(num_shards, seed, preset, assignment):
    rng = np.random.default_rng(seed)
    tx = _presets()[preset]()
    params = _tree(rng)
    num = 4
    rounds = [
        jax.tree.map(lambda x: x * rng.uniform(0.05, 0.3), _tree(rng, (num,))) for _ in range(3)
    ]
    # Make learner 3 an outlier in the last round so the penalty has something to do.
    rounds[-1] = jax.tree.map(lambda x: x.at[3].multiply(40.0), rounds[-1])
    tokens = jnp.asarray(rng.integers(1, 100, num), jnp.float32)
    steps = jnp.asarray(rng.integers(1, 8, num), jnp.float32)
    mask = jnp.array([True, True, seed % 2 == 0, True])
    paths = sorted(outer.flatten(params))
    # Every follower owns at least one tensor: the first ones round-robin, the rest by rule.
    if assignment == "by_layer":
        layers = sorted({p[0] for p in paths})
        owner = {p: layers.index(p[0]) % num_shards for p in paths}
    else:
        owner = {p: int(rng.integers(num_shards)) for p in paths}
    for i, p in enumerate(rng.permutation(len(paths))[:num_shards]):
        owner[paths[p]] = i
    shard_of = owner.__getitem__

    state = tx.init(params)
    shard_params = outer.split_tree(params, shard_of, num_shards)
    shard_states = outer.split_state(tx, state, shard_params)
    p_single, p_shards = params, shard_params
    meta = {"tokens": tokens, "steps": steps, "mask": mask}
    for deltas in rounds:
        upd, state = tx.update(deltas, state, p_single, **meta)
        p_single = jax.tree.map(jnp.add, p_single, upd)
        sd = outer.split_tree(deltas, shard_of, num_shards)
        s_upd, shard_states, stats = outer.sharded_update(tx, sd, shard_states, **meta)
        p_shards = [jax.tree.map(jnp.add, p, u) for p, u in zip(p_shards, s_upd, strict=True)]
        # Every shard took the same decisions as the single process.
        if "reject" in state:
            for s in shard_states:
                np.testing.assert_array_equal(s["reject"].count, state["reject"].count)
                np.testing.assert_allclose(s["reject"].mu, state["reject"].mu, rtol=1e-5)
        if "clip" in state:
            for s in shard_states:
                np.testing.assert_allclose(
                    s["clip"].clip_factor, state["clip"].clip_factor, rtol=1e-5
                )
                np.testing.assert_allclose(
                    s["clip"].input_sq_norm, state["clip"].input_sq_norm, rtol=1e-5
                )
        np.testing.assert_allclose(
            stats.learner_sq_norms, outer.learner_sq_norms(deltas), rtol=1e-5
        )
    merged = outer.merge_trees(p_shards)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), merged, p_single
    )
    back = outer.merge_states(tx, shard_states, params)
    if "reject" in state:
        # Scores E = (G - mu) / sigma cancel: G summed shard by shard differs from the flat sum
        # by float32 rounding (~eps * G), which the score magnifies by 1 / sigma.
        rej = state["reject"]
        g_max = float(jnp.max(outer.learner_sq_norms(rounds[-1])))
        sigma = max(float(rej.sigma), 0.05 * float(rej.mu))
        np.testing.assert_allclose(
            back["reject"].recent_scores,
            rej.recent_scores,
            rtol=1e-5,
            atol=16 * np.finfo(np.float32).eps * g_max / sigma,
        )
        back["reject"] = back["reject"]._replace(recent_scores=rej.recent_scores)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), back, state)


def test_outlier_rejected_identically_on_every_shard():
    rng = np.random.default_rng(1)
    deltas = jax.tree.map(lambda x: x * 0.1, _tree(rng, (3,)))
    deltas["layer_1"]["mlp"] = deltas["layer_1"]["mlp"].at[2].multiply(30.0)
    shard_of = lambda p: 0 if p[0] in ("embed", "layer_0") else 1  # noqa: E731
    sd = outer.split_tree(deltas, shard_of, 2)
    g = sum(outer.learner_sq_norms(d) for d in sd)
    mu = float(g[0])
    seed = {"mu0": mu, "sigma0": 0.1 * mu, "recent_scores0": (1.0,)}
    tx = outer.reject_anomalies(**seed)
    # Shard 0 alone sees nothing unusual about learner 2 ...
    local, _ = tx.update(sd[0], tx.init(None))
    assert local.accepted.tolist()[2]
    # ... but with the leader's global G every shard rejects it, whole.
    decisions = [tx.update(d, tx.init(None), learner_sq_norms=g)[0].accepted for d in sd]
    assert [a.tolist() for a in decisions] == [[True, True, False]] * 2


def test_merged_norm_probe_is_jittable():
    rng = np.random.default_rng(2)
    tx = outer.dips(warmup=0)
    params = _tree(rng)
    deltas = _tree(rng, (2,))
    f = jax.jit(
        lambda d, s, g: outer.shard_merged_sq_norm(tx, d, s, learner_sq_norms=g, tokens=jnp.ones(2))
    )
    got = f(deltas, tx.init(params), outer.learner_sq_norms(deltas))
    merged, _ = outer.token_weighted_mean().update(deltas, None, tokens=jnp.ones(2))
    assert float(got) == pytest.approx(float(outer.tree_sq_norm(merged)), rel=1e-6)


def test_split_errors_are_clear():
    with pytest.raises(ValueError, match="outside"):
        outer.split_tree({"a": jnp.ones(1)}, lambda p: 5, 2)
    with pytest.raises(ValueError, match="more than one shard"):
        outer.merge_trees([{"a": jnp.ones(1)}, {"a": jnp.ones(1)}])
