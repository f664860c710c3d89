"""Di-PS pseudo-gradient penalty: reject learners whose update norm is anomalous.

Di-PS (seed 000, sec. 8). For learner ``j`` in outer step ``t`` the leader sums the
followers' partial squared norms into ``G_j = sum_i ||Delta^{(i,j)}||^2`` and scores it
against an exponential moving mean and deviation of past norms::

    E_j = (G_j - mu) / sigma
    mu    <- alpha * G + (1 - alpha) * mu
    sigma <- sqrt((1 - alpha) * sigma**2 + alpha * (G - mu_new)**2)

Learner ``j`` is rejected *whole* (on every shard) when ``E_j > beta * max(recent E)``.
Defaults ``alpha = 0.02``, ``beta = 3`` (sec. 15: stable for alpha < 0.05 and beta in 1..10).

Choices the paper leaves open, made here and documented:

* **Batch scoring.** All learners of a round are scored against the statistics from
  *before* the round; the accepted ones are then folded in, in learner order. Rejected,
  absent and non-finite norms never enter the history.
* **Warm-up.** Before ``warmup`` accepted norms have been seen the detector only learns:
  everything finite is accepted. The first norms are averaged with a step size
  ``alpha_n = max(alpha, 1/n)`` (n = norms seen so far), so ``mu`` starts as the running mean
  instead of being dominated by the first value. Scores enter the recent-score stack only
  once the detector is warm, and rejection starts when that stack is non-empty.
* **Degenerate statistics.** ``max(recent E)`` is floored at ``min_max_score`` (default 1),
  so the threshold never drops to or below zero when recent scores happen to be negative
  (they do while norms fall); optionally (``min_sigma_ratio``, off by default) ``sigma`` is
  floored at ``min_sigma_ratio * mu`` so identical norms do not turn a 1% larger norm into
  an infinite score.
* **NaN / Inf.** A non-finite ``G_j`` is always rejected, warm or not.

Warm-up and both floors are options; ``warmup=0, min_max_score=None, min_sigma_ratio=0``
(:meth:`dipsjax.rules.AnomalyConfig.paper`) is the paper's rule with none of them. Why the
two on by default are on: :class:`dipsjax.rules.AnomalyConfig` and
``benchmarks/anomaly_ablation.py``. The
formulas live in :mod:`dipsjax.rules`, shared with the leader's NumPy decision step.

References:
  Di-PS: heterogeneous cross-cluster LLM training, sec. 8 and the worked example of sec. 11.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dipsjax import rules
from dipsjax.outer import _base


class AnomalyState(NamedTuple):
    """Detector history (replicated, a few scalars: checkpoints cleanly).

    Attributes:
      mu: EMA of accepted squared norms ``G``.
      sigma: EMA deviation of ``G``.
      count: number of accepted norms folded into ``mu``/``sigma``.
      recent_scores: ring buffer of the last accepted scores ``E``.
      recent_valid: which ring-buffer slots hold a score.
      cursor: next ring-buffer slot to write.
    """

    mu: jax.Array
    sigma: jax.Array
    count: jax.Array
    recent_scores: jax.Array
    recent_valid: jax.Array
    cursor: jax.Array


class AnomalyDecision(NamedTuple):
    """One round's decision: what the leader broadcasts to every follower."""

    accepted: jax.Array  # [L] bool
    scores: jax.Array  # [L] float32 (E_j against the pre-round history)
    threshold: jax.Array  # scalar: beta * max(recent E), or +inf while warming up


def init_anomaly_state(
    *,
    history: int = 32,
    mu: float | None = None,
    sigma: float | None = None,
    recent_scores: Sequence[float] = (),
    count: int | None = None,
) -> AnomalyState:
    """A fresh detector, or one seeded with a known history (for tests and restarts).

    Args:
      history: size of the recent-score stack.
      mu, sigma: seed statistics; when given the detector counts as warm (``count``
        defaults to a large number) unless ``count`` says otherwise.
      recent_scores: seed content of the recent-score stack (most recent last).
      count: how many norms the seeded statistics summarize.
    """
    if history < 1:
        raise ValueError(f"history must be >= 1, got {history}")
    if len(recent_scores) > history:
        raise ValueError(f"recent_scores has {len(recent_scores)} entries > history={history}")
    if (mu is None) != (sigma is None):
        raise ValueError("seed mu and sigma together, or neither")
    if sigma is not None and sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    seeded = mu is not None
    n = count if count is not None else (1_000_000 if seeded else 0)
    scores = jnp.zeros((history,), jnp.float32)
    valid = jnp.zeros((history,), bool)
    k = len(recent_scores)
    if k:
        scores = scores.at[:k].set(jnp.asarray(recent_scores, jnp.float32))
        valid = valid.at[:k].set(True)
    return AnomalyState(
        mu=jnp.asarray(mu if seeded else 0.0, jnp.float32),
        sigma=jnp.asarray(sigma if seeded else 0.0, jnp.float32),
        count=jnp.asarray(n, jnp.int32),
        recent_scores=scores,
        recent_valid=valid,
        cursor=jnp.asarray(k % history, jnp.int32),
    )


