"""The SLURM executor: one heterogeneous job (``sbatch``), a job step per role.

Component 0 of the heterogeneous job holds the syncer (the leader and the followers, one
task each); component ``1 + j`` is learner partition ``j`` (``Requirements.processes``
tasks of ``Requirements.cpus`` CPUs; a partition of several processes joins them with
``jax.distributed``, which finds its coordinator in SLURM's environment). The batch
script, on the job's first node:

1. ``python -m dipsjax.launch.slurm prepare SPEC``: points the spec's addresses at the
   syncer's node (``SLURM_JOB_NODELIST_HET_GROUP_0``'s first host), with TLS credentials
   made there for that name (they never leave the cluster's file system);
2. starts every role as a job step of its component, ``srun --het-group=K ... python -m
   dipsjax.launch.entry ROLE SPEC INDEX``, each in a loop that starts it again (at most
   ``max_restarts`` times, after a backoff) if it fails: the entry resumes it from the run
   folder, as the local launcher's self-healing does;
3. waits for the leader (it ends once the token budget is reached and every role got
   Stop), then for the others, and exits with the leader's code.

GPUs: a learner component asks for its GPUs with ``--gpus-per-task=N`` (``N =
len(Requirements.accelerators)``: each of the partition's ``processes`` tasks gets N GPUs),
on its ``#SBATCH`` lines and again on its ``srun`` step (stated there as ``--cpus-per-task``
is, which ``srun`` no longer inherits from ``sbatch``), so the scheduler assigns them and
sets each task's
``CUDA_VISIBLE_DEVICES``; the step's environment names no device id
(``Requirements.env(scheduler_assigns=True)``), and the ids in ``accelerators`` are not
used. TPUs are not SLURM resources (Cloud TPU VMs are not scheduled through GRES): a job
with ``platform='tpu'`` is refused, as are GPUs for the leader or followers (they share
component 0, whose tasks would all be given them).

Each step logs to ``RUN_DIR/logs/NAME.log``. ``RUN_DIR`` must be on a file system every
node sees. ``Slurm.cancel`` (``scancel``) ends every step. SLURM's backfill scheduler (the
one that starts heterogeneous jobs) reserves whole nodes for each component, so the job
needs a node per component (``scripts/slurm_cluster.sh start --nodes N`` emulates N nodes
on one machine for the tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dipsjax.launch.core import Experiment, Job
from dipsjax.runtime import permissions

# States of a job that has not ended (it may still run, or run again).
LIVE = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
    }
)


@dataclasses.dataclass(frozen=True)
class Slurm:
    """Settings of the batch job: ``partition``, ``time`` limit, ``account``, the
    ``python`` the nodes run (this one by default: a shared install), restarts per role,
    extra ``#SBATCH`` lines, and the environment (``SLURM_CONF``...) of the commands."""

    partition: str | None = None
    time: str = "01:00:00"
    account: str | None = None
    python: str = sys.executable
    max_restarts: int = 3
    restart_backoff: float = 1.0
    sbatch: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def _component(
        self, tasks: int, cpus: int, memory_gb: float | None, gpus: int = 0
    ) -> list[str]:
        lines = [f"#SBATCH --ntasks={tasks}", f"#SBATCH --cpus-per-task={cpus}"]
        if gpus:
            lines.append(f"#SBATCH --gpus-per-task={gpus}")
        if memory_gb is not None:
            lines.append(f"#SBATCH --mem-per-cpu={max(1, int(memory_gb * 1024 / cpus))}M")
        if self.partition:
            lines.append(f"#SBATCH --partition={self.partition}")
        return lines

    @staticmethod
    def gpus(job: Job) -> int:
        """The GPUs each task of ``job`` asks SLURM for (``--gpus-per-task``); refuses what
        SLURM cannot be asked for, naming the field."""
        r = job.requirements
        if r.platform == "tpu":
            raise ValueError(
                f"{job.name}: Requirements.platform 'tpu' is not supported by the SLURM "
                "executor (TPUs are not SLURM GRES): launch TPU learners with the Kubernetes "
                "executor (google.com/tpu) or the local one on a TPU host"
            )
        if r.platform == "gpu" and job.role != "learner":
            raise ValueError(
                f"{job.name}: Requirements.accelerators for the {job.role} are not supported "
                "by the SLURM executor (the leader and followers share component 0, whose "
                "tasks would all get them); give GPUs to learners only"
            )
        return len(r.accelerators) if r.platform == "gpu" and r.accelerators else 0

    def _step(self, job: Job, group: int, spec: str, logs: Path) -> str:
        r = job.requirements
        env = {**r.env(scheduler_assigns=True), **job.env}
        gpus = self.gpus(job)
        if r.processes > 1:  # JAX reads the rest from SLURM; a port per component, as
            # every component shares SLURM_JOB_ID (JAX's default port is made from it)
            env["DIPSJAX_NUM_PROCESSES"] = str(r.processes)
            env["JAX_COORDINATOR_PORT"] = f"$((61440 + (SLURM_JOB_ID * 64 + {group}) % 4096))"
        words = " ".join(
            f"{k}={v if k == 'JAX_COORDINATOR_PORT' else shlex.quote(v)}"
            for k, v in sorted(env.items())
        )
        index = "" if job.role == "leader" else f" {job.index}"
        role = "standby" if job.name == "standby" else job.role
        log = shlex.quote(str(logs / f"{job.name}.log"))
        srun = (
            f"srun --het-group={group} --ntasks={r.processes} --cpus-per-task={r.cpus} "
            + (f"--gpus-per-task={gpus} " if gpus else "")
            + f"--overlap --job-name={job.name} --output={log} "
            f"--open-mode=append --kill-on-bad-exit=1"
        )
        entry = f"{shlex.quote(self.python)} -m dipsjax.launch.entry {role} {spec}{index}"
        return f"role {job.name} {srun} env {words} {entry} &"

    def script(self, experiment: Experiment) -> str:
        """The batch script of ``experiment`` (a heterogeneous job)."""
        spec = experiment.spec
        run_dir = Path(spec.run_dir)
        spec_path = shlex.quote(str(run_dir / "spec.json"))
        logs, cache = run_dir / "logs", shlex.quote(str(run_dir / "jax-cache"))
        syncer = [experiment.job("leader"), *experiment.by_role("follower")]
        # A standby leader: a component of its own (another node where SLURM has one).
        standby = [j for n, j in experiment.jobs.items() if n == "standby"]
        learners = experiment.by_role("learner")
        head = [
            "#!/bin/bash",
            f"#SBATCH --job-name={shlex.quote(experiment.title)}",
            f"#SBATCH --time={self.time}",
            f"#SBATCH --output={shlex.quote(str(run_dir / 'logs' / 'batch.log'))}",
            *(f"#SBATCH --account={self.account}" for _ in [0] if self.account),
            *(f"#SBATCH {line}" for line in self.sbatch),
            *self._component(
                len(syncer),
                max(j.requirements.cpus for j in syncer),
                max((j.requirements.memory_gb or 0 for j in syncer), default=0) or None,
            ),
            "#SBATCH --overcommit",  # the leader is control only: it may share a CPU
        ]
        for job in standby:
            r = job.requirements
            head += ["#SBATCH hetjob", *self._component(1, r.cpus, r.memory_gb)]
        for job in learners:
            r = job.requirements
            gpus = self.gpus(job)
            head += ["#SBATCH hetjob", *self._component(r.processes, r.cpus, r.memory_gb, gpus)]
        body = [
            "set -uo pipefail",
            # The run's files 0600 and folders 0700 (group access: 0640/0750), the job
            # steps' logs included (srun passes its umask on).
            f"umask {permissions.umask():03o}",
            *([f"export {permissions.GROUP_ACCESS_ENV}=1"] if permissions.group_access() else []),
            "export PYTHONUNBUFFERED=1",
            f"export JAX_COMPILATION_CACHE_DIR=${{JAX_COMPILATION_CACHE_DIR:-{cache}}}",
            f"mkdir -p {shlex.quote(str(logs))}",
            f"{shlex.quote(self.python)} -m dipsjax.launch.slurm prepare {spec_path} || exit 1",
            "# role NAME CMD...: runs a job step, starting it again when it fails",
            "role() {",
            "  local name=$1; shift",
            "  local n=0",
            '  until "$@"; do',
            "    n=$((n + 1))",
            f"    if [ $n -gt {self.max_restarts} ]; then",
            '      echo "$name failed $n times: giving up" >&2; return 1',
            "    fi",
            f'    echo "$name failed: starting it again ($n of {self.max_restarts})" >&2',
            f"    sleep {self.restart_backoff}",
            "  done",
            "}",
        ]
        body.append(self._step(syncer[0], 0, spec_path, logs))
        body.append("leader=$!")
        body += [self._step(job, 0, spec_path, logs) for job in syncer[1:]]
        body += [self._step(job, 1, spec_path, logs) for job in standby]
        first = 1 + len(standby)  # the learners' components
        body += [self._step(job, first + i, spec_path, logs) for i, job in enumerate(learners)]
        body += [
            'wait "$leader"; rc=$?',
            'if [ "$rc" != 0 ]; then  # the leader gave up: end every other step with it',
            '  echo "leader exited with $rc: cancelling the job" >&2',
            '  scancel "$SLURM_JOB_ID"',
            "fi",
            "wait  # the others end once the leader has stopped them",
            'echo "leader exited with $rc"',
            "exit $rc",
        ]
        return "\n".join(head + body) + "\n"

    def _run(self, *cmd: str) -> str:
        import os

        out = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, **dict(self.env)}, check=False
        )
        if out.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def launch(self, experiment: Experiment) -> str:
        """Writes ``RUN_DIR/job.sbatch`` and the spec, submits it; returns the job id."""
        run_dir = Path(experiment.spec.run_dir)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        experiment.spec.write(run_dir / "spec.json")
        path = run_dir / "job.sbatch"
        path.write_text(self.script(experiment))
        job_id = self._run("sbatch", "--parsable", str(path)).strip().split(";")[0]
        (run_dir / "slurm_job").write_text(job_id)
        return job_id

    def state(self, job_id: str) -> str | None:
        """The job's state (``PENDING``, ``RUNNING``, ``COMPLETED``...; the first
        component's), or None once SLURM forgot it."""
        try:
            out = self._run("scontrol", "show", "job", job_id)
        except RuntimeError:
            return None
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return None

    def wait(self, job_id: str, timeout: float | None = None, every: float = 1.0) -> str:
        """Waits until the job ended (``timeout`` seconds at most: None waits as long as
        the job may run); returns its last state (``COMPLETED``, ``FAILED``, ...)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = "PENDING"
        while deadline is None or time.monotonic() < deadline:
            state = self.state(job_id)
            if state is None:  # SLURM forgot it (MinJobAge): it ended as last seen ending
                return last if last not in LIVE else "UNKNOWN"
            if state not in LIVE:
                return state
            last = state
            time.sleep(every)
        raise TimeoutError(f"SLURM job {job_id} did not end in {timeout:.0f} s (state {last})")

    def cancel(self, job_id: str) -> None:
        self._run("scancel", job_id)


def prepare(spec_path: str | Path, host: str | None = None, standby_host: str | None = None) -> Any:
    """Points the spec at the syncer's node (and a standby leader's at its component's
    node) and makes its credentials there, naming both (run by the batch script before any
    role starts); returns the new spec."""
    import os
    import socket

    from dipsjax.runtime.credentials import create
    from dipsjax.runtime.spec import RunSpec, address

    spec = RunSpec.read(spec_path)

    def first_node(group: int) -> str:
        nodes = os.environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}") or os.environ.get(
            "SLURM_JOB_NODELIST", ""
        )
        if not nodes:
            return socket.gethostname()
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
        )
        return out.stdout.split()[0]

    if host is None:
        host = first_node(0)
    # The standby's node: its component's (group 1, see ``Slurm.script``).
    if not spec.standby:
        standby_host = host
    elif standby_host is None:
        standby_host = first_node(1)
    run_dir = Path(spec.run_dir)
    creds = run_dir / "credentials"
    if creds.exists():  # a requeued job: every role starts again, with new credentials
        import shutil

        shutil.rmtree(creds)
    create(creds, hosts=list(dict.fromkeys([host, standby_host, "localhost", "127.0.0.1"])))
    spec = dataclasses.replace(
        spec,
        leader=f"{host}:{address(spec.leader)[1]}",
        standby=f"{standby_host}:{address(spec.standby)[1]}" if spec.standby else "",
        followers=tuple(f"{host}:{address(a)[1]}" for a in spec.followers),
        credentials=str(creds.resolve()),
        bind="0.0.0.0",
    )
    spec.write(spec_path)
    return spec


def main(argv: list[str] | None = None) -> int:
    permissions.private()  # files 0600, folders 0700 (0640/0750 with group access)
    parser = argparse.ArgumentParser(prog="python -m dipsjax.launch.slurm")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="point SPEC at this job's syncer node (batch script)")
    p.add_argument("spec")
    p.add_argument("--host", default=None)
    args = parser.parse_args(argv)
    spec = prepare(args.spec, args.host)
    print(f"prepared {args.spec}: leader {spec.leader}, followers {list(spec.followers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
