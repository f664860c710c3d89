"""A LLaMA-style decoder language model in Flax NNX.

Block ``l`` (pre-norm residual, Touvron et al. 2023; Di-PS seed 000 sec. 16 trains a
"LLaMA-like dense" model)::

    h = x + Attn(RMSNorm(x)),      x' = h + SwiGLU(RMSNorm(h))
    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w
    SwiGLU(x)  = W_down (silu(W_gate x) * (W_up x))
    Attn: q = W_q x, k = W_k x, v = W_v x; optional RMSNorm(q), RMSNorm(k) over head_dim
          (Qwen3); rotary position embedding on q, k (Su et al. 2021, half-rotation form);
          grouped-query causal softmax(q k^T / sqrt(head_dim)) v with num_heads / num_kv_heads
          query heads per KV head; out = W_o concat(heads).

``logits = RMSNorm(x_L) W_out``, with ``W_out = E^T`` when embeddings are tied.

Sharding: every parameter carries *logical* axis names through ``nnx.with_partitioning``
(``table_vocab``, ``table_embed``, ``vocab``, ``embed``, ``heads``, ``kv_heads``, ``mlp``,
``norm``) plus the rules :data:`LOGICAL_AXIS_RULES` mapping them to the partition mesh
axes ``fsdp`` (FSDP-style sharding of the model dimension) and ``tensor`` (tensor
parallel over heads, MLP and vocabulary); ``data`` replicates. Shardings are derived from
this metadata (see :func:`dipsjax.learner.mesh.shardings_for`); nothing is built per
array by hand.
Parameters are created unsharded (``eager_sharding=False``) so a model can be built
outside any mesh; the learner materialises them directly sharded with ``jax.jit``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dipsjax.model.configs import ModelConfig

#: Logical axis -> partition mesh axis (``data``, ``fsdp``, ``tensor``:
#: :mod:`dipsjax.learner.mesh`). ``embed`` is sharded over ``fsdp`` (parameters and AdamW
#: state spread over those devices, FSDP/ZeRO-3 style); heads, MLP and vocabulary over
#: ``tensor`` (Megatron-style tensor parallelism); nothing over ``data`` (replicated). The
#: embedding table is sharded on its rows only, over both: with its ``embed`` dimension over
#: ``fsdp`` the backward scatter of a batch-sharded lookup would need a full
#: rematerialisation.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("table_vocab", ("tensor", "fsdp")),
    ("table_embed", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("norm", None),
    ("layers", None),
)

#: The logical axis along which ``scan_layers`` stacks the blocks' parameters (replicated:
#: every device holds every layer, as without the scan).
LAYERS_AXIS = "layers"


def _init(std: float, axes: Sequence[str]):
    return nnx.with_partitioning(
        nnx.initializers.normal(std),
        tuple(axes),
        sharding_rules=LOGICAL_AXIS_RULES,
        eager_sharding=False,
    )


def _dtype(name: str) -> jnp.dtype:
    return jnp.dtype(name)


def _linear(c: ModelConfig, din: int, dout: int, axes: Sequence[str], rngs: nnx.Rngs) -> nnx.Linear:
    """A bias-free projection with the config's dtypes and a partitioned normal init."""
    return nnx.Linear(
        din,
        dout,
        use_bias=False,
        dtype=_dtype(c.dtype),
        param_dtype=_dtype(c.param_dtype),
        kernel_init=_init(c.init_std, axes),
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """``y = x / sqrt(mean(x^2, -1) + eps) * w`` in float32, cast back to ``x``'s dtype."""

    def __init__(self, dim: int, *, eps: float, param_dtype: str = "float32", rngs: nnx.Rngs):
        del rngs  # deterministic initialisation (ones)
        self.eps = eps
        self.scale = nnx.Param(
            jnp.ones((dim,), _dtype(param_dtype)),
            out_sharding=("norm",),
            sharding_rules=LOGICAL_AXIS_RULES,
            eager_sharding=False,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, half-rotation (LLaMA/HF) layout.

    ``x``: ``[..., seq, heads, head_dim]``; ``positions``: ``[seq]``. With
    ``f_i = theta^(-2i/head_dim)``, pairs ``(x_i, x_{i+head_dim/2})`` rotate by ``p f_i``.
    """
    half = x.shape[-1] // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1])
    angles = positions.astype(jnp.float32)[:, None] * freqs[None, :]  # [seq, half]
    cos = jnp.cos(angles)[:, None, :]
    sin = jnp.sin(angles)[:, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query causal self-attention with rotary embeddings and optional QK-norm."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        hd = c.head_dim
        assert hd is not None
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, hd
        self.rope_theta = c.rope_theta
        self.attention = c.attention

        def linear(din: int, dout: int, axes: Sequence[str]) -> nnx.Linear:
            return _linear(c, din, dout, axes, rngs)

        self.q_proj = linear(c.d_model, c.num_heads * hd, ("embed", "heads"))
        self.k_proj = linear(c.d_model, c.num_kv_heads * hd, ("embed", "kv_heads"))
        self.v_proj = linear(c.d_model, c.num_kv_heads * hd, ("embed", "kv_heads"))
        self.o_proj = linear(c.num_heads * hd, c.d_model, ("heads", "embed"))
        if c.qk_norm:
            self.q_norm = RMSNorm(hd, eps=c.norm_eps, param_dtype=c.param_dtype, rngs=rngs)
            self.k_norm = RMSNorm(hd, eps=c.norm_eps, param_dtype=c.param_dtype, rngs=rngs)
        else:
            self.q_norm = None
            self.k_norm = None

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        b, s, _ = x.shape
        q = self.q_proj(x).reshape(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rotary(q, positions, self.rope_theta)
        k = rotary(k, positions, self.rope_theta)
        impl = self.attention
        if impl == "auto":
            gpu = jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
            impl = "cudnn" if gpu else "xla"
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        return self.o_proj(out.reshape(b, s, self.num_heads * self.head_dim))


class MLP(nnx.Module):
    """SwiGLU feed-forward: ``W_down(silu(W_gate x) * W_up x)``."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config

        def linear(din: int, dout: int, axes: Sequence[str]) -> nnx.Linear:
            return _linear(c, din, dout, axes, rngs)

        self.gate_proj = linear(c.d_model, c.d_ff, ("embed", "mlp"))
        self.up_proj = linear(c.d_model, c.d_ff, ("embed", "mlp"))
        self.down_proj = linear(c.d_ff, c.d_model, ("mlp", "embed"))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    """Pre-norm decoder block: ``h = x + Attn(norm(x)); y = h + MLP(norm(h))``."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.attn_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype, rngs=rngs)
        self.attn = Attention(c, rngs=rngs)
        self.mlp_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype, rngs=rngs)
        self.mlp = MLP(c, rngs=rngs)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        h = x + self.attn(self.attn_norm(x), positions)
        return h + self.mlp(self.mlp_norm(h))


class Llama(nnx.Module):
    """LLaMA-style decoder LM: ``tokens [batch, seq] int32 -> logits [batch, seq, vocab]``.

    Logits come out in float32 whatever the compute dtype (the loss is taken in float32).

    Example::

        model = Llama(get_config("tiny"), rngs=nnx.Rngs(0))
        logits = model(jnp.zeros((2, 16), jnp.int32))  # [2, 16, 260]
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        dt, pdt = _dtype(c.dtype), _dtype(c.param_dtype)
        self.embed = nnx.Embed(
            c.vocab_size,
            c.d_model,
            dtype=dt,
            param_dtype=pdt,
            embedding_init=_init(c.init_std, ("table_vocab", "table_embed")),
            rngs=rngs,
        )
        blocks = [Block(c, rngs=rngs) for _ in range(c.num_layers)]
        self.layers = stack_blocks(blocks) if c.scan_layers else nnx.List(blocks)
        self.final_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype, rngs=rngs)
        if c.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nnx.Linear(
                c.d_model,
                c.vocab_size,
                use_bias=False,
                dtype=dt,
                param_dtype=pdt,
                kernel_init=_init(c.init_std, ("embed", "vocab")),
                rngs=rngs,
            )

    def __call__(
        self, tokens: jax.Array, *, activation_sharding: jax.sharding.Sharding | None = None
    ) -> jax.Array:
        """Logits for ``tokens``.

        Args:
          tokens: int ``[batch, seq]``.
          activation_sharding: optional sharding of the residual stream ``[batch, seq,
            d_model]``, imposed after the embedding and after every block (the learner
            passes ``P(("data", "fsdp"), None, None)`` on its mesh, so FSDP-sharded weights are
            gathered rather than activations resharded). The model never reads a mesh.
        """
        return self.logits(self.hidden(tokens, activation_sharding=activation_sharding))

    def hidden(
        self, tokens: jax.Array, *, activation_sharding: jax.sharding.Sharding | None = None
    ) -> jax.Array:
        """The final-normed residual stream ``[batch, seq, d_model]`` the output projection
        reads (:meth:`logits` of it is the model's output); arguments as for a call."""
        positions = jnp.arange(tokens.shape[-1], dtype=jnp.int32)

        def constrain(x: jax.Array) -> jax.Array:
            if activation_sharding is None:
                return x
            return jax.lax.with_sharding_constraint(x, activation_sharding)

        x = constrain(self.embed(tokens))
        block = _remat(self.config.remat)
        if self.config.scan_layers:

            @nnx.scan(
                in_axes=(nnx.Carry, 0),
                out_axes=nnx.Carry,
                transform_metadata={nnx.PARTITION_NAME: LAYERS_AXIS},
            )
            def run(x: jax.Array, layer: Block) -> jax.Array:
                return constrain(block(layer, x, positions))

            x = run(x, self.layers)
        else:
            for layer in self.layers:
                x = constrain(block(layer, x, positions))
        return self.final_norm(x)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits ``[..., vocab]`` of final-normed states ``[..., d_model]``."""
        out = self.embed.attend(hidden) if self.lm_head is None else self.lm_head(hidden)
        return out.astype(jnp.float32)


def stack_blocks(blocks: Sequence[Block]) -> Block:
    """One :class:`Block` whose parameters are ``blocks``' stacked along a leading axis
    (logical axis :data:`LAYERS_AXIS`), for ``nnx.scan``: the same values as the list, so a
    scanned model starts where the unrolled one of the same seed starts."""
    graphdef, *_ = nnx.split(blocks[0], nnx.Param)
    states = [nnx.state(b, nnx.Param) for b in blocks]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    for _, variable in nnx.to_flat_state(stacked):
        names = variable.get_metadata().get("out_sharding")
        if names is not None:
            variable.set_metadata(out_sharding=(LAYERS_AXIS, *names))
    return nnx.merge(graphdef, stacked)


def _call_block(layer: Block, x: jax.Array, positions: jax.Array) -> jax.Array:
    return layer(x, positions)


_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_saveable,
    "save_dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _remat(policy: str):
    """A block's call under the config's rematerialisation policy (``none``: as is)."""
    if policy == "none":
        return _call_block
    return nnx.remat(_call_block, policy=_POLICIES[policy])


def abstract_model(config: ModelConfig) -> Llama:
    """The model with ``jax.ShapeDtypeStruct`` leaves: no memory, any size (``nnx.eval_shape``)."""
    return nnx.eval_shape(lambda: Llama(config, rngs=nnx.Rngs(0)))


def count_params(tree) -> int:
    """Number of scalars in a parameter tree (arrays or ``ShapeDtypeStruct`` leaves)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        n = 1
        for dim in leaf.shape:
            n *= int(dim)
        total += n
    return total
