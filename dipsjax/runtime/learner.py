"""A learner process: one partition's JAX inner loop, pushing to and pulling from followers.

Every protocol decision is :class:`~dipsjax.syncer.learner.LearnerProtocol`'s (the same
object the simulator's learners run); this module only carries out its commands -- control
calls, training rounds on the partition (:class:`~dipsjax.runtime.partition.Compute`),
pushes and pulls on the data plane, orbax checkpoints -- and feeds back what came of them.
The main thread owns the protocol; the watch stream, the heartbeats and (with ``overlap``)
the background puller are threads that only put inputs on its queue. Everything that
touches the partition's computations (training, taking a version, checkpoints) runs on one
compute thread, in the order the protocol asks; a round trains there while the main thread
goes on with the protocol (an overlapping learner's push, pull notices, the next round's
chunk leases), and its result comes back as an input.

A round: draw ``H`` batches (chunks leased from the leader; the next round's are leased
while this one trains, and a restart's rejoin lists them among its leases), train, report
``PushRequested``, stream its tensors to the followers in the order of the leader's
``PushShards`` plan, report ``TransferDone``, wait for ``NotifyPull`` and pull the new
version (Di-PS: a round's learners pull, the others keep training). A per-learner slowdown
(``spec.sim.speeds[j]``) sleeps ``(speed - 1)`` times the measured training time, to make
learners of different speeds on one machine. It sends a heartbeat every
``spec.heartbeat_interval`` seconds from a thread, so a long round never looks like a death.

The learner's arithmetic is the simulator's (:mod:`dipsjax.learner.contribution`: the same
learner, batches, pseudo-gradient and wire codec), so a run's tape replays through
:func:`dipsjax.sim.replay.replay`.

Checkpoints (orbax, ``RUN_DIR/learner{j}/ckpt``, the 3 newest kept): the inner AdamW state
with the data position and counters, at every round start (``start``; ``requested`` when
an overlapping learner's previous push still waits for its plan: restored only if the
leader took that push) and, when waiting, once its push is on the followers, before it is
reported done (``pushed``). The compute thread copies the state to the host; a thread of
its own writes it, and a ``pushed`` one is on disk before the report. ``--resume``
restarts from the checkpoint the protocol picks: the learner rejoins with the same
incarnation, learns from the leader how its last push ended (if the restart lost it, it
goes back to that round's start and trains it again), pulls the current version, and first
trains the chunks still leased to it (the leader lists them, in lease order) before it
leases new ones, so its data continues where it stopped. Its parameters are not
checkpointed: it resumes from the current global version (with ``overlap`` or
``adopt='delta'`` its own unmerged progress since its last push is not kept). SIGTERM
exits cleanly at the next safe point, after the checkpoint writes in flight.

Wire and error feedback (EXTENSION, off by default): ``wire="stat2"`` encodes each push
with :func:`dipsjax.outer.encode_tree` (norms and embeddings BF16, the other matrices in
the statistical 2-bit codec) and the data plane sends those encodings as they are, each
tensor in its own codec. ``error_feedback`` keeps the residual of what the codec withheld
(:class:`~dipsjax.learner.contribution.PushFeedback`, :mod:`dipsjax.outer._feedback`):
each push sends ``C(delta + feedback_decay * e)``, and the protocol settles it by the
outcome the leader's ``NotifyPull`` says (or a rejoin's ``SendModel``; see
:mod:`dipsjax.syncer.learner`). The residual lives in the process's memory: a rejoin in
the same process (the leader was lost) keeps it. With checkpoints, each checkpoint writes
the residual and the pushes not settled yet beside it (``RUN_DIR/learner{j}/feedback/
STEP.npz``, before the checkpoint itself), and a process restarted with ``--resume`` takes
those of the checkpoint it restores and settles the pushes by the leader's word, as a
rejoin does. The leader's word is about the learner's last push only: a restored push
that is not the last one (with ``overlap``, a ``start`` checkpoint written while push
``r`` was in flight, then push ``r + 1`` sent before the process died) settles as
``lost`` even if it was applied, and the residual it carried is sent once more. A new
incarnation starts afresh, from a zero
residual: it loses the residual ``e`` (the part of its applied pushes' targets the codec
withheld: about one push's compression error with decay 1) and the residual held by its
pushes in flight; conservation (:mod:`dipsjax.outer._feedback`) holds again from there on.

Faults: a learner started with a higher ``--incarnation`` (the launcher's restart after a
crash) begins afresh: the leader ends the old incarnation and this one pulls a whole
version first. When the control plane fails (the watch stream breaks, or a call does: the
leader died and is restarted on its port), the protocol rejoins the leader as the same
incarnation from its own checkpoints on a new stream, as ``--resume`` does, in its own
process; past 120 s without a leader it exits 69. Transfers to and from a follower that
died are tried again until it is back on its port. Exit codes: 75 evicted (start a new
incarnation), 69 link down or leader gone, 78 refused (the same process would be refused
again), 0 the job stopped.

Run: ``python -m dipsjax.runtime.learner RUN_DIR/spec.json J [--incarnation N] [--resume]``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import queue
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import jax
import ml_dtypes
import numpy as np
from tensorboardX import SummaryWriter

from dipsjax import outer
from dipsjax.data.pipeline import BatchStream, StreamPosition
from dipsjax.learner import Learner, make_partition_mesh
from dipsjax.learner.contribution import PushFeedback, encode_tree, push_meta
from dipsjax.model.plan import learner_memory
from dipsjax.runtime import books, logs, permissions, progress
from dipsjax.runtime.books import read_books
from dipsjax.runtime.checkpoint import Checkpoints
from dipsjax.runtime.client import ControlClient, booked, in_parallel, model_fingerprint
from dipsjax.runtime.partition import Compute, Partition, process_index
from dipsjax.runtime.spec import REFUSED_EXIT, RunSpec, address, write_json
from dipsjax.syncer import messages as m
from dipsjax.syncer import methods
from dipsjax.syncer.learner import Checkpoint, LearnerProtocol, State, session_base
from dipsjax.task import load_task
from dipsjax.transport.dataplane import DataPlaneClient, FrameError, LinkCut, TransferError

log = logging.getLogger("dipsjax.runtime.learner")  # not __name__: "__main__" when run

EVICTED = m.ExitCode.EVICTED  # exit code (EX_TEMPFAIL): start me again as a new incarnation
UNREACHABLE = m.ExitCode.UNREACHABLE  # exit code (EX_UNAVAILABLE): my link is down
REFUSED = REFUSED_EXIT  # exit code (EX_CONFIG): the same process would be refused again
assert REFUSED == m.ExitCode.REFUSED


class LeaderLost(Exception):
    """The control plane failed (the watch stream broke, or a call did): the leader died
    and is restarted on its port, or the connection did."""

    def __init__(self, why: str, generation: int) -> None:
        super().__init__(why)
        self.generation = generation


# Transfer errors a learner outlives: the follower died or restarted (its port comes back).
TRANSFER_ERRORS = (OSError, FrameError, TransferError)


def retrying(fn: Any, what: str, patience: float = 60.0, on_error: Any = None) -> Any:
    """``fn()``, tried again on transfer errors for ``patience`` seconds: a follower that
    died comes back (on its port, or, replaced, on the one ``on_error()`` looks up), and
    the transfer goes through."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return fn()
        except TRANSFER_ERRORS as e:
            if time.monotonic() > deadline or getattr(e, "refused", False):
                raise  # out of patience, or refused for good (sending again cannot help)
            log.warning("%s failed (%s: %s); trying again", what, type(e).__name__, e)
            time.sleep(0.5)
            if on_error is not None:
                with contextlib.suppress(Exception):  # the leader may be away too
                    on_error()


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _learning_rate(learner: Any, step: int) -> float | None:
    """The inner learning rate at inner step ``step``: the schedule of the optimizer the
    learner's inner step was built with (``None`` if it cannot say)."""
    try:
        from dipsjax.learner.step import learning_rate_schedule

        return float(learning_rate_schedule(learner.inner.optimizer)(step))
    except Exception:  # an inner step of another kind (a task's own optimizer)
        return None


