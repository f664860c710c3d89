"""The inner step: sharded equals unsharded on 1-8 devices; optimizer, donation, BF16."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dipsjax.learner import (
    InnerOptimizerConfig,
    InnerStep,
    cross_entropy,
    make_inner_optimizer,
    make_partition_mesh,
    params_from_dict,
    params_to_dict,
    tokens_in,
)
from dipsjax.learner.step import learning_rate_schedule
from dipsjax.model import Llama, get_config

# Large enough that AdamW moves parameters visibly in two steps.
OPT = InnerOptimizerConfig(learning_rate=1e-3)


def batches(n, *, batch=8, seq=32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 260, (batch, seq + 1)).astype(np.int32) for _ in range(n)]


def host(tree):
    # Copies: a NumPy view of a CPU buffer would pin it and block donation.
    return [np.array(x, copy=True) for x in jax.tree.leaves(jax.device_get(tree))]


@functools.cache
def tiny_init(**overrides):
    """Host copy of ``Llama(tiny, rngs=nnx.Rngs(0))``'s parameters (built eagerly, once)."""
    model = Llama(get_config("tiny", **overrides), rngs=nnx.Rngs(0))
    return jax.device_get(params_to_dict(nnx.state(model, nnx.Param)))


def run_two_steps(inner, init, data):
    params = inner.put_params(init)
    opt_state = inner.init_opt_state(params)
    metrics = []
    for batch in data:
        old = params, opt_state
        params, opt_state, m = inner.step(params, opt_state, inner.put_batch(batch))
        # The step donates the parameter and optimizer buffers.
        assert all(x.is_deleted() for x in jax.tree.leaves(old)), [
            (jax.tree_util.keystr(k), x.shape)
            for k, x in jax.tree_util.tree_leaves_with_path(old)
            if not x.is_deleted()
        ]
        metrics.append({k: float(v) for k, v in m.items()})
        if not metrics[1:]:
            # After one step mu = (1 - b1) * g (the gradient norm is below the clip norm).
            mu = host(opt_state["adamw"][0].mu)
    return metrics, mu, host(params), host(opt_state)


@pytest.fixture(scope="module")
def unsharded():
    inner = InnerStep(get_config("tiny"), OPT, mesh=None)
    init = tiny_init()
    loss, grads = inner.loss_and_grads(inner.put_params(init), inner.put_batch(batches(1)[0]))
    return init, float(loss), host(grads), run_two_steps(inner, init, batches(2))


# (data, fsdp, tensor): each axis alone, pairs, and all three (8 CPU devices as 2 x 2 x 2).
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1), (1, 2, 1), (1, 1, 2), (2, 1, 1), (1, 2, 2), (1, 4, 2), (1, 8, 1), (2, 2, 2)],
)
def test_sharded_step_matches_unsharded(shape, unsharded):
    init, ref_loss, ref_grads, (ref_metrics, ref_mu, ref_params, ref_opt) = unsharded
    data, fsdp, tensor = shape
    devices = jax.devices()[: data * fsdp * tensor]
    mesh = make_partition_mesh(devices, data=data, fsdp=fsdp, tensor=tensor)
    assert dict(mesh.shape) == {"data": data, "fsdp": fsdp, "tensor": tensor}
    inner = InnerStep(get_config("tiny"), OPT, mesh=mesh)
    metrics, mu, params, opt_state = run_two_steps(inner, init, batches(2))
    assert metrics[0]["loss"] == pytest.approx(ref_loss, rel=1e-6)
    assert metrics[0]["grad_norm"] < OPT.clip_norm
    for got, want in zip(metrics, ref_metrics, strict=True):
        assert got == pytest.approx(want, rel=1e-5)
    # Gradients: sharded (from the first AdamW moment) against the unsharded value_and_grad.
    for got, want in zip(mu, ref_grads, strict=True):
        np.testing.assert_allclose(got / (1 - OPT.b1), want, rtol=1e-4, atol=1e-7)
    for got, want in zip(mu, ref_mu, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-8)
    # AdamW divides by |g| per element, so where g ~ 0 a rounding-level change of g moves the
    # update by up to a whole step: all elements within 2 steps, all but 0.1% within 1%.
    lr = OPT.learning_rate
    for got, want in zip(params, ref_params, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=2 * 2 * lr)
        assert np.mean(np.abs(got - want) > 1e-2 * lr) < 1e-3
    for got, want in zip(opt_state, ref_opt, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    shardings = jax.tree.leaves(inner.param_shardings)
    assert all(s.mesh is mesh for s in shardings)


def test_sharded_init_equals_unsharded_init(unsharded):
    init = unsharded[0]
    inner = InnerStep(
        get_config("tiny"), OPT, mesh=make_partition_mesh(jax.devices()[:8], tensor=2)
    )
    params = inner.init_params(0)
    assert {s.spec for s in jax.tree.leaves(jax.tree.map(lambda x: x.sharding, params))} == {
        s.spec for s in jax.tree.leaves(inner.param_shardings)
    }
    for got, want in zip(host(params), host(init), strict=True):
        np.testing.assert_array_equal(got, want)


def test_loss_is_mean_next_token_cross_entropy(unsharded):
    init, loss = unsharded[0], unsharded[1]
    batch = batches(1)[0]
    model = Llama(get_config("tiny"), rngs=nnx.Rngs(0))
    logits = np.asarray(model(jnp.asarray(batch[:, :-1])), np.float64)
    logp = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
    want = -np.mean(np.take_along_axis(logp, batch[:, 1:, None], -1))
    assert loss == pytest.approx(want, rel=1e-5)
    assert loss == pytest.approx(np.log(260), rel=0.05)  # near-uniform at initialisation
    assert jax.tree.leaves(init)[0].dtype == np.float32
    np.testing.assert_allclose(
        cross_entropy(jnp.zeros((1, 3, 4)), jnp.array([[0, 1, 3]])), np.full((1, 3), np.log(4))
    )


def test_bf16_compute_keeps_fp32_master_weights(unsharded):
    inner = InnerStep(get_config("tiny", dtype="bfloat16"), OPT, mesh=None)
    params = inner.put_params(unsharded[0])
    params, opt_state, metrics = inner.step(
        params, inner.init_opt_state(params), inner.put_batch(batches(1)[0])
    )
    # Gradients are taken with respect to FP32 parameters: FP32 moments, FP32 weights.
    assert {x.dtype for x in jax.tree.leaves((params, opt_state))} <= {
        jnp.dtype("float32"),
        jnp.dtype("int32"),
    }
    assert float(metrics["loss"]) == pytest.approx(unsharded[1], abs=0.02)


def test_tokens_counted_as_batch_times_seq_len():
    assert tokens_in(np.zeros((8, 129), np.int32)) == 8 * 128
    with pytest.raises(ValueError, match="seq_len"):
        tokens_in(np.zeros((8,), np.int32))
    with pytest.raises(ValueError, match="integer"):
        tokens_in(np.zeros((2, 5), np.float32))


def test_defaults_follow_the_paper():
    config = InnerOptimizerConfig()
    assert config.learning_rate == 6e-5 and config.clip_norm == 1.0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"schedule": "step"}, "schedule"),
        ({"schedule": "cosine"}, "decay_steps"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"b2": 1.0}, "b2"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"end_lr_ratio": 2.0}, "end_lr_ratio"),
    ],
)
def test_invalid_optimizer_fields_are_named(overrides, field):
    with pytest.raises(ValueError, match=field):
        InnerOptimizerConfig(**overrides)


