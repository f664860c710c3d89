"""Merging a contribution batch ``[L, ...]`` into one outer gradient.

Per-learner weights (normalised over the accepted learners, zero elsewhere):

* ``'uniform'``  -- ``w_j = 1`` (synchronous DiLoCo's plain mean).
* ``'tokens'``   -- ``w_j = T_j`` (Di-PS sec. 8: ``delta = sum_j T_j Delta_j / sum_j T_j``).
* ``'decoupled'``-- ``w_j = c_tok_j * (c_tok_j / c_steps_j)`` (Decoupled DiLoCo: learners
  that processed more data in fewer steps weigh more). A learner with zero steps gets 0.

Merges:

* :func:`token_weighted_mean` -- ``delta = sum_j w_j Delta_j``.
* :func:`radial_directional_average` -- per tensor,
  ``(sum_j w_j ||v_j||) * phi(sum_j w_j phi(v_j))`` with ``phi(x) = x / ||x||`` and
  ``phi(0) = 0``: magnitude and direction are averaged separately so the norm of the merged
  update does not shrink with the number of learners merged (Decoupled DiLoCo, RDA).

On a follower the leader's decision is the one truth: the keyword extra args ``accepted``
(``[L]`` bool) and ``weights`` (``[L]`` float) make every merge read exactly the accepted
rows with exactly the leader's weights, whatever stages precede it in the chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax

from dipsjax import rules
from dipsjax.outer import _base

Weighting = Literal["uniform", "tokens", "decoupled"]
_WEIGHTINGS = ("uniform", "tokens", "decoupled")


def learner_weights(
    accepted: jax.Array,
    *,
    weighting: Weighting = "tokens",
    tokens: Any = None,
    steps: Any = None,
) -> jax.Array:
    """Normalised ``[L]`` float32 weights; all zero when no learner is accepted.

    The same rule the leader runs in NumPy (:func:`dipsjax.rules.weights`).
    """
    return rules.weights(jnp, accepted, weighting=weighting, tokens=tokens, steps=steps)


def _weighted_rows(x: jax.Array, weights: jax.Array, accepted: jax.Array) -> jax.Array:
    """``sum_j w_j x_j`` over the leading axis, skipping rows not accepted (NaN-safe).

    Written as an unrolled sum of ``L`` scaled rows rather than a reduction or a dot: XLA
    then emits one elementwise loop that reads each row once (about 3x faster on CPU).
    """
    zero = jnp.zeros((), jnp.float32)
    return sum(
        weights[j] * jnp.where(accepted[j], x[j].astype(jnp.float32), zero)
        for j in range(x.shape[0])
    )


def weighted_mean(deltas: Any, weights: jax.Array, accepted: jax.Array) -> Any:
    """``sum_j w_j Delta_j`` per leaf, reading only accepted rows (NaN-safe)."""
    return jax.tree.map(lambda x: _weighted_rows(x, weights, accepted), deltas)


def _unit(x: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    norm = jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=True))
    safe = jnp.where(norm > 0, norm, 1.0)
    return jnp.where(norm > 0, x / safe, 0.0), norm


def rda_merge(x: jax.Array, weights: jax.Array, accepted: jax.Array) -> jax.Array:
    """Radial-directional average of one stacked tensor ``[L, ...]`` (see module doc)."""
    x32 = _base.rows_where(accepted, x.astype(jnp.float32))
    feature_axes = tuple(range(1, x32.ndim))
    units, norms = _unit(x32, feature_axes)
    magnitude = jnp.sum(weights * norms.reshape(-1))
    direction = _weighted_rows(units, weights, accepted)
    direction_unit, _ = _unit(direction, tuple(range(direction.ndim)))
    return magnitude * direction_unit


def default_plain_mean(path: str) -> bool:
    """Default RDA exception: embedding tables (path mentions 'embed') use the plain mean."""
    return "embed" in path.lower()


def round_token_scale(tokens: Any, accepted: jax.Array, full_round_tokens: float) -> jax.Array:
    """``min(1, sum_{j accepted} T_j / full_round_tokens)``: the share of a full round merged.

    Decoupled DiLoCo merges as soon as ``K`` of ``M`` learners reported; "each learner's
    contribution to the model update is proportional to the number of tokens it actually
    processed". With weights normalised over the merged learners alone (and RDA, whose norm
    does not depend on how many learners are merged), a round of one learner would move the
    model as far as a round of all ``M``, and ``M`` times as often. Scaling by the merged
    share of a full round's tokens keeps the update per token the same for every ``K``.
    """
    t = _base.learner_vector(tokens, accepted.shape[0], "tokens", jnp.float32)
    merged = jnp.sum(jnp.where(accepted, t, 0.0))
    return jnp.minimum(1.0, merged / full_round_tokens)


def _merge_transform(
    merge_leaf: Callable[[str, jax.Array, jax.Array, jax.Array], jax.Array],
    weighting: Weighting,
    full_round_tokens: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    if weighting not in _WEIGHTINGS:
        raise ValueError(f"weighting must be one of {_WEIGHTINGS}, got {weighting!r}")
    if full_round_tokens is not None and not full_round_tokens > 0:
        raise ValueError(f"full_round_tokens must be > 0 or None, got {full_round_tokens}")

    def init_fn(params: Any) -> optax.EmptyState:
        del params
        return optax.EmptyState()

    def update_fn(
        updates: Any,
        state: optax.EmptyState,
        params: Any = None,
        *,
        tokens: Any = None,
        steps: Any = None,
        mask: Any = None,
        accepted: Any = None,
        weights: Any = None,
        **extra_args: Any,
    ) -> tuple[Any, optax.EmptyState]:
        del params, extra_args
        deltas, present = _base.unwrap(updates, mask)
        num = present.shape[0]
        if accepted is not None:  # the leader's decision: merge exactly these learners
            present = present & _base.learner_vector(accepted, num, "accepted", bool)
        accepted = present
        if weights is None:
            w = learner_weights(accepted, weighting=weighting, tokens=tokens, steps=steps)
        else:  # the leader's weights, applied as given (zero outside the accepted set)
            w = jnp.where(accepted, _base.learner_vector(weights, num, "weights", jnp.float32), 0)
        merged = jax.tree_util.tree_map_with_path(
            lambda path, x: merge_leaf(jax.tree_util.keystr(path), x, w, accepted), deltas
        )
        if full_round_tokens is not None:
            if tokens is None:
                raise ValueError("full_round_tokens needs the keyword argument tokens=[L]")
            scale = round_token_scale(tokens, accepted, full_round_tokens)
            merged = jax.tree.map(lambda x: x * scale, merged)
        return merged, state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def token_weighted_mean(
    weighting: Weighting = "tokens", *, full_round_tokens: float | None = None
) -> optax.GradientTransformationExtraArgs:
    """Merges ``[L, ...]`` contributions into ``delta = sum_j w_j Delta_j / sum_j w_j``.

    With the default ``weighting='tokens'`` this is Di-PS sec. 8,
    ``delta = sum_{j in accepted} T_j Delta_j / sum_{j in accepted} T_j``; see the module
    docstring for ``'uniform'`` and ``'decoupled'``. Reads ``tokens`` (and ``steps`` for
    ``'decoupled'``) and ``mask`` as ``[L]`` keyword extra args; accepts the output of
    :func:`reject_anomalies` or a raw stacked batch. With ``full_round_tokens`` the result is
    scaled by :func:`round_token_scale` (partial-quorum rounds).

    Example:
      >>> import jax.numpy as jnp
      >>> from dipsjax import outer
      >>> tx = outer.token_weighted_mean()
      >>> d = {'w': jnp.array([[0.2, 0.4], [0.5, 0.1]])}
      >>> out, _ = tx.update(d, tx.init(None), tokens=jnp.array([32e3, 64e3]))
      >>> [round(float(v), 6) for v in out['w']]
      [0.4, 0.2]

    References:
      Di-PS, seed 000 sec. 8 and 11; Decoupled DiLoCo (arXiv 2604.21428), token weighting.
    """
    return _merge_transform(
        lambda path, x, w, acc: weighted_mean(x, w, acc), weighting, full_round_tokens
    )


def decoupled_token_weights() -> optax.GradientTransformationExtraArgs:
    """Weighted mean with Decoupled DiLoCo's ``w_j = c_tok_j * (c_tok_j / c_steps_j)``."""
    return token_weighted_mean(weighting="decoupled")