def partition_mesh() -> Any:
    """The partition's mesh over the ``DIPSJAX_PARTITION_DEVICES`` devices the launcher
    gave it (``Requirements.cpu_devices`` or its accelerators), shaped ``(data, fsdp,
    tensor)`` by ``DIPSJAX_PARTITION_MESH`` (``Requirements.mesh_data`` /
    ``mesh_tensor``; unset: every device on ``fsdp``); ``None`` when it gave none or one
    (no mesh: the simulator's arithmetic, bit for bit)."""
    n = int(os.environ.get("DIPSJAX_PARTITION_DEVICES", "1"))
    if n <= 1:
        return None
    devices = jax.devices()
    if len(devices) != n:
        raise RuntimeError(
            f"the launcher gave this partition {n} devices (DIPSJAX_PARTITION_DEVICES) but "
            f"JAX sees {len(devices)}: {devices}"
        )
    shape = os.environ.get("DIPSJAX_PARTITION_MESH", "")
    if not shape:
        return make_partition_mesh(devices)
    try:
        data, fsdp, tensor = (int(x) for x in shape.split(","))
    except ValueError:
        raise RuntimeError(
            f"DIPSJAX_PARTITION_MESH must be 'data,fsdp,tensor' (three integers), got {shape!r}"
        ) from None
    return make_partition_mesh(devices, data=data, fsdp=fsdp, tensor=tensor)


def partition_compute(spec: RunSpec, j: int) -> tuple[Compute, dict]:
    """Learner ``j``'s partition (joined across its processes, if spread), its
    :class:`~dipsjax.runtime.partition.Compute` and its initial parameters on the host
    (every process of the partition calls this, in step)."""
    partition = Partition.from_env()
    cfg = spec.sim
    task = load_task(cfg)
    learner = Learner(
        task,
        task.inner_optimizer or cfg.inner_optimizer(),
        mesh=partition_mesh(),
        learner_id=j,
        seed=cfg.seed,
        donate=False,
    )
    # A BF16 wire sent as it is (no top-k, no error feedback): the pseudo-gradient leaves
    # the device in BF16 (the data plane frames it without converting anything).
    as_is = cfg.wire == "bf16" and cfg.wire_topk is None and not cfg.error_feedback
    wire_dtype = ml_dtypes.bfloat16 if as_is else None
    compute = Compute(learner, methods.build(cfg.method).reference, partition, wire_dtype)
    return compute, compute._params()