def test_schedules():
    warm = learning_rate_schedule(InnerOptimizerConfig(learning_rate=1.0, warmup_steps=4))
    assert [float(warm(i)) for i in (0, 2, 4, 100)] == pytest.approx([0.0, 0.5, 1.0, 1.0])
    cos = learning_rate_schedule(
        InnerOptimizerConfig(
            learning_rate=1.0, warmup_steps=2, schedule="cosine", decay_steps=10, end_lr_ratio=0.1
        )
    )
    assert float(cos(2)) == pytest.approx(1.0)
    assert float(cos(7)) == pytest.approx(0.55, rel=1e-5)
    assert float(cos(12)) == pytest.approx(0.1, rel=1e-5)
    lin = learning_rate_schedule(
        InnerOptimizerConfig(learning_rate=1.0, schedule="linear", decay_steps=10, end_lr_ratio=0.0)
    )
    assert float(lin(5)) == pytest.approx(0.5)


def test_clipping_and_decay_mask():
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones((2,))}
    grads = {"w": jnp.full((2, 2), 100.0), "b": jnp.zeros((2,))}
    tx = make_inner_optimizer(
        InnerOptimizerConfig(learning_rate=1.0, clip_norm=1.0, weight_decay=0.5)
    )
    state = tx.init(params)
    assert "clip" in state and "adamw" in state
    clipped, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    assert float(optax.tree.norm(clipped)) == pytest.approx(1.0)
    updates, _ = tx.update(grads, state, params)
    # Matrices decay (update = -(1 + 0.5 * 1)), vectors do not (zero gradient, no decay).
    np.testing.assert_allclose(updates["w"], -1.5, rtol=1e-4)
    np.testing.assert_allclose(updates["b"], 0.0)


def test_parameter_dicts_round_trip_and_name_mismatches():
    inner = InnerStep(get_config("tiny"), OPT, mesh=None)
    tree = tiny_init()
    state = params_from_dict(inner.abstract_params, tree)
    again = params_to_dict(state)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(tree), strict=True):
        assert a is b
    bad = {**tree, "final_norm": {"scale": np.zeros((3,), np.float32)}}
    with pytest.raises(ValueError, match=r"final_norm/scale.*\(64,\)"):
        params_from_dict(inner.abstract_params, bad)
    missing = {k: v for k, v in tree.items() if k != "lm_head"}
    with pytest.raises(ValueError, match="lm_head"):
        params_from_dict(inner.abstract_params, missing)