def mean() -> optax.GradientTransformationExtraArgs:
    """Plain mean over the present (or accepted) learners, as in synchronous DiLoCo."""
    return token_weighted_mean(weighting="uniform")


def radial_directional_average(
    weighting: Weighting = "decoupled",
    plain_mean: Callable[[str], bool] | None = default_plain_mean,
    *,
    full_round_tokens: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Radial-directional averaging (RDA), per tensor.

    ``rda(v) = (sum_j w_j ||v_j|| / sum_j w_j) * phi(sum_j w_j phi(v_j) / sum_j w_j)``,
    ``phi(x) = x / ||x||``, ``phi(0) = 0``. Its norm equals the weighted mean of the learners'
    norms (unless the directions cancel exactly), and the RDA of identical inputs is that
    input.

    Args:
      weighting: learner weights (default Decoupled DiLoCo's ``c_tok^2 / c_steps``).
      plain_mean: predicate on a tensor's path (``jax.tree_util.keystr``); tensors for which
        it is true use the weighted mean instead (default: embeddings, whose rows are
        updated sparsely). ``None`` applies RDA everywhere.
      full_round_tokens: if given, scale by :func:`round_token_scale` (partial quorums).

    References:
      Decoupled DiLoCo (arXiv 2604.21428), radial-directional averaging; seed 001.
    """

    def merge_leaf(path: str, x: jax.Array, w: jax.Array, acc: jax.Array) -> jax.Array:
        if plain_mean is not None and plain_mean(path):
            return weighted_mean(x, w, acc)
        return rda_merge(x, w, acc)

    return _merge_transform(merge_leaf, weighting, full_round_tokens)
