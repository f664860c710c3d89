"""The outer round's decision rules, written once over an array module.

The leader decides each round (accepted set, weights, clip factor) with NumPy, so that the
leader process needs no JAX; the optax transforms of :mod:`dipsjax.outer` run the same
functions with ``jax.numpy`` inside ``jit``. Every function takes the array module as
``xp`` (``numpy`` or ``jax.numpy``) and uses only operations both provide, in float32.

Rules (Di-PS seed 000 sec. 8; DESIGN.md sec. 3):

* anomaly score ``E_j = (G_j - mu) / sigma``; reject ``j`` when ``E_j > beta * max(recent E)``
  (:func:`score`);
* history ``mu <- a G + (1 - a) mu``, ``sigma <- sqrt((1 - a) sigma^2 + a (G - mu_new)^2)``,
  accepted norms folded in learner order (:func:`fold`);
* learner weights ``uniform`` / ``tokens`` (``T_j``) / ``decoupled`` (``c_tok^2 / c_steps``),
  normalised over the accepted learners (:func:`weights`);
* clip factor ``min(1, c / ||delta||)`` (:func:`clip_factor`).

:class:`AnomalyConfig` holds the penalty's settings in one place; ``AnomalyConfig.paper()``
is the paper's rule with none of our choices (see its docstring for what they are).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

WEIGHTINGS = ("uniform", "tokens", "decoupled")


@dataclasses.dataclass(frozen=True)
class AnomalyConfig:
    """Settings of the Di-PS anomaly penalty (seed 000 sec. 8), in one place.

    Attributes:
      alpha: EMA rate of the norm history (paper default 0.02; stable below 0.05).
      beta: rejection multiplier on ``max(recent E)`` (paper default 3).
      history: size of the recent-score stack.
      warmup: *our choice, on by default* (the paper is silent on the cold start): reject
        nothing until ``warmup`` accepted norms were folded in, and average the first norms
        with step ``max(alpha, 1/n)`` so ``mu`` starts as a running mean. ``0`` = the
        paper's rule: ``mu = sigma = 0`` at the start, so the first round scores +inf, that
        score pins the threshold at +inf until the recent-score stack cycles, and an outlier
        in those rounds enters the history and blinds the detector for good
        (``benchmarks/anomaly_ablation.py``: 0% of outliers rejected vs 100% with warm-up).
      min_max_score: *our choice, on by default*: floor of ``max(recent E)``. ``None`` = the
        paper. While norms fall quickly (early training) every recent score is negative and
        ``beta * max(recent E)`` drops below 0: without the floor 92% of normal learners are
        rejected on the ablation's fast-decaying stream, none with it.
      min_sigma_ratio: *extension, off by default*: floor of ``sigma`` at this fraction of
        ``mu`` (exactly identical norms make sigma ~ 0 and any larger norm an infinite
        score). No measured stream needed it, so the default is the paper's (0).
    """

    alpha: float = 0.02
    beta: float = 3.0
    history: int = 32
    warmup: int = 5
    min_max_score: float | None = 1.0
    min_sigma_ratio: float = 0.0

    def __post_init__(self) -> None:
        checks = [
            (0 < self.alpha <= 1, "alpha", "in (0, 1]"),
            (self.beta > 0, "beta", "> 0"),
            (self.history >= 1, "history", ">= 1"),
            (self.warmup >= 0, "warmup", ">= 0"),
            (self.min_sigma_ratio >= 0, "min_sigma_ratio", ">= 0"),
        ]
        for ok, name, allowed in checks:
            if not ok:
                raise ValueError(
                    f"AnomalyConfig.{name} must be {allowed}, got {getattr(self, name)!r}"
                )

    @classmethod
    def paper(cls, alpha: float = 0.02, beta: float = 3.0, history: int = 32) -> AnomalyConfig:
        """The rule exactly as Di-PS states it: no warm-up, no floors."""
        return cls(alpha, beta, history, warmup=0, min_max_score=None, min_sigma_ratio=0.0)


class History(NamedTuple):
    """The detector's history (a few scalars and the recent-score ring buffer)."""

    mu: Any
    sigma: Any
    count: Any
    recent_scores: Any
    recent_valid: Any
    cursor: Any


class Scores(NamedTuple):
    accepted: Any  # [L] bool
    scores: Any  # [L] float32
    threshold: Any  # scalar (inf while the detector is cold)


def init_history(xp: Any, history: int) -> History:
    return History(
        mu=xp.asarray(0.0, xp.float32),
        sigma=xp.asarray(0.0, xp.float32),
        count=xp.asarray(0, xp.int32),
        recent_scores=xp.zeros((history,), xp.float32),
        recent_valid=xp.zeros((history,), bool),
        cursor=xp.asarray(0, xp.int32),
    )


