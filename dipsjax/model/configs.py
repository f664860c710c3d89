"""Named decoder configurations, validated eagerly.

Every configuration is a frozen :class:`ModelConfig`; :func:`get_config` returns one by
name, optionally with overrides (``get_config("tiny", num_layers=1)``). Each one can be
built abstractly (``jax.eval_shape``) without memory, which is how ``dipsjax plan`` sizes
the 100B production model.

Names and sources:

* ``tiny`` -- byte-level (256 bytes + 4 specials = 260 tokens), 2 layers, d = 64: CPU tests.
* ``small`` -- byte-level, 4 layers, d = 256 (~3.3M parameters): simulations on CPU.
* ``llama3.2-1b`` -- the published Llama 3.2 1B shapes (1.24B parameters, tied embeddings).
* ``qwen3-14b`` -- the published Qwen3 14B shapes (14.8B parameters, QK-norm, untied).
* ``dips-100b`` -- Di-PS's production model (seed 000 sec. 16: "LLaMA-like dense, 96
  layers, hidden size 8192, intermediate size 36864"). The paper does not give heads or
  vocabulary; we assume LLaMA-3-70B-style attention (64 heads of 128, 8 KV heads: GQA) and
  the Llama 3 vocabulary (128256, untied), which gives 103.6B parameters. Full multi-head
  attention would give 112.7B, outside "100B", so the model must use GQA.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Byte-level vocabulary: 256 byte values plus PAD, BOS, EOS and SEP specials.
BYTE_VOCAB_SIZE = 260

_DTYPES = ("float32", "bfloat16")
#: Activation rematerialisation of each block (:class:`ModelConfig` ``remat``): what the
#: backward pass keeps of a block's forward, the rest recomputed (MaxText's ``remat_policy``).
REMAT_POLICIES = ("none", "full", "save_dots", "save_dots_no_batch")
#: Attention implementations (``jax.nn.dot_product_attention``'s): ``auto`` takes cuDNN's
#: fused kernel on a GPU in bfloat16 and XLA's otherwise.
ATTENTION = ("auto", "xla", "cudnn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shapes and numerics of a LLaMA-style decoder (:class:`dipsjax.model.Llama`).

    Attributes:
      name: configuration name, used in plans and logs.
      vocab_size: number of token ids (byte-level models: 256 + specials = 260).
      d_model: residual width (``hidden_size``).
      num_layers: number of decoder blocks.
      num_heads: query heads.
      num_kv_heads: key/value heads (grouped-query attention); divides ``num_heads``.
      head_dim: per-head width; ``None`` means ``d_model // num_heads``.
      d_ff: SwiGLU intermediate width (``intermediate_size``).
      max_seq_len: default training context (rotary embeddings are computed on the fly,
        so longer sequences work; this sizes data and plans only).
      rope_theta: rotary base frequency.
      norm_eps: RMSNorm epsilon.
      tie_embeddings: output projection reuses the input embedding (``logits = h E^T``).
      qk_norm: RMSNorm over ``head_dim`` on queries and keys before rotary (Qwen3).
      dtype: compute dtype, ``"float32"`` or ``"bfloat16"``; parameters stay ``param_dtype``.
      param_dtype: storage dtype of the (master) parameters.
      init_std: standard deviation of the normal initialiser of every matrix.
      remat: what the backward pass keeps of each block's forward (:data:`REMAT_POLICIES`):
        ``none`` keeps every activation; ``full`` only the block's input (everything is
        recomputed); ``save_dots`` the matmul outputs; ``save_dots_no_batch`` those without
        a batch dimension (the weights-side products). The numbers are the same whichever.
      attention: ``auto`` (cuDNN on a GPU in bfloat16, XLA elsewhere), ``xla`` or ``cudnn``
        (:data:`ATTENTION`).
      loss_chunk: ``0`` (default): the loss takes the whole ``[batch, seq, vocab]`` float32
        logits; ``n > 0``: it takes them ``n`` positions of the sequence at a time, each
        chunk's logits recomputed in the backward pass, so they are never whole
        (:func:`dipsjax.learner.step.lm_loss`; the same loss to float32 rounding: the sum
        is taken in another order).
      scan_layers: ``False`` (default): the blocks are a list, traced one by one;
        ``True``: their parameters are stored stacked along a leading ``layers`` axis and
        the blocks run under ``nnx.scan`` (MaxText's ``scan_layers``): one block is traced
        and compiled whatever the depth, its remat policy applied inside the scan. The
        parameter dict the syncer, checkpoints and exports see is the same either way
        (:func:`dipsjax.learner.step.params_to_dict` unstacks it), as are the numbers to
        float32 rounding.
    """

    name: str = "custom"
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    d_ff: int
    max_seq_len: int = 2048
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qk_norm: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    init_std: float = 0.02
    remat: str = "none"
    attention: str = "auto"
    loss_chunk: int = 0
    scan_layers: bool = False

    def __post_init__(self) -> None:
        for field in (
            "vocab_size",
            "d_model",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "d_ff",
            "max_seq_len",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{field} must be an integer >= 1, got {value!r}")
        if self.head_dim is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"ModelConfig.head_dim is None, so d_model ({self.d_model}) must be a "
                    f"multiple of num_heads ({self.num_heads}); or set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
        if not isinstance(self.head_dim, int) or self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim must be an even integer >= 2 (rotary pairs), "
                f"got {self.head_dim!r}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_kv_heads must divide num_heads ({self.num_heads}) for "
                f"grouped-query attention, got {self.num_kv_heads}"
            )
        if not self.rope_theta > 1.0:
            raise ValueError(f"ModelConfig.rope_theta must be > 1, got {self.rope_theta!r}")
        if not 0.0 < self.norm_eps < 1.0:
            raise ValueError(f"ModelConfig.norm_eps must be in (0, 1), got {self.norm_eps!r}")
        if not self.init_std > 0.0:
            raise ValueError(f"ModelConfig.init_std must be > 0, got {self.init_std!r}")
        if (
            not isinstance(self.loss_chunk, int)
            or isinstance(self.loss_chunk, bool)
            or (self.loss_chunk < 0)
        ):
            raise ValueError(
                f"ModelConfig.loss_chunk must be an integer >= 0 (0: whole logits), "
                f"got {self.loss_chunk!r}"
            )
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"ModelConfig.scan_layers must be a bool, got {self.scan_layers!r}")
        for field, allowed in (("remat", REMAT_POLICIES), ("attention", ATTENTION)):
            if getattr(self, field) not in allowed:
                raise ValueError(
                    f"ModelConfig.{field} must be one of {allowed}, got {getattr(self, field)!r}"
                )
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(
                    f"ModelConfig.{field} must be one of {_DTYPES}, got {getattr(self, field)!r}"
                )

    @classmethod
    def tiny(cls, **overrides: Any) -> ModelConfig:
        """The CPU-test configuration (byte vocabulary, 2 layers, d = 64, seq 128)."""
        return get_config("tiny", **overrides)

    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **overrides)

    @property
    def num_params(self) -> int:
        """Exact parameter count from the shapes (equals the count of the built model)."""
        d, hd = self.d_model, self.head_dim
        assert hd is not None
        attn = d * self.num_heads * hd * 2 + d * self.num_kv_heads * hd * 2
        if self.qk_norm:
            attn += 2 * hd
        mlp = 3 * d * self.d_ff
        block = attn + mlp + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.num_layers * block + embed + d