class LearnerNode:
    """Learner ``j`` of a run (see module docstring)."""

    def __init__(self, spec: RunSpec, j: int, incarnation: int = 0, resume: bool = False) -> None:
        self.spec, self.j, self.incarnation, self.resume = spec, j, incarnation, resume
        cfg = spec.sim
        self.compute, params = self.make_compute()
        self.learner, self.reference = self.compute.learner, self.compute.reference
        flat = outer.flatten(params)
        self.paths = list(flat)
        self.shapes = {p: tuple(x.shape) for p, x in flat.items()}
        # The one memory model (dipsjax.model.plan.learner_memory): this learner's step
        # peak, logged and kept beside the measured peak in stats.json.
        n = sum(math.prod(s) for s in self.shapes.values())
        self.planned_peak = sum(learner_memory(n).values())
        self.fingerprint = model_fingerprint({p: (x.shape, x.dtype) for p, x in flat.items()})
        self.task_name = load_task(cfg).name
        self.source, self.stream = self.make_data()
        # Resumed: the pieces (chunk, start, end) still leased to it, trained first.
        self.regrant: list[tuple[int, int, int]] = []
        ckpt_dir = Path(spec.run_dir) / f"learner{j}" / "ckpt"
        if incarnation > 0 and not resume:  # a dead incarnation's state: this one starts afresh
            for old in (ckpt_dir, ckpt_dir.parent / "feedback"):
                if old.exists():
                    shutil.rmtree(old)
        # Written by a thread of its own (the host copy is taken first, on the compute
        # thread): a round start's checkpoint is not on the round's path; a pushed round's
        # is waited for before its report (see ``save``).
        # Orbax writes synchronously in that thread (no threads of its own besides).
        self.ckpt = Checkpoints(ckpt_dir, asynchronous=False)
        self.saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"ckpt{j}")
        self.saving: concurrent.futures.Future | None = None  # the newest checkpoint's write
        self.save_error: BaseException | None = None  # the first write that failed
        # Tokens of every push the leader took (its reply came back), across restarts: the
        # learner's side of the token balance, never rolled back with a checkpoint; and
        # the push request written down, its answer not (see ``read_books``).
        self.reported_path = Path(spec.run_dir) / f"learner{j}" / "reported.json"
        start = read_books(self.reported_path, incarnation, resume)
        # A push request whose answer never came (the leader died, or was deposed, after
        # it may have written the push down): its tokens, until the leader's word says
        # whether it was booked: its plan (a round newer than any this process knows of its
        # pushes: one push is in flight at a time), or a rejoin's ``SendModel.booked``, the
        # leader's count of this incarnation's pushes it booked, against this process's own
        # count of the ones it knows were (``booked_pushes``). An earlier incarnation's
        # (``asks``) is settled by the leader's word on that incarnation (``Reckon``).
        self.reported, self.booked_pushes, self.in_doubt = start.tokens, start.booked, start.doubt
        self.asks, self.unresolved, self.stale_books = start.asks, start.unresolved, start.stale
        self.known_round = -1
        # The protocol: every decision of this learner's side (syncer/learner.py).
        self.proto = LearnerProtocol(
            j,
            incarnation,
            fingerprint=self.fingerprint,
            overlap=bool(cfg.overlap),
            checkpoints=spec.checkpoints,
            saved=self._saved() if resume else (),
            feedback=bool(cfg.error_feedback),
            session_base=session_base(),
            asks=None if self.asks is None else self.asks[0],
        )
        # Error feedback (EXTENSION): the residual and the pushes not settled yet. In memory
        # only: a process that ends takes it along (see the module docstring).
        self.feedback = None
        if cfg.error_feedback:
            self.feedback = PushFeedback(cfg.wire, cfg.feedback_decay, cfg.wire_topk)
        self.terminating = False  # SIGTERM: stop at the next safe point
        self.job_stop: m.Stop | None = None  # the leader's Stop, as the watch stream got it
        self.control = ControlClient(spec, learner=j, incarnation=incarnation)
        tls = spec.ssl_client()
        rate = dict(spec.link_rates).get(j)  # fault injection: a slow link
        # Fault injection: a cut link, in the first incarnation (a new one has a new link).
        self.cut = dict(spec.link_cuts).get(j) if incarnation == 0 else None
        links = [LinkCut() if self.cut else None for _ in spec.followers]
        # Connecting gives up after 5 s (``retrying`` tries again, looking up meanwhile
        # whether a replacement follower took over on another port).
        self.data, self.pull_data = (
            [
                DataPlaneClient(
                    address(a), ssl_context=tls, rate=rate, link=link, connect_timeout=5.0
                )
                for a, link in zip(spec.followers, links, strict=True)
            ]
            for _ in range(2)
        )
        self.pushes = 0  # pushes started by this process
        self.armed: LinkCut | None = None  # fault injection: a cut armed for this push
        # The main thread owns the protocol; every other thread only puts inputs here:
        # ("action", Action, stream), ("lost", LeaderLost), ("pulled", version, params).
        self.inputs: queue.Queue = queue.Queue()
        self.moving = threading.Lock()
        self.notices: queue.Queue = queue.Queue()  # overlap: versions to pull, in the background
        self.latest: tuple[int, Any] | None = None  # overlap: the newest version pulled
        # The trained rounds' (base version, pseudo-gradient), oldest first, until pushed.
        self.deltas: collections.deque = collections.deque()
        # The compute thread: rounds, takes and checkpoints, in the protocol's order; a
        # round's result comes back as ("trained", seq, result), only the newest counts.
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"compute{j}")
        self.train_seq = 0
        self.ahead: collections.deque = collections.deque()  # pieces leased for later rounds
        self.base: Any = None
        self.stop = threading.Event()
        self.pulled = True  # the next push is the first since a pull
        self.exit_code = 0
        self.generation = 0  # the control stream the protocol takes actions from
        self.lost_since: float | None = None  # the leader unreachable since (monotonic)
        self.patience = 120.0  # seconds to wait for a lost leader to come back
        self.trained = {"tokens": 0, "first": None, "last": None}  # for the stats file
        if not self.stale_books:  # a newer incarnation's are left as they are
            self._write_reported()  # its books as it starts (an earlier one's question kept)
        self.tb = SummaryWriter(str(Path(spec.run_dir) / "tb" / f"learner{j}"))

    def make_compute(self) -> tuple[Compute, dict]:
        """Its computations and the parameters they start from (a hook:
        :class:`~dipsjax.runtime.contributor.Contributor` puts a user's own loop here)."""
        return partition_compute(self.spec, self.j)

    # -- control ---------------------------------------------------------------------

    @property
    def rounds(self) -> int:
        return self.proto.rounds

    @property
    def unused(self) -> collections.Counter[str]:
        """Pushes the leader said it did not use, by kind (``Unused``: stale, nonfinite)."""
        return self.proto.unused

    def _saved(self) -> list[Checkpoint]:
        """The checkpoints on disk, for the protocol's choice of which to restore."""
        return [
            Checkpoint(step, meta["kind"], meta["round_id"], m.spans_of(meta.get("spans", ())))
            for step in self.ckpt.steps()
            for meta in [self.ckpt.meta(step)]
        ]

    def next_chunk(self) -> tuple[int, int, int] | None:
        if self.proto.state is not State.TRAINING:
            # A round that a rejoin (or a stop) ended while it drew its batches: a piece
            # leased now would be missing from the rejoin's list, never trained again.
            return None
        if self.regrant:
            return self.regrant.pop(0)
        return self.ahead.popleft() if self.ahead else self.lease()

    def _lease_ahead(self) -> None:
        """While a round trains: lease the next round's pieces (the leader counts them as
        this learner's; a rejoin's ``SendModel`` lists them with the others), so that its
        start does not wait for the control plane. A failure is left to the round start,
        which leases what it lacks itself."""
        if self.stream is None or self.terminating or self.proto.state is not State.TRAINING:
            return
        have = sum(end - start for _, start, end in self.ahead)
        while have < (self.proto.steps or self.spec.sim.inner_steps):
            try:
                piece = self.lease()
            except (grpc.RpcError, ValueError):
                return
            if piece is None:
                return
            self.ahead.append(piece)
            have += piece[2] - piece[1]

    def lease(self) -> tuple[int, int, int] | None:
        for a in self.control.call(m.ChunkRequested(0.0, self.j)):
            if isinstance(a, m.GrantChunk):
                return a.piece
        return None

    def _watch(self, generation: int) -> None:
        try:
            for a in self.control.watch(self.incarnation):
                if isinstance(a, m.Stop):
                    self.job_stop = a  # seen at once, even by a call that fails meanwhile
                self.inputs.put(("action", a, generation))
                if isinstance(a, m.Stop):
                    return
        except Exception as e:  # the leader went away: the main loop rejoins
            self.inputs.put(("lost", LeaderLost(f"watch ended: {e}", generation)))

    def start_watch(self) -> None:
        """A watch stream for the protocol's current control stream."""
        threading.Thread(target=self._watch, args=(self.generation,), daemon=True).start()

    def _heartbeats(self) -> None:
        while not self.stop.wait(self.spec.heartbeat_interval):
            with contextlib.suppress(Exception):  # a missed beat is the leader's to judge
                self.control.call(m.Heartbeat(0.0, self.j), timeout=5.0)

    def _puller(self) -> None:
        """Overlap: pull each version the protocol asks for in the background (the round
        ends when its learners have pulled) and hand it to the main thread."""
        while not self.stop.is_set():
            try:
                version = self.notices.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                v, params = self.pull(version, self.pull_data)
            except Exception as e:  # a follower is away past patience: the round goes on
                log.warning("background pull failed (%s)", e)
                continue
            self.inputs.put(("pulled", v, params))

    # -- the protocol's commands ---------------------------------------------------------

    def now(self) -> float:
        return time.monotonic()

    def execute(self, commands: list[m.Command]) -> None:
        """Carries out the protocol's commands in order; what comes of each goes back to
        the protocol, whose new commands come first."""
        todo = collections.deque(commands)
        while todo:
            c = todo.popleft()
            more = self._one(c)
            todo.extendleft(reversed(more))

    def _one(self, c: m.Command) -> list[m.Command]:
        self.phase(self.proto.state.value)  # the state this command carries out
        if isinstance(c, m.Send):
            return self._send(c.event)
        if isinstance(c, m.Train):
            return self._train(c)
        if isinstance(c, m.Push):
            return self._push(c.plan)
        if isinstance(c, m.Pull):
            return self._pull(c)
        if isinstance(c, m.Save):
            self._on_worker(self.save, c)
            return []
        if isinstance(c, m.Restore):
            self._settle_in_doubt(c.last_round, c.booked)
            return self._on_worker(self.restore, c)
        if isinstance(c, m.Reckon):
            return self._reckon(c)
        if isinstance(c, m.Settle):
            assert self.feedback is not None, "Settle without error feedback"
            self.feedback.settle(c.round_id, c.outcome)
            log.debug("push of round %d settled: %s", c.round_id, c.outcome)
            return []
        if isinstance(c, m.Exit):
            self.exit_code = int(c.code)
            what = {0: "stopped", 69: "unreachable", 75: "evicted", 78: "refused"}
            log.log(
                logging.INFO if self.exit_code == 0 else logging.WARNING,
                "%s (%s) after %d rounds (exit %d)",
                what.get(self.exit_code, "exit"),
                c.reason,
                self.rounds,
                self.exit_code,
            )
            return []
        raise TypeError(f"learner {self.j}: no way to carry out {c}")

    def _send(self, event: m.Event) -> list[m.Command]:
        if isinstance(event, m.PushRequested):
            # A Stop or an eviction that came while it trained ends the round here: the
            # leader that sent a Stop may be gone, and the call would wait for it in vain.
            self._drain()
            if not self.proto.asking():
                return []
        if self.terminating:
            return []  # SIGTERM: no more calls (the control channel is being closed)
        pushing = isinstance(event, m.PushRequested)
        if pushing:  # written down before it is sent: a kill from here on leaves it in doubt
            if self.in_doubt:  # no word settled an earlier one (none can now): kept apart
                log.warning("a push in doubt (%d tokens) left unresolved", self.in_doubt)
                self.unresolved += self.in_doubt
            self.in_doubt = event.meta.tokens
            self._write_reported()
        try:
            replies = self.control.call(event)
        except (grpc.RpcError, ValueError) as e:
            return self._call_failed(e, type(event).__name__)  # a push stays in doubt
        self.lost_since = None
        if pushing and self.spec.answer_pause > 0:  # fault injection: a kill lands here
            log.info("answer pause, %d tokens in doubt", event.meta.tokens)
            time.sleep(self.spec.answer_pause)
        if pushing:
            if booked(replies, self.control.refused):
                self.reported += event.meta.tokens  # the leader has it (refused ones too)
                self.booked_pushes += 1
            self.in_doubt = 0
            self._write_reported()
        out: list[m.Command] = []
        for a in replies:  # a refused join is answered to its caller
            self._heard(a)
            out += self.proto.on_action(a, self.now(), self.generation)
        return out

    def _call_failed(self, e: Exception, what: str) -> list[m.Command]:
        """A control call failed: the leader is away (the protocol rejoins), or SIGTERM
        closed the channel (``ValueError``; nothing more to do)."""
        if self.terminating:
            return []
        if not isinstance(e, grpc.RpcError):
            raise e
        return self._lost(LeaderLost(f"{what}: {e.code()}", self.generation))

    def _lost(self, e: LeaderLost) -> list[m.Command]:
        """The control plane failed on stream ``e.generation``: the protocol decides
        (rejoin on a new stream, or exit); past ``patience`` it gives up."""
        if e.generation < self.generation or self.terminating:
            return []  # an older stream's end: already handled (or SIGTERM: stopping)
        if self.job_stop is not None:  # the leader stopped the job, then went: done
            return self.proto.on_action(self.job_stop, self.now())
        log.warning("control plane lost (%s); rejoining", e)
        now = self.now()
        if self.lost_since is None:
            self.lost_since = now
        elif now - self.lost_since > self.patience:
            return self.proto.on_gave_up(
                now, f"the leader did not come back in {self.patience:.0f} s"
            )
        time.sleep(0.5)
        out = self.proto.on_leader_lost(now, e.generation)
        if self.proto.stream != self.generation:
            self.generation = self.proto.stream
            self.start_watch()
            self.latest = None
        return out

    def _drain(self) -> None:
        """Takes what the other threads said meanwhile (a Stop, an eviction, a pull
        notice), before a long command."""
        while True:
            try:
                item = self.inputs.get_nowait()
            except queue.Empty:
                return
            self.execute(self._input(item))

    def _on_worker(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the compute thread, after what it has to do already (a round in
        training finishes first), and its result."""
        return self.worker.submit(fn, *args).result()

    def _train(self, c: m.Train) -> list[m.Command]:
        """Starts a round on the compute thread; its result comes back as an input."""
        self.train_seq += 1
        self.worker.submit(self._round, c, self.train_seq)
        return []

    def _round(self, c: m.Train, seq: int) -> None:
        """The compute thread: one round (taking the newest version first, if asked)."""
        try:
            if c.wait > 0:
                time.sleep(c.wait)  # no chunk to lease now
            if self.terminating or self.stop.is_set() or seq != self.train_seq:
                return
            latest = self.latest
            if c.adopt and latest is not None and latest[0] > self.learner.version:
                self.take(*latest)  # the newest version, at a round start
                self.pulled = True
            result: tuple = self._train_round(seq, c.steps or self.spec.sim.inner_steps)
        except BaseException as e:  # the main thread raises it (a bug: the process ends)
            result = ("error", e)
        self.inputs.put(("trained", seq, result))

    def _trained(self, seq: int, result: tuple) -> list[m.Command]:
        """A round's result, on the main thread: to the protocol, unless what came
        meanwhile ended that round (a stop, an eviction, a rejoin)."""
        kind = result[0]
        if seq != self.train_seq or self.proto.state is not State.TRAINING:
            if kind == "error":  # a round that no longer counts, but a failure all the same
                log.error("a round ended meanwhile failed: %r", result[1])
            return []
        if kind == "error":
            raise result[1]
        if kind == "lease failed":
            return self._call_failed(result[1], "ChunkRequested")
        if kind == "nothing":
            return []  # the user's loop gave nothing (a contributor that stopped)
        meta, delta = result[1], result[2]
        if meta is None:
            return self.proto.on_trained(None, self.now())
        self.deltas.append((meta.base_version, delta))
        # The next round starts first; then its log line and scalars, beside it.
        self.execute(self.proto.on_trained(meta, self.now()))
        if len(result) > 3:
            self._log_round(*result[3])
        return []

    def make_data(self) -> tuple[Any, BatchStream | None]:
        """The task's training data and the stream that leases it (a
        :class:`~dipsjax.runtime.contributor.Contributor`'s node has none: its user reads
        their own data)."""
        source = load_task(self.spec.sim).source
        return source, BatchStream(source, source=self.next_chunk)

    def _train_round(self, seq: int, steps: int) -> tuple:
        """Trains one round of ``steps`` inner steps from the version taken, on the compute
        thread: ``("trained", meta, delta)`` (``meta`` ``None``: no chunk to lease now), or
        ``("lease failed", error)`` (a :class:`~dipsjax.runtime.contributor.Contributor`'s
        node has the user's loop do it). Once its batches are drawn, the main thread leases
        the next round's."""
        speed = self.spec.sim.speeds[self.j] if self.spec.sim.speeds else 1.0
        try:
            data = self.stream.take_round(steps)
        except (grpc.RpcError, ValueError) as e:  # leasing a chunk failed
            return ("lease failed", e)
        if not data.batches:
            return ("trained", None, None)
        self.inputs.put(("taken", seq))
        t0 = time.perf_counter()
        contrib, delta = self.compute.call("round", data.batches, len(data.batches), self.base)
        took = time.perf_counter() - t0
        time.sleep((speed - 1.0) * took)
        self._count(contrib.tokens, t0, took)
        meta = push_meta(contrib, data, self.incarnation, speed * took, pulled=self.pulled)
        self.pulled = False
        return ("trained", meta, delta, (contrib, speed * took))

    def _push(self, plan: m.PushShards) -> list[m.Command]:
        # The oldest round trained and not pushed is this plan's (one push at a time, in
        # the order they were requested).
        base, delta = self.deltas.popleft()
        try:
            self.push(plan, delta, base)
        except TRANSFER_ERRORS as e:
            log.warning("push of round %d failed (%s)", plan.round_id, e)
            kind = getattr(e, "kind", None)
            replayed, nonfinite = kind == "replayed", kind == "nonfinite"
            up = () if replayed or nonfinite else self._followers_up()
            return self.proto.on_pushed(
                plan.round_id,
                self.now(),
                failed=True,
                replayed=replayed,
                nonfinite=nonfinite,
                followers_up=up,
            )
        return self.proto.on_pushed(plan.round_id, self.now())

    def _pull(self, c: m.Pull) -> list[m.Command]:
        if c.background:
            self.notices.put(c.version)
            return []
        joining = c.first or self.proto.resume
        if joining:
            for k in range(len(self.data)):  # a follower may have been replaced meanwhile
                with contextlib.suppress(Exception):
                    self.find_follower(k)
        v, params = self.pull(c.version)
        self._on_worker(self.take, v, params, c.first)
        self.pulled = True
        log.log(logging.INFO if joining else logging.DEBUG, "pulled version %d", v)
        if joining:
            for cl in self.data + self.pull_data:  # fault injection: the link was slow to join
                if cl.rate is not None:
                    cl.rate = None
                    cl.close()  # the next transfer connects unthrottled
        return self.proto.on_pulled(v, self.now())

    def _heard(self, action: m.Action) -> None:
        """A plan for this learner names a round of its pushes: a push in doubt newer than
        every round known was booked (the plan is the leader's word), and is counted."""
        if isinstance(action, m.PushShards) and action.learner == self.j:
            if action.round_id > self.known_round and self.in_doubt:
                self._count_in_doubt(f"its plan for round {action.round_id} came")
            self.known_round = max(self.known_round, action.round_id)

    def _settle_in_doubt(self, last_round: int, booked: int) -> None:
        """A rejoin's word on this learner's pushes (``SendModel``): one in doubt was booked
        if the leader booked more of this incarnation's pushes (``booked``) than this
        process knows of. The leader's count is then this process's own: a process resumed
        from a checkpoint (a whole run's ``--resume`` keeps incarnations) starts from what
        its predecessor pushed. (A round id cannot say it: a push that waited for a round
        and was dropped there has none. Every rejoin's ``SendModel`` carries the count; a
        first join's, ``-1``, comes before any push.)"""
        if self.in_doubt and booked > self.booked_pushes + 1:  # more than the one in doubt
            log.error(
                "the leader booked %d pushes of this incarnation; this process knows of %d "
                "and one in doubt: counted that one",
                booked,
                self.booked_pushes,
            )
        if self.in_doubt and booked > self.booked_pushes:
            self._count_in_doubt(f"the leader booked {booked} of its pushes")
        self.in_doubt = 0
        self.known_round = max(self.known_round, last_round)
        if booked >= 0:
            self.booked_pushes = booked
        self._write_reported()

    def _reckon(self, c: m.Reckon) -> list[m.Command]:
        """The leader's word on an earlier incarnation's push in doubt (``asks``: its
        incarnation, its pushes its record knew were booked, the tokens in doubt): booked
        if the leader booked more of that incarnation's pushes than the record knew of."""
        if self.asks is None:
            return []
        incarnation, known, tokens = self.asks
        word = c.booked if c.incarnation == incarnation else None
        counted, unresolved = books.settle(known, tokens, word)
        if unresolved:
            log.warning(
                "the leader cannot say how many pushes of incarnation %d it booked: its push "
                "in doubt (%d tokens) is not counted, and is kept as unresolved",
                incarnation,
                tokens,
            )
        elif counted:
            log.info(
                "incarnation %d's push in doubt was booked (the leader booked %d of its "
                "pushes, its record knew of %d): counted",
                incarnation,
                c.booked,
                known,
            )
        self.reported += counted
        self.unresolved += unresolved
        self.asks = None
        self._write_reported()
        return []

    def _count_in_doubt(self, why: str) -> None:
        log.info("a push request whose answer was lost was booked (%s): counted", why)
        self.reported += self.in_doubt
        self.booked_pushes += 1
        self.in_doubt = 0
        self._write_reported()

    def _input(self, item: tuple) -> list[m.Command]:
        kind = item[0]
        if kind == "action":
            self._heard(item[1])
            return self.proto.on_action(item[1], self.now(), item[2])
        if kind == "lost":
            return self._lost(item[1])
        if kind == "pulled":
            self.latest = (item[1], item[2])
            return self.proto.on_pulled(item[1], self.now(), background=True)
        if kind == "trained":
            return self._trained(item[1], item[2])
        if kind == "taken":
            if item[1] == self.train_seq:
                self._lease_ahead()
            return []
        raise TypeError(f"unknown input {kind!r}")

    def pull(self, version: int, clients: list | None = None) -> tuple[int, dict]:
        """One complete model of one version, from every follower at once."""
        clients = self.data if clients is None else clients
        results = in_parallel(
            lambda k: retrying(
                lambda: clients[k].pull(version, codec="fp32"),
                f"pull from follower {k}",
                patience=self.spec.transfer_patience,
                on_error=lambda: self.find_follower(k),
            ),
            range(len(clients)),
        )
        versions = {v for v, _ in results}
        if versions != {version}:
            raise RuntimeError(f"pulled versions {versions}, wanted {version}")
        flat = {self.paths[i]: x for _, tensors in results for i, x in tensors.items()}
        return version, outer.unflatten(flat)

    def encoded(self, round_id: int, delta: dict) -> dict:
        """The push's tensors by path: arrays the data plane encodes in the ``wire`` codec,
        or, under ``stat2``, ``wire_topk`` or error feedback, the learner's own encoding
        (:class:`~dipsjax.outer.Encoded` leaves, norms and embeddings BF16 under ``stat2``:
        :func:`dipsjax.outer.encode_tree`, the simulator's), sent as they are."""
        cfg = self.spec.sim
        if self.feedback is not None:
            tree = self.feedback.encode(round_id, delta)
        elif cfg.wire == "stat2" or cfg.wire_topk is not None:
            tree = encode_tree(delta, cfg.wire, cfg.wire_topk)
        else:
            return outer.flatten(jax.device_get(delta))
        return outer.flatten(jax.device_get(tree))

    def push(self, plan: m.PushShards, delta: dict, base: int) -> None:
        """Round ``plan.round_id``'s pseudo-gradient ``delta``, trained from version
        ``base``, to the followers of the plan."""
        flat = self.encoded(plan.round_id, delta)
        by_follower: dict[int, list] = {}
        for tr in plan.transfers:  # in the plan's order
            by_follower.setdefault(tr.follower, []).append((tr.layer, flat[self.paths[tr.layer]]))
        codec = self.spec.sim.wire
        ticket = bytes.fromhex(plan.ticket)  # the leader's grant, checked by each follower

        def one(k: int) -> int:
            tensors = by_follower[k]
            return self.data[k].push(
                plan.round_id, self.j, self.incarnation, base, tensors, codec=codec, ticket=ticket
            )

        order = sorted(by_follower)
        self.pushes += 1
        if self.cut and self.pushes == 2:  # fault injection: the link cut mid-push
            log.warning(
                "link to follower %d cut for %s s, round %d", order[-1], self.cut, plan.round_id
            )
            link = self.data[order[-1]].link
            assert link is not None
            link.cut_after(1 << 16, self.cut)
            self.armed = link
        if self.spec.push_pause > 0 and len(order) > 1:  # fault injection: a push cut mid-way
            one(order[0])
            log.warning("mid-push pause, round %d", plan.round_id)
            time.sleep(self.spec.push_pause)
            order = order[1:]
        try:
            in_parallel(
                lambda k: retrying(
                    lambda: one(k),
                    f"push to follower {k}",
                    patience=self.spec.transfer_patience,
                    on_error=lambda: self.find_follower(k),
                ),
                order,
            )
        finally:
            if self.armed is not None:  # fault injection: the cut is for this push only
                self.armed.disarm()
                self.armed = None

    def _followers_up(self) -> set[int]:
        """The followers the leader hears from, asked for ``transfer_patience`` seconds
        (none when it cannot be asked: the leader is away, and its return is handled by
        the watch stream's rejoin)."""
        deadline = time.monotonic() + self.spec.transfer_patience
        while True:
            try:
                return set(self.control.status(timeout=5.0)["followers_up"])
            except Exception:
                if time.monotonic() > deadline:
                    return set()
                time.sleep(0.5)

    def find_follower(self, k: int) -> None:
        """Follower ``k`` did not answer: if the leader knows it at another address (a
        replacement took over its shard), talk to that one from now on."""
        moved = self.control.status(timeout=5.0)["follower_addresses"].get(str(k))
        with self.moving:  # the push and the overlap puller may both look it up
            if moved is None or address(moved) == tuple(self.data[k].address):
                return
            log.info("follower %d moved to %s", k, moved)
            self._move(k, moved)

    def _move(self, k: int, moved: str) -> None:
        for clients in (self.data, self.pull_data):
            old = clients[k]
            clients[k] = DataPlaneClient(
                address(moved),
                ssl_context=old.ssl_context,
                rate=old.rate,
                link=old.link,
                connect_timeout=5.0,
            )
            old.close()

    def take(self, version: int, params: dict, first: bool = False) -> None:
        """Starts from a global version: its parameters (``replace``), or, with
        ``adopt='delta'``, the learner's own plus the global change since its last one."""
        delta = self.spec.sim.adopt == "delta" and not first and self.base is not None
        self.compute.call("take", params, version, first, self.base if delta else None)
        self.base = params

    # -- checkpoints -------------------------------------------------------------------

    def save(self, c: m.Save) -> None:
        """Checkpoints the inner state, data position and counters (``Save.step``)."""
        meta = {
            "kind": c.kind,
            "rounds": self.rounds,
            "round_id": c.round_id,
            "version": self.learner.version,
            "position": self.stream.position.to_dict(),
            "tokens": self.trained["tokens"],
            "spans": [list(sp) for sp in c.spans],  # ``requested``: the push it waited on
        }
        # On the host, copied now: the next round reuses the device buffers.
        state = jax.tree.map(np.array, self.compute.call("opt_state"))  # (gathered, if spread)
        if self.feedback is not None:  # the residual first: a checkpoint has its residual
            self.feedback.save(self._feedback_path(c.step))
        if self.save_error is not None:
            raise self.save_error  # an earlier write failed: say so now
        self.saving = self.saver.submit(self._write, c, state, meta)
        if c.kind == "pushed":
            # On disk before the leader hears of the push (the protocol's TransferDone
            # comes next): a learner killed after its report resumes past this round.
            self.saved_wait()

    def _write(self, c: m.Save, state: Any, meta: dict) -> None:
        """The checkpoint thread: writes what :meth:`save` took (orbax, in the background)."""
        try:
            self.ckpt.save(c.step, state, meta, copy=False)
        except BaseException as e:
            self.save_error = self.save_error or e
            raise
        if self.feedback is not None:
            # Older residuals only: a newer one may be written already, its checkpoint next.
            kept = set(self.ckpt.steps(wait=False)) | {c.step}
            for f in self._feedback_path(0).parent.glob("*.npz"):
                if f.stem.isdigit() and int(f.stem) < c.step and int(f.stem) not in kept:
                    f.unlink(missing_ok=True)
        log.debug("checkpoint %d (%s, round %s) saved", c.step, c.kind, c.round_id)

    def saved_wait(self) -> None:
        """Returns once every checkpoint started is on disk (raises if a write failed)."""
        if self.saving is not None:
            self.saving.result()
        if self.save_error is not None:
            raise self.save_error
        self.ckpt.wait()

    def _feedback_path(self, step: int) -> Path:
        return Path(self.spec.run_dir) / f"learner{self.j}" / "feedback" / f"{step}.npz"

    def restore(self, c: m.Restore) -> list[m.Command]:
        """Restores the checkpoint the protocol chose (``None``: none: start afresh on the
        chunks still leased to it); what it restored goes to ``learner{j}/resumed.json``.
        With error feedback, a new process takes the checkpoint's residual and pushes in
        flight (a rejoin within the process keeps its own, newer), and returns the
        protocol's ``Settle`` s of those pushes."""
        self.saved_wait()  # the writes in flight first: the choice counts them
        settles: list[m.Command] = []
        fb = self.feedback
        if fb is not None and fb.state is None and c.step is not None:
            path = self._feedback_path(c.step)
            if path.exists():
                settles = self.proto.on_restored(fb.load(path), c)
                log.info("error feedback: residual of checkpoint %d restored", c.step)
        record: dict[str, Any] = {
            "step": c.step,
            "version": c.version,
            "leases": [list(sp) for sp in c.regrant],
            "last_round": c.last_round,
            "last_outcome": c.last_outcome,
        }
        if c.step is None:  # stopped before its first round: start afresh, on its leases
            self.regrant = [tuple(sp) for sp in c.regrant]
            record["regrant"] = [list(sp) for sp in self.regrant]
        else:
            state, meta = self.ckpt.restore(self.compute.call("opt_state"), c.step)
            self.ckpt.drop_after(c.step)
            self.compute.call("set_opt_state", state)
            pos = StreamPosition.from_dict(meta["position"])
            self.stream = BatchStream(self.source, source=self.next_chunk, position=pos)
            # The piece it stopped in is read on from its position; the rest first.
            self.regrant = [
                tuple(sp)
                for sp in c.regrant
                if not (sp.chunk == pos.chunk and sp.start <= pos.offset < sp.end)
            ]
            self.trained["tokens"] = meta["tokens"]
            record.update(
                kind=meta["kind"],
                rounds=self.rounds,
                position=meta["position"],
                regrant=[list(sp) for sp in self.regrant],
            )
        self.base = None
        self.ahead.clear()  # leased ahead: among the leases the leader listed, if it knows them
        self.deltas.clear()  # rounds the rejoin dropped
        out = Path(self.spec.run_dir) / f"learner{self.j}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "resumed.json").write_text(json.dumps(record))
        log.info("resumed %s", record)
        return settles

    # -- the loop ----------------------------------------------------------------------

    def warm_up(self) -> None:
        """Compiles everything a round runs (inner steps, the round's pseudo-gradient, taking
        a version) on a round of zeros before joining, then puts the learner back as it
        was, so that compile time never counts as training time (the slowdown multiplies
        measured training time)."""
        cfg = self.spec.sim
        self.phase("compiling")
        sample = self.source.batch(0, 0)
        mesh = self.learner.inner.mesh
        log.info(
            "compiling: task %s, batch %s, %d inner steps a round, mesh %s, planned peak "
            "%.3f GB (weights, AdamW, reference, gradients, the step's outputs)",
            self.task_name,
            [tuple(x.shape) for x in jax.tree.leaves(sample)],
            cfg.inner_steps,
            "none (one device)"
            if mesh is None
            else " x ".join(f"{a}={n}" for a, n in mesh.shape.items())
            + f" over {mesh.devices.size} {mesh.devices.flat[0].platform} devices",
            self.planned_peak / 1e9,
        )
        t0 = time.perf_counter()
        # The round's shapes: a shorter round would compile another program.
        self.compute.call("warm_up", sample, cfg.inner_steps)
        # The push's own encoding (stat2, error feedback), on a pseudo-gradient of zeros.
        zeros = outer.unflatten({p: np.zeros(s, np.float32) for p, s in self.shapes.items()})
        if self.feedback is not None:
            self.feedback.warm_up(zeros)
        elif cfg.wire == "stat2" or cfg.wire_topk is not None:
            jax.block_until_ready(encode_tree(zeros, cfg.wire, cfg.wire_topk))
        log.info("compiled in %.1f s", time.perf_counter() - t0)

    def phase(self, name: str) -> None:
        """``RUN_DIR/learner{j}/phase.json`` (:mod:`dipsjax.runtime.progress`), written
        when the phase changes: what the launcher's console shows while learners compile."""
        if getattr(self, "_phase", None) == name:
            return
        self._phase = name
        with contextlib.suppress(OSError):  # the console's, never worth a learner's life
            progress.write_phase(
                self.spec.run_dir, self.j, name, incarnation=self.incarnation, rounds=self.rounds
            )

    def _log_round(self, contrib: Any, seconds: float) -> None:
        """A trained round: its log line, and TensorBoard against the learner's own tokens
        (with the wall time): the training loss, tokens/s, the learning rate of its last
        inner step and the gradient norm (mean over its steps, before clipping)."""
        done, wall = self.learner.tokens_done, time.time()
        metrics: dict[str, float] = {}
        if math.isfinite(contrib.grad_norm):
            metrics["grad_norm"] = contrib.grad_norm
        lr = _learning_rate(self.learner, max(self.learner.steps_done - 1, 0))  # its last step
        if lr is not None:
            metrics["lr"] = lr
        scalars = {
            "learner/train_loss": contrib.train_loss,
            "learner/tokens_per_s": contrib.tokens / max(seconds, 1e-9),
            "learner/grad_norm": metrics.get("grad_norm"),
            "learner/lr": metrics.get("lr"),
        }
        for tag, value in scalars.items():
            if value is not None:
                self.tb.add_scalar(tag, value, done, walltime=wall)
        self.tb.flush()  # a learner killed later still leaves its rounds' scalars
        log.info(
            "trained %d steps from version %d: loss %.4f, grad norm %s, lr %s, %d tokens "
            "(%d in all) in %.2f s",
            contrib.steps,
            contrib.base_version,
            contrib.train_loss,
            _fmt(metrics.get("grad_norm")),
            _fmt(metrics.get("lr")),
            contrib.tokens,
            done,
            seconds,
        )

    def _count(self, tokens: int, started: float, compute: float) -> None:
        tr = self.trained
        tr["tokens"] += tokens
        tr["compute"] = tr.get("compute", 0.0) + compute
        tr["first"] = started if tr["first"] is None else tr["first"]
        tr["last"] = time.perf_counter()

    def _write_reported(self) -> None:
        if self.stale_books:  # a newer incarnation's books: left as they are
            return
        self.reported_path.parent.mkdir(parents=True, exist_ok=True)
        record = books.Books(
            self.reported, self.booked_pushes, self.in_doubt, self.asks, self.unresolved
        )
        books.write_books(self.reported_path, self.incarnation, record)  # whole, by rename
        self.write_stats()  # so a learner killed hard still leaves its count in its stats

    def write_stats(self) -> None:
        """``RUN_DIR/learner{j}/stats.json``: tokens trained and the seconds from the start of
        the first round to the end of the last (what ``benchmarks/system.py`` compares)."""
        tr = self.trained
        seconds = (tr["last"] - tr["first"]) if tr["first"] is not None else 0.0
        out = Path(self.spec.run_dir) / f"learner{self.j}"
        out.mkdir(parents=True, exist_ok=True)
        import resource

        use = resource.getrusage(resource.RUSAGE_SELF)
        stats = {
            "tokens": tr["tokens"],
            "seconds": seconds,
            "rounds": self.rounds,
            "reported": self.reported,
            "compute_seconds": tr.get("compute", 0.0),  # wall time of its rounds' steps
            "cpu_seconds": use.ru_utime + use.ru_stime,  # the process's, all threads
            # The step's planned peak (learner_memory) and the process's measured peak
            # resident memory (JAX and the data included).
            "planned_peak_bytes": self.planned_peak,
            "peak_rss_bytes": use.ru_maxrss * 1024,
            "unused": dict(self.unused),  # pushes the leader said were bad input, by kind
            **(
                {}
                if self.feedback is None
                else {  # error feedback (EXTENSION): the residual, pushes settled by outcome
                    "feedback": {
                        "residual_norm": self.feedback.residual_norm(),
                        "settled": dict(self.feedback.settled),
                        "unsettled": sorted(self.feedback.pending),
                    }
                }
            ),
            "partition_calls": self.compute.calls,  # computations, shared if spread
            "processes": self.compute.partition.num_processes,
        }
        write_json(out / "stats.json", stats)

    def solo(self, rounds: int) -> None:
        """The same learner with no outer communication: ``rounds`` rounds back to back on a
        fixed chunk order (the baseline of ``benchmarks/system.py``)."""
        self.warm_up()
        self._barrier("solo")
        cfg = self.spec.sim
        order = [(self.j * 97 + i) % self.spec.num_chunks for i in range(self.spec.num_chunks)]
        self.stream = BatchStream(self.source, source=order)
        speed = cfg.speeds[self.j] if cfg.speeds else 1.0
        for _ in range(rounds):
            data = self.stream.take_round(cfg.inner_steps)
            t0 = time.perf_counter()
            contrib, _ = self.compute.call("round", data.batches, len(data.batches), None)
            took = time.perf_counter() - t0
            time.sleep((speed - 1.0) * took)
            self._count(contrib.tokens, t0, took)
            self.proto.rounds += 1  # (no protocol: counted for the stats)
        self.write_stats()
        self.tb.close()

    def _barrier(self, name: str, timeout: float = 600.0) -> None:
        """Waits until every learner of the run has reached ``name`` (marker files in the run
        directory), so that solo learners train at the same time, contending for the cores
        as they do in a run, not some of them alone while others still compile."""
        marks = Path(self.spec.run_dir) / f"barrier-{name}"
        marks.mkdir(exist_ok=True)
        (marks / str(self.j)).touch()
        deadline = time.monotonic() + timeout
        while len(list(marks.iterdir())) < self.spec.sim.learners:
            if time.monotonic() > deadline:
                raise TimeoutError(f"learner {self.j}: not every learner reached {name!r}")
            time.sleep(0.01)

    def wait_to_join(self, seconds: float) -> None:
        """A late learner (``joins``): compiled, it joins ``seconds`` after training began
        (the first learner active), as the simulator's late learners do after its start."""
        self.phase("waiting to join")
        log.info("joins %g s after training began", seconds)
        while not self.terminating:
            with contextlib.suppress(Exception):  # the leader may be starting
                st = self.control.status(timeout=5.0)
                if st["stopped"] or (st["began"] is not None and st["t"] - st["began"] >= seconds):
                    return
            time.sleep(0.2)

    def run(self) -> None:
        # Heartbeats first: a resumed member must not look dead while it compiles.
        threading.Thread(target=self._heartbeats, daemon=True).start()
        self.write_stats()  # a learner stopped while it compiles still has its stats file
        self.warm_up()
        late = dict(self.spec.sim.joins).get(self.j)
        if late is not None and not self.resume and self.incarnation == 0:
            self.wait_to_join(float(late))
        self.start_watch()
        if self.spec.sim.overlap:
            threading.Thread(target=self._puller, daemon=True).start()
        try:
            self.execute(self.proto.start(self.now(), resume=self.resume))
            while self.proto.state is not State.EXITED:
                self.phase(self.proto.state.value)
                if self.terminating:
                    log.info("SIGTERM after %d rounds", self.rounds)
                    break
                try:
                    item = self.inputs.get(timeout=0.2)
                except queue.Empty:
                    continue
                self.execute(self._input(item))
        finally:
            self.phase("exited")
            self.stop.set()
            self.worker.shutdown(wait=True, cancel_futures=True)  # the round in training ends
            self.write_stats()
            self.tb.close()
            self.saver.shutdown(wait=True)
            try:
                self.saved_wait()
            except Exception as e:  # said, and the exit is not clean
                log.error("checkpoint write failed: %s", e)
                self.exit_code = self.exit_code or 1
            self.ckpt.close()  # writes in flight finish: the newest checkpoint is whole
            for c in self.data + self.pull_data:
                c.close()
            # Last: the partition's other processes, if spread, end too (this fails at once
            # if one of them is gone, which is why it comes after everything else).
            with contextlib.suppress(Exception):
                self.compute.stop()


def serve_partition(spec: RunSpec, j: int) -> int:
    """A process of learner ``j``'s partition other than its first: it computes what
    process 0 broadcasts (every inner step, on its share of the partition's devices) and
    never talks to the syncer; it ends when process 0 says stop, or with the partition's
    JAX world when process 0 dies."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    compute, _ = partition_compute(spec, j)
    p = compute.partition
    log.info("process %d of %d: serving", p.process_id, p.num_processes)
    served = compute.serve()
    log.info("process %d: stopped after %d calls", p.process_id, served)
    out = Path(spec.run_dir) / f"learner{j}" / f"process{p.process_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"calls": served}))
    return 0


def main(argv: list[str] | None = None) -> int:
    permissions.private()  # what this process writes is its owner's alone
    parser = argparse.ArgumentParser(prog="dipsjax-learner", description=__doc__)
    parser.add_argument("spec")
    parser.add_argument("index", type=int)
    parser.add_argument("--incarnation", type=int, default=0)
    parser.add_argument("--solo", type=int, default=0, help="train this many rounds alone")
    parser.add_argument("--resume", action="store_true", help="restart from its checkpoints")
    args = parser.parse_args(argv)
    pid = process_index()
    logs.setup(f"learner{args.index}" + (f".p{pid}" if pid > 0 else ""))
    spec = RunSpec.read(args.spec)
    if process_index() > 0:
        return serve_partition(spec, args.index)
    log.info("starting: incarnation %d%s", args.incarnation, ", resumed" if args.resume else "")
    with contextlib.suppress(OSError):  # the console's: up, building its model
        progress.write_phase(spec.run_dir, args.index, "starting", incarnation=args.incarnation)
    node = LearnerNode(spec, args.index, args.incarnation, args.resume)

    def on_term(*_: Any) -> None:
        node.terminating = True  # no locks here: the loop checks it at its safe points
        # A call blocked on a leader that is gone ends now, not at its deadline (30 s,
        # past the launcher's patience: it would be killed before writing its files).
        threading.Thread(target=node.control.close, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    if args.solo:
        node.solo(args.solo)
    else:
        node.run()
    return node.exit_code


if __name__ == "__main__":
    sys.exit(main())
