"""Wire codecs for pseudo-gradients: pure functions ``encode -> uint8 payload -> decode``.

Di-PS sends parameters as BF16 and keeps the outer state in FP32 (seed 000 sec. 12, 15);
Decoupled DiLoCo reports int4 outer gradients close to bf16 quality and 2-bit or 1-bit
beyond its acceptable range (seed 003). Codecs:

=========  ==========================  ===============================================
codec      bytes per value             error bound (round to nearest)
=========  ==========================  ===============================================
``fp32``   4                           exact
``bf16``   2                           ``|x' - x| <= 2**-8 * |x|`` (normal range)
``int8``   1 (+4 per block scale)      ``|x' - x| <= max|block| / 254``
``int4``   0.5 (+4 per block scale)    ``|x' - x| <= max|block| / 14``
``stat2``  0.25 (+8 per block)         ``|x' - x| <= max_k width_k + 2**-8 * max|block|``
=========  ==========================  ===============================================

Integer codecs are symmetric absmax quantizers with one FP32 scale per block of
``block_size`` consecutive values (the flattened tensor, zero-padded): ``s = max|block| * (1/q)``
in FP32 (two roundings: the same bits eagerly and under ``jit``) with ``q = 127`` (int8) or
``7`` (int4), ``x' = s * round(x / s)``; the bounds of the table hold up to the FP32
rounding of ``s``, ``x / s`` and ``s * q``, a factor ``1 + (4q + 3) 2**-24`` (first order
``(4q + 2) 2**-24``; :func:`error_bound` includes it). A non-finite value turns
its whole block non-finite after decoding, so a corrupt contribution stays detectable.

``stat2`` (EXTENSION: a statistical 2-bit codec, not in the papers; meant to be used with
the error feedback of :mod:`dipsjax.outer._feedback`) codes each value as a 2-bit index
into four levels of its block. The levels are the block's *quartile centroids*: the block's
``n`` values are sorted and cut into four equal-count buckets (bucket ``k`` holds sorted
positions ``floor(k n / 4) .. floor((k+1) n / 4) - 1``; with ``n < 4`` a bucket holds at
least one position, so buckets repeat); level ``k`` is the mean of bucket ``k`` (clipped to
the bucket's range against rounding), rounded to BF16. Each value then takes the index of
its *nearest* level (the lower one on a tie). Why these choices:

* the mean is the squared-error-optimal level of a bucket, and equal-count buckets spend the
  four levels where the values are (a pseudo-gradient block is bell-shaped, and absmax
  levels like int4's would leave most values on the two levels nearest zero);
* nearest-level assignment never does worse than the bucket's own level (each value's
  error is at most its bucket's width ``width_k = max - min`` of the bucket, plus the BF16
  rounding of the level), and decoding is a monotone step function of the value: equal
  values decode equally, and a block of equal BF16 values decodes exactly;
* the levels are means of block values, so they lie in ``[bf16(min), bf16(max)]`` of the
  block (BF16 rounding is monotone): a decoded value never leaves the block's range.

Indices are packed four to a byte (value ``4i + j`` in bits ``2j .. 2j+1`` of byte ``i``),
the four levels travel as BF16 in ``Encoded.scales``. Wire bytes of a tensor of ``n``
values in blocks of ``B`` (a multiple of 4): ``ceil(n / B) * (B / 4 + 8)``, i.e.
``2 + 64 / B`` bits a value on whole blocks: 2.25 at the default ``B = 256``. Pad positions
of the last block take no part in its statistics. A non-finite value makes all four levels
of its block NaN, so the whole block decodes non-finite.

Trees (:func:`encode_tree`): under ``stat2``, the leaves :func:`leaf_codecs` names go as
BF16 instead: 1-D and scalar leaves (norms, biases) and embeddings (leaves whose path
contains one of ``embeddings``, by default ``embed`` and ``lm_head``): they are few values,
and coarse errors in them cost the most.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

Codec = Literal["fp32", "bf16", "int8", "int4", "stat2"]
CODECS: tuple[str, ...] = ("fp32", "bf16", "int8", "int4", "stat2")
_LEVELS = {"int8": 127, "int4": 7}
#: The block size each blocked codec uses when none is given.
DEFAULT_BLOCK = {"int8": 64, "int4": 64, "stat2": 256}
#: Path fragments :func:`leaf_codecs` takes for embeddings (input table, output head).
EMBEDDINGS: tuple[str, ...] = ("embed", "lm_head")


@dataclasses.dataclass(frozen=True)
class Encoded:
    """An encoded tensor: a ``uint8`` payload, per-block side data and static metadata.

    ``scales``: one FP32 scale a block (``int8``, ``int4``), four BF16 levels a block
    (``stat2``), empty for ``fp32`` and ``bf16``.
    """

    payload: jax.Array  # uint8 [num_bytes]
    scales: jax.Array  # float32 [num_blocks] | bfloat16 [4 * num_blocks] | empty
    codec: str = dataclasses.field(metadata={"static": True}, default="fp32")
    shape: tuple[int, ...] = dataclasses.field(metadata={"static": True}, default=())
    dtype: str = dataclasses.field(metadata={"static": True}, default="float32")
    block_size: int = dataclasses.field(metadata={"static": True}, default=0)

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (payload + side data)."""
        return int(self.payload.size) + int(self.scales.size) * self.scales.dtype.itemsize


