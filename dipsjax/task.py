"""Bring your own task: the model, loss, data, evaluation and optimizers a job trains.

A :class:`Task` is everything about *what* is trained; the rest of dipsjax (the learners'
protocol, the syncer, the books, chunk leasing, checkpoints, replay) is about *how*, and
works the same for any task. A config names its task by import path, and every process of
a job (and the simulator) builds it the same way::

    # mypkg/tasks.py
    def get_task(cfg, hidden=64):          # cfg: the experiment's SimConfig
        return dipsjax.task.Task(
            name="mlp",
            model=lambda rngs: MLP(hidden, rngs=rngs),       # any NNX module
            loss=lambda model, batch: mse(model(batch["x"]), batch["y"]),
            data=lambda: MyChunks(cfg.batch_size),           # a DataSource, built lazily
            eval_batches=lambda: my_validation_batches(),
            eval_metrics=lambda model, batch: {"mae": mae(model(batch["x"]), batch["y"])},
        )

    # the config: sim=dict(task="mypkg.tasks:get_task", task_args={"hidden": 128}, ...)

Validation reports the loss, the figures derived from it (:attr:`Task.metrics`) and the
task's own (:attr:`Task.eval_metrics`), as ``val_loss``, ``val_bpb`` and ``val_<name>``
(:meth:`dipsjax.sim.world.World.evaluate`).

The built-in LLaMA language model on a text corpus is one task among others
(:func:`dipsjax.tasks.lm.get_task`, the default).

Data. A :class:`DataSource` gives deterministic batches by ``(chunk, index)``: chunks are
the leader's unit of data assignment (a learner leases a piece of a chunk, trains it, and
the ledger settles it once its push is applied, or gives it back when it is lost), so a
learner's *data position* is just the piece and batch it is on: a
:class:`~dipsjax.data.pipeline.BatchStream` reads each piece through a grain dataset
iterator, and its :class:`~dipsjax.data.pipeline.StreamPosition` keeps the books with that
iterator's checkpointable state; the learner's checkpoints keep it and replay reads the
pieces again. ``batch`` is called from the reading thread, one call at a time. Every
batch counts the same ``tokens_per_batch`` in the job's books (the "tokens" of a non-text
task are whatever unit it counts: examples, pixels, ...).

Sharding. On a partition mesh the learner places every leaf of a batch with its leading
axis split over the mesh's batch axes (``data`` and ``fsdp``), and parameters as their NNX
sharding annotations say. A loss may read :func:`activation_sharding` (the ``[batch,
...]`` sharding of the partition, ``None`` unsharded) to constrain its activations.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import optax

    from dipsjax.sim.config import SimConfig

PyTree = Any


@runtime_checkable
class DataSource(Protocol):
    """Training batches by ``(chunk, index)``: deterministic, random access.

    Attributes:
      num_chunks: chunks of the training set (the leader's ledger leases pieces of them).
      batches_per_chunk: batches in every chunk.
      tokens_per_batch: what one batch counts in the job's books (an exact int; for text,
        ``batch_size * seq_len`` target tokens).
    """

    num_chunks: int
    batches_per_chunk: int
    tokens_per_batch: int

    def batch(self, chunk: int, index: int) -> PyTree:
        """Batch ``index`` (``0 <= index < batches_per_chunk``) of chunk ``chunk``: a pytree
        of NumPy arrays whose leaves share their leading (batch) axis. The same call gives
        the same batch in every process, every time."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Task:
    """What a job trains (see the module docstring).

    Attributes:
      name: a short name for logs and reports.
      model: ``model(rngs) -> nnx.Module``, the model factory (``nnx.Rngs`` seeded by the
        job's seed: every learner starts from the same parameters). Its ``nnx.Param``
        leaves are what the job trains, shards over followers and exports.
      loss: ``loss(model, batch) -> scalar``, the mean training loss of a batch (the inner
        optimizer minimises it; validation reports it on :attr:`eval_batches`).
      data: the training :class:`DataSource`, or a function that builds it (called once,
        only in the processes that read data: learners, the simulator, the launcher).
      eval_batches: the validation batches (a sequence, or a function returning one), each
        counting :attr:`DataSource.tokens_per_batch`-like weight ``count(batch)``.
      metrics: ``metrics(mean_val_loss) -> {name: value}``, validation figures derived from
        the mean validation loss (the language model's ``bits_per_byte``); none by default.
      eval_metrics: ``eval_metrics(model, batch) -> {name: scalar}``, the task's own
        validation figures (a classifier's ``accuracy``): each a mean over the batch,
        computed under ``jax.jit`` in the same pass as the validation loss and averaged over
        :attr:`eval_batches` weighted by ``count(batch)`` as the loss is. Reported beside
        the loss by the simulator's results, the runtime's evaluator (``eval.jsonl``,
        TensorBoard, ``dipsjax status``, the console) and the end-of-run validation, as
        ``val_<name>``. Names must differ from ``loss`` and from :attr:`metrics`' names;
        none by default.
      count: ``count(batch) -> int``, what a batch counts in the books; by default the
        source's ``tokens_per_batch`` (the language model checks its token batches here).
      inner_optimizer: an ``optax`` transform for the learners' inner steps; ``None``: the
        config's (:class:`~dipsjax.learner.step.InnerOptimizerConfig` from ``inner_*``).
      outer_optimizer: EXTENSION: ``outer_optimizer(learning_rate, momentum) -> optax
        transform``, the step that takes the place of the followers' Nesterov SGD at the end
        of the method's outer chain (the chain's other stages, e.g. the Di-PS penalty and
        clipping, stay), called with the config's ``outer_lr`` and ``outer_momentum``;
        ``None``: the config's ``outer_optimizer`` (a ``"package.module:function"`` of the
        same contract), else the papers' Nesterov. A task's and a config's both set is an
        error (:func:`outer_optimizer_of`). The followers and the simulator build it from the
        task; the leader never loads the task. Give a module-level function (not a lambda
        made anew in ``get_task``) so that equal configs share one compiled chain.
    """

    name: str
    model: Callable[[Any], Any]
    loss: Callable[[Any, PyTree], Any]
    data: DataSource | Callable[[], DataSource]
    eval_batches: Sequence[PyTree] | Callable[[], Sequence[PyTree]] = ()
    metrics: Callable[[float], dict[str, float]] | None = None
    count: Callable[[PyTree], int] | None = None
    inner_optimizer: optax.GradientTransformation | None = None
    eval_metrics: Callable[[Any, PyTree], dict[str, Any]] | None = None
    outer_optimizer: Callable[[float, float], optax.GradientTransformation] | None = None

    def __post_init__(self) -> None:
        for field in ("model", "loss"):
            if not callable(getattr(self, field)):
                raise TypeError(f"Task.{field} must be callable, got {getattr(self, field)!r}")
        for field in ("metrics", "count", "eval_metrics", "outer_optimizer"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise TypeError(f"Task.{field} must be callable or None, got {value!r}")
        if not (callable(self.data) or isinstance(self.data, DataSource)):
            raise TypeError(
                "Task.data must be a DataSource (num_chunks, batches_per_chunk, "
                f"tokens_per_batch, batch(chunk, index)) or a function returning one, got "
                f"{self.data!r}"
            )

    @functools.cached_property
    def source(self) -> DataSource:
        """The training data (built on first use)."""
        given = self.data
        # A class is a factory (its attributes may look like a DataSource's).
        src = given if isinstance(given, DataSource) and not isinstance(given, type) else given()
        check_source(src, self.name)
        return src

    @functools.cached_property
    def validation(self) -> list[PyTree]:
        """The validation batches (built on first use)."""
        given = self.eval_batches() if callable(self.eval_batches) else self.eval_batches
        return list(given)

    def tokens_in(self, batch: PyTree) -> int:
        """What ``batch`` counts in the books."""
        if self.count is not None:
            return int(self.count(batch))
        return int(self.source.tokens_per_batch)

    def extra_metrics(self, loss: float) -> dict[str, float]:
        return {} if self.metrics is None else dict(self.metrics(loss))

    def bits_per_byte(self, loss: float) -> float:
        """The ``bits_per_byte`` metric of a validation loss, NaN for a task without one."""
        return float(self.extra_metrics(loss).get("bits_per_byte", math.nan))


def outer_optimizer_of(task: Task, cfg: SimConfig) -> Callable[..., Any] | None:
    """The followers' outer step of experiment ``cfg`` training ``task``: the task's
    :attr:`Task.outer_optimizer`, else ``None`` (the config's ``outer_optimizer``, if any, is
    resolved with the method's chain). Raises a ``ValueError`` when both name one."""
    if task.outer_optimizer is not None and cfg.outer_optimizer:
        raise ValueError(
            f"task {task.name!r} carries an outer_optimizer and the config names "
            f"outer_optimizer={cfg.outer_optimizer!r}: set one of them"
        )
    return task.outer_optimizer


def check_source(src: Any, name: str = "task") -> None:
    """Raises a ``TypeError``/``ValueError`` naming what a data source lacks."""
    if not isinstance(src, DataSource):
        raise TypeError(
            f"{name}: the data source {src!r} is not a DataSource (it needs num_chunks, "
            "batches_per_chunk, tokens_per_batch and batch(chunk, index))"
        )
    for field in ("num_chunks", "batches_per_chunk", "tokens_per_batch"):
        value = getattr(src, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: DataSource.{field} must be an integer >= 1, got {value!r}")


# -- naming a task in a config ---------------------------------------------------------------

#: The built-in language model (LLaMA decoder on a text corpus): the default task.
DEFAULT = "dipsjax.tasks.lm:get_task"


def resolve(path: str) -> Callable[..., Task]:
    """The function ``"package.module:function"`` names (a clear error if it does not): a
    module of the installed packages, or of the current folder."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"task {path!r}: expected 'package.module:function'")
    if os.getcwd() not in sys.path:  # a task module in the current folder, as `python -m`
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"task {path!r}: cannot import {module_name!r} ({e})") from e
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"task {path!r}: {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise ValueError(f"task {path!r}: {attr!r} is not callable")
    return fn


def load_task(cfg: SimConfig) -> Task:
    """The task of experiment ``cfg``: ``resolve(cfg.task)(cfg, **cfg.task_args)``, built
    once per process, config and data folder (``$DIPSJAX_DATA``)."""
    return _load_task(cfg, os.environ.get("DIPSJAX_DATA"))


@functools.lru_cache(maxsize=16)
def _load_task(cfg: SimConfig, data: str | None) -> Task:
    del data  # a key of the cache only: the task reads its data from there
    fn = resolve(cfg.task or DEFAULT)
    task = fn(cfg, **dict(cfg.task_args))
    if not isinstance(task, Task):
        raise TypeError(f"task {cfg.task!r} returned {type(task).__name__}, not a dipsjax Task")
    return task


# -- activation sharding, for losses that constrain their activations ----------------------------

_ACTIVATIONS: contextvars.ContextVar[Any] = contextvars.ContextVar("activations", default=None)


def activation_sharding() -> Any:
    """The partition's ``[batch, ...]`` activation sharding while a learner traces its loss
    (``None`` unsharded, or outside a learner)."""
    return _ACTIVATIONS.get()


@contextlib.contextmanager
def activations_sharded(sharding: Any) -> Iterator[None]:
    """Sets :func:`activation_sharding` for the losses traced inside."""
    token = _ACTIVATIONS.set(sharding)
    try:
        yield
    finally:
        _ACTIVATIONS.reset(token)
