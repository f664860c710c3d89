"""Followers: the union of their shard updates equals the single-process outer step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dipsjax import outer
from dipsjax.syncer import Follower
from dipsjax.syncer import leader as L

PARAMS = {
    "embed": {"table": np.arange(12.0).reshape(4, 3)},
    "layer_0": {"w": np.ones((3, 3)), "b": np.zeros(3)},
    "layer_1": {"w": 2 * np.ones((3, 3))},
    "head": np.ones(3),
}


def _shard_of(path):
    return {"embed": 0, "layer_0": 1, "layer_1": 2, "head": 0}[path[0]]


def _round(tx, reference, payloads, decide_kwargs):
    fs = [
        Follower(k, shard, tx, capacity=4, reference=reference)
        for k, shard in enumerate(outer.split_tree(PARAMS, _shard_of, 3))
    ]
    learners = tuple(sorted(payloads))
    for j in learners:
        for f, part in zip(fs, outer.split_tree(payloads[j], _shard_of, 3), strict=True):
            f.receive(0, j, part)
    g = sum(f.partial_norms(0, learners) for f in fs)
    decide = L.Decide(0, learners, sq_norms=tuple(float(x) for x in g), **decide_kwargs)
    m = sum(f.merged_partial(decide) for f in fs)
    factor = float(outer.clip_factor(m, 1.0))
    apply = L.Apply(0, 1, factor, m)
    for f in fs:
        assert f.apply(decide, apply) == 1
    return fs, g, m


@pytest.mark.parametrize("reference", ["start", "server"])
def test_followers_equal_single_process(reference):
    rng = np.random.default_rng(0)
    tx = outer.dips(warmup=0)
    ends = {
        j: jax.tree.map(lambda p: p + 0.3 * rng.standard_normal(p.shape), PARAMS) for j in (0, 1, 2)
    }
    payloads = (
        ends
        if reference == "server"
        else {j: jax.tree.map(lambda p, e: p - e, PARAMS, ends[j]) for j in ends}
    )
    kw = dict(
        accepted=(True, False, True),
        tokens=(10, 20, 30),
        steps=(1, 1, 1),
        weights=(0.25, 0.0, 0.75),
    )
    fs, g, m = _round(tx, reference, payloads, kw)
    # Single process: the same chain on the whole tree with the same decision.
    deltas = jax.tree.map(
        lambda *xs: jnp.stack(xs),
        *[jax.tree.map(lambda p, e: p - e, PARAMS, ends[j]) for j in (0, 1, 2)],
    )
    np.testing.assert_allclose(g, outer.learner_sq_norms(deltas), rtol=1e-5)
    state = tx.init(jax.tree.map(jnp.asarray, PARAMS))
    upd, _ = tx.update(
        deltas, state, tokens=jnp.array([10.0, 20, 30]), accepted=jnp.array([True, False, True])
    )
    want = jax.tree.map(lambda p, u: p + u, PARAMS, upd)
    got = outer.merge_trees([f.pull()[1] for f in fs])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
    # Every follower recorded the same global clip factor and merged norm.
    for f in fs:
        assert float(f.opt_state["clip"].input_sq_norm) == pytest.approx(m)


def test_apply_is_idempotent_and_ordered():
    tx = outer.diloco()
    payload = {j: jax.tree.map(lambda p: 0.1 * np.ones_like(p), PARAMS) for j in (0,)}
    kw = dict(accepted=(True,), tokens=(1,), steps=(1,), weights=(1.0,))
    fs, _, m = _round(tx, "start", payload, kw)
    before = jax.device_get(fs[0].params)
    decide = L.Decide(0, (0,), (True,), (1,), (1,), (1.0,), (1.0,))
    assert fs[0].apply(decide, L.Apply(0, 1, 1.0, m)) == 1  # a retried round: no-op
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(fs[0].params), before)
    with pytest.raises(ValueError, match="cannot apply version 3"):
        fs[0].apply(decide, L.Apply(2, 3, 1.0, m))


def test_bad_shards_are_refused_with_a_clear_error():
    f = Follower(0, {"w": np.ones((2, 2))}, outer.diloco(), capacity=2)
    with pytest.raises(ValueError, match="shape"):
        f.receive(0, 1, {"w": np.ones((3, 2))})
    with pytest.raises(ValueError, match="missing"):
        f.receive(0, 1, {"v": np.ones((2, 2))})
    with pytest.raises(ValueError, match="no shard from"):
        f.partial_norms(0, (1,))
    f.receive(0, 1, {"w": np.ones((2, 2))})  # still serving after the bad ones
    assert f.partial_norms(0, (1,)).tolist() == [4.0]
