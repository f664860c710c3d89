"""``dipsjax run [CONFIG]``: a leader, followers and learners as processes on this machine.

Starts ``python -m dipsjax.runtime.{leader,follower,learner}`` with the run's
:class:`~dipsjax.runtime.spec.RunSpec` (free ports, a fresh job credential), one log file
per process under ``RUN_DIR/logs/`` (each line with its time, level and role:
:mod:`dipsjax.runtime.logs`), learners pinned round-robin to the cores. Shows the leader's
progress every few seconds, with each learner's phase (``learners: 2 compiling, 2
training``) and the newest validation loss, waits for the token budget, and ends with a
summary of the event tape (``RUN_DIR/tape.jsonl``). Ctrl-C (or SIGTERM) stops every process
it started, cleanly, within seconds.

With ``evaluate`` (the default), an evaluator (:mod:`dipsjax.runtime.evaluator`) runs
beside the roles at the lowest CPU priority: it validates each version the followers save
(every ``eval_every`` versions) as it appears, into ``RUN_DIR/eval.jsonl`` (the console,
``dipsjax status``) and ``RUN_DIR/tb/eval``; it ends with the job, and the end-of-run
evaluation of every saved version follows as before.

Self-healing: a process that dies is started again (:class:`Healer`: a learner as a new
incarnation, a follower from its newest checkpoint, the leader from its snapshot, on their
own ports, after a backoff; ``RunSpec.max_restarts`` per role), so a run survives a
``kill -9`` of any one of its processes; ``RUN_DIR/restarts.jsonl`` lists what happened.

Every role checkpoints as it goes (followers: shard and outer state after each outer step;
learners: inner state and data position each round; the leader: its metadata after each
event). ``dipsjax run --resume RUN_DIR`` restarts a stopped run's processes from their
newest checkpoints, on fresh ports, and continues to the budget.

Run: ``dipsjax run`` (the shipped ``quickstart`` config; ``--method``, ``--arg ci``); the
run folder is ``./runs/NAME-TIME`` in the current folder unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dipsjax.launch import config as run_config
from dipsjax.launch.core import Experiment, requirements_from_config, role_jobs
from dipsjax.launch.local import Local
from dipsjax.runtime import logs, permissions, progress
from dipsjax.runtime.credentials import create as create_credentials
from dipsjax.runtime.credentials import load as load_credentials
from dipsjax.runtime.spec import REFUSED_EXIT, RunSpec, write_json
from dipsjax.sim.config import SimConfig
from dipsjax.syncer.leader import Leader
from dipsjax.syncer.tape import EventTape, phase_seconds

PROGRESS_EVERY = 5.0  # seconds between the console's progress lines


def new_run_dir(runs: Path, name: str) -> Path:
    """``runs/NAME-YYYYmmdd-HHMMSS``, with ``-2``, ``-3``... when runs started within the
    same second (the folder must be new: it gets fresh credentials)."""
    base = runs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_spec(
    sim: SimConfig,
    run_dir: Path,
    heartbeat_interval: float = 1.0,
    credentials: str | Path | None = None,
    tls: bool = True,
    **settings: Any,
) -> RunSpec:
    """The run's spec: ports, credentials, the followers' layers and the corpus's chunks.

    ``credentials``: a directory made by ``dipsjax credentials``; by default a fresh set is
    made in ``RUN_DIR/credentials`` (readable by its owner only). ``settings``: other
    :class:`RunSpec` fields, e.g. the run config's data-plane limits
    (:func:`dipsjax.launch.config.spec_settings` gives them with ``heartbeat_interval``).
    """
    with permissions.restricted():  # the run's files its owner's alone (or its group's)
        return _make_spec(sim, run_dir, heartbeat_interval, credentials, tls, settings)


def _make_spec(
    sim: SimConfig,
    run_dir: Path,
    heartbeat_interval: float,
    credentials: Any,
    tls: bool,
    settings: dict[str, Any],
) -> RunSpec:
    import numpy as np

    from dipsjax import outer
    from dipsjax.runtime.client import model_fingerprint, model_layout
    from dipsjax.syncer.schedule import assign_layers
    from dipsjax.task import load_task, outer_optimizer_of

    if credentials is not None:
        # Names what is missing or readable by others now, before anything is written.
        load_credentials(credentials)
    # ``standby_leader`` (the run config's switch) becomes the standby's address.
    settings = dict(settings)
    if settings.pop("standby_leader", False):
        settings["standby"] = f"127.0.0.1:{free_port()}"
    # Checks the settings before anything is written (the run folder included).
    probe = RunSpec(
        sim, "", (), "", str(run_dir), (), 0, heartbeat_interval, **{**settings, "standby": ""}
    )
    task = load_task(sim)
    # What a role would die of after the start, caught now: both outer optimizers set, one
    # that builds no chain, a task without validation batches (the evaluator's).
    step = outer_optimizer_of(task, sim)
    if step is not None or sim.outer_optimizer:
        from dipsjax.syncer import methods

        methods.build(sim.method, sim.method_settings()).make_tx(step)
    if not task.validation:
        raise ValueError(
            f"task {task.name!r} has no validation batches (Task.eval_batches): the run's "
            "versions are evaluated on them"
        )
    permissions.make_dir(run_dir)
    if credentials is None:
        credentials = create_credentials(Path(run_dir) / "credentials").directory
    paths, params = model_layout(probe)
    flat = outer.flatten(params)
    fingerprint = model_fingerprint({p: (np.shape(flat[p]), flat[p].dtype) for p in paths})
    sizes = [4 * int(np.prod(np.shape(flat[p]))) for p in paths]
    n_followers = min(sim.followers, len(paths))
    data = task.source
    return RunSpec(
        sim=sim,
        leader=f"127.0.0.1:{free_port()}",
        followers=tuple(f"127.0.0.1:{free_port()}" for _ in range(n_followers)),
        credentials=str(Path(credentials).resolve()),
        run_dir=str(run_dir),
        layer_owner=assign_layers(sizes, n_followers),
        num_chunks=data.num_chunks,
        batches_per_chunk=data.batches_per_chunk,
        step_tokens=data.tokens_per_batch,
        heartbeat_interval=heartbeat_interval,
        tls=tls,
        fingerprint=fingerprint,
        **settings,
    )


class Healer:
    """The launcher's restart policy (self-healing, as Kubernetes restarts the paper's
    leader): a role that exits while the job has not stopped (whatever its exit code; one
    that crashes after the stop too) is started again after a backoff (``spec.restart_backoff``,
    doubled per restart of that role, at most 8 s), at most ``spec.max_restarts`` times:

    * a learner as a new incarnation (``--incarnation n``): the leader evicts the old one,
      its leases go back to the ledger, and it pulls one complete version before it pushes;
    * a follower from its newest checkpoint (``--resume latest``, once it has one) on its
      own port;
    * the leader from its snapshot (``--resume``, once it has one) on its own port; the
      others reconnect.

    Only the launcher's own shutdown (Ctrl-C, SIGTERM to ``dipsjax run``) ends every role.

    Each death and restart is a line of ``RUN_DIR/restarts.jsonl`` (role, exit code, when it
    was seen dead and when it was started again, seconds since the launch), and the
    learners' incarnations are kept in ``RUN_DIR/incarnations/`` for ``--resume``.

    A role that fails at start-up (an error exit within :attr:`STARTUP_S` seconds of its
    start) twice in a row with the same last log line (a config error it dies of, say) is
    not started again: the launcher gives up at once, the role's last log lines in its
    message, rather than bury the error under restarts. Out of restarts, the message has
    them too.
    """

    STARTUP_S = 60.0  # an error exit this soon after its start is a failure at start-up
    TAIL_LINES = 15  # of the role's log, in the message of a role given up on

    def __init__(self, experiment: Experiment, procs: Local, t0: float) -> None:
        self.experiment, self.procs, self.t0 = experiment, procs, t0
        spec = self.spec = experiment.spec
        self.run_dir = Path(spec.run_dir)
        self.count: dict[str, int] = {}
        self.due: dict[str, tuple[float, int, float]] = {}  # name -> (restart at, rc, seen)
        self.stopped = False
        self.started_at: dict[str, float] = {}
        self.early: dict[str, tuple[int, str] | None] = {}  # its last death at start-up

    def args(self, name: str, restart: bool = False) -> list[str]:
        """Arguments of a role's next start, by the rule a cluster's restarts use
        (:func:`dipsjax.launch.entry.start_args`: resume from what the run folder holds; a
        learner's ``restart`` is a new incarnation, counted in ``RUN_DIR/incarnations/``)."""
        from dipsjax.launch.entry import start_args

        role = name.rstrip("0123456789")
        index = int(name[len(role) :] or 0)
        move = role == "follower" and self.spec.move_followers
        standby = bool(self.spec.standby)
        return start_args(role, index, self.run_dir, restart=restart, move=move, standby=standby)

    def job_stopped(self) -> bool:
        """Whether the leader has stopped the job (its snapshot says so; once it does, it
        stays so for this launch)."""
        if not self.stopped:
            snap = self.run_dir / "leader" / "snapshot.json"
            with contextlib.suppress(OSError, ValueError):  # not written yet
                self.stopped = bool(json.loads(snap.read_text()).get("stopped"))
        return self.stopped

    def check(self) -> None:
        """Notices exits, starts due restarts; raises once a role is out of restarts. A
        role that exits while the job has not stopped is started again whatever its exit
        code (SIGTERM ends a role with 0); one that ends with 0 once it stopped is done."""
        now = time.monotonic()
        for name, p in self.procs.procs.items():
            rc = p.poll()
            if rc is None or name in self.due or (rc == 0 and self.job_stopped()):
                continue
            if name in self.spec.no_restart:  # fault injection: its host is gone
                continue
            if name == "standby" and rc == 0 and self.job_stopped():
                continue
            n = self.count.get(name, 0)
            if rc == REFUSED_EXIT:
                raise RuntimeError(
                    f"{name} was refused by the leader (exit code {rc}: another model "
                    f"fingerprint?); see {self.procs.logs / (name + '.log')}"
                )
            log_path = self.procs.logs / (name + ".log")
            failure = self.startup_failure(name, rc, now)
            if failure is not None and self.early.get(name) == failure:
                raise RuntimeError(
                    f"{name} failed at start-up twice in a row with the same error (exit "
                    f"code {rc}): {failure[1]}\nthe last lines of {log_path}:\n"
                    f"{self.tail(name)}"
                )
            self.early[name] = failure
            if n >= self.spec.max_restarts:
                raise RuntimeError(
                    f"{name} exited with code {rc} after {n} restarts (max_restarts="
                    f"{self.spec.max_restarts}); see {log_path}\nthe last lines of {log_path}:"
                    f"\n{self.tail(name)}"
                )
            delay = min(self.spec.restart_backoff * 2**n, 8.0)
            print(f"{name} exited with code {rc}: restarting it in {delay:.1f} s", flush=True)
            self.due[name] = (now + delay, rc, now)
        for name, (at, rc, seen) in list(self.due.items()):
            if now < at:
                continue
            del self.due[name]
            self.count[name] = self.count.get(name, 0) + 1
            self.start(name, *self.args(name, restart=True))
            record = {"role": name, "rc": rc, "seen": seen - self.t0, "restarted": now - self.t0}
            with (self.run_dir / "restarts.jsonl").open("a") as fh:
                fh.write(json.dumps(record) + "\n")

    def start(self, name: str, *args: str) -> None:
        self.started_at[name] = time.monotonic()
        self.procs.start(self.experiment.job(name), *args)
        self.procs.write_pids()

    def tail(self, name: str, lines: int | None = None) -> str:
        """The last lines of role ``name``'s log (``""`` if it has none)."""
        try:
            text = (self.procs.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-(lines or self.TAIL_LINES) :])

    def startup_failure(self, name: str, rc: int, now: float) -> tuple[int, str] | None:
        """``(exit code, last log line)`` of a death at start-up: an error exit (not a
        signal, not one of the protocol's exit codes: evicted, unreachable, refused)
        within :attr:`STARTUP_S` of its start; None for any other death."""
        from dipsjax.syncer import messages as m

        protocol = {int(c) for c in m.ExitCode}
        started = self.started_at.get(name)
        if rc <= 0 or rc in protocol or started is None or now - started > self.STARTUP_S:
            return None
        last = next((x for x in reversed(self.tail(name).splitlines()) if x.strip()), "")
        return rc, re.sub(logs.LINE, "", last).strip()  # without its time: the same error


