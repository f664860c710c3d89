"""``dipsjax run --executor slurm|kubernetes`` (and ``launch/dips.py``): a run of a config
on a cluster. The executors' settings come from the config's ``launch.slurm`` and
``launch.kubernetes`` blocks (the fields of :class:`~dipsjax.launch.slurm.Slurm` and
:class:`~dipsjax.launch.kubernetes.Kubernetes`), overridable with ``--set``."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

from dipsjax.launch.config import spec_settings
from dipsjax.launch.core import Experiment, role_jobs


def executor_settings(cfg: Any, name: str, cls: type) -> dict[str, Any]:
    """The config's ``launch.NAME`` block as ``cls``'s fields (errors name the field)."""
    launch = cfg.get("launch") or {}
    block = launch.get(name) if hasattr(launch, "get") else None
    block = dict(block or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in block.items():
        if key not in fields:
            raise ValueError(f"config launch.{name}.{key}: unknown; known {sorted(fields)}")
        if isinstance(value, list):
            block[key] = tuple(tuple(x) if isinstance(x, list) else x for x in value)
    return block


def k8s_name(name: str) -> str:
    """A config's name as a JobSet name (an RFC 1035 label: its pods' DNS names)."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    out = out if out[:1].isalpha() else f"dipsjax-{out}"
    return out[:40].rstrip("-")


def cluster(args: Any, cfg: Any, sim: Any, requirements: dict, run_dir: Path) -> int:
    """Prepares (and, for SLURM, submits) the run on ``args.executor``."""
    if args.credentials:
        raise ValueError(
            f"--credentials: the {args.executor} executor makes the job's credentials where "
            "it runs (SLURM: on the syncer's node; Kubernetes: for the pods' DNS names)"
        )
    from dipsjax.runtime import permissions

    permissions.make_dir(run_dir)  # 0700 (0750 with group access)
    if args.executor == "kubernetes":
        from dipsjax.launch import kubernetes as k8s

        executor = k8s.Kubernetes(**executor_settings(cfg, "kubernetes", k8s.Kubernetes))
        name = k8s_name(cfg.name)
        settings = spec_settings(cfg)
        experiment = k8s.prepare(sim, name, run_dir, executor, settings, **requirements)
        path = executor.write(experiment, run_dir / "credentials", run_dir / "jobset.yaml")
        jobs = experiment.jobs
        print(
            f"wrote {path}: JobSet {name} ({len(jobs)} jobs: leader, "
            f"{len(experiment.by_role('follower'))} followers, "
            f"{len(experiment.by_role('learner'))} learners; image {executor.image}), "
            "validated against the JobSet and Kubernetes schemas.\n"
            f"Start it with: kubectl apply -f {path}   (it holds the job's credentials)"
        )
        return 0
    from dipsjax.launch.run import finish, make_spec, report
    from dipsjax.launch.slurm import Slurm
    from dipsjax.runtime.spec import RunSpec

    executor = Slurm(**executor_settings(cfg, "slurm", Slurm))
    spec = make_spec(sim, run_dir, credentials=args.credentials, **spec_settings(cfg))
    experiment = Experiment(cfg.name, spec).add(role_jobs(spec, **requirements))
    job_id = executor.launch(experiment)
    print(
        f"submitted SLURM job {job_id}: {run_dir}/job.sbatch ({len(experiment.jobs)} job "
        f"steps); logs in {run_dir}/logs; watch it with: dipsjax status {run_dir}",
        flush=True,
    )
    if not args.wait:
        return 0
    t0 = time.monotonic()
    try:
        state = executor.wait(job_id)
    except KeyboardInterrupt:
        executor.cancel(job_id)
        print(f"stopped: SLURM job {job_id} cancelled", flush=True)
        return 130
    print(f"SLURM job {job_id} ended: {state}", flush=True)
    if state != "COMPLETED":
        print(f"the job did not complete: see {run_dir}/logs/batch.log and the roles' logs")
        return 1
    spec = RunSpec.read(run_dir / "spec.json")  # as the job prepared it
    report(spec, finish(spec, time.monotonic() - t0, slurm_job=job_id, slurm_state=state))
    return 0
