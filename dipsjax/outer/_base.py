"""Shared pieces of the outer library: the contribution batch and per-learner reductions.

A *contribution batch* is a pytree whose leaves are stacked on a leading learner axis
``[L, ...]``: leaf ``x[j]`` is learner ``j``'s pseudo-gradient for that tensor. Per-learner
metadata travels as keyword-only extra arguments of fixed shape ``[L]`` (``tokens``,
``steps``, ``mask``), so a round in which only some learners report does not recompile.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any


class Contributions(NamedTuple):
    """A contribution batch after a per-learner filter such as :func:`reject_anomalies`.

    Attributes:
      deltas: pytree of pseudo-gradients stacked on a leading learner axis ``[L, ...]``.
      accepted: ``[L]`` bool, the learners whose pseudo-gradient is merged. Rejected and
        absent learners are never read by the merge (their rows may hold NaN).
    """

    deltas: PyTree
    accepted: jax.Array


def num_learners(stacked: PyTree) -> int:
    """Size of the leading learner axis, checked to agree across leaves."""
    sizes = {leaf.shape[0] if leaf.ndim else None for leaf in jax.tree.leaves(stacked)}
    if not sizes:
        raise ValueError("the contribution batch has no leaves")
    if None in sizes or len(sizes) != 1:
        raise ValueError(
            "every leaf of a contribution batch needs the same leading learner axis [L, ...]; "
            f"found leading sizes {sorted(s for s in sizes if s is not None)}"
            + (" and a scalar leaf" if None in sizes else "")
        )
    return sizes.pop()


def learner_vector(value: Any, num: int, name: str, dtype: Any) -> jax.Array:
    """Validates a per-learner ``[L]`` extra argument (shape is static, so checked at trace)."""
    arr = jnp.asarray(value, dtype=dtype)
    if arr.shape != (num,):
        raise ValueError(f"{name} must have shape [L] = ({num},), got {tuple(arr.shape)}")
    return arr


def present_mask(mask: Any, num: int) -> jax.Array:
    """``mask`` as an ``[L]`` bool array; ``None`` means every learner is present."""
    if mask is None:
        return jnp.ones((num,), dtype=bool)
    return learner_vector(mask, num, "mask", bool)


def unwrap(updates: PyTree | Contributions, mask: Any) -> tuple[PyTree, jax.Array]:
    """Returns ``(deltas, accepted)`` from a raw stacked batch or a :class:`Contributions`."""
    if isinstance(updates, Contributions):
        num = num_learners(updates.deltas)
        return updates.deltas, updates.accepted & present_mask(mask, num)
    num = num_learners(updates)
    return updates, present_mask(mask, num)


def learner_sq_norms(stacked: PyTree) -> jax.Array:
    """Per-learner squared L2 norm over every leaf of a (sub-)tree, ``[L]`` float32.

    On a follower that holds only some layers this is the *partial* statistic
    ``sum_{i in shard} ||Delta^{(i,j)}||^2`` of Di-PS sec. 8; the leader sums the partials
    of all shards to get ``G_j``.
    """
    num = num_learners(stacked)
    total = jnp.zeros((num,), jnp.float32)
    for leaf in jax.tree.leaves(stacked):
        x = leaf.astype(jnp.float32).reshape(num, -1)
        total = total + jnp.sum(x * x, axis=1)
    return total


def tree_sq_norm(tree: PyTree) -> jax.Array:
    """Squared global L2 norm of a pytree, float32 scalar."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)


def rows_where(accepted: jax.Array, x: jax.Array) -> jax.Array:
    """Zeroes the rows of ``x`` ([L, ...]) whose learner is not accepted (NaN-safe)."""
    sel = accepted.reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.where(sel, x, jnp.zeros((), x.dtype))
