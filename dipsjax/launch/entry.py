"""The one command a cluster starts for every role: ``python -m dipsjax.launch.entry ROLE
SPEC [INDEX]``.

``INDEX`` (a follower's or learner's) is taken from the command line, else from the
environment: ``DIPSJAX_INDEX``, or ``JOBSET_JOB_INDEX`` (a JobSet's job index, which the
Kubernetes manifest passes through the downward API). The start arguments come from what
the run folder holds, so a restart by the cluster's own machinery (a Kubernetes restart
policy, a SLURM requeue) resumes as the local launcher's self-healing does:

* the leader with ``--resume`` once it has a snapshot;
* a follower with ``--resume latest`` once it has a checkpoint;
* a learner as a new incarnation for each start after its first (its starts are counted
  in ``RUN_DIR/starts/learner{j}``): the leader ends the old one, and the new one pulls a
  whole version before it pushes. Incarnations are kept in ``RUN_DIR/incarnations/``
  (:func:`incarnation`), the one store every launcher reads and bumps: the local
  launcher's self-healing, a cluster's restarts and a run made from a snapshot.

:func:`start_args` is the one rule for a role's start arguments; the local launcher's
``Healer`` uses it too.

Then it replaces itself (``exec``) with ``python -m dipsjax.runtime.ROLE``, so signals
reach the role's process directly.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from dipsjax.launch.core import MODULES, ROLES

# What a role's first log line says of where it runs.
CLUSTER_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "HOSTNAME", "JOBSET_JOB_INDEX")


def count_start(run_dir: Path, name: str) -> int:
    """How many times ``name`` was started before (and counts this start)."""
    path = run_dir / "starts" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    before = int(path.read_text()) if path.exists() else 0
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(before + 1))
    tmp.replace(path)
    return before


def incarnation(run_dir: Path, learner: int, *, new: bool = False) -> int:
    """The incarnation learner ``learner`` starts as: the one recorded for it (its own file
    ``RUN_DIR/incarnations/learner{j}``, else what ``RUN_DIR/incarnations.json`` gives it, as
    a run made from a snapshot has, else 0), or with ``new`` one more, recorded (a restart).
    One file a learner: learners a cluster starts at the same moment never rewrite each
    other's counts."""
    path = run_dir / "incarnations" / f"learner{learner}"
    if path.exists():
        n = int(path.read_text())
    else:
        given = run_dir / "incarnations.json"
        n = int(json.loads(given.read_text()).get(f"learner{learner}", 0)) if given.exists() else 0
    if new:
        n += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(n))
        tmp.replace(path)
    return n


def start_args(
    role: str,
    index: int,
    run_dir: Path,
    *,
    restart: bool | None = None,
    move: bool = False,
    standby: bool = False,
) -> list[str]:
    """A role's arguments after ``SPEC [INDEX]``, from what ``run_dir`` holds: the leader
    resumes from its snapshot and a follower from its newest checkpoint once they have one
    (``move``: a follower on a new port; a ``restart`` of the leader alone: ``--alone``,
    its peers are up); a learner starts as its recorded incarnation, or as a new one when
    this is a ``restart``. ``restart=None``: a cluster's start, counted in
    ``RUN_DIR/starts/``, every one after the first a restart. With a ``standby`` leader in
    the run, the ``standby`` role always stands by (``--standby``), and so does the leader
    once the run has had one (a leader's restart: the standby may have taken over)."""
    if role == "standby":  # follows the lease; resumes from the snapshot when it takes over
        return ["--standby", "--listen-on", "standby"]
    if role == "leader":
        from dipsjax.runtime.lease import newest_epoch

        if standby and newest_epoch(run_dir) >= 1:
            return ["--standby"]  # the standby may have taken over: this one stands by now
        if not (run_dir / "leader" / "snapshot.json").exists():
            return []
        return ["--resume", "--alone"] if restart else ["--resume"]
    if role == "follower":
        ckpt = run_dir / f"follower{index}" / "ckpt"
        resume = ["--resume", "latest"] if ckpt.is_dir() and any(ckpt.iterdir()) else []
        return [*resume, *(["--port", "0"] if move else [])]
    if restart is None:
        restart = count_start(run_dir, f"learner{index}") > 0
    return ["--incarnation", str(incarnation(run_dir, index, new=restart))]


def command(role: str, spec_path: str, index: int | None, count: bool = True) -> list[str]:
    from dipsjax.runtime.spec import RunSpec

    if role not in (*ROLES, "standby"):
        raise ValueError(f"role must be one of {(*ROLES, 'standby')}, got {role!r}")
    if index is None and role not in ("leader", "standby"):
        for var in ("DIPSJAX_INDEX", "JOBSET_JOB_INDEX"):
            if os.environ.get(var, "").isdigit():
                index = int(os.environ[var])
                break
        else:
            raise ValueError(f"{role}: no index (give INDEX, or set DIPSJAX_INDEX)")
    spec = RunSpec.read(spec_path)
    if role == "standby" and not spec.standby:
        raise ValueError(f"standby: {spec_path} names no standby leader (standby_leader: true)")
    limit = len(spec.followers) if role == "follower" else spec.sim.learners
    if role not in ("leader", "standby") and not 0 <= index < limit:
        raise ValueError(f"{role} index {index} is out of range [0, {limit})")
    args = [] if role in ("leader", "standby") else [str(index)]
    from dipsjax.runtime.partition import process_index

    if role == "learner" and process_index() > 0:
        extra = []  # a spread partition's other process: it serves the first, no incarnation
    else:
        extra = start_args(
            role,
            index or 0,
            Path(spec.run_dir),
            restart=None if count else False,
            standby=bool(spec.standby),
        )
    module = MODULES["leader" if role == "standby" else role]
    return [sys.executable, "-m", module, spec_path, *args, *extra]


def main(argv: list[str] | None = None) -> int:
    from dipsjax.runtime import permissions

    permissions.private()  # files 0600, folders 0700 (0640/0750 with group access)
    parser = argparse.ArgumentParser(prog="python -m dipsjax.launch.entry", description=__doc__)
    parser.add_argument("role", choices=(*ROLES, "standby"))
    parser.add_argument("spec", help="the run's spec.json")
    parser.add_argument("index", nargs="?", type=int, default=None)
    parser.add_argument("--print", action="store_true", help="print the command, run nothing")
    args = parser.parse_args(argv)
    try:
        cmd = command(args.role, args.spec, args.index, count=not args.print)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    if args.print:
        print(" ".join(cmd))
        return 0
    where = [f"host {socket.gethostname()}", f"pid {os.getpid()}"]
    where += [f"{k} {os.environ[k]}" for k in CLUSTER_VARS if k in os.environ]
    print(f"{args.role}: {' '.join(cmd[2:])} ({', '.join(where)})", flush=True)
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
