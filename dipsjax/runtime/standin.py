"""Learner stand-ins: the learner's protocol with real tensors and no training.

For load tests and benchmarks (``benchmarks/load.py``, ``tests/runtime/test_load.py``): one
process runs many stand-ins as threads, so that dozens of learners fit on a small host.
Each stand-in joins (with the job's model fingerprint), pulls the version it is sent, and
then, round after round: asks to push, streams BF16 tensors of the model's shapes (small
random values: real bytes through the real data plane, TLS and checksums included) to the
followers its plan names, reports the transfer done, waits for its pull notice and pulls
that version, until the leader stops the job. A process also sends every stand-in's
heartbeats.

Every control-plane call is timed (its round trip, the leader's work included) and tagged
with whether a data-plane transfer of this process was in flight then. Each process writes
``RUN_DIR/standins/P.json``: per stand-in, the tokens it reported and the pushes, pulls and
refusals it saw, and the latencies. The tokens are counted here, independently of the
leader's books, so that a test can balance the two.

Run by the launcher of a load test as ``python -m dipsjax.runtime.standin SPEC FIRST LAST``
(stand-ins ``FIRST..LAST``, inclusive).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import ml_dtypes
import numpy as np

from dipsjax.runtime import permissions
from dipsjax.runtime.client import ControlClient, booked, in_parallel
from dipsjax.runtime.spec import RunSpec, address
from dipsjax.syncer import messages as m
from dipsjax.syncer.learner import LearnerProtocol, State, session_base
from dipsjax.transport.dataplane import DataPlaneClient


class Recorder:
    """Control-plane round trips of one process: ``(kind, seconds, busy)`` each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: list[tuple[str, float, bool]] = []
        self.transfers = 0  # data-plane transfers in flight in this process

    def busy(self) -> bool:
        return self.transfers > 0

    def add(self, kind: str, seconds: float, busy: bool) -> None:
        with self.lock:
            self.samples.append((kind, seconds, busy))

    @contextlib.contextmanager
    def transfer(self):
        with self.lock:
            self.transfers += 1
        try:
            yield
        finally:
            with self.lock:
                self.transfers -= 1


