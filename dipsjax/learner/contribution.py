"""What a learner contributes and how it takes a new version: the learner side's arithmetic,
shared by the simulator's learners (``sim/engine.py``, ``sim/replay.py``), the learner
process (``runtime/learner.py``, ``runtime/partition.py``) and the decentralized baseline.

* :func:`delta_to_send`: the pseudo-gradient a push carries (start or server reference);
* :func:`add_global_change`: adopting a new version while keeping one's own progress;
* :func:`push_meta`: what a push reports (tokens, steps, base version, data spans);
* :func:`wire`: the pseudo-gradient as the followers receive it through a wire codec;
* :class:`PushFeedback`: a learner process's error feedback (EXTENSION), its pushes
  encoded with :func:`dipsjax.outer.feedback_encode` and settled by the protocol core's
  ``Settle`` commands with :func:`dipsjax.outer.feedback_settle`.
"""

from __future__ import annotations

import collections
import functools
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from dipsjax import outer
from dipsjax.learner.round import Learner
from dipsjax.syncer.messages import PushMeta, spans_of


def delta_to_send(reference: str, contrib: Any, learner: Learner, base: Any) -> dict:
    """What a learner sends: ``theta_start - theta_end`` (start reference), or
    ``theta_base - theta_end`` against the version it last pulled (server reference: the
    followers add ``theta_now - theta_base``; a round that did not start from a fresh pull
    still yields exactly ``theta_now - theta_end``)."""
    if reference != "server":
        return contrib.delta
    return jax.tree.map(lambda b, e: jnp.asarray(b, jnp.float32) - e, base, learner.params_dict())


@jax.jit
def add_global_change(own: Any, new: Any, base: Any) -> dict:
    """``own + (new - base)``: a learner adopting a new global version by adding the global
    change since the version it started from, keeping its own progress since then (one
    compiled program: at a round start, on the learner's critical path)."""
    return jax.tree.map(
        lambda o, n, b: o + (jnp.asarray(n, jnp.float32) - jnp.asarray(b, jnp.float32)),
        own,
        new,
        base,
    )


def push_meta(
    contrib: Any, data: Any, incarnation: int, train_seconds: float, *, pulled: bool
) -> PushMeta:
    """What a learner reports with its push, from its contribution and the round's data."""
    return PushMeta(
        tokens=contrib.tokens,
        steps=contrib.steps,
        base_version=contrib.base_version,
        incarnation=incarnation,
        train_seconds=train_seconds,
        pulled=pulled,
        start_chunk=data.start.chunk,
        start_offset=data.start.offset,
        spans=spans_of(data.spans),
    )


def wire(codec: str, payload: dict, topk: float | None = None) -> dict:
    """What the followers receive: a pseudo-gradient through the wire codec ``codec``
    (``fp32``: as it is). ``bf16`` takes the data plane's host path (``ml_dtypes``, round to
    nearest even: bit-identical to :func:`dipsjax.outer.encode` then ``decode``, and about
    ten times faster than their op-by-op dispatch on a small model's many tensors).
    ``topk`` (EXTENSION, without error feedback the control of its ablation): only each
    leaf's ``ceil(topk * n)`` largest-magnitude values are coded, the rest zeroed before coding
    (:func:`sparsify`)."""
    if topk is not None:
        return outer.decode_tree(encode_tree(payload, codec, topk))
    if codec == "fp32":
        return payload
    if codec == "bf16":
        return jax.tree.map(_bf16_round_trip, payload)
    return outer.decode_tree(outer.encode_tree(payload, codec))


def sparsify(tree: Any, topk: float | None) -> Any:
    """Each leaf of ``tree`` with all but its ``ceil(topk * n)`` largest-magnitude values
    zeroed (:func:`dipsjax.outer.top_k`, the function error feedback uses); ``None``: as
    it is."""
    if topk is None:
        return tree
    return jax.tree.map(lambda x: outer.top_k(x, topk), tree)


@functools.partial(jax.jit, static_argnames=("codec", "topk"))
def encode_tree(tree: Any, codec: str, topk: float | None = None) -> Any:
    """:func:`dipsjax.outer.encode_tree` of :func:`sparsify` ``(tree, topk)``: a push's
    tensors as a learner without error feedback encodes them itself (``stat2``, top-k)."""
    return outer.encode_tree(sparsify(tree, topk), codec)


_feedback_encode = jax.jit(
    outer.feedback_encode, static_argnames=("codec", "block_size", "embeddings", "topk")
)
_feedback_settle = jax.jit(outer.feedback_settle, static_argnames=("outcome",))