def leaders_done(procs: Local) -> bool:
    """Whether the leader has ended (0), and with a standby, every leader process has
    ended, one of them with 0 (the one that stopped the job; a killed one never did)."""
    leaders = [p for n, p in procs.procs.items() if n in ("leader", "standby")]
    codes = [p.poll() for p in leaders]
    return None not in codes and 0 in codes


def shard_files(run_dir: Path, name: str) -> list[Path]:
    return sorted(run_dir.glob(f"follower*/{name}.npz"))


def load_params(files: list[Path]) -> tuple[int, dict[str, Any]]:
    """A model from its followers' shard files, checked to be of one version."""
    import numpy as np

    from dipsjax import outer

    flat, versions = {}, set()
    for path in files:
        with np.load(path) as z:
            versions.add(int(z["__version__"]))
            flat.update({tuple(k.split("/")): z[k] for k in z.files if k != "__version__"})
    if len(versions) != 1:
        raise ValueError(f"followers ended at different versions {sorted(versions)}")
    return versions.pop(), outer.unflatten(flat)


def final_params(run_dir: Path) -> tuple[int, dict[str, Any]]:
    """The model the followers ended with (their ``final.npz`` shards, merged)."""
    return load_params(shard_files(run_dir, "final"))


def summarize(run_dir: Path) -> dict[str, Any]:
    """The event tape's figures: rounds, tokens, per-phase seconds (the paper's table)."""
    tape_path = run_dir / "tape.jsonl"
    tape = EventTape.read(tape_path) if tape_path.exists() else EventTape()
    rounds = tape.round_records()

    phases = [phase_seconds(r.timings, r.grace) for r in rounds]

    def mean_phase(name: str) -> float:
        xs = [x for p in phases if (x := p[name]) is not None]
        return sum(xs) / len(xs) if xs else 0.0

    return {
        "rounds": len(rounds),
        "applied": sum(r.applied for r in rounds),
        "version": max((r.version for r in rounds), default=0),
        "accepted": sum(sum(r.accepted) for r in rounds),
        "rejected": sum(len(r.accepted) - sum(r.accepted) for r in rounds),
        "tokens": sum(p.tokens for r in rounds for p in r.participants),
        "participants_per_round": [len(r.participants) for r in rounds],
        "phase_seconds": {
            "grace": sum(r.grace for r in rounds) / max(len(rounds), 1),
            "push": mean_phase("push"),
            "update": mean_phase("update"),
            "pull": mean_phase("pull"),
        },
    }


