"""What a learner contributes and how it takes a new version: the learner side's arithmetic,
shared by the simulator's learners (``sim/engine.py``, ``sim/replay.py``), the learner
process (``runtime/learner.py``, ``runtime/partition.py``) and the decentralized baseline.

* :func:`delta_to_send`: the pseudo-gradient a push carries (start or server reference);
* :func:`add_global_change`: adopting a new version while keeping one's own progress;
* :func:`push_meta`: what a push reports (tokens, steps, base version, data spans);
* :func:`wire`: the pseudo-gradient as the followers receive it through a wire codec.
"""

from __future__ import annotations

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


def add_global_change(own: Any, new: Any, base: Any) -> dict:
    """``own + (new - base)``: a learner adopting a new global version by adding the global
    change since the version it started from, keeping its own progress since then."""
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


def wire(codec: str, payload: dict) -> dict:
    """What the followers receive: a pseudo-gradient through the wire codec ``codec``
    (``fp32``: as it is). ``bf16`` takes the data plane's host path (``ml_dtypes``, round to
    nearest even: bit-identical to :func:`dipsjax.outer.encode` then ``decode``, and about
    ten times faster than their op-by-op dispatch on a small model's many tensors)."""
    if codec == "fp32":
        return payload
    if codec == "bf16":
        return jax.tree.map(_bf16_round_trip, payload)
    return outer.decode_tree(outer.encode_tree(payload, codec))


def _bf16_round_trip(x: Any) -> np.ndarray:
    host = np.asarray(x)
    return host.astype(np.float32).astype(ml_dtypes.bfloat16).astype(host.dtype)
