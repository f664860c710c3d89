"""Error feedback for compressed pseudo-gradients, correct under an asynchronous server.

EXTENSION (not in the papers; off unless a caller uses it). A learner that pushes its
pseudo-gradients through a lossy codec ``C`` (e.g. ``stat2``, :mod:`dipsjax.outer._codecs`)
keeps a residual ``e`` (FP32, the parameters' tree) of what compression withheld from the
server, and adds it to its next push (Seide et al. 2014; Karimireddy et al. 2019):

    target = delta + decay * e        sent: C(target)        decoded = decode(C(target))

With a synchronous server every push is applied and ``e <- target - decoded``. An
asynchronous server does not apply every push, and a learner may push again before it
learns what became of its last push (one push in flight with ``overlap``, or more). So the
residual is settled per push *when its outcome is known*, and the residual a push uses is
handed over to that push when it is encoded (the state keeps what other pushes settle
meanwhile), so no part of it is ever sent twice:

* :func:`feedback_encode`: ``(state, delta) -> (state', encoded, pending)``; ``state'``
  no longer holds the residual ``held = e`` the push carries (it holds ``0``);
* :func:`feedback_settle`: ``(state, pending, outcome) -> state``, adding to the residual
  what the outcome leaves owed:

=============  =====================================  ====================================
outcome        the server ...                         residual gets
=============  =====================================  ====================================
``applied``    merged ``decoded`` into a version      ``target - decoded``
``rejected``   judged it an anomaly, did not apply    ``held`` (as if never pushed)
``stale``      dropped it as too stale                ``held``
``discarded``  did not apply it, without judging it   ``held``
               (round discarded, push refused)
``lost``       never got it (transfer or peer lost)   ``held``
``nonfinite``  found it non-finite                    ``held``
=============  =====================================  ====================================

Why: the residual stands for *compression error of applied pushes*, the part of an applied
push's target the server did not receive. A push that was not applied delivered nothing,
so nothing of it may count as delivered (``decoded`` is not subtracted), and the residual
it carried is still owed in full (``held`` comes back, undecayed: no push consumed it).
Its ``delta`` does not enter the residual either: a rejected or stale push was refused for
its content, and re-sending it through the residual would override the server's decision
(and make it staler); a discarded or lost push was not judged, but whether its progress is
sent again is the learner's own business -- with the server reference
(``theta_base - theta_end``, :func:`dipsjax.learner.contribution.delta_to_send`) and
``adopt='delta'`` the next pseudo-gradient already contains it, and carrying it here too
would send it twice. A non-finite target (or decode) never enters the residual whatever
the outcome says: :func:`feedback_encode` hands over no residual then (``held = 0``, the
state keeps ``e``) and :func:`feedback_settle` adds nothing.

Invariant (decay 1, FP32 rounding aside): at any time
``sum(delta of applied pushes) == sum(decoded of applied pushes) + e + sum(held in flight)``.

``topk`` (EXTENSION of this extension): only the ``ceil(topk * n)`` largest-magnitude values
of each leaf's target are coded (the others are sent as zero and stay in the residual
through ``target - decoded``). The wire accounting stays that of the dense codec: the
coding of the kept values' positions is not implemented.

Everything is a pure function of pytrees; ``codec``, ``block_size``, ``embeddings``,
``topk`` and ``outcome`` are static under ``jax.jit``. The reconstruction
``pending.decoded`` is :func:`dipsjax.outer.decode_tree` of what is sent: the followers'
own decode, equal bit for bit.

Drivers: the simulator (:mod:`dipsjax.sim.engine`) and the learner process
(:class:`dipsjax.learner.contribution.PushFeedback`, which settles by the ``Settle``
commands of :class:`dipsjax.syncer.learner.LearnerProtocol`: the outcome the leader's
``NotifyPull`` says for each push, ``lost`` when it says none).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dipsjax.outer._codecs import CODECS, EMBEDDINGS, Codec, decode_tree, encode_tree


class Outcome(enum.StrEnum):
    """What became of a push (see the module docstring for the residual each leaves)."""

    APPLIED = "applied"
    REJECTED = "rejected"
    STALE = "stale"
    DISCARDED = "discarded"
    LOST = "lost"
    NONFINITE = "nonfinite"


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)


@dataclasses.dataclass(frozen=True)
class FeedbackState:
    """A learner's error-feedback state: the residual (FP32, the parameters' tree)."""

    residual: Any


@dataclasses.dataclass(frozen=True)
class Pending:
    """A push whose outcome is not known yet.

    ``target``: ``delta + decay * held`` (what the push meant to deliver); ``decoded``: what
    the followers decode from it (the learner's reconstruction); ``held``: the residual it
    carries; ``finite``: whether target and decode are finite (a scalar bool).
    """

    target: Any
    decoded: Any
    held: Any
    finite: jax.Array


jax.tree_util.register_dataclass(FeedbackState, data_fields=["residual"], meta_fields=[])
jax.tree_util.register_dataclass(
    Pending, data_fields=["target", "decoded", "held", "finite"], meta_fields=[]
)


def feedback_init(params: Any) -> FeedbackState:
    """A zero residual shaped like ``params`` (FP32)."""
    return FeedbackState(jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params))


def _all_finite(*trees: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for t in trees for x in jax.tree.leaves(t)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def top_k(x: jax.Array, fraction: float) -> jax.Array:
    """``x`` with all but its ``ceil(fraction * x.size)`` largest-magnitude values zeroed
    (ties as :func:`jax.lax.top_k` breaks them; non-finite values are kept)."""
    flat = x.reshape(-1)
    k = min(flat.size, math.ceil(fraction * flat.size))
    if k >= flat.size:
        return x
    score = jnp.where(jnp.isfinite(flat), jnp.abs(flat), jnp.inf)
    _, idx = jax.lax.top_k(score, k)
    keep = jnp.zeros(flat.shape, bool).at[idx].set(True)
    return jnp.where(keep, flat, 0.0).reshape(x.shape)


def _check(codec: str, decay: Any, topk: float | None) -> None:
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    if isinstance(decay, int | float) and not 0.0 <= decay <= 1.0:
        raise ValueError(f"error-feedback decay must lie in [0, 1], got {decay}")
    if topk is not None and not 0.0 < topk <= 1.0:
        raise ValueError(f"topk must be a fraction in (0, 1], got {topk}")


def feedback_encode(
    state: FeedbackState,
    delta: Any,
    *,
    codec: Codec = "stat2",
    decay: float | jax.Array = 1.0,
    block_size: int | None = None,
    embeddings: Sequence[str] = EMBEDDINGS,
    topk: float | None = None,
) -> tuple[FeedbackState, Any, Pending]:
    """Encodes ``delta + decay * e`` for a push; returns ``(state', encoded, pending)``.

    ``encoded`` is :func:`dipsjax.outer.encode_tree` of the target (``codec``, ``block_size``
    and ``embeddings`` as there); ``state'`` hands the residual over to the push (it holds
    zero) unless the target is not finite (then it keeps ``e`` and the push holds none).
    Settle ``pending`` with :func:`feedback_settle` once the push's outcome is known.
    """
    _check(codec, decay, topk)
    e = state.residual
    target = jax.tree.map(lambda d, r: jnp.asarray(d, jnp.float32) + decay * r, delta, e)
    sent = target if topk is None else jax.tree.map(lambda t: top_k(t, topk), target)
    encoded = encode_tree(sent, codec, block_size=block_size, embeddings=embeddings)
    decoded = jax.tree.map(lambda x: x.astype(jnp.float32), decode_tree(encoded))
    finite = _all_finite(target, decoded)
    held = jax.tree.map(lambda r: jnp.where(finite, r, 0.0), e)
    kept = jax.tree.map(lambda r: jnp.where(finite, 0.0, r), e)
    return FeedbackState(kept), encoded, Pending(target, decoded, held, finite)


def feedback_settle(
    state: FeedbackState, pending: Pending, outcome: Outcome | str
) -> FeedbackState:
    """The residual once ``pending``'s push had ``outcome`` (an :class:`Outcome`, static
    under jit; see the module docstring's table)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    if outcome == Outcome.APPLIED:
        owed = jax.tree.map(
            lambda t, d, h: jnp.where(pending.finite, t - d, h),
            pending.target,
            pending.decoded,
            pending.held,
        )
    else:
        owed = pending.held
    return FeedbackState(jax.tree.map(jnp.add, state.residual, owed))
