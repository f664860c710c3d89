"""A follower process: its shard of the model and FP32 outer state, a data-plane server for
pushes and pulls, and a control client that carries out the leader's decisions.

A driver of :meth:`dipsjax.syncer.Follower.handle` (the follower's protocol, the one the
simulator runs): pushes arrive on the data plane (whole, checked) and are staged; the
leader's actions arrive on the ``Watch`` stream, go to the core, and the commands that come
back are carried out in order: ``Save`` (the journal's on disk before the next command; a
checkpoint's started), ``Send`` (the control client), ``Exit``. It decides nothing. Pulls
are served from version snapshots while the next round's pushes arrive.

Checkpoints off the round's critical path. The journal, in ``RUN_DIR/follower{k}/journal``,
is on disk before what it backs is reported (the core's ordering rule): each decided
round's inputs, its stacked batch (``batch-v{V}-r{R}.bin``, written in a thread from the
moment its norms are taken) and ``Decide`` (``decided-v{V}-r{R}.json``), before the merge
is reported, and each step's ``Apply`` (``applied-v{V}-r{R}.json``, a few bytes), before
the step is reported; each written whole (a temporary file, synced, renamed). The
:class:`~dipsjax.syncer.follower.FollowerState` (version, shard, outer state) of every
``checkpoint_every``-th version is saved with orbax to ``RUN_DIR/follower{k}/ckpt/{version}``
(the 3 newest kept) after the step is reported, in orbax's thread, from the live buffers
(no copy: the parameters are never written in place, and the next outer step, which
donates the outer state's buffers, first waits for the write). Once a checkpoint is on
disk and the leader counted its version (it sends the next ``Apply``), the journal's older
entries are deleted. A follower killed at any moment comes back at the leader's version,
or one more mid-update: ``--resume V`` restores the newest checkpoint at or below version
``V`` (the leader's, which the launcher reads from its snapshot) and redoes the journal's
steps up to ``V``; ``--resume latest`` the newest checkpoint and every step the journal
holds; with no checkpoint on disk (killed before its first one, during compilation)
version 0 (:func:`~dipsjax.syncer.follower.resume_step`,
:meth:`~dipsjax.syncer.follower.Follower.redo`). One whose journal write or checkpoint
fails exits non-zero (a journal write: before reporting). SIGTERM exits cleanly, after
the writes in flight.

Faults: a heartbeat thread tells the leader the follower is alive (one silent for 3
intervals is lost and the round that needs it discarded whole). A restarted follower first
reports itself lost, then joins at its version. When its control stream breaks (the leader
died, or only the stream did), the core says it was lost and joins again, keeping a round
it was applying; the driver sends that once the leader is back.

Run: ``python -m dipsjax.runtime.follower RUN_DIR/spec.json K [--resume V|latest]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hmac
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jax
import jax.numpy as jnp
import numpy as np
from tensorboardX import SummaryWriter

from dipsjax import outer
from dipsjax.runtime import logs, permissions
from dipsjax.runtime.checkpoint import Checkpoints
from dipsjax.runtime.client import ControlClient, model_layout, model_shapes
from dipsjax.runtime.credentials import push_ticket
from dipsjax.runtime.spec import RunSpec, address, write_cpu_seconds, write_json
from dipsjax.syncer import messages as m
from dipsjax.syncer import methods
from dipsjax.syncer.follower import Follower, PushRefused, covered, resume_step, warm_up
from dipsjax.task import load_task, outer_optimizer_of
from dipsjax.transport.dataplane import DataPlaneServer, Header, decode_tensor, encode_tensor
from dipsjax.transport.refusals import RefusalLog

REFUSAL_LOG_INTERVAL = 10.0  # seconds: one log line, metrics write, TB point per kind
#: A journal entry's file name: kind, version, round (see the module doc).
_JOURNAL_NAME = re.compile(r"(batch|decided|applied)-v(\d+)-r(\d+)\.(?:bin|json)")


def _write_arrays(fh: Any, arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> None:
    """Arrays as raw bytes after a JSON header (key, stored dtype, shape, given dtype of
    each): no checksum to compute (a zip's CRC costs a core about a second a GB), and the
    file is whole or absent (written to a temporary name, synced, renamed)."""
    header = json.dumps(
        [[k, str(x.dtype), list(x.shape), dtypes[k]] for k, x in arrays.items()]
    ).encode()
    fh.write(len(header).to_bytes(8, "little") + header)
    for x in arrays.values():
        fh.write(memoryview(np.ascontiguousarray(x)).cast("B"))


def _read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """What :func:`_write_arrays` wrote: the arrays and their given dtypes by key; raises
    ``ValueError`` naming the file if it is cut short."""
    arrays, dtypes = {}, {}
    with path.open("rb") as fh:
        try:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        except ValueError as e:
            raise ValueError(f"{path}: its header is cut short or not JSON ({e})") from e
        for key, stored, shape, given in header:
            count = int(np.prod(shape, dtype=np.int64))
            x = np.fromfile(fh, dtype=stored, count=count)
            if x.size != count:
                raise ValueError(f"{path}: tensor {key} is cut short ({x.size} of {count})")
            arrays[key], dtypes[key] = x.reshape(shape), given
    return arrays, dtypes


def warm_up_decode(shard: Any, wire: str) -> None:
    """Compiles the data plane's decode of every tensor of ``shard`` under ``wire`` as a
    learner sends it (:func:`dipsjax.outer.leaf_codecs`), on zeros, before joining."""
    flat = outer.flatten(shard)
    codecs = outer.flatten(outer.leaf_codecs(shard, wire))
    for p, x in flat.items():
        codec = codecs[p]
        block = outer.DEFAULT_BLOCK.get(codec, 0)
        payload, scales, shape = encode_tensor(np.zeros(np.shape(x), np.float32), codec, block)
        decode_tensor(Header(0, codec, shape=shape, block_size=block), payload, scales)


log = logging.getLogger("dipsjax.runtime.follower")  # not __name__: "__main__" when run


class FollowerNode:
    """Follower ``k`` of a run: numerics, data plane and control client."""

    def __init__(
        self,
        spec: RunSpec,
        k: int,
        resume: int | None = None,
        init: str = "model",
        port: int | None = None,
    ) -> None:
        self.spec, self.k = spec, k
        self.mine = [i for i, owner in enumerate(spec.layer_owner) if owner == k]
        if init == "zeros":  # benchmarks of models too large to initialize in every process
            shapes = model_shapes(spec)
            self.paths = list(shapes)
            flat = {self.paths[i]: jnp.zeros(shapes[self.paths[i]][0]) for i in self.mine}
        elif init == "model":
            self.paths, params = model_layout(spec)
            flat = outer.flatten(params)
        else:
            raise ValueError(f"init must be 'model' or 'zeros', got {init!r}")
        shard = outer.unflatten({self.paths[i]: flat[self.paths[i]] for i in self.mine})
        # each pushed tensor's header is checked against these before its body is read
        self.shapes = {i: tuple(np.shape(flat[self.paths[i]])) for i in self.mine}
        method = methods.build(spec.sim.method, spec.method_settings())
        # The task's outer step, if it brings one (built lazily: no data is read here).
        tx = method.make_tx(outer_optimizer_of(load_task(spec.sim), spec.sim))
        # FP32 shards barely compress: the CPU goes to serving pulls meanwhile.
        self.ckpt = Checkpoints(Path(spec.run_dir) / f"follower{k}" / "ckpt", compress=False)
        version, opt_state, ended = 0, None, []
        step = None if resume is None else resume_step(self.ckpt.steps(), resume)
        if step is not None:
            template = (shard, tx.init(shard))
            (shard, opt_state), meta = self.ckpt.restore(template, step=step)
            version = int(meta["version"])
            ended = meta.get("ended", [])  # rounds over by then: their replays are refused
            self.ckpt.drop_after(version)  # newer ones are of versions past the leader's
        elif resume is not None:
            self.ckpt.drop_after(-1)  # steps of versions the leader never counted
            log.info(
                "no checkpoint to resume from in %s: starting at version 0", self.ckpt.directory
            )
        else:  # a new run: a journal left in its folder is of another one
            for old in self.journal.glob("*"):
                old.unlink()
        self.checkpointed = version  # the newest checkpoint known to be on disk
        self.checkpointed_pruned = -1  # the checkpoint the journal was last trimmed to
        self.saving: int | None = None  # the version of the checkpoint being written
        self._batch_writes: dict[int, tuple[threading.Thread, dict]] = {}  # by round
        self.follower = Follower(
            k,
            shard,
            tx,
            reference=method.reference,
            version=version,
            opt_state=None if opt_state is None else jax.tree.map(jnp.asarray, opt_state),
            ended=ended,
            **spec.sim.follower_options(),  # as the simulator's followers
        )
        if resume is not None:  # restarted: the steps its journal holds since, redone
            self._redo(None if resume < 0 else resume, step)
        self.applied_tokens = self._applied_tokens(self.follower.version)  # TensorBoard's x
        if init == "model":  # compile before joining (too costly in memory for huge models)
            # What arrives: BF16 (stat2's levels are BF16 values, decoded as such too).
            wire = jnp.bfloat16 if spec.sim.wire in ("bf16", "stat2") else jnp.float32
            t0 = time.perf_counter()
            warm_up(shard, tx, spec.sim.learners, method.reference, wire)
            if spec.sim.wire == "stat2":  # the decode of each tensor's shape (stat2's is compiled)
                warm_up_decode(shard, spec.sim.wire)
            log.info("compiled its outer step in %.1f s", time.perf_counter() - t0)
        if step is None and spec.checkpoints:  # version 0 too: a run can stop before step 1
            st = self.follower.state
            self.ckpt.save(0, (st.params, st.opt_state), {"version": 0}, copy=False)
            self.saving = 0
        self.lock = threading.Lock()
        self.busy = False  # carrying out an action: SIGTERM waits for it to finish
        self.terminating = False
        self.restarted = resume is not None
        self.stop = threading.Event()
        self.tb = SummaryWriter(str(Path(spec.run_dir) / "tb" / f"follower{k}"))
        self.control = ControlClient(spec, follower=k)
        host, spec_port = address(spec.followers[k])
        port = spec_port if port is None else port  # 0: any free one (a replacement)
        self.resent = {"duplicate": 0, "replaced": 0}
        self.metrics_lock = threading.Lock()
        self._granted: dict[tuple[int, int, int], bytes] = {}  # grant -> its ticket
        self.data = DataPlaneServer(
            self.on_push,
            self.on_pull,
            host=spec.bind or host,
            port=port,
            ssl_context=spec.ssl_server(),
            expect=self._expect,
            **spec.dataplane_limits(),
        )
        self.refusals = RefusalLog(
            REFUSAL_LOG_INTERVAL,
            emit=log.warning,
            prefix="",
        )
        self.data.on_refusal = self._refused
        self.address = f"{host}:{self.data.address[1]}"  # announced when it joins
        self.follower.address = self.address
        self.exit_code = 0

    def _logged_versions(self) -> set[int]:
        """The versions ``decisions.jsonl`` has a line of."""
        path = Path(self.spec.run_dir) / f"follower{self.k}" / "decisions.jsonl"
        got = set()
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    got.add(int(json.loads(line)["version"]))
        return got

    def _applied_tokens(self, version: int) -> int:
        """The tokens the versions up to ``version`` applied (``decisions.jsonl``; 0 when
        it has none, or lines without tokens from an older run)."""
        path = Path(self.spec.run_dir) / f"follower{self.k}" / "decisions.jsonl"
        by_version: dict[int, int] = {}  # a round redone after a restart is logged twice
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    d = json.loads(line)
                    if int(d["version"]) <= version:
                        by_version[int(d["version"])] = int(d.get("tokens", 0))
        return sum(by_version.values())

    def on_push(
        self, round_id: int, learner: int, incarnation: int, base: int, tensors: dict
    ) -> None:
        if sorted(tensors) != self.mine:
            raise PushRefused(
                "layout",
                f"follower {self.k} holds tensors {self.mine[:4]}..., got {sorted(tensors)[:4]}...",
            )
        tree = outer.unflatten({self.paths[i]: x for i, x in tensors.items()})
        with self.lock:
            outcome = self.follower.receive(round_id, learner, tree, incarnation)
            if outcome != "staged":  # a resent push equal to the staged one, or a retrained one
                self.resent[outcome] += 1
                self._write_metrics()

    def _expect(self, header: Any) -> None:
        """A pushed tensor's header, before its body is read: granted by the leader (its
        ticket for the round, learner and incarnation; else refused: ``ticket``), one of
        this follower's tensors, with its shape (else ``layout``, ``shape``)."""
        grant = (header.round_id, header.learner, header.incarnation)
        ticket = self._granted.get(grant)
        if ticket is None:
            if len(self._granted) >= 1024:  # a push's frames share one grant: keep a few
                self._granted.clear()
            ticket = self._granted[grant] = push_ticket(self.spec.token, *grant)
        if not hmac.compare_digest(header.ticket, ticket):
            raise PushRefused(
                "ticket",
                f"follower {self.k}: the leader did not grant round {grant[0]} to learner "
                f"{grant[1]} (incarnation {grant[2]}): push refused",
            )
        want = self.shapes.get(header.tensor)
        if want is None:
            raise PushRefused("layout", f"follower {self.k} does not hold tensor {header.tensor}")
        if tuple(header.shape) != want:
            raise PushRefused(
                "shape",
                f"follower {self.k}: tensor {header.tensor} has shape {want}, "
                f"the push announces {tuple(header.shape)}",
            )

    def _refused(self, kind: str, message: str) -> None:
        """The data plane refused something: counted exactly (``self.data.refused``); the
        log line, ``follower{k}/metrics.json`` and TensorBoard (``follower/refused/KIND``)
        at most once per kind per :data:`REFUSAL_LOG_INTERVAL` (a storm floods nothing)."""
        if self.refusals.record(kind, message):
            self._write_metrics()
            count = self.data.refused[kind]
            step, wall = self.applied_tokens, time.time()  # the run's common x-axis
            self.tb.add_scalar(f"follower/refused/{kind}", count, step, walltime=wall)

    def _write_metrics(self) -> None:
        """``follower{k}/metrics.json``: data-plane traffic and refusals by kind."""
        with self.metrics_lock:
            d = self.data
            with d._lock:
                doc = {"refused": dict(d.refused), **self.resent, **d.stats}
            write_json(Path(self.spec.run_dir) / f"follower{self.k}" / "metrics.json", doc)

    def on_pull(self, version: int) -> tuple[int, dict[int, Any]]:
        with self.lock:
            v, shard = self.follower.pull(None if version < 0 else version)
        flat = outer.flatten(shard)
        return v, {i: np.asarray(flat[self.paths[i]]) for i in self.mine}

    def on_term(self, *_: Any) -> None:
        """SIGTERM: leave now if waiting for the leader, else after the current action."""
        self.terminating = True
        if not self.busy:
            raise SystemExit(0)

    def handle(self, action: m.Action) -> bool:
        """Hands one action to the core and carries out its commands; False on ``Exit``."""
        if isinstance(action, m.Apply):
            time.sleep(self.spec.apply_delay)  # fault injection (0 unless a test sets it)
            # The step donates the outer state's buffers; a new step (not a repeat) also
            # says the leader counted this version, which frees the journal before it.
            self._checkpoint_written(prune=action.version == self.follower.version + 1)
        with self.lock:
            compute = isinstance(action, m.RequestNorms | m.Decide | m.Apply)
            with self._turn() if compute else contextlib.nullcontext():
                t0 = time.perf_counter()
                commands = self.follower.handle(action, time.monotonic())
                seconds = time.perf_counter() - t0
        for c in commands:
            if isinstance(c, m.Send) and isinstance(c.event, m.FollowerLost):
                log.warning("%s: joining again", c.event.reason)
        return self.carry_out(commands, seconds)

    def carry_out(self, commands: list[m.Command], apply_s: float = 0.0) -> bool:
        """Carries out the core's commands in order: ``Save`` (the journal's on disk before
        the next command: a failed one raises and nothing after it is sent; a checkpoint
        started), ``Send``, ``Exit`` (returns False). The bookkeeping of an outer step
        comes after its report, and also when the report fails (the leader died meanwhile:
        the step was taken and journaled, and the follower joins again at its new version;
        the failure is raised after the bookkeeping)."""
        after = None
        try:
            for c in commands:
                if isinstance(c, m.Save) and c.kind == "batch":
                    self._save_batch(c.round_id, c.version)
                elif isinstance(c, m.Save) and c.kind == "inputs":
                    self._save_inputs(c.round_id, c.version)
                elif isinstance(c, m.Save) and c.kind == "applied":
                    self._save_applied(c.round_id, c.version)
                    d, a = self.follower.last_applied
                    after = functools.partial(self._after_apply, d, a, c.version, apply_s)
                elif isinstance(c, m.Save):
                    self._save_version(c.version)
                elif isinstance(c, m.Send):
                    self.control.call(c.event)
                elif isinstance(c, m.Exit):
                    self.exit_code = int(c.code)
                    log.info("exits (%d): %s", self.exit_code, c.reason)
                    return False
        except Exception:  # the report failed (not SystemExit: a failed save ends the process)
            if after is not None:
                after()
            raise
        if after is not None:
            after()
        return True

    def _save_version(self, version: int) -> None:
        """Starts writing the shard, outer state and ended rounds of ``version`` (orbax, in
        its thread, from the live buffers: :meth:`_checkpoint_written` waits for it before
        the next outer step donates them)."""
        if not self.spec.checkpoints:
            return
        st = self.follower.state
        if st.version != version:
            raise RuntimeError(f"follower {self.k}: asked to save {version} at {st.version}")
        meta = {"version": version, "ended": self.follower.ended_rounds()}
        try:
            self.ckpt.save(version, (st.params, st.opt_state), meta, copy=False)
        except Exception as e:
            raise SystemExit(
                f"follower {self.k}: checkpoint of version {version} failed: {e!r}"
            ) from e
        self.saving = version

    def _checkpoint_written(self, prune: bool = True) -> None:
        """Waits for the checkpoint being written, if any (off the critical path unless a
        round is shorter than the write); with ``prune`` (it is sent the ``Apply`` of the
        version after its own, so the leader counted its version and no resume goes back
        past it: not so for a repeated ``Apply``, sent again before the leader counted
        it), deletes the journal's entries the newest checkpoint written makes useless. A
        write that failed ends the process non-zero (its journal still holds every step
        since the last good one)."""
        if self.saving is not None:
            self._wait_checkpoint()
        if not prune or self.checkpointed_pruned == self.checkpointed:
            return
        for path, kind, version, _ in self._journal():
            if covered("applied" if kind == "applied" else "decided", version, self.checkpointed):
                path.unlink(missing_ok=True)
        self.checkpointed_pruned = self.checkpointed

    def _close_checkpoints(self) -> None:
        """At exit: writes in flight finish (the newest checkpoint is whole). One that
        failed is logged and makes the exit code non-zero; the rest of the exit goes on
        (the journal still holds every step since the last good checkpoint)."""
        try:
            self.ckpt.close()
        except Exception as e:
            log.error("the checkpoint of version %s failed: %r", self.saving, e)
            self.exit_code = self.exit_code or 1

    def _wait_checkpoint(self) -> None:
        t0 = time.perf_counter()
        try:
            self.ckpt.wait()
        except Exception as e:
            raise SystemExit(
                f"follower {self.k}: checkpoint of version {self.saving} failed: {e!r}"
            ) from e
        waited = time.perf_counter() - t0
        if waited > 0.05:
            log.info("waited %.2f s for the checkpoint of version %d", waited, self.saving)
        self.checkpointed, self.saving = self.saving, None

    @property
    def journal(self) -> Path:
        return Path(self.spec.run_dir) / f"follower{self.k}" / "journal"

    def _journal(self) -> list[tuple[Path, str, int, int]]:
        """The journal's entries, ``(path, kind, version, round)``, by name: ``batch`` (a
        round's stacked batch, at the version its norms were taken), ``decided`` (its
        ``Decide``: the version the round was decided at) and ``applied`` (a step's
        ``Apply``: the version it made). Files being written (``.tmp``) are not entries."""
        got = []
        for path in sorted(self.journal.glob("*")):
            hit = _JOURNAL_NAME.fullmatch(path.name)
            if hit:
                got.append((path, hit[1], int(hit[2]), int(hit[3])))
        return got

    def _write_whole(self, path: Path, write: Any, what: str, unsent: str) -> None:
        """``write(file)`` into ``path`` whole (a temporary file, synced, then renamed); a
        failure ends the process non-zero before anything after it is reported."""
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            folder = os.open(path.parent, os.O_RDONLY)  # the rename survives a host's loss
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except Exception as e:
            raise SystemExit(
                f"follower {self.k}: saving {what} failed, not reporting {unsent}: {e!r}"
            ) from e

    def _save_batch(self, round_id: int, version: int) -> None:
        """Starts writing ``round_id``'s stacked batch (fixed once its norms are taken) to
        the journal, whole, in a thread of its own: it goes to disk while the leader
        decides and the other followers take their norms; :meth:`_save_inputs` waits for
        it at the merge."""
        if not self.spec.checkpoints:
            return
        arrays, dtypes = {}, {}
        for path, leaf in outer.flatten(self.follower.round_batch(round_id)).items():
            x = np.asarray(leaf)
            key = "/".join(map(str, path))  # tensors by path, as save() keys them
            dtypes[key] = str(x.dtype)
            # BF16 as its bits (a dtype numpy reads back without ml_dtypes).
            arrays[key] = x.view(np.uint16) if x.dtype == jnp.bfloat16 else x
        target = self.journal / f"batch-v{version:09d}-r{round_id:09d}.bin"
        box: dict[str, Any] = {"bytes": sum(x.nbytes for x in arrays.values())}

        def write() -> None:
            t0 = time.perf_counter()
            try:
                self._write_whole(
                    target,
                    lambda fh: _write_arrays(fh, arrays, dtypes),
                    f"the batch of round {round_id}",
                    "its merge",
                )
                box["seconds"] = time.perf_counter() - t0
            except BaseException as e:  # raised where the merge waits for it
                box["error"] = e

        thread = threading.Thread(target=write, name=f"journal-r{round_id}", daemon=True)
        thread.start()
        self._batch_writes[round_id] = (thread, box)

    def _save_inputs(self, round_id: int, version: int) -> None:
        """The inputs of decided ``round_id``, its stacked batch (waited for: its write
        started with the norms) and its ``Decide``, on disk on return, whole: a follower
        killed while the round is applied, or later, before a checkpoint holds the step,
        redoes it from them. A write that fails ends the process non-zero before the merge
        is reported: the leader never applies a round whose inputs one follower could lose."""
        if not self.spec.checkpoints:
            return
        decision, _ = self.follower.round_inputs(round_id)
        for r in [r for r in self._batch_writes if r < round_id]:  # rounds that ended
            self._batch_writes.pop(r)[0].join()
        if round_id not in self._batch_writes:  # its norms' Save never came: write it now
            self._save_batch(round_id, version)
        thread, box = self._batch_writes.pop(round_id)
        t0 = time.perf_counter()
        thread.join()
        waited = time.perf_counter() - t0
        if "error" in box:
            raise box["error"]
        doc = {"version": version, "decide": m.to_json(decision)}
        self._write_whole(
            self.journal / f"decided-v{version:09d}-r{round_id:09d}.json",
            lambda fh: fh.write(json.dumps(doc).encode()),
            f"the inputs of round {round_id}",
            "its merge",
        )
        log.info(
            "journaled the inputs of round %d (%.2f GB in %.2f s, %.2f s of it at the merge)",
            round_id,
            box["bytes"] / 1e9,
            box["seconds"],
            waited,
        )

    def _save_applied(self, round_id: int, version: int) -> None:
        """The ``Apply`` of the step that made ``version`` and the rounds ended by then, on
        disk on return, whole, before the step is reported."""
        if not self.spec.checkpoints:
            return
        _, a = self.follower.last_applied
        doc = {"apply": m.to_json(a), "ended": self.follower.ended_rounds()}
        self._write_whole(
            self.journal / f"applied-v{version:09d}-r{round_id:09d}.json",
            lambda fh: fh.write(json.dumps(doc).encode()),
            f"the step of round {round_id}",
            "it",
        )

    def _redo(self, upto: int | None, step: int | None) -> None:
        """A restarted follower redoes the steps its journal holds since the checkpoint it
        restored (``step``; ``None``: version 0), up to version ``upto`` (``None``: all),
        and takes back the inputs of a round decided at the version it reaches (the core
        decides, :meth:`~dipsjax.syncer.follower.Follower.redo`); the journal's entries
        past ``upto`` (versions the leader never counted) are deleted."""
        for tmp in self.journal.glob("*.tmp"):  # a write the dead process did not finish
            tmp.unlink()
        decided, applied, batches = [], [], {}
        base = step or 0
        for path, kind, version, round_id in self._journal():
            if upto is not None and version > upto:  # past the leader's version
                path.unlink()
            elif covered("applied" if kind == "applied" else "decided", version, base):
                continue  # the checkpoint restored holds it (kept: a resume may go back)
            elif kind == "applied":
                doc = json.loads(path.read_text())
                a = m.from_json(doc["apply"])
                assert isinstance(a, m.Apply) and a.round_id == round_id, path
                applied.append((a, doc["ended"]))
            elif kind == "batch":
                batches[version, round_id] = path
            else:
                decided.append((version, round_id, path))
        for version, round_id, path in decided:  # a Decide is written after its batch
            if (version, round_id) not in batches:
                raise ValueError(f"follower {self.k}: {path} has no batch beside it")
        decided = [
            (version, *self._read_inputs(path, batches[version, round_id]))
            for version, round_id, path in decided
        ]
        redone = self.follower.redo(decided, applied, upto)
        v = self.follower.version
        # The decision log of the steps redone, where the dead process did not write it (it
        # was killed between the step's report and its bookkeeping).
        logged = self._logged_versions()
        decisions = {d.round_id: d for _, d, _ in decided}
        for a, _ in sorted(applied, key=lambda e: e[0].version):
            if (step or 0) < a.version <= v and a.version not in logged:
                self._log_decision(decisions[a.round_id], a)
        if upto is not None and v != upto:
            raise FileNotFoundError(
                f"follower {self.k}: cannot resume at version {upto}: its checkpoint is of "
                f"version {step or 0} and its journal ({self.journal}) redoes only to {v}"
            )
        log.info(
            "resumed at version %d (checkpoint of version %d, %d step%s redone from its journal)",
            v,
            step or 0,
            redone,
            "" if redone == 1 else "s",
        )
        for r in self.follower.decided_rounds():
            log.info("holds the inputs of round %d (decided at version %d)", r, v)

    def _read_inputs(self, decided: Path, batch: Path) -> tuple[m.Decide, Any]:
        """A decided round's ``Decide`` and stacked batch, as :meth:`_save_inputs` wrote
        them; raises ``ValueError`` naming the file if they do not fit this shard."""
        decision = m.from_json(json.loads(decided.read_text())["decide"])
        if not isinstance(decision, m.Decide):
            raise ValueError(f"follower {self.k}: {decided} holds no Decide")
        arrays, dtypes = _read_arrays(batch)
        leaves = {}
        for p in outer.flatten(self.follower.params):
            key = "/".join(map(str, p))
            if key not in arrays:
                raise ValueError(f"follower {self.k}: {batch} has no tensor {key}")
            x = arrays[key]
            leaves[p] = x.view(jnp.bfloat16) if dtypes[key] == "bfloat16" else x
        return decision, outer.unflatten(leaves)

    def _send_until_up(self, commands: list[m.Command]) -> None:
        """Sends the core's join commands, waiting for a leader that may be restarting
        too: a failed send is retried (not the ones before it) until it goes through."""
        pending = list(commands)
        while pending:
            c = pending[0]
            try:
                if isinstance(c, m.Send):
                    self.control.call(c.event)
            except grpc.RpcError:
                if self.terminating:
                    raise SystemExit(0) from None
                time.sleep(0.5)
                continue
            pending.pop(0)

    def _after_apply(self, d: m.Decide, a: m.Apply, v: int, apply_s: float) -> None:
        """Bookkeeping of an outer step, done once the leader has the reply so that it is
        off the round's critical path: the decision log, timings and, every ``eval_every``
        versions, the shard for evaluation."""
        self._log_decision(d, a)
        accepted = [j for j, ok in zip(d.learners, d.accepted, strict=False) if ok]
        log.info(
            "applied round %d: version %d, learners %s accepted of %s, clip %s, in %.3f s%s",
            a.round_id,
            v,
            accepted,
            list(d.learners),
            a.clip_factor,
            apply_s,
            ", checkpoint started" if self.saving == v else "",
        )
        # TensorBoard against the tokens its versions hold (the run's common x-axis).
        self.applied_tokens += sum(n for n, ok in zip(d.tokens, d.accepted, strict=True) if ok)
        step, wall = self.applied_tokens, time.time()
        self.tb.add_scalar("follower/apply_s", apply_s, step, walltime=wall)
        self.tb.add_scalar("follower/version", v, step, walltime=wall)
        self._write_timing(v, apply_s)
        if self.spec.checkpoints and v % self.spec.sim.eval_every == 0:
            with self.lock:
                path = self.save(f"v{v}")
            log.info("saved version %d for evaluation: %s", v, path.name)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """With ``spec.compute_in_turns``, one follower of the host computes at a time."""
        if not self.spec.compute_in_turns:
            yield
            return
        with (Path(self.spec.run_dir) / "compute.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _write_timing(self, version: int, apply_s: float) -> None:
        out = Path(self.spec.run_dir) / f"follower{self.k}"
        out.mkdir(parents=True, exist_ok=True)
        with (out / "apply_seconds.jsonl").open("a") as fh:
            fh.write(json.dumps({"version": version, "seconds": apply_s}) + "\n")

    def _log_decision(self, d: m.Decide, a: m.Apply) -> None:
        """What this follower applied, one JSON line per round (``decisions.jsonl``)."""
        record = {
            "round": a.round_id,
            "version": a.version,
            "learners": list(d.learners),
            "accepted": list(d.accepted),
            "weights": list(d.weights),
            "clip_factor": a.clip_factor,
            "tokens": sum(n for n, ok in zip(d.tokens, d.accepted, strict=True) if ok),
        }
        out = Path(self.spec.run_dir) / f"follower{self.k}"
        out.mkdir(parents=True, exist_ok=True)
        with (out / "decisions.jsonl").open("a") as fh:
            fh.write(json.dumps(record) + "\n")

    def save(self, name: str) -> Path:
        """The shard's newest version as ``RUN_DIR/follower{k}/NAME.npz`` (tensor paths as
        keys joined by ``/``, plus ``__version__``): what the launcher evaluates."""
        v, shard = self.follower.pull()
        out = Path(self.spec.run_dir) / f"follower{self.k}"
        out.mkdir(parents=True, exist_ok=True)
        arrays = {"/".join(p): np.asarray(x) for p, x in outer.flatten(shard).items()}
        np.savez(out / f"{name}.npz", __version__=np.asarray(v), **arrays)
        return out / f"{name}.npz"

    def _heartbeats(self) -> None:
        while not self.stop.wait(self.spec.heartbeat_interval):
            with contextlib.suppress(Exception):  # a missed beat is the leader's to judge
                self.control.call(m.FollowerHeartbeat(0.0, self.k), timeout=5.0)

    def _serve(self) -> bool:
        """Carries out the leader's actions until Stop or SIGTERM (True), or until the
        control stream breaks (False: the leader died; it will be back on its port)."""
        try:
            for action in self.control.watch():
                self.busy = True
                go_on = self.handle(action)
                self.busy = False
                if not go_on or self.terminating:
                    return True
        except grpc.RpcError as e:
            self.busy = False
            if self.terminating:
                return True
            log.warning("watch ended (%s)", e.code())
            time.sleep(min(self.spec.heartbeat_interval, 1.0))
            return False
        return True

    def run(self) -> None:
        log.info(
            "serving the data plane on %s (%d tensors), at version %d",
            self.address,
            len(self.mine),
            self.follower.version,
        )
        with self.lock:
            commands = self.follower.start(time.monotonic(), self.restarted)
        self._send_until_up(commands)
        log.info("joined the leader at %s", self.spec.leader)
        threading.Thread(target=self._heartbeats, daemon=True).start()
        try:
            while not self._serve():  # the stream broke: say so, join again once it is back
                log.warning("control plane lost; rejoining")
                with self.lock:
                    commands = self.follower.leader_lost(time.monotonic())
                self._send_until_up(commands)
            if self.spec.checkpoints:
                with self.lock:
                    self.save("final")
                log.info("saved its final shard (version %d)", self.follower.version)
            self.tb.close()
        finally:
            self.stop.set()
            self.data.close()
            self._write_metrics()
            log.info(self.refusals.summary())
            self._close_checkpoints()
            write_cpu_seconds(Path(self.spec.run_dir) / f"follower{self.k}" / "cpu.json")
            log.info("stopped at version %d", self.follower.version)


def main(argv: list[str] | None = None) -> int:
    permissions.private()  # what this process writes is its owner's alone
    parser = argparse.ArgumentParser(prog="dipsjax-follower", description=__doc__)
    parser.add_argument("spec")
    parser.add_argument("index", type=int)
    parser.add_argument(
        "--resume",
        default=None,
        metavar="V",
        help="restart from version V's checkpoint, or from the newest ('latest')",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="serve the data plane on this port instead of the spec's (0: any free one); "
        "the follower announces it, and learners find it through the leader",
    )
    parser.add_argument(
        "--init",
        default="model",
        choices=("model", "zeros"),
        help="shard at version 0: the model's initialization, or zeros (large-model benchmarks)",
    )
    args = parser.parse_args(argv)
    logs.setup(f"follower{args.index}")
    log.info("starting: resume %s, port %s", args.resume, args.port)
    resume = args.resume
    if resume is not None:
        if resume != "latest" and not resume.isdigit():
            parser.error(f"--resume takes a version (>= 0) or 'latest', got {resume!r}")
        resume = -1 if resume == "latest" else int(resume)
    node = FollowerNode(RunSpec.read(args.spec), args.index, resume, args.init, args.port)
    signal.signal(signal.SIGTERM, node.on_term)  # exits through the finally blocks
    node.run()
    return node.exit_code


if __name__ == "__main__":
    sys.exit(main())