jax.tree_util.register_dataclass(
    Encoded,
    data_fields=["payload", "scales"],
    meta_fields=["codec", "shape", "dtype", "block_size"],
)


def _blocks(x: jax.Array, block_size: int) -> jax.Array:
    flat = x.reshape(-1)
    pad = (-flat.size) % block_size
    return jnp.pad(flat, (0, pad)).reshape(-1, block_size)


def _block_size(codec: str, block_size: int | None) -> int:
    if block_size is None:
        return DEFAULT_BLOCK.get(codec, 0)
    return block_size


def _check(codec: str, block_size: int) -> None:
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    if codec in _LEVELS and (block_size < 2 or block_size % 2):
        raise ValueError(f"block_size must be an even number >= 2, got {block_size}")
    if codec == "stat2" and (block_size < 4 or block_size % 4):
        raise ValueError(f"block_size must be a multiple of 4 for stat2, got {block_size}")


def wire_size(n: int, codec: Codec, block_size: int | None = None) -> int:
    """Bytes on the wire of ``n`` values under ``codec`` (the formulas of the table)."""
    block_size = _block_size(codec, block_size)
    _check(codec, block_size)
    if codec in ("fp32", "bf16"):
        return n * (4 if codec == "fp32" else 2)
    blocks = math.ceil(n / block_size)
    if codec == "stat2":
        return blocks * (block_size // 4 + 8)
    return blocks * (block_size if codec == "int8" else block_size // 2) + 4 * blocks


def _stat2_levels(blocks: jax.Array, count: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(levels [nb, 4] float32 (BF16 values), widths [nb])``: the quartile centroids of
    each block (its first ``count`` values) and the widest bucket's width."""
    size = blocks.shape[1]
    pos = jnp.arange(size)[None, :]
    valid = pos < count[:, None]
    finite = jnp.all(jnp.isfinite(blocks) | ~valid, axis=1)
    key = jnp.where(valid, jnp.where(jnp.isfinite(blocks), blocks, 0.0), jnp.inf)
    s = jnp.sort(key, axis=1)  # pad positions (+inf) last
    levels, widths = [], []
    for k in range(4):
        start = (k * count) // 4
        end = jnp.maximum(((k + 1) * count) // 4, start + 1)
        inside = (pos >= start[:, None]) & (pos < end[:, None])
        total = jnp.sum(jnp.where(inside, s, 0.0), axis=1)
        lo = jnp.take_along_axis(s, start[:, None], axis=1)[:, 0]
        hi = jnp.take_along_axis(s, (end - 1)[:, None], axis=1)[:, 0]
        levels.append(jnp.clip(total / (end - start).astype(jnp.float32), lo, hi))
        widths.append(hi - lo)
    c = jnp.stack(levels, axis=1).astype(jnp.bfloat16)
    c = jnp.where(finite[:, None], c, jnp.nan)
    return c, jnp.where(finite, jnp.max(jnp.stack(widths, axis=1), axis=1), jnp.nan)


def _counts(n: int, num_blocks: int, block_size: int) -> jax.Array:
    return jnp.clip(n - block_size * jnp.arange(num_blocks), 0, block_size)


def _encode_stat2(x: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    blocks = _blocks(x.astype(jnp.float32), block_size)
    levels, _ = _stat2_levels(blocks, _counts(x.size, blocks.shape[0], block_size))
    c = levels.astype(jnp.float32)
    mid = (c[:, 1:] + c[:, :-1]) * 0.5  # levels ascend: the nearest is the midpoints passed
    idx = jnp.sum(blocks[:, :, None] > mid[:, None, :], axis=2, dtype=jnp.uint8)
    q = idx.reshape(-1, 4)
    payload = q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)
    return payload, levels.reshape(-1)


def encode(x: jax.Array, codec: Codec = "bf16", *, block_size: int | None = None) -> Encoded:
    """Encodes one tensor for the wire (jit-compatible; ``codec`` and sizes are static).

    ``block_size``: values a block of the blocked codecs (default :data:`DEFAULT_BLOCK`).
    """
    block_size = _block_size(codec, block_size)
    _check(codec, block_size)
    x = jnp.asarray(x)
    meta = {"codec": codec, "shape": tuple(x.shape), "dtype": str(x.dtype)}
    no_scales = jnp.zeros((0,), jnp.float32)
    if codec == "fp32":
        payload = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint8).reshape(-1)
        return Encoded(payload, no_scales, block_size=0, **meta)
    if codec == "bf16":
        payload = jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint8).reshape(-1)
        return Encoded(payload, no_scales, block_size=0, **meta)
    if codec == "stat2":
        payload, levels = _encode_stat2(x, block_size)
        return Encoded(payload, levels, block_size=block_size, **meta)
    levels = _LEVELS[codec]
    blocks = _blocks(x.astype(jnp.float32), block_size)
    # A product, not ``/ levels``: XLA may turn a division by a constant into this product
    # under jit and not eagerly (jax 0.12.1 does), and the scales must not depend on it.
    scales = jnp.max(jnp.abs(blocks), axis=1) * np.float32(1.0 / levels)
    safe = jnp.where(scales > 0, scales, 1.0)[:, None]
    q = jnp.clip(jnp.round(blocks / safe), -levels, levels).astype(jnp.int8)
    if codec == "int8":
        payload = jax.lax.bitcast_convert_type(q, jnp.uint8).reshape(-1)
    else:
        nib = (q + 8).astype(jnp.uint8).reshape(-1, 2)
        payload = nib[:, 0] | (nib[:, 1] << 4)
    return Encoded(payload, scales, block_size=block_size, **meta)


def decode(enc: Encoded) -> jax.Array:
    """Decodes to the tensor's original shape and dtype (values as the codec allows).

    The one decode: followers decode what they receive with it, and a learner's error
    feedback (:func:`dipsjax.outer.feedback_encode`) reconstructs what it sent with it.
    """
    size = int(np.prod(enc.shape, dtype=np.int64))
    if enc.codec == "fp32":
        out = jax.lax.bitcast_convert_type(enc.payload.reshape(-1, 4), jnp.float32)
    elif enc.codec == "bf16":
        out = jax.lax.bitcast_convert_type(enc.payload.reshape(-1, 2), jnp.bfloat16)
    elif enc.codec == "stat2":
        p = enc.payload[:, None] >> jnp.array([0, 2, 4, 6], jnp.uint8)[None, :]
        idx = (p & 0x03).astype(jnp.int32).reshape(-1, enc.block_size)
        levels = enc.scales.astype(jnp.float32).reshape(-1, 4)
        out = jnp.take_along_axis(levels, idx, axis=1).reshape(-1)[:size]
    elif enc.codec in _LEVELS:
        if enc.codec == "int8":
            q = jax.lax.bitcast_convert_type(enc.payload, jnp.int8).astype(jnp.float32)
        else:
            lo = (enc.payload & 0x0F).astype(jnp.float32) - 8.0
            hi = (enc.payload >> 4).astype(jnp.float32) - 8.0
            q = jnp.stack([lo, hi], axis=1).reshape(-1)
        out = (q.reshape(-1, enc.block_size) * enc.scales[:, None]).reshape(-1)[:size]
    else:
        raise ValueError(f"unknown codec {enc.codec!r}; expected one of {CODECS}")
    return out.reshape(enc.shape).astype(enc.dtype)


def _path_name(path: Any) -> str:
    return jax.tree_util.keystr(path).lower()


def leaf_codecs(tree: Any, codec: Codec, *, embeddings: Sequence[str] = EMBEDDINGS) -> Any:
    """The codec of each leaf of ``tree`` (a tree of strings of the same structure).

    Under ``stat2``: ``bf16`` for leaves of at most one dimension (norms, biases) and for
    leaves whose path (``jax.tree_util.keystr``, lower case) contains one of ``embeddings``
    (case-insensitive); ``stat2`` for the others. Other codecs apply to every leaf.
    """
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    if isinstance(embeddings, str):
        raise ValueError(f"embeddings must be a sequence of names, got the string {embeddings!r}")
    names = tuple(e.lower() for e in embeddings)

    def pick(path: Any, x: Any) -> str:
        if codec != "stat2":
            return codec
        name = _path_name(path)
        if jnp.ndim(x) <= 1 or any(e in name for e in names):
            return "bf16"
        return codec

    return jax.tree_util.tree_map_with_path(pick, tree)


def encode_tree(
    tree: Any,
    codec: Codec = "bf16",
    *,
    block_size: int | None = None,
    embeddings: Sequence[str] = EMBEDDINGS,
) -> Any:
    """:func:`encode` applied to every leaf, with the codec :func:`leaf_codecs` gives it."""
    codecs = leaf_codecs(tree, codec, embeddings=embeddings)
    return jax.tree.map(lambda c, x: encode(x, c, block_size=block_size), codecs, tree)


def decode_tree(tree: Any) -> Any:
    """:func:`decode` applied to every :class:`Encoded` leaf."""
    return jax.tree.map(decode, tree, is_leaf=lambda x: isinstance(x, Encoded))


def wire_bytes(tree: Any) -> int:
    """Total bytes on the wire of an encoded tree."""
    leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Encoded))
    return sum(leaf.nbytes for leaf in leaves)


def error_bound(x: jax.Array, codec: Codec, *, block_size: int | None = None) -> jax.Array:
    """The documented per-element worst-case absolute error of ``codec`` on ``x``."""
    block_size = _block_size(codec, block_size)
    _check(codec, block_size)
    x = jnp.asarray(x, jnp.float32)
    if codec == "fp32":
        return jnp.zeros_like(x)
    if codec == "bf16":
        return jnp.abs(x) * 2.0**-8
    blocks = _blocks(x, block_size)
    absmax = jnp.max(jnp.abs(blocks), axis=1, keepdims=True)
    if codec == "stat2":
        _, widths = _stat2_levels(blocks, _counts(x.size, blocks.shape[0], block_size))
        bound = widths[:, None] + absmax * 2.0**-8
    else:  # s (twice), x / s and s * q round in FP32: (4q + 3) units in the last place of 1
        q = _LEVELS[codec]
        bound = absmax / (2 * q) * (1 + (4 * q + 3) * 2.0**-24)
    return jnp.broadcast_to(bound, blocks.shape).reshape(-1)[: x.size].reshape(x.shape)