def evaluate_run(spec: RunSpec) -> list[dict[str, float]]:
    """Validation figures of every saved version (the followers save one every
    ``eval_every`` versions and the last: :meth:`dipsjax.sim.world.Evaluation.point`,
    ``val_loss``, ``val_bpb`` and the task's own ``val_<name>``), with the leader's time and
    the tokens applied by then; TensorBoard ``tb/eval``: ``eval/<figure>`` against them."""
    from tensorboardX import SummaryWriter

    from dipsjax.sim.world import World

    run_dir = Path(spec.run_dir)
    world = World(spec.sim)
    tape_path = run_dir / "tape.jsonl"
    rounds = EventTape.read(tape_path).round_records() if tape_path.exists() else []
    ended, tokens, total = {0: 0.0}, {0: 0}, 0
    for r in rounds:
        if r.applied:
            total += sum(p.tokens for p, ok in zip(r.participants, r.accepted, strict=True) if ok)
            ended[r.version], tokens[r.version] = r.timings["ended"], total
    versions = {0: world.init_params}
    for name in sorted({p.stem for p in run_dir.glob("follower0/*.npz")}):
        v, params = load_params(shard_files(run_dir, name))
        versions[v] = params
    curve = []
    tb = SummaryWriter(str(run_dir / "tb" / "eval"))
    for v in sorted(versions):
        figures = world.evaluate(versions[v]).point()
        point = {"version": v, "t": ended.get(v, 0.0), "tokens": tokens.get(v, 0), **figures}
        curve.append(point)
        for key, value in figures.items():  # every figure the task has (no NaN bpb)
            if math.isfinite(value):
                tb.add_scalar(f"eval/{key}", value, point["tokens"])
    tb.close()
    return curve


