"""Checkpoints of the runtime's processes: orbax, asynchronous, the few newest kept.

A :class:`Checkpoints` is one orbax ``CheckpointManager`` over a folder: each step holds a
pytree of arrays (``state``: a follower's shard and outer state, a learner's inner state)
and a small JSON document (``meta``: version, data position, counters). Saving returns at
once and writes in the background (orbax's async checkpointing); :meth:`close` waits for
writes in flight, so a process that exits cleanly (SIGTERM) leaves its newest checkpoint
whole. A step is on disk only once complete (orbax commits a step by renaming its folder).

The tree is stored as its list of leaves and rebuilt on :meth:`restore` against a
template of the same structure (a freshly initialized state), so any pytree (optax states,
NNX states) round-trips without registering anything with orbax.

Host arrays are written as they are: orbax's numpy handler is told not to deep-copy them
(its default copies every array before returning, in time and memory: measured here, 7 s
and 2 GB more for a 2 GB array, while the write itself took 0.4 s). :meth:`save` copies
them itself unless the caller keeps the buffers unchanged until :meth:`wait`.

``compress=False`` writes the arrays without orbax's zstd (its default): FP32 parameters
and optimizer states barely compress (a 2 GB state measured here: 1.8 GB compressed against
1.9 GB, for 9.3 s of CPU against 5.8 s), and a host that checkpoints while it serves
(a follower) keeps that CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np


class Checkpoints:
    """Asynchronous orbax checkpoints in ``directory``, keeping the ``keep`` newest
    (``compress``: orbax's zstd, see the module doc)."""

    def __init__(
        self,
        directory: str | Path,
        keep: int = 3,
        asynchronous: bool = True,
        compress: bool = True,
    ) -> None:
        import orbax.checkpoint as ocp

        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._ocp = ocp
        self.directory = Path(directory).absolute()
        # This process alone writes here, even in a JAX world of several processes (a
        # learner partition spread over hosts: its first process checkpoints host arrays).
        me = jax.process_index()
        self.directory.mkdir(parents=True, exist_ok=True)  # orbax won't, for one process
        multiprocessing = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
        types = ocp.type_handlers.create_type_handler_registry(
            (np.ndarray, ocp.type_handlers.NumpyHandler(deepcopy_host_arrays=False)),
            (jax.Array, ocp.type_handlers.ArrayHandler()),  # saves copy them to the host
        )
        state = ocp.PyTreeCheckpointHandler(
            type_handler_registry=types,
            multiprocessing_options=multiprocessing,
            use_compression=compress,
        )
        handlers = ocp.handlers.DefaultCheckpointHandlerRegistry()
        handlers.add("state", ocp.args.PyTreeSave, state)
        handlers.add("state", ocp.args.PyTreeRestore, state)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=False,
                enable_async_checkpointing=asynchronous,
                multiprocessing_options=multiprocessing,
            ),
            handler_registry=handlers,
        )

    def save(self, step: int, state: Any, meta: dict[str, Any], copy: bool = True) -> None:
        """Starts writing ``state`` and ``meta`` as ``step``; returns before the write
        finishes. ``copy``: the arrays are copied now (later updates may reuse their
        buffers); ``False``: written from their buffers, which the caller keeps unchanged
        until :meth:`wait` returns (no copy in time or memory)."""
        take = (lambda x: np.array(x, copy=True)) if copy else np.asarray
        leaves = {f"{i:06d}": take(x) for i, x in enumerate(jax.tree.leaves(state))}
        args = self._ocp.args
        saved = self.manager.save(
            step,
            args=args.Composite(state=args.PyTreeSave(leaves), meta=args.JsonSave(meta)),
        )
        if not saved:  # orbax skips a step at or below its newest one
            raise RuntimeError(
                f"checkpoint step {step} was not saved in {self.directory}: it has "
                f"{sorted(self.manager.all_steps())} (drop newer steps after a resume)"
            )

    def wait(self) -> None:
        """Returns once every save started so far is on disk."""
        self.manager.wait_until_finished()

    def steps(self, wait: bool = True) -> list[int]:
        """Complete steps on disk, oldest first, after the writes in flight (``wait=False``:
        now, the steps being written included)."""
        if wait:
            self.manager.wait_until_finished()
        return sorted(self.manager.all_steps())

    def drop_after(self, step: int) -> None:
        """Deletes every step newer than ``step`` (a process that resumed from ``step``
        writes its later steps again)."""
        for s in self.steps():
            if s > step:
                self.manager.delete(s)

    def meta(self, step: int) -> dict[str, Any]:
        """The JSON document of ``step``."""
        args = self._ocp.args
        return dict(self.manager.restore(step, args=args.Composite(meta=args.JsonRestore())).meta)

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """``(state, meta)`` of ``step`` (default: the newest), the state as numpy arrays in
        ``template``'s tree structure. Raises ``FileNotFoundError`` naming the folder when
        there is no such step, ``ValueError`` when the saved tree does not fit the template."""
        steps = self.steps()
        if not steps or (step is not None and step not in steps):
            want = "any step" if step is None else f"step {step}"
            raise FileNotFoundError(f"no checkpoint with {want} in {self.directory} (has {steps})")
        step = steps[-1] if step is None else step
        tmpl_leaves, treedef = jax.tree.flatten(template)
        target = {f"{i:06d}": np.zeros_like(np.asarray(x)) for i, x in enumerate(tmpl_leaves)}
        args = self._ocp.args
        restore_args = self._ocp.checkpoint_utils.construct_restore_args(target)
        got = self.manager.restore(
            step,
            args=args.Composite(
                state=args.PyTreeRestore(target, restore_args=restore_args),
                meta=args.JsonRestore(),
            ),
        )
        leaves = [np.asarray(got.state[k]) for k in sorted(target)]
        for k, x, t in zip(sorted(target), leaves, tmpl_leaves, strict=True):
            if x.shape != np.shape(t):
                raise ValueError(
                    f"checkpoint {self.directory}/{step}: leaf {k} has shape {x.shape}, the "
                    f"model wants {np.shape(t)}"
                )
        return jax.tree.unflatten(treedef, leaves), dict(got.meta)

    def close(self) -> None:
        """Waits for writes in flight, then releases orbax's threads."""
        self.manager.wait_until_finished()
        self.manager.close()
