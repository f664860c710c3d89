"""The simulated world: the task (model, data, evaluation: :mod:`dipsjax.task`), and the
timing model (speeds and links).

Built once per experiment and shared by every method, so that methods compare on the same
model, data and token budget. Timing:

* a learner's step takes ``step_time * speed_j * noise`` virtual seconds (heterogeneity
  ``eta``: speeds spread evenly over ``[1, 1 + eta/100]``, or explicit ``speeds``; noise
  ``exp(step_noise * N(0, 1))``);
* tensor ``l`` on the wire weighs its share of a *virtual* model (``virtual_params``
  parameters at the wire codec's bytes per value), so a tiny model can stand in for a 1B
  one's communication; a transfer from learner ``j`` to follower ``f`` runs at
  ``min(bandwidth_j, follower_gbps)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dipsjax import outer
from dipsjax.data.pipeline import BatchStream, StreamPosition
from dipsjax.learner import Learner
from dipsjax.learner.round import evaluate
from dipsjax.sim.config import WIRE_BYTES, SimConfig
from dipsjax.syncer.schedule import assign_layers
from dipsjax.task import load_task


class World:
    """Model, data, followers' sharding and the timing model of one experiment."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.task = load_task(cfg)
        self.source = self.task.source
        self.eval_batches = self.task.validation
        if not self.eval_batches:
            raise ValueError(f"task {self.task.name!r} has no validation batches")
        self.inner_cfg = self.task.inner_optimizer or cfg.inner_optimizer()
        self.evaluator = self.learner("eval")
        self.init_params = self.evaluator.params_dict()
        self.rng = np.random.default_rng(cfg.seed)
        m = cfg.learners
        self.speed = list(cfg.speeds) or [
            1.0 + cfg.eta / 100.0 * (j / (m - 1) if m > 1 else 0.0) for j in range(m)
        ]
        # Shards: tensors (flattened order) dealt to followers, balanced by bytes.
        flat = outer.flatten(self.init_params)
        self.paths = list(flat)
        sizes = [int(np.prod(np.shape(flat[p]))) for p in self.paths]
        self.num_followers = min(cfg.followers, len(self.paths))
        self.layer_owner = assign_layers([4 * s for s in sizes], self.num_followers)
        real = sum(sizes)
        per_value = cfg.virtual_params / real * WIRE_BYTES[cfg.wire]
        self.layer_bytes = [s * per_value for s in sizes]
        self.wire_bytes = sum(self.layer_bytes)
        owner = dict(zip(self.paths, self.layer_owner, strict=True))
        self.shard_of = owner.__getitem__

    def learner(self, learner_id: Any) -> Learner:
        """A fresh learner (same initialisation for every learner, as after a first pull)."""
        return Learner(
            self.task,
            self.inner_cfg,
            mesh=None,
            learner_id=learner_id,
            seed=self.cfg.seed,
            donate=False,
        )

    def ledger(self) -> Any:
        """A fresh chunk ledger over this world's chunks (``cfg.seed`` orders the epochs)."""
        from dipsjax.data import new_ledger

        return new_ledger(
            self.source.num_chunks,
            batches_per_chunk=self.source.batches_per_chunk,
            seed=self.cfg.seed,
        )

    def stream(self, source: Any, position: StreamPosition | None = None) -> BatchStream:
        return BatchStream(self.source, source=source, position=position)

    def method(self) -> Any:
        """The experiment's method parts from the registry, sharded over these followers."""
        from dipsjax.syncer import methods

        settings = self.cfg.method_settings(tuple(self.layer_owner), self.num_followers)
        return methods.build(self.cfg.method, settings)

    def followers(self, method: Any) -> list[Any]:
        """Followers holding the initial model, one shard each, running the method's chain."""
        from dipsjax.syncer.follower import Follower

        tx = method.make_tx()
        return [
            Follower(k, shard, tx, reference=method.reference, **self.cfg.follower_options())
            for k, shard in enumerate(self.split(self.init_params))
        ]

    def split(self, tree: dict) -> list[dict]:
        """A parameter-shaped tree cut into the followers' shards."""
        return outer.split_tree(tree, self.shard_of, self.num_followers)

    @property
    def ideal_tokens_per_second(self) -> float:
        """Aggregate throughput if every learner trained alone with no outer communication."""
        per_step = self.source.tokens_per_batch
        return sum(per_step / (self.cfg.step_time * s) for s in self.speed)

    def evaluate(self, params: dict) -> tuple[float, float]:
        self.evaluator.pull(params, version=0)
        res = evaluate(self.evaluator.inner, self.evaluator.params, self.eval_batches)
        return res.loss, self.task.bits_per_byte(res.loss)

    def train_time(self, j: int, steps: int) -> float:
        noise = (
            math.exp(self.cfg.step_noise * self.rng.standard_normal())
            if self.cfg.step_noise
            else 1.0
        )
        return steps * self.cfg.step_time * self.speed[j] * noise

    def rate(self, j: int, follower: int | None = None) -> float:
        """Bytes per second of a transfer between learner ``j`` and a follower."""
        del follower  # every follower has the same link
        return min(self.cfg.bandwidth(j), self.cfg.follower_gbps) * 1e9 / 8

    def pull_time(self, j: int) -> float:
        """A whole model from all followers at once (their egress links in parallel)."""
        gbps = min(self.cfg.bandwidth(j), self.cfg.follower_gbps * self.num_followers)
        return self.cfg.latency + self.wire_bytes * 8 / (gbps * 1e9)
