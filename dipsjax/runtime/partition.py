"""A learner partition's computations, on one process or spread over several.

A partition may span several processes (hosts): ``jax.distributed`` joins them into one
JAX world *of that partition only* (never one world across learners: its coordination
service stops every process of a world when one dies, and learners must fail alone). Its
mesh then spans every process's devices, and every computation on it is SPMD: all the
partition's processes must make the same calls in the same order.

Only process 0 talks to the syncer (joins, leases chunks, pushes, pulls, checkpoints):
the transfer plan names it alone. :class:`Compute` is how it computes: each call that
touches the partition's devices is first broadcast (``multihost_utils.broadcast_one_to_all``,
a pickled ``(name, args)``: the batches, a pulled version) to the other processes, whose
:meth:`Compute.serve` loop makes the same call; results it needs on the host (the
pseudo-gradient, the optimizer state to checkpoint) are gathered
(``multihost_utils.process_allgather``). With one process it simply calls.

The launcher says how a partition is spread through the environment:
``DIPSJAX_NUM_PROCESSES``, ``DIPSJAX_COORDINATOR`` (``host:port`` of process 0; the local
executor picks a free port for each start, Kubernetes uses the first pod's DNS name) and
the process's index (:func:`process_index`). Under SLURM, ``DIPSJAX_NUM_PROCESSES`` alone
is set and JAX finds the rest in SLURM's environment.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
from typing import Any

import jax
import numpy as np

from dipsjax.learner.contribution import add_global_change, delta_to_send

STOP = "stop"


def process_index() -> int:
    """This process's place in its partition, as its launcher said: ``DIPSJAX_PROCESS_ID``
    (local), ``SLURM_PROCID`` (a SLURM step) or ``JOB_COMPLETION_INDEX`` (a Kubernetes
    Indexed Job); 0 in a partition of one process."""
    if int(os.environ.get("DIPSJAX_NUM_PROCESSES", "1")) <= 1:
        return 0
    for var in ("DIPSJAX_PROCESS_ID", "SLURM_PROCID", "JOB_COMPLETION_INDEX"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


@dataclasses.dataclass(frozen=True)
class Partition:
    """Where this process is in its partition."""

    process_id: int = 0
    num_processes: int = 1

    @property
    def spread(self) -> bool:
        return self.num_processes > 1

    @classmethod
    def from_env(cls) -> Partition:
        """Joins the partition's JAX world when the launcher spread it over processes
        (``DIPSJAX_NUM_PROCESSES`` > 1); call before JAX first touches its devices."""
        n = int(os.environ.get("DIPSJAX_NUM_PROCESSES", "1"))
        if n <= 1:
            return cls()
        coordinator = os.environ.get("DIPSJAX_COORDINATOR")
        if coordinator:
            pid = process_index()
            jax.distributed.initialize(
                coordinator, n, pid, initialization_timeout=120, heartbeat_timeout_seconds=10
            )
        else:  # a cluster JAX knows (SLURM): it reads the coordinator and ids from there
            jax.distributed.initialize(initialization_timeout=120, heartbeat_timeout_seconds=10)
        if jax.process_count() != n:
            raise RuntimeError(f"partition of {n} processes, but JAX has {jax.process_count()}")
        return cls(jax.process_index(), n)


def _host(tree: Any, spread: bool) -> Any:
    """``tree`` as host NumPy arrays (gathered from every process when spread)."""
    if not spread:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


@functools.partial(jax.jit, static_argnums=1)
def _cast(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype), tree)


class Compute:
    """The partition's computations (see module docstring): on process 0, :meth:`call`
    broadcasts each one to the other processes, which run them in :meth:`serve`."""

    def __init__(
        self, learner: Any, reference: str, partition: Partition, wire_dtype: Any = None
    ) -> None:
        self.learner, self.reference, self.partition = learner, reference, partition
        # The push's wire dtype when the data plane sends the pseudo-gradient as it is
        # (``bf16``): cast where it was computed, so only wire bytes leave the device and the
        # push thread converts nothing. Round to nearest even, as the host's encoding (the
        # same bits on CPU, tested; an accelerator may give NaNs another payload).
        self.wire_dtype = wire_dtype
        self.calls = 0  # calls made (process 0) or served (the others)
        # The parameters the learner started from (set by the warm-up), until it takes a
        # global version: the base of a server-reference round that has none (a solo
        # learner's, ``LearnerNode.solo``: it never pulls, so it is still on its start).
        self.start: Any = None

    # -- what process 0 calls ----------------------------------------------------------

    def call(self, name: str, *args: Any) -> Any:
        if self.partition.spread:
            self._broadcast((name, args))
        self.calls += 1
        return getattr(self, f"_{name}")(*args)

    def stop(self) -> None:
        """Ends the other processes' :meth:`serve` loops."""
        if self.partition.spread:
            self._broadcast((STOP, ()))

    # -- the other processes -------------------------------------------------------------

    def serve(self) -> int:
        """Makes every call process 0 broadcasts until it says stop; returns how many."""
        while True:
            name, args = self._broadcast(None)
            if name == STOP:
                return self.calls
            self.calls += 1
            getattr(self, f"_{name}")(*args)

    def _broadcast(self, message: Any) -> Any:
        """Process 0's ``message`` on every process (a length, then the pickled bytes)."""
        from jax.experimental import multihost_utils

        data = pickle.dumps(message) if self.partition.process_id == 0 else b""
        size = multihost_utils.broadcast_one_to_all(np.array([len(data)], np.int64))
        buf = np.frombuffer(data, np.uint8) if data else np.zeros(int(size[0]), np.uint8)
        out = multihost_utils.broadcast_one_to_all(buf)
        return pickle.loads(np.asarray(out, np.uint8).tobytes())

    # -- the computations (every process makes each) --------------------------------------

    def _params(self) -> dict:
        return _host(self.learner.params_dict(), self.partition.spread)

    def _round(self, batches: list, num_steps: int, base: Any) -> tuple[Any, dict]:
        """A round of inner steps and its pseudo-gradient, on the host (in ``wire_dtype``
        when one is set). ``base`` is the version the round is measured against (server
        reference); ``None`` before the learner ever took a version (a solo learner), which
        then measures against where it started."""
        if base is None and self.reference == "server":
            if self.start is None:
                raise ValueError("a server-reference round needs the version it started from")
            base = self.start
        contrib = self.learner.run_round(batches, num_steps=num_steps, reference="start")
        delta = delta_to_send(self.reference, contrib, self.learner, base)
        if self.wire_dtype is not None:
            delta = _cast(delta, self.wire_dtype)
        delta = _host(delta, self.partition.spread)
        return dataclasses.replace(contrib, delta=None), delta

    def _take(self, params: Any, version: int, first: bool, base: Any) -> None:
        """Starts from a global version: ``params``, or (``base`` given: ``adopt='delta'``)
        the learner's own plus the global change since ``base``."""
        own, self.start = params, None
        if base is not None:
            own = add_global_change(self.learner.params_dict(), params, base)
        self.learner.pull(own, version=version, reset_optimizer=first)

    def _opt_state(self) -> Any:
        return _host(self.learner.opt_state, self.partition.spread)

    def _set_opt_state(self, state: Any) -> None:
        self.learner.set_opt_state(state)

    def _warm_up(self, sample: Any, steps: int) -> None:
        """Compiles a round, its pseudo-gradient and taking a version on zeros shaped like
        ``sample`` (a batch of the task), then puts the learner back as it was."""
        init = self._params()
        batch = jax.tree.map(np.zeros_like, sample)
        for _ in range(2):  # the second from pulled parameters, as every real round starts
            contrib = self.learner.run_round([batch] * steps, num_steps=steps, reference="start")
            delta = delta_to_send(self.reference, contrib, self.learner, init)
            if self.wire_dtype is not None:
                jax.block_until_ready(_cast(delta, self.wire_dtype))
            jax.block_until_ready(add_global_change(delta, init, init))
            self.learner.pull(init, version=0, reset_optimizer=True)
        self.learner.steps_done = self.learner.tokens_done = 0
        self.start = init