class PushFeedback:
    """A learner process's error feedback (EXTENSION; :mod:`dipsjax.outer._feedback`).

    :meth:`encode` hands a push's pseudo-gradient plus ``decay`` times the residual to
    :func:`dipsjax.outer.feedback_encode` and keeps its :class:`~dipsjax.outer.Pending` by
    round; :meth:`settle` carries out the protocol core's ``Settle(round_id, outcome)``
    (:class:`~dipsjax.syncer.learner.LearnerProtocol` with ``feedback=True``) with
    :func:`dipsjax.outer.feedback_settle`. What it sends is ``encode``'s tree of
    :class:`~dipsjax.outer.Encoded` (norms and embeddings BF16 under ``stat2``), decoded by
    the followers with :func:`dipsjax.outer.decode`: equal to ``Pending.decoded`` bit for bit.
    """

    def __init__(self, codec: str, decay: float = 1.0, topk: float | None = None) -> None:
        self.codec, self.decay, self.topk = codec, decay, topk
        self.state: outer.FeedbackState | None = None
        self.pending: dict[int, outer.Pending] = {}
        self.sent: dict[int, Any] = {}  # round -> its encoded tree (a retried push's too)
        self.settled: collections.Counter[str] = collections.Counter()  # pushes, by outcome

    def encode(self, round_id: int, delta: Any) -> Any:
        """The encoded tree the push of ``round_id`` sends (encoded once per round)."""
        if round_id not in self.sent:
            if self.state is None:
                self.state = outer.feedback_init(delta)
            self.state, encoded, pending = _feedback_encode(
                self.state, delta, codec=self.codec, decay=self.decay, topk=self.topk
            )
            self.pending[round_id], self.sent[round_id] = pending, encoded
        return self.sent[round_id]

    def warm_up(self, delta: Any) -> None:
        """Compiles encoding and every settlement on ``delta`` (zeros shaped like a push),
        leaving the state as it was."""
        state, _, pending = _feedback_encode(
            outer.feedback_init(delta), delta, codec=self.codec, decay=self.decay, topk=self.topk
        )
        for outcome in outer.Outcome:
            jax.block_until_ready(_feedback_settle(state, pending, outcome))

    def settle(self, round_id: int, outcome: str) -> None:
        """Settles the push of ``round_id`` (one never encoded: nothing to settle)."""
        self.sent.pop(round_id, None)
        pending = self.pending.pop(round_id, None)
        if pending is None or self.state is None:
            return
        self.state = _feedback_settle(self.state, pending, outer.Outcome(outcome))
        self.settled[str(outcome)] += 1

    def save(self, path: str | os.PathLike) -> None:
        """Writes the residual and the pushes not settled yet to ``path`` (``.npz``, via a
        temporary file renamed into place: a file there is whole)."""
        arrays: dict[str, np.ndarray] = {}
        if self.state is not None:
            arrays.update(_named("residual", self.state.residual))
        for r, pending in self.pending.items():
            for field in ("target", "decoded", "held"):
                arrays.update(_named(f"pending/{r}/{field}", getattr(pending, field)))
            arrays[f"pending/{r}/finite"] = np.asarray(pending.finite)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike) -> list[int]:
        """Takes the residual and the unsettled pushes :meth:`save` wrote (a restarted
        process); returns those pushes' rounds, for the protocol to settle."""
        with np.load(path) as data:
            flat = {k: data[k] for k in data.files}
        self.state = (
            outer.FeedbackState(_tree(flat, "residual"))
            if any(k.startswith("residual/") for k in flat)
            else None
        )
        rounds = sorted({int(k.split("/")[1]) for k in flat if k.startswith("pending/")})
        self.pending = {
            r: outer.Pending(
                _tree(flat, f"pending/{r}/target"),
                _tree(flat, f"pending/{r}/decoded"),
                _tree(flat, f"pending/{r}/held"),
                jnp.asarray(flat[f"pending/{r}/finite"]),
            )
            for r in rounds
        }
        self.sent = {}
        return rounds

    def residual_norm(self) -> float:
        """The residual's L2 norm (0 before the first push)."""
        if self.state is None:
            return 0.0
        leaves = jax.tree.leaves(self.state.residual)
        return float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in leaves)))


def _named(prefix: str, tree: Any) -> dict[str, np.ndarray]:
    """``{prefix/a/b: array}`` of a nested dict of arrays (``/`` joins its keys)."""
    flat = outer.flatten(jax.device_get(tree))
    bad = [path for path in flat if any("/" in str(k) for k in path)]
    if bad:
        raise ValueError(f"error feedback cannot save a tree whose keys hold '/': {bad[0]}")
    return {"/".join((prefix, *path)): np.asarray(x) for path, x in flat.items()}


def _tree(flat: dict[str, np.ndarray], prefix: str) -> dict:
    """The nested dict :func:`_named` wrote under ``prefix``."""
    head = prefix + "/"
    return outer.unflatten(
        {
            tuple(k[len(head) :].split("/")): jnp.asarray(v)
            for k, v in flat.items()
            if k.startswith(head)
        }
    )


def _bf16_round_trip(x: Any) -> np.ndarray:
    host = np.asarray(x)
    return host.astype(np.float32).astype(ml_dtypes.bfloat16).astype(host.dtype)
