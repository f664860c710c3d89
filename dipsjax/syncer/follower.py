"""The follower: owns a shard of the global parameters and its FP32 outer state.

A follower receives learners' shards (data plane), reports per-learner partial squared
norms, merges with the leader's ONE decision, reports its merged partial norm, and applies
the outer chain (:mod:`dipsjax.outer`) with the leader's global statistics: the union of
all followers' results is exactly the single-process outer step (DESIGN.md sec. 4).

Pseudo-gradient reference (DESIGN.md sec. 3):

* ``'start'`` (DiLoCo / Decoupled DiLoCo): the learner sends ``Delta = theta_start - theta_end``.
* ``'server'`` (Di-PS): the learner sends its parameters ``theta_end`` and the follower forms
  ``Delta = theta_now - theta_end`` against its *current* parameters when the round runs.

Contributions are stacked into a fixed ``[capacity, ...]`` batch with a mask, so rounds of
any size reuse one compiled step. Applying is idempotent: a version at or below the
follower's own is ignored (retries and a restarted leader cannot apply a round twice).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dipsjax import outer
from dipsjax.syncer.leader import Apply, Decide

REFERENCES = ("start", "server")


class Follower:
    """One follower's state and its four protocol steps (sans-IO: plain method calls)."""

    def __init__(
        self,
        follower_id: int,
        params: Mapping[str, Any],
        tx: optax.GradientTransformationExtraArgs,
        *,
        capacity: int,
        reference: str = "start",
        version: int = 0,
        opt_state: Any = None,
    ) -> None:
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.follower_id = follower_id
        self.tx = tx
        self.capacity = capacity
        self.reference = reference
        # Own copies: the outer step donates these buffers.
        self.params = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), dict(params))
        self.opt_state = tx.init(self.params) if opt_state is None else opt_state
        self.version = version
        self._staged: dict[tuple[int, int], Any] = {}
        self._batch: dict[int, tuple[tuple[int, ...], Any]] = {}

    # -- data plane ----------------------------------------------------------------

    def receive(self, round_id: int, learner: int, payload: Mapping[str, Any]) -> None:
        """Stages a learner's shard (``Delta`` or ``theta_end``, by ``reference``)."""
        got = outer.flatten(payload)
        want = outer.flatten(self.params)
        if got.keys() != want.keys():
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            raise ValueError(
                f"follower {self.follower_id}: shard from learner {learner} does not match "
                f"its layers (missing {missing[:3]}, unexpected {extra[:3]})"
            )
        for path, x in got.items():
            if tuple(np.shape(x)) != tuple(want[path].shape):
                raise ValueError(
                    f"follower {self.follower_id}: learner {learner} sent {path} with shape "
                    f"{tuple(np.shape(x))}, expected {tuple(want[path].shape)}"
                )
        self._staged[(round_id, learner)] = jax.tree.map(
            lambda x: jnp.asarray(x, jnp.float32), dict(payload)
        )

    def pull(self) -> tuple[int, dict[str, Any]]:
        """The current version and parameters of this shard."""
        return self.version, self.params

    # -- control plane -------------------------------------------------------------

    def _stack(self, round_id: int, learners: tuple[int, ...]) -> Any:
        if len(learners) > self.capacity:
            raise ValueError(f"{len(learners)} learners exceed capacity {self.capacity}")
        missing = [j for j in learners if (round_id, j) not in self._staged]
        if missing:
            raise ValueError(
                f"follower {self.follower_id}: round {round_id} has no shard from {missing}"
            )
        rows = [self._staged[(round_id, j)] for j in learners]
        zeros = jax.tree.map(jnp.zeros_like, self.params)
        rows += [zeros] * (self.capacity - len(rows))
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *rows)
        if self.reference == "server":
            stacked = _server_delta(self.params, stacked)
        return stacked

    def partial_norms(self, round_id: int, learners: tuple[int, ...]) -> np.ndarray:
        """Step 1: per-learner squared norms of this shard's pseudo-gradients, ``[len]``."""
        stacked = self._stack(round_id, learners)
        self._batch[round_id] = (learners, stacked)
        return np.asarray(outer.learner_sq_norms(stacked))[: len(learners)]

    def _meta(self, decision: Decide) -> dict[str, jax.Array]:
        n, pad = len(decision.learners), self.capacity - len(decision.learners)
        return {
            "tokens": jnp.asarray(list(decision.tokens) + [0] * pad, jnp.float32),
            "steps": jnp.asarray(list(decision.steps) + [0] * pad, jnp.float32),
            "mask": jnp.asarray([True] * n + [False] * pad),
            "accepted": jnp.asarray(list(decision.accepted) + [False] * pad),
            "learner_sq_norms": jnp.asarray(list(decision.sq_norms) + [0.0] * pad, jnp.float32),
        }

    def merged_partial(self, decision: Decide) -> float:
        """Step 2: squared norm of this shard's merged update under the leader's decision."""
        _, stacked = self._batch[decision.round_id]
        return float(_merged_norm(self.tx, stacked, self.opt_state, self._meta(decision)))

    def apply(self, decision: Decide, apply: Apply) -> int:
        """Step 3: the outer step with the global statistics; returns the new version."""
        if apply.version <= self.version:
            return self.version  # already applied: idempotent
        if apply.version != self.version + 1:
            raise ValueError(
                f"follower {self.follower_id} is at version {self.version}, "
                f"cannot apply version {apply.version}"
            )
        _, stacked = self._batch.pop(decision.round_id)
        meta = self._meta(decision)
        meta["merged_sq_norm"] = jnp.asarray(apply.merged_sq_norm, jnp.float32)
        self.params, self.opt_state = _apply(self.tx, self.params, self.opt_state, stacked, meta)
        self.version = apply.version
        for key in [k for k in self._staged if k[0] == decision.round_id]:
            del self._staged[key]
        return self.version

    def discard(self, round_id: int) -> None:
        """Forgets everything staged for ``round_id`` (round abandoned)."""
        self._batch.pop(round_id, None)
        for key in [k for k in self._staged if k[0] == round_id]:
            del self._staged[key]


@jax.jit
def _server_delta(params: Any, stacked_end: Any) -> Any:
    return jax.tree.map(lambda p, e: p[None] - e, params, stacked_end)


@functools.partial(jax.jit, static_argnums=0)
def _merged_norm(tx: Any, stacked: Any, state: Any, meta: dict) -> jax.Array:
    return outer.shard_merged_sq_norm(tx, stacked, state, **meta)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def _apply(tx: Any, params: Any, state: Any, stacked: Any, meta: dict) -> tuple[Any, Any]:
    updates, state = tx.update(stacked, state, params, **meta)
    return optax.apply_updates(params, updates), state