class StandIn:
    """Learner ``j``'s protocol, with tensors of the model's ``shapes`` and no training."""

    def __init__(
        self,
        spec: RunSpec,
        j: int,
        shapes: list[tuple[int, ...]],
        rec: Recorder,
        poisoned: bool = False,
    ) -> None:
        self.spec, self.j, self.shapes, self.rec = spec, j, shapes, rec
        self.poisoned = poisoned  # fault injection: its first push is all NaN
        self.control = ControlClient(spec, learner=j)
        tls = spec.ssl_client()
        self.clients = [
            DataPlaneClient(address(a), timeout=300, connect_timeout=600, ssl_context=tls)
            for a in spec.followers
        ]
        self.actions: queue.Queue = queue.Queue()
        self.job_stop: m.Stop | None = None  # the leader's Stop, as the watch stream got it
        self.proto = LearnerProtocol(j, fingerprint=spec.fingerprint, session_base=session_base())
        rng = np.random.default_rng(1000 + j)
        largest = max(int(np.prod(s)) for s in shapes)
        self.block = (rng.standard_normal(largest, np.float32) * 1e-3).astype(ml_dtypes.bfloat16)
        self.version = 0
        self.stats: dict[str, Any] = {
            "reported": 0,
            "pushes": 0,
            "pulls": 0,
            "refused": 0,
            "bytes_pulled": 0,
            "unused": {},  # the leader's word on pushes it did not use, by kind
        }
        self.span = [float("inf"), 0.0]  # wall time of its first push and its last transfer

    def call(self, event: m.Event) -> list[m.Action]:
        busy = self.rec.busy()
        t0 = time.perf_counter()
        replies = self.control.call(event, timeout=60)
        self.rec.add(type(event).__name__, time.perf_counter() - t0, busy)
        return replies

    def _watch(self) -> None:
        try:
            for a in self.control.watch():
                if isinstance(a, m.Stop):
                    self.job_stop = a
                self.actions.put(a)
        except Exception as e:  # the stream broke: the main loop raises it
            self.actions.put(e)

    def pull(self, version: int) -> None:
        def one(k: int) -> None:
            def sink(tensor: int, x: Any) -> None:
                self.stats["bytes_pulled"] += x.nbytes

            v, _ = self.clients[k].pull(version, codec="bf16", sink=sink)
            if v != version:
                raise RuntimeError(f"stand-in {self.j}: pulled version {v}, wanted {version}")

        with self.rec.transfer():
            in_parallel(one, range(len(self.clients)))
        self.span[1] = time.time()
        self.version = version
        self.stats["pulls"] += 1

    def push(self, plan: m.PushShards) -> None:
        def one(k: int) -> None:
            layers = [tr.layer for tr in plan.transfers if tr.follower == k]
            block = self.block
            if self.poisoned and self.stats["pushes"] == 0:
                block = np.full_like(block, np.nan)
            tensors = (
                (i, block[: int(np.prod(self.shapes[i]))].reshape(self.shapes[i])) for i in layers
            )
            inc = self.proto.incarnation
            ticket = bytes.fromhex(plan.ticket)
            self.clients[k].push(
                plan.round_id, self.j, inc, self.version, tensors, codec="bf16", ticket=ticket
            )

        self.span[0] = min(self.span[0], time.time())
        with self.rec.transfer():
            in_parallel(one, sorted({tr.follower for tr in plan.transfers}))
        self.span[1] = time.time()
        self.stats["pushes"] += 1

    def _one(self, c: m.Command, train_seconds: float) -> list[m.Command]:
        """Carries out one of the protocol's commands: real control calls and transfers,
        a sleep for training."""
        p = self.proto
        if isinstance(c, m.Send):
            try:
                replies = self.call(c.event)
            except grpc.RpcError as e:
                return self._call_failed(e)
            if isinstance(c.event, m.PushRequested) and booked(replies, self.control.refused):
                # Counted here, apart: the leader has it (refused ones too), as a learner
                # counts it (a call that failed never reached the books).
                self.stats["reported"] += c.event.meta.tokens
            out: list[m.Command] = []
            for reply in replies:
                out += p.on_action(reply, time.monotonic())
            return out
        if isinstance(c, m.Train):
            # The leader's count (adaptive steps, EXTENSION), else the job's H; a round's
            # time and reported time scale with it (1 s an H when none is slept).
            sim = self.spec.sim
            steps = c.steps or sim.inner_steps
            share = steps / sim.inner_steps
            time.sleep(train_seconds * share + c.wait)
            tokens = steps * self.spec.batch_tokens
            meta = m.PushMeta(
                tokens, steps, self.version, train_seconds=(train_seconds or 1.0) * share
            )
            return p.on_trained(meta, time.monotonic())
        if isinstance(c, m.Push):
            self.push(c.plan)
            return p.on_pushed(c.plan.round_id, time.monotonic())
        if isinstance(c, m.Pull):
            self.pull(c.version)
            return p.on_pulled(c.version, time.monotonic())
        if isinstance(c, m.Exit):
            if c.code == m.ExitCode.REFUSED:
                raise RuntimeError(f"stand-in {self.j}: {c.reason}")
            return []
        raise TypeError(f"stand-in {self.j}: cannot carry out {c}")

    def _call_failed(self, e: grpc.RpcError) -> list[m.Command]:
        """A call the leader did not answer: it stopped the job and went (its Stop comes on
        the watch stream, maybe a moment after), or it died, which in a load test is an
        error (stand-ins keep no checkpoints to rejoin with)."""
        deadline = time.monotonic() + 10.0
        while self.job_stop is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.job_stop is None:
            raise e
        return self.proto.on_action(self.job_stop, time.monotonic())

    def run(self, train_seconds: float) -> None:
        """The learner's protocol (:class:`~dipsjax.syncer.learner.LearnerProtocol`) with
        fake training, until the leader stops the job."""
        threading.Thread(target=self._watch, daemon=True).start()
        p = self.proto
        todo = collections.deque(p.start(time.monotonic()))
        try:
            while True:
                while todo:
                    c = todo.popleft()
                    todo.extendleft(reversed(self._one(c, train_seconds)))
                if p.state is State.EXITED:
                    break
                a = self.actions.get(timeout=600)
                if isinstance(a, Exception):
                    raise a
                todo.extend(p.on_action(a, time.monotonic()))
        finally:
            self.stats["refused"] = sum(p.refused.values())
            self.stats["unused"] = dict(p.unused)
            for c in self.clients:
                c.close()


