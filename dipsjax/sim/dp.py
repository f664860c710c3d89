"""The data-parallel baseline: every step, all learners' gradients are averaged.

One all-reduce per step over the slowest link (ring: ``2 (M - 1) / M`` model sizes per
learner), a barrier every step. Trains one model on the concatenated batches of all
learners, so it is the synchronous reference the outer-optimizer methods are judged by.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from dipsjax.data import LocalLedger
from dipsjax.sim.config import SimConfig, SimResult, TokenCount
from dipsjax.sim.world import World, figures_text


def simulate_dp(cfg: SimConfig, progress: Callable[[str], None] | None = None) -> SimResult:
    world = World(cfg)
    ledger = LocalLedger(world.ledger())
    model = world.learner("dp")
    streams = [world.stream(ledger.source(str(j))) for j in range(cfg.learners)]
    min_gbps = min(cfg.bandwidth(j) for j in range(cfg.learners))
    m = cfg.learners
    allreduce = (
        0.0 if m == 1 else cfg.latency + 2 * (m - 1) / m * world.wire_bytes * 8 / (min_gbps * 1e9)
    )
    t, tokens, comm, steps, train_time = 0.0, 0, 0.0, 0, 0.0
    curve: list[dict[str, float]] = []

    def record() -> None:
        figures = world.evaluate(model.params_dict()).point()
        curve.append(
            {
                "t": t,
                "version": steps,
                "tokens_consumed": tokens,
                "tokens_applied": tokens,
                **figures,
            }
        )
        if progress is not None:
            progress(f"t={t:8.1f}s step={steps:5d} tokens={tokens:9d} {figures_text(figures)}")

    while tokens < cfg.token_budget:
        parts = [s.next_batch() for s in streams]
        if any(p is None for p in parts):
            break
        for j, p in enumerate(parts):
            if p.finished:
                ledger.settle(str(j), [p.piece])
        # One data-parallel batch: every learner's, concatenated leaf by leaf (any task).
        batch = jax.tree.map(lambda *xs: np.concatenate(xs), *[p.tokens for p in parts])
        model.run_round([batch], num_steps=1)
        step = max(world.train_time(j, 1) for j in range(m))
        train_time += step
        t += step + allreduce
        comm += allreduce
        tokens += len(parts) * world.source.tokens_per_batch
        steps += 1
        if steps % (cfg.inner_steps * cfg.eval_every) == 0:
            record()
    record()
    return SimResult(
        config=cfg,
        virtual_time=t,
        tokens=TokenCount(consumed=tokens, reported=tokens, applied=tokens),
        rounds=steps,
        comm_time=comm,
        phases={"train": train_time, "allreduce": comm},
        curve=curve,
        final_loss=curve[-1]["val_loss"],
        final_bpb=curve[-1]["val_bpb"],
        params=model.params_dict(),
        ideal_tokens_per_second=world.ideal_tokens_per_second,
        chunk_ledger=ledger.state,
    )
