"""The Di-PS paper's naive baseline: decentralized asynchronous DiLoCo (seed 000 sec. 4).

Every learner keeps its own replica of the global model and its own Nesterov state. When a
learner finishes its ``H`` inner steps it applies its pseudo-gradient to its replica at
once, then sends it to every other learner over its own link, one after the other
(``latency + bytes / min(bandwidth_j, bandwidth_i)`` each); a receiver applies it to its
replica on arrival. The sender starts its next round from its replica when its sends are
done (its outbound transfers are on its critical path, as a collective's would be). No
penalty, no weighting beyond one pseudo-gradient at a time, no grace: the point of the
baseline is that without a global history nobody can judge a stale pseudo-gradient.

Outer communication time counts every transfer, so it compares with Di-PS's pushes and
pulls (the paper's communication ablation: at 16 learners with the slowest link going from
10 to 1 Gbps, Di-PS cut total outer communication time 1.06-4.69x against this baseline).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dipsjax import outer
from dipsjax.data import LocalLedger
from dipsjax.learner.contribution import wire
from dipsjax.sim.cluster import Clock
from dipsjax.sim.config import SimConfig, SimResult, TokenCount
from dipsjax.sim.world import World, figures_text


@functools.partial(jax.jit, static_argnums=0)
def _outer_step(tx: Any, params: Any, state: Any, delta: Any) -> tuple[Any, Any]:
    stacked = jax.tree.map(lambda x: x[None], delta)
    updates, state = tx.update(stacked, state, params, mask=jnp.ones((1,), bool))
    return optax.apply_updates(params, updates), state


def simulate_decentralized(
    cfg: SimConfig, progress: Callable[[str], None] | None = None
) -> SimResult:
    world = World(cfg)
    ledger = LocalLedger(world.ledger())
    tx = outer.diloco(*cfg.outer())
    m = cfg.learners
    replicas = [jax.tree.map(jnp.asarray, world.init_params) for _ in range(m)]
    states = [tx.init(replicas[0]) for _ in range(m)]
    learners = [world.learner(j) for j in range(m)]
    streams = [world.stream(ledger.source(str(j))) for j in range(m)]
    clock = Clock()
    stopped = [False]
    count = {"consumed": 0, "reported": 0, "pushes": 0}
    comm = [0.0]
    phases = {"train": 0.0, "send": 0.0}
    curve: list[dict[str, float]] = []
    applied = [0]
    training = [0] * m  # tokens of each learner's round in progress

    def record(t: float) -> None:
        figures = world.evaluate(jax.device_get(replicas[0])).point()
        curve.append(
            {
                "t": t,
                "version": applied[0],
                "tokens_consumed": count["consumed"],
                "tokens_applied": count["reported"],
                **figures,
            }
        )
        if progress is not None:
            progress(f"t={t:8.1f}s tokens={count['consumed']:9d} {figures_text(figures)}")

    def apply(i: int, delta: Any) -> None:
        replicas[i], states[i] = _outer_step(tx, replicas[i], states[i], delta)
        applied[0] += 1

    def start(j: int) -> None:
        if stopped[0]:
            return
        learners[j].pull(jax.device_get(replicas[j]), version=0)
        batches = []
        for _ in range(cfg.inner_steps):
            b = streams[j].next_batch()
            if b is None:
                break
            batches.append(b.tokens)
            if b.finished:
                ledger.settle(str(j), [b.piece])
        if not batches:
            return
        count["consumed"] += len(batches) * world.source.tokens_per_batch  # batches drawn
        contrib = learners[j].run_round(batches, num_steps=len(batches), reference="start")
        training[j] = contrib.tokens
        dt = world.train_time(j, contrib.steps)
        phases["train"] += dt
        clock.at(clock.now + dt, trained, j, wire(cfg.wire, contrib.delta), contrib.tokens)

    def trained(j: int, delta: Any, tokens: int) -> None:
        t = clock.now
        training[j] = 0
        count["reported"] += tokens
        count["pushes"] += 1
        apply(j, delta)
        free = t
        for i in range(m):
            if i == j:
                continue
            gbps = min(cfg.bandwidth(j), cfg.bandwidth(i))
            dt = cfg.latency + world.wire_bytes * 8 / (gbps * 1e9)
            free += dt
            comm[0] += dt
            phases["send"] += dt
            clock.at(free, apply, i, delta)
        if applied[0] // m > len(curve) * cfg.eval_every - 1:
            record(t)
        if count["reported"] >= cfg.token_budget:
            stopped[0] = True
            return
        clock.at(free, start, j)

    for j in range(m):
        clock.at(0.0, start, j)
    clock.run(lambda: stopped[0])
    record(clock.now)
    return SimResult(
        config=cfg,
        virtual_time=clock.now,
        tokens=TokenCount(
            consumed=count["consumed"],
            unpushed=sum(training),
            reported=count["reported"],
            applied=count["reported"],
        ),
        rounds=count["pushes"],
        comm_time=comm[0],
        phases=phases,
        curve=curve,
        final_loss=curve[-1]["val_loss"],
        final_bpb=curve[-1]["val_bpb"],
        params=jax.device_get(replicas[0]),
        ideal_tokens_per_second=world.ideal_tokens_per_second,
        chunk_ledger=ledger.state,
    )