def canonical(tree):
    """``{path: host copy}`` of a parameter-shaped state in the dict the syncer sees."""
    from dipsjax import outer

    return {p: np.array(x, copy=True) for p, x in outer.flatten(params_to_dict(tree)).items()}


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2, 2)])
def test_a_scanned_sharded_step_matches_the_unrolled_unsharded_one(shape):
    """Issue 21: a learner whose blocks are stacked and scanned (``scan_layers``), on a
    (data, fsdp, tensor) mesh of CPU devices, starts from the unrolled model's parameter
    dict and takes two AdamW steps to the unrolled unsharded learner's parameters and
    moments, seen through the same dict. The stacked layer axis is replicated; the norm
    scales of the stacked blocks get no weight decay (a rank-2 stack of vectors)."""
    init = tiny_init()
    plain = InnerStep(get_config("tiny"), OPT, mesh=None)
    data, fsdp, tensor = shape
    mesh = make_partition_mesh(
        jax.devices()[: data * fsdp * tensor], data=data, fsdp=fsdp, tensor=tensor
    )
    scanned = InnerStep(get_config("tiny", scan_layers=True), OPT, mesh=mesh)
    kernel = scanned.param_shardings["layers"]["attn"]["q_proj"]["kernel"].get_value()
    assert kernel.spec[0] is None and kernel.mesh is mesh
    results = []
    for inner in (plain, scanned):
        params = inner.put_params(init)
        opt_state = inner.init_opt_state(params)
        losses = []
        for batch in batches(2):
            params, opt_state, m = inner.step(params, opt_state, inner.put_batch(batch))
            losses.append(float(m["loss"]))
        adam = opt_state["adamw"][0]
        results.append((losses, canonical(params), canonical(adam.mu), canonical(adam.nu)))
    (ref_losses, *ref), (losses, *got) = results
    assert losses == pytest.approx(ref_losses, rel=1e-6)
    lr = OPT.learning_rate
    for name, got_tree, ref_tree in zip(("params", "mu", "nu"), got, ref, strict=True):
        assert list(got_tree) == list(ref_tree)
        for path, want in ref_tree.items():
            have = got_tree[path]
            if name == "params":  # AdamW's per-element division: as in the test above
                np.testing.assert_allclose(have, want, rtol=0, atol=2 * 2 * lr, err_msg=str(path))
                assert np.mean(np.abs(have - want) > 1e-2 * lr) < 1e-3, path
            else:
                np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-7, err_msg=str(path))
    # The decay mask, per layer: a stacked norm scale is a vector, a stacked kernel a matrix.
    from dipsjax.learner.step import _decay_mask

    mask = {
        "/".join(map(str, p)): v.get_value()
        for p, v in nnx.to_flat_state(_decay_mask(scanned.abstract_params))
    }
    assert mask["layers/attn_norm/scale"] is False and mask["layers/mlp/up_proj/kernel"] is True


def test_scanned_parameter_dicts_round_trip_and_name_a_missing_layer():
    inner = InnerStep(get_config("tiny", scan_layers=True), OPT, mesh=None)
    tree = tiny_init()
    state = params_from_dict(inner.abstract_params, tree)
    stacked = state["layers"]["attn"]["q_proj"]["kernel"].get_value()
    assert stacked.shape == (2, 64, 64)
    np.testing.assert_array_equal(stacked[1], tree["layers"]["1"]["attn"]["q_proj"]["kernel"])
    again = params_to_dict(state)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(tree), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(again) == jax.tree.structure(tree)
    missing = {**tree, "layers": {"0": tree["layers"]["0"]}}
    with pytest.raises(ValueError, match=r"at /layers: missing keys \['1'\]"):
        params_from_dict(inner.abstract_params, missing)
    bad = {
        **tree,
        "layers": {
            **tree["layers"],
            "1": {**tree["layers"]["1"], "attn_norm": {"scale": np.ones(3)}},
        },
    }
    with pytest.raises(ValueError, match=r"layers/1/attn_norm/scale.*\(64,\)"):
        params_from_dict(inner.abstract_params, bad)


def test_the_inner_clip_is_optax_s_rule_as_one_scalar_factor():
    """``clip_by_global_norm``: optax's trigger and state, the clip taken as a factor
    (XLA fuses it into AdamW instead of writing out a second float32 copy of every
    gradient: 4.9 GB at 1B). Below the norm it passes the gradients bit for bit; above it
    gives optax's result to float32 rounding, with global norm c."""
    from dipsjax.learner.step import clip_by_global_norm

    rng = np.random.default_rng(0)
    grads = {"a": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32), "b": jnp.ones(7)}
    norm = float(optax.tree.norm(grads))
    for c in (2 * norm, 0.1 * norm):
        ours, state = jax.jit(clip_by_global_norm(c).update)(grads, optax.EmptyState())
        theirs, _ = jax.jit(optax.clip_by_global_norm(c).update)(grads, optax.EmptyState())
        assert isinstance(state, optax.EmptyState)
        for k, g in grads.items():
            if c > norm:
                np.testing.assert_array_equal(ours[k], g)
            np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6)
        assert float(optax.tree.norm(ours)) == pytest.approx(min(c, norm), rel=1e-6)
