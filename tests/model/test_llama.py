"""The NNX decoder: causality, grouped-query attention, rotary, tying, QK-norm, annotations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dipsjax.model import LOGICAL_AXIS_RULES, Llama, get_config
from dipsjax.model.llama import RMSNorm, rotary


def tokens(batch=2, seq=16, seed=0, vocab=260):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (batch, seq)), jnp.int32)


@pytest.fixture(scope="module")
def tiny_model():
    return Llama(get_config("tiny"), rngs=nnx.Rngs(0))


def test_logits_shape_and_dtype(tiny_model):
    logits = tiny_model(tokens())
    assert logits.shape == (2, 16, 260) and logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()


def test_causal(tiny_model):
    x = tokens(seq=12)
    y = x.at[:, 7:].set((x[:, 7:] + 1) % 260)
    a, b = tiny_model(x), tiny_model(y)
    np.testing.assert_allclose(a[:, :7], b[:, :7], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[:, 7:], b[:, 7:])


def test_rmsnorm_formula():
    norm = RMSNorm(8, eps=1e-6, rngs=nnx.Rngs(0))
    norm.scale[...] = jnp.arange(1.0, 9.0)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(3, 8)), jnp.float32)
    want = x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-6) * np.arange(1.0, 9.0)
    np.testing.assert_allclose(norm(x), want, rtol=1e-5)


def test_rotary_scores_depend_on_relative_position_only():
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)

    def score(pq, pk):
        rq = rotary(q, jnp.array([pq]), 10_000.0)
        rk = rotary(k, jnp.array([pk]), 10_000.0)
        return float(jnp.sum(rq * rk))

    assert score(5, 3) == pytest.approx(score(12, 10), rel=1e-4)
    assert score(0, 0) == pytest.approx(float(jnp.sum(q * k)), rel=1e-5)
    assert score(5, 3) != pytest.approx(score(5, 4), rel=1e-3)


def reference_attention(attn, x):
    """Naive grouped-query attention: KV heads repeated, explicit causal mask."""
    b, s, _ = x.shape
    h, kh, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    pos = jnp.arange(s)
    q = rotary(attn.q_proj(x).reshape(b, s, h, d), pos, attn.rope_theta)
    k = rotary(attn.k_proj(x).reshape(b, s, kh, d), pos, attn.rope_theta)
    v = attn.v_proj(x).reshape(b, s, kh, d)
    k, v = jnp.repeat(k, h // kh, axis=2), jnp.repeat(v, h // kh, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)
    return attn.o_proj(out.reshape(b, s, h * d))


def test_grouped_query_attention_matches_reference(tiny_model):
    attn = tiny_model.layers[0].attn
    assert attn.num_heads == 4 and attn.num_kv_heads == 2
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 10, 64)), jnp.float32)
    got = attn(x, jnp.arange(10))
    np.testing.assert_allclose(got, reference_attention(attn, x), rtol=1e-4, atol=1e-6)


def test_tied_and_untied_embeddings():
    tied = Llama(get_config("tiny", tie_embeddings=True), rngs=nnx.Rngs(0))
    untied = Llama(get_config("tiny"), rngs=nnx.Rngs(0))
    assert tied.lm_head is None and untied.lm_head is not None
    n_tied = sum(x.size for x in jax.tree.leaves(nnx.state(tied, nnx.Param)))
    n_untied = sum(x.size for x in jax.tree.leaves(nnx.state(untied, nnx.Param)))
    assert n_untied - n_tied == 260 * 64
    x = tokens()
    h = tied.final_norm(_hidden(tied, x))
    np.testing.assert_allclose(tied(x), h @ tied.embed.embedding[...].T, rtol=1e-5, atol=1e-5)


def _hidden(model, x):
    h = model.embed(x)
    for layer in model.layers:
        h = layer(h, jnp.arange(x.shape[1]))
    return h


def test_qk_norm_adds_per_head_norms():
    model = Llama(get_config("tiny", qk_norm=True), rngs=nnx.Rngs(0))
    attn = model.layers[0].attn
    assert attn.q_norm.scale.shape == (16,) and attn.k_norm.scale.shape == (16,)
    assert get_config("tiny", qk_norm=True).num_params == get_config("tiny").num_params + 2 * 2 * 16
    assert np.isfinite(np.asarray(model(tokens()))).all()


def test_bf16_compute_keeps_fp32_parameters():
    f32 = Llama(get_config("tiny"), rngs=nnx.Rngs(0))
    bf16 = Llama(get_config("tiny", dtype="bfloat16"), rngs=nnx.Rngs(0))
    assert {x.dtype for x in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {jnp.dtype("float32")}
    x = tokens()
    a, b = f32(x), bf16(x)
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(a, b, atol=0.05)


def test_every_matrix_carries_logical_axes():
    rules = dict(LOGICAL_AXIS_RULES)
    _, params = nnx.split(Llama(get_config("tiny", qk_norm=True), rngs=nnx.Rngs(0)), nnx.Param)
    for path, var in nnx.to_flat_state(params):
        meta = var.get_metadata()
        axes = meta.get("out_sharding")
        assert axes is not None and len(axes) == var.ndim, path
        assert all(a in rules for a in axes), path
        assert meta.get("sharding_rules") == LOGICAL_AXIS_RULES


def _loss_grads_and_temp_bytes(config):
    import optax

    graphdef, params = nnx.split(Llama(config, rngs=nnx.Rngs(0)), nnx.Param)

    def loss(p, batch):
        logits = nnx.merge(graphdef, p)(batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    batch = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 33)), jnp.int32)
    fn = jax.jit(jax.value_and_grad(loss))
    value, grads = fn(params, batch)
    temp = fn.lower(params, batch).compile().memory_analysis().temp_size_in_bytes
    return float(value), jax.tree.leaves(grads), temp


def test_remat_policies_give_the_same_numbers_in_less_activation_memory():
    ref_loss, ref_grads, ref_temp = _loss_grads_and_temp_bytes(get_config("tiny"))
    temps = {}
    for policy in ("full", "save_dots", "save_dots_no_batch"):
        loss, grads, temps[policy] = _loss_grads_and_temp_bytes(get_config("tiny", remat=policy))
        assert loss == ref_loss
        # Gradients to the last bits of each leaf: the recomputed forward is another XLA
        # program, which may round differently. Up to jax 0.12.0 they were equal bit for bit;
        # 0.12.1 gives the first layer's gradients up to 2 ulps of each leaf's largest value
        # apart (the same for all three policies); a real difference (a missing term) is far larger.
        for got, want in zip(grads, ref_grads, strict=True):
            ulp = np.spacing(np.max(np.abs(want)).astype(np.float32))
            assert np.max(np.abs(got - want)) <= 4 * ulp
    # XLA's own plan of the compiled program's scratch memory: every policy keeps less than
    # keeping everything, and recomputing everything less than keeping the matmul outputs.
    # (On a model this small the two "dots" policies' order is the scheduler's choice.)
    assert max(temps.values()) < ref_temp and temps["full"] < temps["save_dots"]


def test_attention_implementation_is_a_setting():
    tokens = jnp.asarray(np.arange(2 * 16).reshape(2, 16) % 256, jnp.int32)
    out = {
        impl: Llama(get_config("tiny", attention=impl), rngs=nnx.Rngs(0))(tokens)
        for impl in ("auto", "xla")
    }
    np.testing.assert_array_equal(out["auto"], out["xla"])  # auto is XLA's off a GPU
    for field, bad in (("attention", "flash"), ("remat", "some")):
        with pytest.raises(ValueError, match=rf"ModelConfig\.{field} must be one of"):
            get_config("tiny", **{field: bad})


def _lm_loss_grads_and_temp_bytes(config, batch):
    from dipsjax.learner.step import lm_loss

    graphdef, params = nnx.split(Llama(config, rngs=nnx.Rngs(0)), nnx.Param)
    fn = jax.jit(jax.value_and_grad(lambda p, b: lm_loss(nnx.merge(graphdef, p), b)))
    value, grads = fn(params, batch)
    temp = fn.lower(params, batch).compile().memory_analysis().temp_size_in_bytes
    return float(value), jax.tree.leaves(grads), temp


@pytest.mark.parametrize("tie", [True, False])
def test_a_chunked_loss_gives_the_same_numbers_without_whole_logits(tie):
    """Issue 21: ``loss_chunk`` takes the logits 16 positions at a time (a sequence of 60:
    the last chunk padded), recomputed in the backward pass. The loss and every gradient
    equal the whole-logits loss's to float32 rounding (the sums run in another order), and
    XLA's plan of the program's scratch memory is smaller (a vocabulary of 4096: the
    logits dominate). ``loss_chunk=0`` is the model as it was, bit for bit."""
    base = get_config("tiny", vocab_size=4096, tie_embeddings=tie)
    batch = jnp.asarray(np.random.default_rng(1).integers(0, 4096, (4, 61)), jnp.int32)
    ref_loss, ref_grads, ref_temp = _lm_loss_grads_and_temp_bytes(base, batch)
    loss, grads, temp = _lm_loss_grads_and_temp_bytes(
        get_config("tiny", vocab_size=4096, tie_embeddings=tie, loss_chunk=16), batch
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for got, want in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-8)
    whole_logits = 4 * 60 * 4096 * 4  # float32 [batch, seq, vocab]
    assert ref_temp - temp > whole_logits, (temp, ref_temp)  # at least the logits fewer
    # The reference path is the plain model: optax's cross-entropy of its logits.
    _, plain_grads, _ = _loss_grads_and_temp_bytes_of(base, batch)
    for got, want in zip(ref_grads, plain_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match=r"ModelConfig\.loss_chunk must be an integer >= 0"):
        get_config("tiny", loss_chunk=-1)


def _loss_grads_and_temp_bytes_of(config, batch):
    import optax

    graphdef, params = nnx.split(Llama(config, rngs=nnx.Rngs(0)), nnx.Param)

    def loss(p, b):
        logits = nnx.merge(graphdef, p)(b[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[:, 1:]).mean()

    value, grads = jax.jit(jax.value_and_grad(loss))(params, batch)
    return float(value), jax.tree.leaves(grads), None


def _dot_count(config):
    """Matrix products in XLA's optimised program of one loss-and-gradient call."""
    graphdef, params = nnx.split(Llama(config, rngs=nnx.Rngs(0)), nnx.Param)
    fn = jax.jit(jax.grad(lambda p, t: jnp.mean(nnx.merge(graphdef, p)(t) ** 2)))
    text = fn.lower(params, tokens()).compile().as_text()
    return text.count(" dot(")


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_layers_give_the_unrolled_numbers(remat):
    """Issue 21: ``scan_layers`` stores the blocks' parameters stacked (logical axis
    ``layers`` first) and runs them under ``nnx.scan``. Built from the same seed it holds the
    unrolled model's values (stacked); its logits and every gradient equal the unrolled
    model's to float32 rounding, under each remat policy."""
    from dipsjax.learner.step import params_to_dict

    plain = Llama(get_config("tiny", remat=remat, num_layers=3), rngs=nnx.Rngs(0))
    scanned = Llama(
        get_config("tiny", remat=remat, num_layers=3, scan_layers=True), rngs=nnx.Rngs(0)
    )
    for path, var in nnx.to_flat_state(nnx.state(scanned, nnx.Param)):
        if path[0] == "layers":
            assert var.shape[0] == 3 and var.get_metadata()["out_sharding"][0] == "layers"
    want = params_to_dict(nnx.state(plain, nnx.Param))
    got = params_to_dict(nnx.state(scanned, nnx.Param))
    assert list(got["layers"]) == ["0", "1", "2"]
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    x = tokens(seed=3)
    np.testing.assert_allclose(scanned(x), plain(x), rtol=1e-5, atol=1e-6)

    def loss(model, t):
        return jnp.mean(model(t) ** 2)

    g_plain = params_to_dict(nnx.grad(loss)(plain, x))
    g_scanned = params_to_dict(nnx.grad(loss)(scanned, x))
    for a, b in zip(jax.tree.leaves(g_scanned), jax.tree.leaves(g_plain), strict=True):
        # Float32 rounding of sums taken in another order: relative to the tensor's scale.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.max(np.abs(b)))


def test_a_scanned_program_holds_one_block_whatever_the_depth():
    """What the scan is for: XLA compiles one block's products, not one set a layer. The
    unrolled program's matrix products grow with the depth; the scanned one's do not."""
    unrolled = {n: _dot_count(get_config("tiny", num_layers=n)) for n in (2, 6)}
    scanned = {n: _dot_count(get_config("tiny", num_layers=n, scan_layers=True)) for n in (2, 6)}
    assert unrolled[6] > 2 * unrolled[2], unrolled
    assert scanned[6] == scanned[2], scanned
    with pytest.raises(ValueError, match=r"ModelConfig\.scan_layers must be a bool"):
        get_config("tiny", scan_layers="yes")
