"""Global-norm clipping that works on a shard of the model.

``optax.clip_by_global_norm`` computes the norm of the tree it is given; a follower holding
only some layers must instead clip with the norm of the *whole* merged update (Di-PS sec. 8:
``g = min(1, c / ||delta||_2) * delta`` over the full model), so that every shard is scaled
by the same factor. This transform takes that global squared norm as the extra argument
``merged_sq_norm`` and records the norm it saw and the factor it applied in its state.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dipsjax import rules
from dipsjax.outer import _base


class GlobalClipState(NamedTuple):
    """What the last update saw: the squared norm used and the factor applied.

    On a follower that was not given ``merged_sq_norm``, ``input_sq_norm`` is the *partial*
    squared norm of its shard: the statistic it reports to the leader.
    """

    input_sq_norm: jax.Array
    clip_factor: jax.Array


def clip_factor(sq_norm: jax.Array, max_norm: float) -> jax.Array:
    """``min(1, c / ||delta||)`` from ``||delta||^2``; 1 for a zero update
    (:func:`dipsjax.rules.clip_factor`, which the leader runs in NumPy)."""
    return rules.clip_factor(jnp, sq_norm, max_norm)


_factor = clip_factor


def clip_by_global_norm(max_norm: float = 1.0) -> optax.GradientTransformationExtraArgs:
    """Scales the update by ``min(1, max_norm / ||update||_2)`` over the whole model.

    Keyword extra args:
      merged_sq_norm: squared norm of the *whole* merged update (sum of the followers'
        partials). Without it the norm of the given tree is used, which is the same thing
        in a single process.
      clip_factor: the factor decided by the leader; when given it is applied as is.

    References:
      Di-PS, seed 000 sec. 6 and 8 (clip threshold 1).
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")

    def init_fn(params: Any) -> GlobalClipState:
        del params
        return GlobalClipState(jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32))

    def update_fn(
        updates: Any,
        state: GlobalClipState,
        params: Any = None,
        *,
        merged_sq_norm: Any = None,
        clip_factor: Any = None,
        **extra_args: Any,
    ) -> tuple[Any, GlobalClipState]:
        del params, state, extra_args
        if merged_sq_norm is None:
            sq = _base.tree_sq_norm(updates)
        else:
            sq = jnp.asarray(merged_sq_norm, jnp.float32)
            if sq.shape != ():
                raise ValueError(f"merged_sq_norm must be a scalar, got shape {sq.shape}")
        if clip_factor is None:
            factor = _factor(sq, max_norm)
        else:  # the leader's factor, applied as given
            factor = jnp.asarray(clip_factor, jnp.float32)
            if factor.shape != ():
                raise ValueError(f"clip_factor must be a scalar, got shape {factor.shape}")
        clipped = jax.tree.map(lambda x: (x * factor).astype(x.dtype), updates)
        return clipped, GlobalClipState(sq, factor)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
