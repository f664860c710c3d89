"""Whole outer optimizers from a few arguments, as ``optax.named_chain``s.

The stage names are stable (``'reject'``, ``'merge'``, ``'clip'``, ``'nesterov'``) so that
state reads like the papers: ``state['reject'].mu``, ``state['clip'].clip_factor``,
``state['nesterov'][0].trace`` (the FP32 Nesterov momentum the followers own).

Defaults follow Di-PS sec. 13 (outer lr 0.7, momentum 0.8, clip 1, alpha 0.02, beta 3) for
every preset, so that methods compared in the simulator differ only in what they merge.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import optax

from dipsjax.outer._anomaly import reject_anomalies
from dipsjax.outer._clipping import clip_by_global_norm
from dipsjax.outer._merge import (
    Weighting,
    default_plain_mean,
    radial_directional_average,
    token_weighted_mean,
)


def nesterov(learning_rate: float = 0.7, momentum: float = 0.8) -> optax.GradientTransformation:
    """Outer Nesterov SGD with an FP32 momentum buffer (``optax.sgd(nesterov=True)``)."""
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    return optax.sgd(learning_rate, momentum=momentum, nesterov=True, accumulator_dtype=jnp.float32)


def _finish(
    parts: list[tuple[str, optax.GradientTransformation]],
    max_norm: float | None,
    learning_rate: float,
    momentum: float,
    step: optax.GradientTransformation | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Appends the optional global clip and the outer step (Nesterov, or ``step``: an
    extension, stage ``'outer'``); names the chain."""
    if max_norm is not None:
        parts.append(("clip", clip_by_global_norm(max_norm)))
    if step is None:
        parts.append(("nesterov", nesterov(learning_rate, momentum)))
    else:
        parts.append(("outer", step))
    return optax.named_chain(*parts)


def dips(
    learning_rate: float = 0.7,
    momentum: float = 0.8,
    *,
    alpha: float = 0.02,
    beta: float = 3.0,
    max_norm: float | None = 1.0,
    step: optax.GradientTransformation | None = None,
    **anomaly_kwargs: object,
) -> optax.GradientTransformationExtraArgs:
    """Di-PS outer optimizer: anomaly penalty -> token-weighted mean -> clip -> Nesterov.

    Extra args: ``tokens`` ([L], required), ``mask``; on a shard also ``learner_sq_norms``,
    ``merged_sq_norm`` and optionally the leader's ``accepted``.

    References:
      Di-PS, seed 000 sec. 6 (algorithm), sec. 8 (penalty, weighting, clipping).
    """
    parts: list[tuple[str, optax.GradientTransformation]] = [
        ("reject", reject_anomalies(alpha, beta, **anomaly_kwargs)),
        ("merge", token_weighted_mean("tokens")),
    ]
    return _finish(parts, max_norm, learning_rate, momentum, step)


def decoupled_diloco(
    learning_rate: float = 0.7,
    momentum: float = 0.8,
    *,
    rda: bool = True,
    weighting: Weighting = "decoupled",
    plain_mean: Callable[[str], bool] | None = default_plain_mean,
    max_norm: float | None = None,
    full_round_tokens: float | None = None,
    step: optax.GradientTransformation | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Decoupled DiLoCo outer optimizer: ``c_tok^2/c_steps`` weights -> RDA -> Nesterov.

    Args:
      rda: radial-directional averaging (default) or the plain weighted mean.
      weighting: learner weights (default ``'decoupled'``).
      plain_mean: tensors merged by the weighted mean under RDA (default: embeddings).
      max_norm: optional global clipping (off by default; the paper does not clip).
      full_round_tokens: tokens of a round where all ``M`` learners report; when given, a
        round that merges fewer is scaled by its share (see
        :func:`dipsjax.outer.round_token_scale`). Use it with a quorum ``K < M``.

    References:
      Decoupled DiLoCo for Resilient Distributed Pre-training (arXiv 2604.21428).
    """
    merge = (
        radial_directional_average(weighting, plain_mean, full_round_tokens=full_round_tokens)
        if rda
        else token_weighted_mean(weighting, full_round_tokens=full_round_tokens)
    )
    parts: list[tuple[str, optax.GradientTransformation]] = [("merge", merge)]
    return _finish(parts, max_norm, learning_rate, momentum, step)


def diloco(
    learning_rate: float = 0.7,
    momentum: float = 0.8,
    *,
    max_norm: float | None = None,
    step: optax.GradientTransformation | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Synchronous DiLoCo outer optimizer: plain mean over present learners -> Nesterov.

    References:
      Douillard et al., DiLoCo (2023); Di-PS seed 000 sec. 3.
    """
    parts: list[tuple[str, optax.GradientTransformation]] = [
        ("merge", token_weighted_mean("uniform"))
    ]
    return _finish(parts, max_norm, learning_rate, momentum, step)