_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=BYTE_VOCAB_SIZE,
        d_model=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        d_ff=192,
        max_seq_len=128,
    ),
    "small": dict(
        vocab_size=BYTE_VOCAB_SIZE,
        d_model=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        d_ff=768,
        max_seq_len=256,
    ),
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    "llama3.2-1b": dict(
        vocab_size=128_256,
        d_model=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        d_ff=8192,
        max_seq_len=8192,
        rope_theta=500_000.0,
        norm_eps=1e-5,
        tie_embeddings=True,
        dtype="bfloat16",
    ),
    # https://huggingface.co/Qwen/Qwen3-14B/blob/main/config.json
    "qwen3-14b": dict(
        vocab_size=151_936,
        d_model=5120,
        num_layers=40,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        d_ff=17_408,
        max_seq_len=4096,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
        tie_embeddings=False,
        qk_norm=True,
        dtype="bfloat16",
    ),
    # Di-PS seed 000 sec. 16 (96 layers, hidden 8192, intermediate 36864); heads, KV heads
    # and vocabulary are our assumption (see the module docstring).
    "dips-100b": dict(
        vocab_size=128_256,
        d_model=8192,
        num_layers=96,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        d_ff=36_864,
        max_seq_len=4096,
        rope_theta=500_000.0,
        norm_eps=1e-5,
        tie_embeddings=False,
        dtype="bfloat16",
    ),
}

#: Every named configuration, in plan order.
CONFIG_NAMES: tuple[str, ...] = tuple(_CONFIGS)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The named configuration, with optional field overrides.

    Raises:
      ValueError: unknown name (the message lists the known ones) or an invalid field.
    """
    if name not in _CONFIGS:
        raise ValueError(f"unknown model config {name!r}; known: {', '.join(CONFIG_NAMES)}")
    fields = {"name": name, **_CONFIGS[name], **overrides}
    return ModelConfig(**fields)
