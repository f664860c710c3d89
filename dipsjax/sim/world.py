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

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dipsjax import outer
from dipsjax.data.pipeline import BatchStream, StreamPosition
from dipsjax.learner import Learner
from dipsjax.sim.config import WIRE_BYTES, SimConfig
from dipsjax.syncer.schedule import assign_layers
from dipsjax.task import load_task, outer_optimizer_of


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One validation of a model (:meth:`World.evaluate`).

    Attributes:
      loss: the task's validation loss, the mean of its batches' losses weighted by what
        each counts (``count(batch)``; for a language model, nats per target token).
      metrics: every other figure: the loss-derived ones (:attr:`dipsjax.task.Task.metrics`,
        the language model's ``bits_per_byte``) and the task's own
        (:attr:`dipsjax.task.Task.eval_metrics`, weighted as the loss), by name.
      count: what the validation batches counted in all.
    """

    loss: float
    metrics: dict[str, float]
    count: int

    @property
    def bpb(self) -> float:
        """Bits per byte (NaN for a task without them)."""
        return float(self.metrics.get("bits_per_byte", math.nan))

    def point(self) -> dict[str, float]:
        """The figures as the reports name them: ``val_loss``, ``val_bpb`` (NaN for a task
        without bits per byte) and ``val_<name>`` for every other metric."""
        out = {"val_loss": self.loss, "val_bpb": self.bpb}
        out.update({f"val_{k}": v for k, v in self.metrics.items() if k != "bits_per_byte"})
        return out


def figures_text(point: Mapping[str, float]) -> str:
    """``val_loss=2.1043 bpb=3.036 val_accuracy=0.9375``: the ``val_*`` figures of a point
    (:meth:`Evaluation.point`), bits per byte only where the task has them."""
    parts = [f"val_loss={point['val_loss']:.4f}"]
    if math.isfinite(point.get("val_bpb", math.nan)):
        parts.append(f"bpb={point['val_bpb']:.3f}")
    parts += [f"{k}={v:.4f}" for k, v in point.items() if k.startswith("val_") and k not in _SHOWN]
    return " ".join(parts)


_SHOWN = ("val_loss", "val_bpb")


@functools.lru_cache(maxsize=16)
def _eval_pass(graphdef: Any, loss: Any, eval_metrics: Any) -> Any:
    """``(params, batch) -> (loss, {name: figure})``, jitted: the task's loss and its own
    ``eval_metrics`` in one pass (one compiled function per model, loss and metrics)."""

    def run(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        model = nnx.merge(graphdef, params)
        figures = eval_metrics(model, batch)
        if not isinstance(figures, Mapping):
            raise TypeError(
                f"Task.eval_metrics must return a dict {{name: scalar}}, got {type(figures)}"
            )
        out = {}
        for name, value in figures.items():
            if not isinstance(name, str) or jnp.shape(value) != ():
                raise ValueError(
                    f"Task.eval_metrics: figure {name!r} must be a scalar named by a string "
                    f"(the batch's mean), got shape {jnp.shape(value)}"
                )
            out[name] = jnp.asarray(value, jnp.float32)
        return jnp.asarray(loss(model, batch), jnp.float32), out

    return jax.jit(run)


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
        # Each tensor priced in the codec it travels in (stat2 sends norms and embeddings as
        # BF16: outer.leaf_codecs), scaled to the virtual model's size.
        codecs = outer.flatten(outer.leaf_codecs(self.init_params, cfg.wire))
        scale = cfg.virtual_params / real
        self.layer_bytes = [
            s * WIRE_BYTES[codecs[p]] * scale for p, s in zip(self.paths, sizes, strict=True)
        ]
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

        tx = method.make_tx(outer_optimizer_of(self.task, self.cfg))
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

    def evaluate(self, params: dict) -> Evaluation:
        """The task's validation figures of ``params`` (a parameter-shaped nested dict) on
        its validation batches: the loss, its derived metrics and the task's own
        ``eval_metrics`` (computed with the loss, under jit), each the mean over the batches
        weighted by what they count."""
        self.evaluator.pull(params, version=0)
        inner, state = self.evaluator.inner, self.evaluator.params
        own = self.task.eval_metrics
        fn = None if own is None else _eval_pass(inner.graphdef, self.task.loss, own)
        total, sums, count = 0.0, {}, 0
        for batch in self.eval_batches:
            n = inner.tokens_in(batch)
            on_device = inner.put_batch(batch)
            if fn is None:
                loss, figures = inner.eval_loss(state, on_device), {}
            else:
                loss, figures = fn(state, on_device)
            loss, figures = jax.device_get((loss, figures))
            count += n
            total += float(loss) * n
            for name, value in figures.items():
                sums[name] = sums.get(name, 0.0) + float(value) * n
        loss = total / count
        derived = self.task.extra_metrics(loss)
        clash = ({"loss", "bpb"} | set(derived)) & set(sums)
        if clash:
            raise ValueError(
                f"task {self.task.name!r}: eval_metrics names {sorted(clash)} clash with the "
                "loss, bpb or the loss-derived metrics"
            )
        figures = {k: float(v) for k, v in derived.items()}
        figures.update({k: v / count for k, v in sums.items()})
        return Evaluation(loss, figures, count)

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
