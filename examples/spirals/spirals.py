"""An example task outside the package: an MLP (Flax NNX) classifying points of three
interleaved spirals (2-D inputs, no text, no tokens), trained by dipsjax through its task
API (:mod:`dipsjax.task`).

Name it in a config as ``task="spirals:get_task"`` (this file importable: installed, or in
the current directory) and run it like any other job::

    dipsjax run run_config.py         # leader, follower, learners as processes
    dipsjax simulate sim_config.py    # the same task in the simulator

The job's "tokens" are examples here: every batch counts ``batch_size``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dipsjax.task import Task

CLASSES = 3


class MLP(nnx.Module):
    """``x [batch, 2] -> logits [batch, CLASSES]``: two hidden GELU layers."""

    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(2, hidden, rngs=rngs)
        self.mid = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.gelu(self.inp(x))
        h = jax.nn.gelu(self.mid(h))
        return self.out(h)


def spirals(rng: np.random.Generator, n: int, noise: float = 0.08) -> dict[str, np.ndarray]:
    """``n`` points of three spirals: ``{"x": float32[n, 2], "y": int32[n]}``."""
    y = rng.integers(0, CLASSES, n)
    r = rng.uniform(0.05, 1.0, n)
    theta = 3.0 * r + 2.0 * np.pi * y / CLASSES
    x = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)
    x = x + noise * rng.standard_normal(x.shape)
    return {"x": x.astype(np.float32), "y": y.astype(np.int32)}


class SpiralChunks:
    """The training set as a :class:`dipsjax.task.DataSource`: ``num_chunks`` chunks of
    ``batches_per_chunk`` batches, batch ``(c, i)`` drawn from a generator seeded by
    ``(seed, c, i)``: the same in every process, every time."""

    def __init__(self, batch_size: int, num_chunks: int = 256, batches_per_chunk: int = 4, seed=0):
        self.batch_size, self.seed = batch_size, seed
        self.num_chunks, self.batches_per_chunk = num_chunks, batches_per_chunk
        self.tokens_per_batch = batch_size  # the books count examples

    def batch(self, chunk: int, index: int) -> dict[str, np.ndarray]:
        return spirals(np.random.default_rng((self.seed, chunk, index)), self.batch_size)


def loss(model: MLP, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean softmax cross-entropy of the batch's labels."""
    logits = model(batch["x"])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))


def accuracy(model: MLP, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The task's own validation figure: the share of the batch classified right (reported
    as ``val_accuracy`` beside the loss; chance is 1/3)."""
    right = jnp.argmax(model(batch["x"]), axis=-1) == batch["y"]
    return {"accuracy": jnp.mean(right.astype(jnp.float32))}


def outer_sgd(learning_rate: float, momentum: float) -> optax.GradientTransformation:
    """The followers' outer step as plain momentum SGD (``optax.sgd``) in place of the
    papers' Nesterov (called with the config's ``outer_lr`` and ``outer_momentum``)."""
    return optax.sgd(learning_rate, momentum=momentum)


def get_task(cfg, hidden: int = 32, eval_batches: int = 4, outer: str = "nesterov") -> Task:
    """The spirals task of experiment ``cfg`` (its ``batch_size`` and ``seed``); ``outer``:
    the followers' outer step, ``"nesterov"`` (the config's: the papers') or ``"sgd"``
    (:func:`outer_sgd`, carried by the task)."""
    if outer not in ("nesterov", "sgd"):
        raise ValueError(f"spirals: outer must be 'nesterov' or 'sgd', got {outer!r}")
    rng = np.random.default_rng((cfg.seed, 10**6))  # held out: another stream
    return Task(
        name="spirals",
        model=lambda rngs: MLP(hidden, rngs=rngs),
        loss=loss,
        data=lambda: SpiralChunks(cfg.batch_size, seed=cfg.seed),
        eval_batches=[spirals(rng, cfg.batch_size) for _ in range(eval_batches)],
        eval_metrics=accuracy,
        outer_optimizer=outer_sgd if outer == "sgd" else None,
    )
