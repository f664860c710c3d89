"""The local executor: one process per job on this machine (``dipsjax run``'s default).

Each job runs as ``python -m MODULE RUN_DIR/spec.json ARGS`` in a session of its own, with
its requirements' environment (``JAX_PLATFORMS``, ``JAX_NUM_CPU_DEVICES``; for
accelerators this host's device ids: ``CUDA_VISIBLE_DEVICES``, or the TPU chips and bounds
that split a TPU host, :func:`dipsjax.launch.core.tpu_split_env`), a log file
``RUN_DIR/logs/NAME.log``,
and learners pinned to cores in turn (``Requirements.cpus`` cores each). Everything it
started is stopped on exit: :meth:`Local.stop` (SIGTERM, then SIGKILL after a timeout)
from the launcher's ``finally``, and, should the launcher itself be killed, the kernel's
parent-death signal (``PR_SET_PDEATHSIG``: SIGTERM, asked for by
:mod:`dipsjax.launch._child`, which every job is started through) ends every child with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dipsjax.launch.core import Experiment, Job


class Local:
    """The processes of one run on this machine; stops them all, whatever happens.

    ``pin``: pin learners to cores (``Requirements.cpus`` each, in turn over the cores this
    process may use); two JAX processes on 2 cores run fastest one per core.
    """

    def __init__(self, spec: Any, append: bool = False, pin: bool = True) -> None:
        self.spec, self.pin = spec, pin
        self.mode = "a" if append else "w"
        self.logs = Path(spec.run_dir) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.jobs: dict[str, Job] = {}
        self.groups: dict[str, list[subprocess.Popen]] = {}  # a spread job's other processes
        self.started: set[str] = set()
        self.helpers: dict[str, subprocess.Popen] = {}  # beside the roles (the evaluator)

    def cores_for(self, job: Job, process: int = 0) -> set[int] | None:
        """The cores a learner process is pinned to: ``cpus`` cores each, in turn (the
        processes of a spread partition side by side); other roles are not pinned."""
        if not self.pin or job.role != "learner":
            return None
        cores = sorted(os.sched_getaffinity(0))
        n = min(job.requirements.cpus, len(cores))
        start = (job.index * job.requirements.processes + process) * n
        return {cores[(start + i) % len(cores)] for i in range(n)}

    def environment(self, job: Job) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **job.requirements.env(), **job.env)
        # A persistent compilation cache shared by the run's processes (unless one is set):
        # a restarted learner loads its compiled steps rather than compiling them again.
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(self.spec.run_dir) / "jax-cache"))
        return env

    def start(self, job: Job, *extra: str) -> subprocess.Popen:
        """Starts (or starts again) ``job`` with ``extra`` arguments after its own; returns
        its (first) process. A job of several processes (a partition spread over
        ``Requirements.processes``) starts them all, in a JAX world of their own on a fresh
        coordinator port; its other processes are ``self.groups[NAME]``, and starting the
        job again first ends any of them still running (they serve the old first one)."""
        spec_path = str(Path(self.spec.run_dir) / "spec.json")
        cmd = job.executable.command(*extra)
        # python -m dipsjax.launch._child PARENT MODULE SPEC ARGS...
        cmd[2:3] = ["dipsjax.launch._child", str(os.getpid()), cmd[2], spec_path]
        env = self.environment(job)
        n = job.requirements.processes
        if n > 1 and job.requirements.accelerators is not None:
            raise ValueError(
                f"{job.name}: a partition of {n} processes with accelerators "
                f"{job.requirements.accelerators}: on one machine its processes would share "
                "them; the local executor spreads only CPU partitions (cpu_devices)"
            )
        if n > 1:
            self._end(self.groups.pop(job.name, []))
            from dipsjax.launch.run import free_port

            env.update(DIPSJAX_NUM_PROCESSES=str(n), DIPSJAX_COORDINATOR=f"127.0.0.1:{free_port()}")
        procs = []
        for i in range(n):
            name = job.name if i == 0 else f"{job.name}.p{i}"
            log = (self.logs / f"{name}.log").open("a" if name in self.started else self.mode)
            self.started.add(name)
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, "DIPSJAX_PROCESS_ID": str(i)} if n > 1 else env,
                start_new_session=True,  # our Ctrl-C handling stops them, in order
            )
            log.close()
            pin = self.cores_for(job, i)
            if pin:
                os.sched_setaffinity(proc.pid, pin)
            procs.append(proc)
        self.procs[job.name], self.jobs[job.name] = procs[0], job
        if n > 1:
            self.groups[job.name] = procs[1:]
        return procs[0]

    def start_helper(self, name: str, module: str, *args: str) -> subprocess.Popen:
        """A process beside the job's roles (the evaluator): ``python -m MODULE SPEC ARGS``
        started as a role is (through :mod:`dipsjax.launch._child`, a session of its own,
        its log ``RUN_DIR/logs/NAME.log``), on the CPU, not pinned, never restarted;
        :meth:`stop` ends it first. Not one of :attr:`procs` (the job's roles)."""
        spec_path = str(Path(self.spec.run_dir) / "spec.json")
        cmd = [sys.executable, "-m", "dipsjax.launch._child", str(os.getpid()), module]
        env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(self.spec.run_dir) / "jax-cache"))
        with (self.logs / f"{name}.log").open("a" if name in self.started else self.mode) as log:
            self.started.add(name)
            proc = subprocess.Popen(
                [*cmd, spec_path, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.helpers[name] = proc
        return proc

    def launch(self, experiment: Experiment, *extra: str) -> None:
        """Starts every job of ``experiment`` (leader first, then followers, learners)."""
        for role in ("leader", "follower", "learner"):
            for job in experiment.by_role(role):
                self.start(job, *extra)
        self.write_pids()

    def failed(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() not in (None, 0)]

    def all(self) -> dict[str, subprocess.Popen]:
        """Every process, by name (a spread job's others as ``NAME.pI``)."""
        out = dict(self.procs)
        for name, group in self.groups.items():
            out.update({f"{name}.p{i + 1}": p for i, p in enumerate(group)})
        return out

    def write_pids(self) -> None:
        pids = {name: p.pid for name, p in self.all().items()}
        path = Path(self.spec.run_dir) / "pids.json"
        path.with_suffix(".tmp").write_text(json.dumps(pids))
        path.with_suffix(".tmp").replace(path)  # whole, for whoever reads it meanwhile

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to every process still running, SIGKILL to those not gone in
        ``timeout`` seconds; returns once all have exited. A spread job's other processes
        are left to its first one (which tells them to stop once it has finished) until
        it has exited, then ended the same way."""
        self._end(list(self.helpers.values()), timeout)
        self._end(list(self.procs.values()), timeout)
        self._end([p for group in self.groups.values() for p in group], timeout)

    @staticmethod
    def _end(procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