def run(
    spec_path: str,
    first: int,
    last: int,
    train_seconds: float = 0.0,
    poison: tuple[int, ...] = (),
) -> dict:
    """Runs stand-ins ``first..last`` until the leader stops the job; returns their record
    (also written to ``RUN_DIR/standins/FIRST.json``). Stand-ins in ``poison`` send NaN in
    their first push (fault injection: bad input the leader must reject and report)."""
    spec = RunSpec.read(spec_path)
    layout = json.loads((Path(spec.run_dir) / "shapes.json").read_text())
    shapes = [tuple(s) for s in layout]
    rec = Recorder()
    standins = [StandIn(spec, j, shapes, rec, j in poison) for j in range(first, last + 1)]
    stop = threading.Event()
    errors: list[str] = []

    def beats() -> None:
        while not stop.wait(spec.heartbeat_interval):
            for s in standins:
                with contextlib.suppress(Exception):
                    s.call(m.Heartbeat(0.0, s.j))

    def one(s: StandIn) -> None:
        try:
            s.run(train_seconds)
        except Exception as e:
            errors.append(f"stand-in {s.j}: {type(e).__name__}: {e}")

    threading.Thread(target=beats, daemon=True).start()
    threads = [threading.Thread(target=one, args=(s,)) for s in standins]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    record = {
        "standins": {str(s.j): {**s.stats, "span": s.span} for s in standins},
        "samples": rec.samples,
        "errors": errors,
    }
    out = Path(spec.run_dir) / "standins" / f"{first}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record))
    return record


def write_shapes(spec: RunSpec) -> None:
    """``RUN_DIR/shapes.json``: the model's tensor shapes in flattened order (the
    stand-ins read it, so they need not build the model)."""
    from dipsjax.runtime.client import model_shapes

    shapes = [list(s) for s, _ in model_shapes(spec).values()]
    (Path(spec.run_dir) / "shapes.json").write_text(json.dumps(shapes))


def _probe(spec: RunSpec, phase: list[str], samples: list, stop: threading.Event) -> None:
    """Ticks (they change nothing the leader does not check every second anyway: its
    deadlines and heartbeats) every 20 ms, each round trip timed with the phase it fell
    in (a learner id outside the job would be refused and counted). It runs
    in the launcher's own, otherwise idle, process: the leader's side of the latency,
    without a busy client's waits."""
    client = ControlClient(spec, learner=spec.sim.learners)
    while not stop.wait(0.02):
        t0 = time.perf_counter()
        try:
            client.call(m.Tick(0.0), timeout=10)
        except Exception:  # a lost call counts as the longest
            samples.append((phase[0], time.time(), float("inf")))
            continue
        samples.append((phase[0], time.time(), time.perf_counter() - t0))
    client.close()