def plot(curve: list[dict[str, float]], path: Path) -> Path:
    """Validation loss against the leader's time and against the tokens applied."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "t", "time (s)"), (axes[1], "tokens", "tokens applied")):
        ax.plot([p[key] for p in curve], [p["val_loss"] for p in curve], marker="o")
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(spec: RunSpec, summary: dict[str, Any]) -> None:
    """The end-of-run table: per learner, the rounds, the phases and the final loss."""
    from rich.console import Console
    from rich.table import Table

    run_dir = Path(spec.run_dir)
    status_path = run_dir / "leader" / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {"learners": {}}
    console = Console()
    title = (
        f"{spec.sim.method}: {summary['rounds']} rounds, version {summary['version']}, "
        f"{summary['wall_seconds']:.0f} s"
    )
    table = Table(title=title)
    for col in ("learner", "slowdown", "tokens pushed", "contributions accepted", "incarnation"):
        table.add_column(col, justify="right")
    speeds = spec.sim.speeds or (1.0,) * spec.sim.learners
    for j in range(spec.sim.learners):
        st = status["learners"].get(str(j), {})
        table.add_row(
            str(j),
            f"{speeds[j]:g}",
            str(st.get("tokens", "-")),
            str(st.get("accepted", "-")),
            str(st.get("incarnation", "-")),
        )
    console.print(table)
    ph = summary["phase_seconds"]
    console.print(
        f"per round (s): grace {ph['grace']:.2f}  push {ph['push']:.2f}  update "
        f"{ph['update']:.2f}  pull {ph['pull']:.2f};  contributions accepted "
        f"{summary['accepted']}, rejected {summary['rejected']}"
    )
    if summary.get("curve"):
        last = summary["curve"][-1]
        bpb = last["val_bpb"]  # NaN for a task without bits per byte (not a language model)
        extra = f" ({bpb:.3f} bits/byte)" if math.isfinite(bpb) else ""
        extra += "".join(f", {k} {v:.4f}" for k, v in progress.other_figures(last).items())
        console.print(f"validation loss {last['val_loss']:.4f}{extra} at version {last['version']}")
    console.print(
        f"outputs: {run_dir}/tape.jsonl, timeline.png, loss.png, tb/ (tensorboard --logdir "
        f"{run_dir}/tb), logs/"
    )


def resumable(run_dir: Path) -> RunSpec:
    """A stopped run's spec with fresh ports (the old ones may be taken by now)."""
    path = Path(run_dir) / "spec.json"
    if not path.exists():
        raise FileNotFoundError(f"--resume: {path} not found (not a run folder?)")
    spec = RunSpec.read(path)
    snap = Path(run_dir) / "leader" / "snapshot.json"
    if not snap.exists():
        raise FileNotFoundError(f"--resume: {run_dir} has no leader snapshot to resume from")
    state = json.loads(snap.read_text())
    if state.get("stopped") and Leader.restore(state).budget_reached():
        raise ValueError(f"--resume: {run_dir} already finished (it reached its token budget)")
    return dataclasses.replace(
        spec,
        leader=f"127.0.0.1:{free_port()}",
        followers=tuple(f"127.0.0.1:{free_port()}" for _ in spec.followers),
    )


