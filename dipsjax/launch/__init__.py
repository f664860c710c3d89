"""Launching dipsjax jobs: a small API in XManager's vocabulary (experiment, job group, job,
executable, executor, requirements) and its executors: :class:`Local` (one process per
job on this machine, the default), :class:`Slurm` (a heterogeneous SLURM job) and
:class:`Kubernetes` (a JobSet manifest). See :mod:`dipsjax.launch.core`."""

from dipsjax.launch.core import (
    Executable,
    Experiment,
    Job,
    JobGroup,
    Requirements,
    role_job,
    role_jobs,
)
from dipsjax.launch.kubernetes import Kubernetes
from dipsjax.launch.local import Local
from dipsjax.launch.slurm import Slurm

__all__ = [
    "Executable",
    "Experiment",
    "Job",
    "JobGroup",
    "Kubernetes",
    "Local",
    "Requirements",
    "Slurm",
    "role_job",
    "role_jobs",
]