def launch_load(
    spec: RunSpec,
    groups: int = 4,
    train_seconds: float = 0.0,
    timeout: float = 900.0,
    idle_seconds: float = 3.0,
    leader_core: bool = False,
    poison: tuple[int, ...] = (),
    nice: int = 0,
) -> dict[str, Any]:
    """Runs a real leader and followers with ``spec.sim.learners`` stand-ins in ``groups``
    processes until the leader stops the job (its token budget); returns the stand-ins'
    records merged (``standins``, ``samples``, ``errors``), the leader's final ``status``,
    the ``wall`` seconds, and ``probe``: ``(phase, time, seconds)`` control-plane round trips
    of a probe in this process, ``idle`` for ``idle_seconds`` once every follower is up
    and before any stand-in starts, ``load`` while the stand-ins run. ``leader_core``:
    the leader and the probe get the first core to themselves and every other process
    shares the rest, as a leader on its own host would (the paper's leader is a separate,
    control-only process). ``poison``: stand-ins whose first push is all NaN."""
    from dipsjax.launch.core import module_job
    from dipsjax.launch.local import Local

    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec.write(run_dir / "spec.json")
    write_shapes(spec)
    procs = Local(spec, pin=False)
    n = spec.sim.learners
    bounds = [(g * n // groups, (g + 1) * n // groups - 1) for g in range(groups)]
    t0 = time.monotonic()
    cores = sorted(os.sched_getaffinity(0))
    split = leader_core and len(cores) > 1

    def start(name: str, module: str, *args: str, first: bool = False) -> None:
        procs.start(module_job(name, module, *args))
        if nice and not first:  # the whole new session: every thread, now and later
            os.setpriority(os.PRIO_PGRP, procs.procs[name].pid, nice)
        if split:
            os.sched_setaffinity(procs.procs[name].pid, set(cores[:1] if first else cores[1:]))

    try:
        start("leader", "dipsjax.runtime.leader", first=True)
        for k in range(len(spec.followers)):
            start(f"follower{k}", "dipsjax.runtime.follower", str(k))
        status = ControlClient(spec, learner=n)
        while len(status.status()["followers_up"]) < len(spec.followers):
            if procs.failed() or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the followers did not come up; see {procs.logs}")
            time.sleep(0.2)
        status.close()
        if split:
            os.sched_setaffinity(0, set(cores[:1]))  # the probe shares the leader's core
        phase, samples, stop = ["idle"], [], threading.Event()
        probe = threading.Thread(target=_probe, args=(spec, phase, samples, stop), daemon=True)
        probe.start()
        time.sleep(idle_seconds)
        phase[0] = "load"
        for a, b in bounds:
            extra = ["--train-seconds", str(train_seconds)]
            extra += [f"--poison={j}" for j in poison if a <= j <= b]
            start(f"standins{a}", "dipsjax.runtime.standin", str(a), str(b), *extra)
        while any(p.poll() is None for p in procs.procs.values()):
            failed = procs.failed()
            if failed:
                raise RuntimeError(f"{failed} failed; see {procs.logs}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the load test did not end in {timeout:.0f} s (deadlock?)")
            time.sleep(0.2)
        if procs.failed():
            raise RuntimeError(f"{procs.failed()} failed; see {procs.logs}")
    finally:
        if "stop" in locals():
            stop.set()
            probe.join(15)
        procs.stop()
        os.sched_setaffinity(0, set(cores))
    wall = time.monotonic() - t0
    merged: dict[str, Any] = {"standins": {}, "samples": [], "errors": []}
    for a, _ in bounds:
        rec = json.loads((run_dir / "standins" / f"{a}.json").read_text())
        merged["standins"].update(rec["standins"])
        merged["samples"] += rec["samples"]
        merged["errors"] += rec["errors"]
    merged["status"] = json.loads((run_dir / "leader" / "status.json").read_text())
    merged["wall"] = wall
    merged["probe"] = samples
    return merged


def main(argv: list[str] | None = None) -> int:
    permissions.private()  # what this process writes is its owner's alone
    parser = argparse.ArgumentParser(prog="dipsjax-standin", description=__doc__)
    parser.add_argument("spec")
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("--train-seconds", type=float, default=0.0)
    parser.add_argument(
        "--poison", type=int, action="append", default=[], help="its first push is all NaN"
    )
    args = parser.parse_args(argv)
    record = run(args.spec, args.first, args.last, args.train_seconds, tuple(args.poison))
    for e in record["errors"]:
        print(e, flush=True)
    return 1 if record["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