def score(
    xp: Any,
    state: History,
    sq_norms: Any,
    present: Any,
    *,
    beta: float,
    warmup: int,
    min_max_score: float | None,
    min_sigma_ratio: float,
) -> Scores:
    """``accepted_j = present_j & isfinite(G_j) & (cold | E_j <= beta * max(recent E))``."""
    g = xp.asarray(sq_norms, xp.float32)
    sigma = xp.maximum(state.sigma, xp.float32(min_sigma_ratio) * xp.abs(state.mu))
    sigma = xp.maximum(sigma, xp.float32(np.finfo(np.float32).tiny))
    scores = (g - state.mu) / sigma
    max_recent = xp.max(xp.where(state.recent_valid, state.recent_scores, -xp.inf))
    if min_max_score is not None:
        max_recent = xp.maximum(max_recent, xp.float32(min_max_score))
    warm = (state.count >= warmup) & xp.any(state.recent_valid)
    threshold = xp.where(warm, xp.float32(beta) * max_recent, xp.inf).astype(xp.float32)
    accepted = xp.asarray(present, bool) & xp.isfinite(g) & (scores <= threshold)
    return Scores(accepted, scores, threshold)


def fold(
    xp: Any,
    state: History,
    sq_norms: Any,
    scores: Any,
    accepted: Any,
    *,
    alpha: float,
    warmup: int,
) -> History:
    """Folds the accepted finite norms, in learner order, into the history."""
    g_all = xp.asarray(sq_norms, xp.float32)
    e_all = xp.asarray(scores, xp.float32)
    acc = xp.asarray(accepted, bool)
    history = state.recent_scores.shape[0]
    slots = xp.arange(history)
    was_warm = state.count >= warmup
    st = state
    for j in range(g_all.shape[0]):
        g, e = g_all[j], e_all[j]
        take = acc[j] & xp.isfinite(g)
        n = st.count + 1
        if warmup > 0:
            a = xp.maximum(xp.float32(alpha), xp.float32(1.0) / n.astype(xp.float32))
        else:
            a = xp.float32(alpha)
        mu = a * g + (1 - a) * st.mu
        sigma = xp.sqrt((1 - a) * st.sigma**2 + a * (g - mu) ** 2)
        push = take & was_warm
        here = push & (slots == st.cursor)
        st = History(
            mu=xp.where(take, mu, st.mu).astype(xp.float32),
            sigma=xp.where(take, sigma, st.sigma).astype(xp.float32),
            count=xp.where(take, n, st.count).astype(xp.int32),
            recent_scores=xp.where(here, e, st.recent_scores).astype(xp.float32),
            recent_valid=st.recent_valid | here,
            cursor=xp.where(push, (st.cursor + 1) % history, st.cursor).astype(xp.int32),
        )
    return st


def weights(
    xp: Any, accepted: Any, *, weighting: str, tokens: Any = None, steps: Any = None
) -> Any:
    """Normalised ``[L]`` float32 weights over the accepted learners (all 0 if none)."""
    acc = xp.asarray(accepted, bool)
    num = acc.shape[0]
    if weighting == "uniform":
        raw = xp.ones((num,), xp.float32)
    elif weighting in ("tokens", "decoupled"):
        if tokens is None:
            raise ValueError(f"weighting={weighting!r} needs the keyword argument tokens=[L]")
        t = _vector(xp, tokens, num, "tokens", xp.float32)
        if weighting == "tokens":
            raw = t
        else:
            if steps is None:
                raise ValueError("weighting='decoupled' needs the keyword argument steps=[L]")
            s = _vector(xp, steps, num, "steps", xp.float32)
            raw = xp.where(s > 0, t * (t / xp.where(s > 0, s, xp.float32(1))), xp.float32(0))
    else:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    raw = xp.where(acc & xp.isfinite(raw) & (raw > 0), raw, xp.float32(0)).astype(xp.float32)
    total = xp.sum(raw)
    return xp.where(total > 0, raw / xp.where(total > 0, total, xp.float32(1)), xp.float32(0))


def clip_factor(xp: Any, sq_norm: Any, max_norm: float) -> Any:
    """``min(1, c / ||delta||)`` from ``||delta||^2``; 1 for a zero update."""
    sq = xp.asarray(sq_norm, xp.float32)
    norm = xp.sqrt(sq)
    c = xp.float32(max_norm)
    return xp.where(norm > c, c / xp.where(norm > 0, norm, xp.float32(1)), xp.float32(1)).astype(
        xp.float32
    )


def _vector(xp: Any, value: Any, num: int, name: str, dtype: Any) -> Any:
    arr = xp.asarray(value, dtype=dtype)
    if arr.shape != (num,):
        raise ValueError(f"{name} must have shape [L] = ({num},), got {tuple(arr.shape)}")
    return arr