def launch(
    spec: RunSpec,
    *,
    timeout: float | None = None,
    progress: bool = True,
    evaluate: bool = True,
    resume: bool = False,
    experiment: Experiment | None = None,
    external_learners: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Runs the job described by ``spec`` to its token budget with the local executor;
    returns the tape's summary. ``timeout``: seconds after which it stops every process and
    raises :class:`TimeoutError` (default: no limit). ``experiment``: its jobs (default:
    ``role_jobs(spec)``, one CPU device a learner). ``external_learners``: learner ids it
    neither starts nor restarts, left to processes of their own (a user's training loop
    through :class:`~dipsjax.runtime.contributor.Contributor`). With ``resume``, every
    process restarts from its newest checkpoint in ``spec.run_dir`` (followers from the
    leader's version), once the folder is as private as a new run's (one an older version
    wrote may be ``0644``/``0755``)."""
    if resume:
        group = permissions.group_access()
        if n := permissions.tighten(spec.run_dir, group):
            print(
                f"permissions: {n} entries of {spec.run_dir} tightened to "
                f"{'0750/0640' if group else '0700/0600'}",
                flush=True,
            )
    with permissions.restricted():  # every process it starts inherits the umask
        return _launch(spec, timeout, progress, evaluate, resume, experiment, external_learners)


def console_line(spec: RunSpec, elapsed: float, procs: Local | None = None) -> str:
    """The launcher's progress line: the leader's version, round and token books, each
    learner's phase (``learners: 2 compiling, 2 training``: from ``learner{j}/phase.json``,
    so that compiling learners show as such), the newest validation, and the leader's
    view of each learner."""
    run_dir = Path(spec.run_dir)
    try:
        st = json.loads((run_dir / "leader" / "status.json").read_text())
    except (OSError, ValueError):  # not written yet (the leader starting), or being replaced
        st = None
    parts = []
    if st is not None:
        parts.append(
            f"version {st['version']} round {st['rounds']} ({st['phase']}), tokens "
            f"{st['tokens']['reported']}/{st['budget']}, rejected {st['tokens']['rejected']}"
        )
    else:
        parts.append(f"version - (leader starting), budget {spec.sim.token_budget}")
    phases = progress.read_phases(run_dir, spec.sim.learners)
    parts.append(progress.phase_counts(phases, spec.sim.learners))
    validation = progress.validation_text(progress.read_validation(run_dir))
    evaluator = procs.helpers.get("evaluator") if procs is not None else None
    if evaluator is not None and evaluator.poll() not in (None, 0):
        validation = f"evaluator exited ({evaluator.returncode}: see logs/evaluator.log)"
    if validation:
        parts.append(validation)
    if st is not None and st.get("learners"):
        parts.append(
            "  ".join(f"L{j}: {v['state']} {v['tokens']} tok" for j, v in st["learners"].items())
        )
    return f"[{elapsed:6.1f}s] " + " | ".join(parts)


def _launch(
    spec: RunSpec,
    timeout: float | None,
    progress: bool,
    evaluate: bool,
    resume: bool,
    experiment: Experiment | None,
    external_learners: tuple[int, ...] = (),
) -> dict[str, Any]:
    outside = set(external_learners)
    if not outside <= set(range(spec.sim.learners)):
        raise ValueError(
            f"external_learners {sorted(outside)}: the job's learners are 0 .. "
            f"{spec.sim.learners - 1}"
        )
    run_dir = permissions.make_dir(spec.run_dir)
    spec.write(run_dir / "spec.json")
    jobs_path = run_dir / "jobs.json"
    if experiment is None:
        saved = json.loads(jobs_path.read_text()) if jobs_path.exists() else None
        experiment = Experiment.for_spec(spec, saved)
    jobs_path.write_text(json.dumps(experiment.requirements(), indent=1))
    procs = Local(spec, append=resume)
    again: list[str] = []
    follower_again: list[str] = []
    leader_again: list[str] = []
    if resume:
        snap = json.loads((run_dir / "leader" / "snapshot.json").read_text())
        again, follower_again = ["--resume"], ["--resume", str(snap["version"])]
        leader_again = ["--resume", "--reopen"]  # a run a fault stopped goes on

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    t0 = time.monotonic()
    healer = Healer(experiment, procs, t0)
    try:
        healer.start("leader", *leader_again)
        if spec.standby:
            healer.start("standby", *healer.args("standby"))
        for k in range(len(spec.followers)):
            healer.start(f"follower{k}", *follower_again)
        # Every learner starts now; one with a join time in the config (``joins``) compiles,
        # then waits to join until that many seconds after training began.

        def start_learners() -> None:
            for j in range(spec.sim.learners):
                if f"learner{j}" not in procs.procs and j not in outside:
                    # A learner without checkpoints (a run started from a snapshot) comes
                    # back as a new incarnation (``entry.incarnation``) and pulls.
                    has_ckpt = (run_dir / f"learner{j}" / "ckpt").exists()
                    resumed = again if has_ckpt else []
                    healer.start(f"learner{j}", *healer.args(f"learner{j}"), *resumed)

        start_learners()
        if evaluate:  # validation of the versions saved, as it trains (lowest CPU priority)
            procs.start_helper("evaluator", "dipsjax.runtime.evaluator")
        last = 0.0
        while True:
            time.sleep(0.1)
            if len(procs.procs) < 1 + len(spec.followers) + spec.sim.learners - len(outside):
                start_learners()
            healer.check()  # restarts any role that exited while the job runs
            if leaders_done(procs) and healer.job_stopped():
                break  # the leader ends (0) once the job stopped
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the run did not reach its budget in {timeout:.0f} s")
            if progress and time.monotonic() - last > PROGRESS_EVERY:
                last = time.monotonic()
                print(console_line(spec, time.monotonic() - t0, procs), flush=True)
        for p in procs.procs.values():  # everyone got Stop: let them finish
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                break
        helper = procs.helpers.get("evaluator")
        if helper is not None:  # it evaluates the job's last version, then ends by itself
            with contextlib.suppress(subprocess.TimeoutExpired):
                helper.wait(90)
    finally:
        procs.stop()
        signal.signal(signal.SIGTERM, previous)
    pids = {name: p.pid for name, p in procs.all().items()}
    return finish(spec, time.monotonic() - t0, evaluate, pids=pids)


def finish(spec: RunSpec, wall: float, evaluate: bool = True, **extra: Any) -> dict[str, Any]:
    """What every run ends with, however it was launched: the tape's summary with the
    leader's token books, the timeline, the validation curve (``evaluate``) and
    ``RUN_DIR/summary.json``."""
    run_dir = Path(spec.run_dir)
    summary = summarize(run_dir)
    if (run_dir / "tape.jsonl").exists():
        from dipsjax.runtime import timeline

        tape = EventTape.read(run_dir / "tape.jsonl")
        timeline.plot(tape, run_dir / "timeline.png", title=f"{spec.sim.method}: {run_dir.name}")
    status_path = run_dir / "leader" / "status.json"
    if status_path.exists():
        summary["leader_tokens"] = json.loads(status_path.read_text())["tokens"]
    summary["wall_seconds"] = wall
    summary.update(extra)
    if evaluate:
        summary["curve"] = evaluate_run(spec)
        plot(summary["curve"], run_dir / "loss.png")
    write_json(run_dir / "summary.json", summary, indent=1)
    return summary


def outcome(run_dir: Path) -> int:
    """The exit code of a run that ended: 0 once it reached its token budget; otherwise
    (a fault stopped it short, or it did not stop) 1, printing why and how to resume."""
    run_dir = Path(run_dir)
    snap = run_dir / "leader" / "snapshot.json"
    state = json.loads(snap.read_text()) if snap.exists() else None
    leader = Leader.restore(state) if state is not None else None
    if leader is not None and leader.stopped and leader.budget_reached():
        return 0
    if leader is None:
        why = "the leader left no snapshot"
    elif leader.stopped:
        why = leader.stop_reason or "the leader stopped"
    else:
        why = "the job did not stop"
    used = ""
    if leader is not None:
        used = f" ({leader.budget_tokens()} tokens used of {leader.config.token_budget})"
    print(f"the run stopped short of its budget: {why}{used}", flush=True)
    if leader is not None:
        print(f"it can be resumed: dipsjax run --resume {run_dir}", flush=True)
    return 1


def _run_to_the_end(spec: RunSpec, **kwargs: Any) -> int:
    """``dipsjax run``'s launch, new or resumed: its report and exit code (130 on Ctrl-C;
    non-zero with the reason when it stopped short of its budget)."""
    run_dir = Path(spec.run_dir)
    try:
        summary = launch(spec, **kwargs)
    except KeyboardInterrupt:
        print("stopped: every process was ended", flush=True)
        return 130
    except (RuntimeError, TimeoutError) as e:
        return _gave_up(run_dir, e)
    report(spec, summary)
    return outcome(run_dir)


def _gave_up(run_dir: Path, error: Exception) -> int:
    """The launcher gave up (a role out of restarts, a timeout): why, and how to resume."""
    print(f"the run stopped short of its budget: {error}", flush=True)
    if (Path(run_dir) / "leader" / "snapshot.json").exists():
        print(f"it can be resumed: dipsjax run --resume {run_dir}", flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dipsjax run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", default="quickstart")
    parser.add_argument("--arg", default=None, help="argument to get_config (e.g. 'ci')")
    parser.add_argument("--method", default=None, help="dips, decoupled, sync_diloco, naive_async")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set sim.learners=2 --set "
        "launch.learner.cpu_devices=2 (repeatable)",
    )
    parser.add_argument("--out", default=None, help="run folder (default ./runs/NAME-TIME)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="local: stop every process if the run has not reached its budget after this "
        "many seconds (exit 1; resumable with --resume); default no limit",
    )
    parser.add_argument(
        "--credentials",
        default=None,
        metavar="DIR",
        help="the run's credentials, made by `dipsjax credentials DIR` (default: a fresh set "
        "in RUN_DIR/credentials)",
    )
    parser.add_argument(
        "--group-access",
        action="store_true",
        help="the run folder readable by your group (0750/0640; default: yours alone, "
        "0700/0600; or DIPSJAX_GROUP_ACCESS=1); the credentials stay yours alone",
    )
    parser.add_argument(
        "--external-learner",
        action="append",
        type=int,
        default=[],
        metavar="J",
        help="local: leave learner J to a process of your own (your training loop through "
        "dipsjax.runtime.contributor.Contributor; see docs/own-loop.md); repeatable",
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue a stopped run",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "slurm", "kubernetes"),
        default="local",
        help="local: processes on this machine (default); slurm: submit a heterogeneous "
        "job (sbatch); kubernetes: write a JobSet manifest to RUN_DIR/jobset.yaml",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="slurm: wait for the job to end and print its summary",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the job's plan (memory and wire bytes per role, layer assignment, push "
        "plan, placement) and start nothing",
    )
    args = parser.parse_args(argv)
    if args.group_access:  # the role processes inherit it
        os.environ[permissions.GROUP_ACCESS_ENV] = "1"
    if args.resume and args.executor != "local":
        parser.error(f"--resume: the {args.executor} executor resumes through its own restarts")
    if args.resume:
        try:
            spec = resumable(Path(args.resume))
        except (FileNotFoundError, ValueError, KeyError) as e:
            parser.error(str(e))
        print(f"resuming {args.resume}: {spec.sim.method}", flush=True)
        return _run_to_the_end(
            spec,
            resume=True,
            timeout=args.timeout,
            external_learners=tuple(args.external_learner),
        )
    # The whole config is validated before anything is written or started: a bad value
    # is one line on stderr naming the field, and exit code 2.
    try:
        cfg = run_config.load(args.config, args.arg, args.set)
        sim = run_config.sim_config(cfg, args.method, plan_only=args.dry_run)
        requirements = requirements_from_config(cfg)
    except (FileNotFoundError, ValueError) as e:
        print(f"{parser.prog}: error: {args.config}: {e}", file=sys.stderr, flush=True)
        return 2
    if args.dry_run:
        from dipsjax.runtime.dryrun import format_plan, plan

        placement = cfg.get("placement")
        try:
            print(format_plan(plan(sim, None if placement is None else placement.to_dict())))
        except (KeyError, ValueError) as e:
            parser.error(f"{args.config}: {e}")
        return 0
    run_dir = Path(args.out) if args.out else new_run_dir(Path.cwd() / "runs", cfg.name)
    if args.executor != "local":
        from dipsjax.launch.cli import cluster

        try:
            return cluster(args, cfg, sim, requirements, run_dir)
        except (FileNotFoundError, ValueError, RuntimeError, TimeoutError) as e:
            parser.error(f"{args.config}: {e}")
    try:
        spec = make_spec(
            sim, run_dir, credentials=args.credentials, **run_config.spec_settings(cfg)
        )
    except (FileNotFoundError, ValueError, PermissionError) as e:
        parser.error(str(e))
    print(
        f"run {run_dir}: {sim.method}, {sim.learners} learners, {len(spec.followers)} "
        f"followers, budget {sim.token_budget} tokens",
        flush=True,
    )
    try:
        experiment = Experiment(cfg.name, spec).add(role_jobs(spec, **requirements))
    except ValueError as e:
        parser.error(f"{args.config}: {e}")
    return _run_to_the_end(
        spec,
        experiment=experiment,
        timeout=args.timeout,
        external_learners=tuple(args.external_learner),
    )


if __name__ == "__main__":
    sys.exit(main())