def score_learners(
    state: AnomalyState,
    sq_norms: jax.Array,
    present: jax.Array,
    *,
    beta: float = 3.0,
    warmup: int = 5,
    min_max_score: float | None = 1.0,
    min_sigma_ratio: float = 0.0,
) -> AnomalyDecision:
    """Scores ``G`` ([L]) against the history and decides the accepted set (pure).

    ``accepted_j = present_j and isfinite(G_j) and (cold or E_j <= beta * max(recent E))``.
    The same rule the leader runs in NumPy (:func:`dipsjax.rules.score`).
    """
    out = rules.score(
        jnp,
        state,
        sq_norms,
        present,
        beta=beta,
        warmup=warmup,
        min_max_score=min_max_score,
        min_sigma_ratio=min_sigma_ratio,
    )
    return AnomalyDecision(accepted=out.accepted, scores=out.scores, threshold=out.threshold)


def fold_history(
    state: AnomalyState,
    sq_norms: jax.Array,
    scores: jax.Array,
    accepted: jax.Array,
    *,
    alpha: float = 0.02,
    warmup: int = 5,
) -> AnomalyState:
    """Folds the accepted norms (in learner order) into ``mu``, ``sigma`` and the stack.

    The same rule the leader runs in NumPy (:func:`dipsjax.rules.fold`).
    """
    return AnomalyState(
        *rules.fold(jnp, state, sq_norms, scores, accepted, alpha=alpha, warmup=warmup)
    )


def reject_anomalies(
    alpha: float = 0.02,
    beta: float = 3.0,
    *,
    history: int = 32,
    warmup: int = 5,
    min_max_score: float | None = 1.0,
    min_sigma_ratio: float = 0.0,
    mu0: float | None = None,
    sigma0: float | None = None,
    recent_scores0: Sequence[float] = (),
    count0: int | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Di-PS anomaly penalty over a contribution batch ``[L, ...]``.

    Input: a pytree stacked on a leading learner axis. Output: :class:`Contributions`
    (the same deltas plus the ``[L]`` accepted mask) for a following merge transform.

    Keyword extra args (all optional):
      mask: ``[L]`` bool, the learners present this round.
      learner_sq_norms: ``[L]`` global ``G_j`` summed over *all* shards. Followers holding a
        sub-tree pass it so that every shard takes the same decision; without it ``G`` is
        computed from the updates given.
      accepted: ``[L]`` bool decided by the leader; when given it overrides the local
        decision (the history is folded with it), so followers apply exactly the leader's set.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from dipsjax import outer
      >>> tx = optax.chain(outer.reject_anomalies(), outer.token_weighted_mean())
      >>> params = {'w': jnp.zeros(2)}
      >>> state = tx.init(params)
      >>> deltas = {'w': jnp.array([[0.2, 0.4], [0.5, 0.1]])}
      >>> merged, state = tx.update(deltas, state, tokens=jnp.array([32e3, 64e3]))
      >>> [round(float(v), 6) for v in merged['w']]
      [0.4, 0.2]

    References:
      Di-PS, seed 000 sec. 8 (formulas) and sec. 11 (worked example).
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")

    def init_fn(params: Any) -> AnomalyState:
        del params
        return init_anomaly_state(
            history=history,
            mu=mu0,
            sigma=sigma0,
            recent_scores=recent_scores0,
            count=count0,
        )

    def update_fn(
        updates: Any,
        state: AnomalyState,
        params: Any = None,
        *,
        mask: Any = None,
        learner_sq_norms: Any = None,
        accepted: Any = None,
        **extra_args: Any,
    ) -> tuple[_base.Contributions, AnomalyState]:
        del params, extra_args
        deltas, present = _base.unwrap(updates, mask)
        num = present.shape[0]
        if learner_sq_norms is None:
            g = _base.learner_sq_norms(deltas)
        else:
            g = _base.learner_vector(learner_sq_norms, num, "learner_sq_norms", jnp.float32)
        decision = score_learners(
            state,
            g,
            present,
            beta=beta,
            warmup=warmup,
            min_max_score=min_max_score,
            min_sigma_ratio=min_sigma_ratio,
        )
        acc = decision.accepted
        if accepted is not None:
            acc = _base.learner_vector(accepted, num, "accepted", bool) & present
        new_state = fold_history(state, g, decision.scores, acc, alpha=alpha, warmup=warmup)
        return _base.Contributions(deltas, acc), new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
