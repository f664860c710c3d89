"""Replay: recompute the final global parameters from the event tape alone.

For each :class:`~dipsjax.syncer.tape.RoundRecord`, in order: every participant retrains its
contribution from the global parameters of its base version with the data the record names
(start position and chunks leased; its AdamW state continuing from its previous contribution
in the same incarnation), the followers stage it, recompute the norms (checked against the
tape) and apply the recorded decision. Bit-for-bit equal to the run that wrote the tape.

A run resumed from checkpoints (``--resume``) puts the pushes it lost in an unapplied
round, and each resumed learner's ``active`` record says how many of its rounds its
restored inner state had trained: replay takes the learner's AdamW state back to that
point before its first push after the restart, as the learner did.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dipsjax import outer
from dipsjax.learner import Learner
from dipsjax.learner.contribution import add_global_change, delta_to_send, wire
from dipsjax.sim.config import SimConfig
from dipsjax.sim.world import World
from dipsjax.syncer import messages as m
from dipsjax.syncer import methods as methods_lib
from dipsjax.syncer.tape import EventTape


def replay(cfg: SimConfig, tape: EventTape, world: World | None = None) -> dict:
    """The final global parameters recomputed from ``tape`` (see module docstring), on a
    fresh ``World(cfg)`` or on ``world`` (a fresh one of another kind, e.g. the fault
    tests' toy world)."""
    if cfg.method not in methods_lib.METHODS:
        raise ValueError(f"replay needs a syncer method, not {cfg.method!r}")
    if cfg.error_feedback:
        raise ValueError(
            "replay does not carry error feedback (error_feedback=True): a push's payload "
            "depends on its learner's residual, which the tape does not hold"
        )
    world = World(cfg) if world is None else world
    method = world.method()
    followers = world.followers(method)
    versions = {0: world.init_params}
    learners: dict[int, tuple[int, Learner]] = {}
    adopted: dict[int, tuple[int, dict]] = {}  # per learner: (incarnation, last version taken)
    history: dict[int, list[Any]] = {}  # per learner: its inner state after each round
    resumes: dict[int, list[tuple[float, int]]] = {}  # per learner: (time, rounds kept)
    for r in tape.records:
        if r["kind"] == "membership" and r["event"] == "active" and "rounds" in r:
            resumes.setdefault(r["learner"], []).append((r["t"], r["rounds"]))
    for rec in tape.round_records():
        for p in sorted(rec.participants + rec.dropped, key=lambda p: p.pushed_at):
            j, meta = p.learner, p.meta
            if j not in learners or learners[j][0] != meta.incarnation:
                learners[j] = (meta.incarnation, world.learner(j))
                history[j] = [_copy(learners[j][1].opt_state)]
            learner = learners[j][1]
            while resumes.get(j) and resumes[j][0][0] < p.pushed_at:
                _, kept_rounds = resumes[j].pop(0)
                learner.set_opt_state(history[j][kept_rounds])
                del history[j][kept_rounds + 1 :]
            if meta.pulled:
                params = versions[meta.base_version]
                fresh = adopted.get(j) is None or adopted[j][0] != meta.incarnation
                if cfg.adopt == "delta" and not fresh:
                    params = add_global_change(learner.params_dict(), params, adopted[j][1])
                learner.pull(params, version=meta.base_version)
                adopted[j] = (meta.incarnation, versions[meta.base_version])
            batches = world.stream(list(meta.spans)).take_round(meta.steps).batches
            contrib = learner.run_round(batches, num_steps=meta.steps, reference="start")
            history[j].append(_copy(learner.opt_state))
            if not any(p is q for q in rec.participants):
                # Dropped (stale, or lost to a leader restart; a learner may have one of
                # each in a round): retrained only to carry the learner's state on.
                continue
            base = versions.get(meta.base_version)
            delta = delta_to_send(method.reference, contrib, learner, base)
            for f, part in zip(
                followers, world.split(wire(cfg.wire, delta, cfg.wire_topk)), strict=True
            ):
                f.receive(rec.round_id, j, part)
        if not rec.participants:
            continue
        learners_t = tuple(p.learner for p in rec.participants)
        bases = tuple(p.base_version for p in rec.participants)
        g = sum(f.partial_norms(rec.round_id, learners_t, bases) for f in followers)
        np.testing.assert_allclose(
            g, rec.sq_norms or g, rtol=1e-6, err_msg=f"round {rec.round_id}: norms differ"
        )
        if not rec.applied:
            for f in followers:
                f.discard(rec.round_id)
            continue
        decision = m.Decide(
            rec.round_id,
            learners_t,
            tuple(rec.accepted),
            tuple(p.tokens for p in rec.participants),
            tuple(p.steps for p in rec.participants),
            tuple(rec.weights),
            tuple(rec.sq_norms),
        )
        merged = sum(f.merged_partial(decision) for f in followers)
        apply = m.Apply(rec.round_id, rec.version, rec.clip_factor, merged)
        for f in followers:
            f.apply(decision, apply)
        versions[rec.version] = jax.device_get(outer.merge_trees([f.pull()[1] for f in followers]))
    return versions[max(versions)]


def _copy(tree: Any) -> Any:
    return jax.tree.map(np.array, jax.device_get(tree))


def tree_equal(a: Any, b: Any) -> bool:
    """Exact equality of two parameter trees."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )
