"""A small launch API in XManager's vocabulary: experiment, job group, job, executable,
executor, requirements.

A dipsjax job is a set of roles, each a :class:`Job`: the leader (control only, no JAX),
one follower per shard, one learner per partition. :func:`role_jobs` builds them from a
:class:`~dipsjax.runtime.spec.RunSpec`; an executor starts them:

* :class:`dipsjax.launch.local.Local` (the default): one process per job on this machine
  (``dipsjax run`` is built on it);
* :class:`dipsjax.launch.slurm.Slurm`: one heterogeneous SLURM job, a job step per role;
* :class:`dipsjax.launch.kubernetes.Kubernetes`: a JobSet manifest, one replicated job per
  role.

Every job is told where its run is the same way, whatever starts it: its first argument is
``RUN_DIR/spec.json``, which names the leader's and followers' addresses and the
credentials directory (never the secrets themselves). ``python -m dipsjax.launch.entry
ROLE`` is the one command a cluster starts for every role: it reads its index and process
number from the cluster's environment (SLURM or Kubernetes), and picks its start arguments
(``--resume``, a new incarnation) from what the run folder holds, so a restart by the
cluster's own machinery (a Kubernetes restart policy, a SLURM requeue) resumes as the local
launcher's self-healing does.

Example (what ``launch/dips.py`` does)::

    from dipsjax import launch
    from dipsjax.launch.run import launch as run_locally, make_spec

    spec = make_spec(sim, run_dir)                        # addresses, credentials, shards
    exp = launch.Experiment("quickstart", spec)
    exp.add(launch.role_jobs(spec, learner=launch.Requirements(cpu_devices=2)))
    run_locally(spec, experiment=exp)                     # Local processes, self-healing
    # or: launch.Slurm(time="02:00:00").launch(exp) -> a SLURM job id
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROLES = ("leader", "follower", "learner")


@dataclasses.dataclass(frozen=True)
class Requirements:
    """What one job needs (``xm.JobRequirements``).

    Attributes:
      cpus: cores for each of its processes (local: the learners are pinned to cores in
        turn; SLURM: ``--cpus-per-task``; Kubernetes: ``resources.requests.cpu``).
      memory_gb: memory each process may use (SLURM ``--mem``, Kubernetes limits); None:
        not stated.
      cpu_devices: JAX CPU devices in each process (``JAX_NUM_CPU_DEVICES``): the learner's
        partition mesh spans them (``DIPSJAX_PARTITION_DEVICES``); None: one device, the
        process's environment unchanged (the simulator's arithmetic, bit for bit).
      accelerators: device ids each of its processes may use on its host; None: JAX runs
        on the CPU (``JAX_PLATFORMS=cpu``). Where the executor places the process itself
        (local) they are host ids (``CUDA_VISIBLE_DEVICES`` on GPUs; on TPUs the chips and
        the bounds that split a host, :func:`tpu_split_env`); where a scheduler assigns the
        devices (SLURM, Kubernetes) only their number counts: it is requested per process
        (``--gpus-per-task``, ``nvidia.com/gpu`` / ``google.com/tpu``) and the scheduler
        sets the visible devices (see :meth:`env`).
      platform: ``cpu``, ``gpu`` or ``tpu`` (with ``accelerators``).
      processes: processes of one partition (multi-host: ``jax.distributed`` inside the
        partition only; never one world across learners); each gets ``cpu_devices`` (1 if
        not given) CPU devices or its ``accelerators``.
      mesh_data, mesh_tensor: the partition mesh's plain data-parallel and tensor-parallel
        axes; its ``fsdp`` axis takes the rest of the partition's devices
        (:func:`dipsjax.learner.mesh.mesh_shape`; the default: every device on ``fsdp``).
        The learner reads the shape from ``DIPSJAX_PARTITION_MESH``.
    """

    cpus: int = 1
    memory_gb: float | None = None
    cpu_devices: int | None = None
    accelerators: tuple[int, ...] | None = None
    platform: str = "cpu"
    processes: int = 1
    mesh_data: int = 1
    mesh_tensor: int = 1

    def __post_init__(self) -> None:
        checks = [
            (self.cpus >= 1, "cpus", "an integer >= 1"),
            (self.memory_gb is None or self.memory_gb > 0, "memory_gb", "None or > 0"),
            (self.cpu_devices is None or self.cpu_devices >= 1, "cpu_devices", "None or >= 1"),
            (self.platform in ("cpu", "gpu", "tpu"), "platform", "'cpu', 'gpu' or 'tpu'"),
            (
                (self.platform == "cpu") == (self.accelerators is None),
                "accelerators",
                "device ids exactly when platform is 'gpu' or 'tpu'",
            ),
            (self.processes >= 1, "processes", "an integer >= 1"),
            (self.mesh_data >= 1, "mesh_data", "an integer >= 1"),
            (self.mesh_tensor >= 1, "mesh_tensor", "an integer >= 1"),
        ]
        for ok, name, allowed in checks:
            if not ok:
                got = getattr(self, name)
                raise ValueError(f"Requirements.{name} must be {allowed}, got {got!r}")
        if (self.mesh_data, self.mesh_tensor) != (1, 1):
            self.mesh_shape  # noqa: B018  (raises, naming the axes, if they do not fit)

    @property
    def partition_devices(self) -> int:
        """The devices of the partition's mesh: ``cpu_devices`` (1 if not given) or
        ``len(accelerators)``, times ``processes``."""
        per = len(self.accelerators) if self.accelerators is not None else self.cpu_devices or 1
        return per * self.processes

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        """The partition mesh's ``(data, fsdp, tensor)`` over :attr:`partition_devices`."""
        from dipsjax.learner.mesh import mesh_shape

        try:
            return mesh_shape(self.partition_devices, data=self.mesh_data, tensor=self.mesh_tensor)
        except ValueError as e:
            raise ValueError(f"Requirements.mesh_data / mesh_tensor: {e}") from None

    def env(self, scheduler_assigns: bool = False) -> dict[str, str]:
        """The environment that gives a process these devices.

        ``scheduler_assigns``: the executor's view of accelerators. False (the local
        executor): ``accelerators`` are this host's device ids, and the process is told
        them (``CUDA_VISIBLE_DEVICES``; on TPUs :func:`tpu_split_env`). True (SLURM,
        Kubernetes): the scheduler assigns the devices and sets what the process sees
        (SLURM's ``CUDA_VISIBLE_DEVICES``; in a pod the runtime exposes only its devices,
        numbered from 0), so no device id is set here: a host id such as
        ``CUDA_VISIBLE_DEVICES=4,5,6,7`` inside a pod of 4 GPUs would hide every one of
        them. Either way ``JAX_PLATFORMS`` and ``DIPSJAX_PARTITION_DEVICES`` are set, and
        ``DIPSJAX_PARTITION_MESH`` (``data,fsdp,tensor``) where the mesh is not all ``fsdp``.
        CPU partitions are the same in both views."""
        env = {}
        if (self.mesh_data, self.mesh_tensor) != (1, 1):
            env["DIPSJAX_PARTITION_MESH"] = ",".join(str(n) for n in self.mesh_shape)
        if self.platform == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
            if self.cpu_devices is not None or self.processes > 1:
                per = self.cpu_devices or 1  # a spread partition: 1 device a process at least
                env["JAX_NUM_CPU_DEVICES"] = str(per)
                env["DIPSJAX_PARTITION_DEVICES"] = str(self.partition_devices)
            return env
        env["JAX_PLATFORMS"] = "cuda" if self.platform == "gpu" else "tpu"
        env["DIPSJAX_PARTITION_DEVICES"] = str(self.partition_devices)
        if not scheduler_assigns:
            ids = tuple(self.accelerators or ())
            if self.platform == "gpu":
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
            else:
                env.update(tpu_split_env(ids))
        return env


# The shape (x, y, z) of a TPU process's chips, by their number, as JAX's own multi-process
# test harness splits one host (jax-ml/jax, jax/_src/test_multiprocess.py: 1 chip 1,1,1;
# 2 chips 1,2,1; 4 chips 2,2,1; 8 chips, a whole 2x4 v6e host, 2,4,1).
TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
TPU_BASE_PORT = 8476  # libtpu's default process port


def tpu_split_env(chips: tuple[int, ...]) -> dict[str, str]:
    """The environment that gives one process ``chips`` of a TPU host, as a TPU world of
    its own (a learner partition never shares a JAX world with another).

    ``TPU_VISIBLE_CHIPS`` alone does not split a host: libtpu also needs the shape of the
    process's chips and of its world, and a port of its own (two processes on the default
    port collide). What is set follows JAX's multi-process test harness
    (jax-ml/jax ``jax/_src/test_multiprocess.py``, which starts several TPU processes on one
    host) and the JAX team's recipe for non-communicating processes on one Cloud TPU VM
    (gist skye/f82ba45d2445bb19d53545538754f9a3, linked from jax-ml/jax#8809 and #14977,
    which names the same settings by their older names ``TPU_VISIBLE_DEVICES`` and
    ``TPU_MESH_CONTROLLER_ADDRESS`` / ``_PORT``; the harness's current names are used):

    * ``TPU_VISIBLE_CHIPS``: the chips, e.g. ``4,5,6,7``;
    * ``TPU_CHIPS_PER_PROCESS_BOUNDS``: their shape, :data:`TPU_CHIP_BOUNDS` (1, 2, 4 or 8
      chips);
    * ``TPU_PROCESS_BOUNDS=1,1,1`` and ``CLOUD_TPU_TASK_ID=0``: one process in its world;
    * ``TPU_PROCESS_PORT`` = 8476 + the first chip, and ``TPU_PROCESS_ADDRESSES`` =
      ``localhost:PORT``: a port per process, distinct for disjoint chips;
    * ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` (as the harness sets it): libtpu otherwise refuses
      to load in a second process of the host.

    The chips must be 1, 2, 4 or 8 consecutive ids starting at a multiple of their number
    (0-3 and 4-7, as the harness assigns them): other sets have no bounds there. Not run on
    a TPU here (no TPU was available)."""
    n = len(chips)
    aligned = n in TPU_CHIP_BOUNDS and chips == tuple(range(chips[0], chips[0] + n))
    if not aligned or chips[0] % n:
        raise ValueError(
            f"Requirements.accelerators must be 1, 2, 4 or 8 consecutive TPU chips starting at "
            f"a multiple of their number (e.g. (0, 1, 2, 3) or (4, 5, 6, 7)) to split a TPU "
            f"host, got {chips!r}"
        )
    port = TPU_BASE_PORT + chips[0]
    return {
        "TPU_VISIBLE_CHIPS": ",".join(str(c) for c in chips),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[n],
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": str(port),
        "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "CLOUD_TPU_TASK_ID": "0",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }


@dataclasses.dataclass(frozen=True)
class Executable:
    """A Python module run as ``python -m MODULE ARGS`` (``xm.Executable``)."""

    module: str
    args: tuple[str, ...] = ()

    def command(self, *extra: str, python: str = sys.executable) -> list[str]:
        return [python, "-m", self.module, *self.args, *extra]


@dataclasses.dataclass(frozen=True)
class Job:
    """One role of a run (``xm.Job``): a leader, a follower or a learner partition.

    Attributes:
      name: ``leader``, ``follower{k}`` or ``learner{j}``.
      role: ``leader``, ``follower`` or ``learner``.
      index: the follower's or learner's index (0 for the leader).
      executable: what it runs; the spec path is its first argument.
      requirements: what it needs.
      env: extra environment.
    """

    name: str
    role: str
    index: int
    executable: Executable
    requirements: Requirements = Requirements()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Job.role must be one of {ROLES}, got {self.role!r}")


@dataclasses.dataclass(frozen=True)
class JobGroup:
    """Jobs that run together (``xm.JobGroup``), by name."""

    jobs: tuple[Job, ...]

    def __post_init__(self) -> None:
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"JobGroup: job names must be unique, got {names}")

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


class Experiment:
    """A titled run and the jobs added to it (``xm.Experiment``).

    ``spec`` is the run's :class:`~dipsjax.runtime.spec.RunSpec` (where it writes, the
    addresses and the credentials every job is given)."""

    def __init__(self, title: str, spec: Any) -> None:
        self.title, self.spec = title, spec
        self._jobs: dict[str, Job] = {}

    def add(self, jobs: Job | JobGroup | Iterable[Job]) -> Experiment:
        for job in [jobs] if isinstance(jobs, Job) else jobs:
            if job.name in self._jobs:
                raise ValueError(f"Experiment {self.title!r} already has a job {job.name!r}")
            self._jobs[job.name] = job
        return self

    @property
    def jobs(self) -> dict[str, Job]:
        return dict(self._jobs)

    def job(self, name: str) -> Job:
        if name not in self._jobs:
            raise KeyError(f"Experiment {self.title!r} has no job {name!r}: {sorted(self._jobs)}")
        return self._jobs[name]

    def by_role(self, role: str) -> list[Job]:
        return sorted((j for j in self._jobs.values() if j.role == role), key=lambda j: j.index)

    def requirements(self) -> dict[str, dict[str, Any]]:
        """Each job's requirements, as JSON (``RUN_DIR/jobs.json``: ``--resume`` keeps them)."""
        return {n: dataclasses.asdict(j.requirements) for n, j in self._jobs.items()}

    @classmethod
    def for_spec(cls, spec: Any, saved: Mapping[str, Any] | None = None) -> Experiment:
        """Every role of ``spec``, with the requirements saved by :meth:`requirements`."""
        reqs = {}
        for name, r in (saved or {}).items():
            acc = r.get("accelerators")
            reqs[name] = Requirements(**{**r, "accelerators": None if acc is None else tuple(acc)})
        exp = cls(Path(spec.run_dir).name, spec)
        return exp.add(
            dataclasses.replace(j, requirements=reqs.get(j.name, j.requirements))
            for j in role_jobs(spec)
        )


MODULES = {
    "leader": "dipsjax.runtime.leader",
    "follower": "dipsjax.runtime.follower",
    "learner": "dipsjax.runtime.learner",
}


def role_job(role: str, index: int = 0, requirements: Requirements | None = None) -> Job:
    """One role's job: ``python -m dipsjax.runtime.ROLE SPEC [INDEX]``."""
    args = () if role == "leader" else (str(index),)
    name = "leader" if role == "leader" else f"{role}{index}"
    return Job(name, role, index, Executable(MODULES[role], args), requirements or Requirements())


def module_job(name: str, module: str, *args: str) -> Job:
    """A job running any module (a stand-in, a benchmark's own process); its role is read
    from its name (``leader``, ``follower*``, anything else a learner)."""
    role = next((r for r in ("leader", "follower") if name.startswith(r)), "learner")
    return Job(name, role, 0, Executable(module, args))


def role_jobs(
    spec: Any,
    *,
    learner: Requirements | None = None,
    learners: Mapping[int, Requirements] | None = None,
    follower: Requirements | None = None,
    leader: Requirements | None = None,
) -> JobGroup:
    """Every role of ``spec``: the leader (and its standby, ``spec.standby``: a job named
    ``standby`` of role ``leader``), ``len(spec.followers)`` followers and
    ``spec.sim.learners`` learners, each with ``learner``'s requirements unless
    ``learners`` gives that partition its own (``{j: Requirements(...)}``).

    A run config's ``launch`` block is held to the same rules up front, before anything is
    written (:func:`dipsjax.launch.schema.check_partitions`); these checks are for API
    callers."""
    per = dict(learners or {})
    default = learner or Requirements()
    unknown = sorted(set(per) - set(range(spec.sim.learners)))
    if unknown:
        raise ValueError(f"learner requirements for learners {unknown}: only {spec.sim.learners}")
    for j in range(spec.sim.learners):
        r = per.get(j, default)
        data, fsdp, _ = r.mesh_shape
        n = data * fsdp  # the batch is split over data x fsdp
        if spec.sim.batch_size % n:
            raise ValueError(
                f"learner {j}: its partition splits the batch over {n} devices (data x fsdp "
                f"of its mesh {r.mesh_shape}), which must divide sim.batch_size "
                f"({spec.sim.batch_size})"
            )
    jobs = [role_job("leader", 0, leader)]
    if getattr(spec, "standby", ""):  # a standby leader: the same program on its own address
        exe = Executable(MODULES["leader"])  # its start arguments: ``entry.start_args``
        jobs.append(Job("standby", "leader", 1, exe, leader or Requirements()))
    jobs += [role_job("follower", k, follower) for k in range(len(spec.followers))]
    jobs += [role_job("learner", j, per.get(j, default)) for j in range(spec.sim.learners)]
    return JobGroup(tuple(jobs))


def requirements_from_config(cfg: Any) -> dict[str, Any]:
    """``role_jobs`` keyword arguments from a config's optional ``launch`` block:
    ``launch.learner`` (one ``Requirements`` field dict for every learner),
    ``launch.learners`` (``{j: fields}`` per learner), ``launch.follower``, ``launch.leader``.
    Errors name the field."""
    block = cfg.get("launch") if hasattr(cfg, "get") else None
    if block is None:
        return {}
    block = block.to_dict() if hasattr(block, "to_dict") else dict(block)
    known = {"learner", "learners", "follower", "leader", "slurm", "kubernetes"}
    if set(block) - known:
        bad = sorted(set(block) - known)[0]
        raise ValueError(f"config launch.{bad}: unknown; known {sorted(known)}")

    def make(where: str, fields: Any) -> Requirements:
        if not hasattr(fields, "items"):
            raise ValueError(f"config launch.{where}: expected Requirements fields, got {fields!r}")
        fields = dict(fields)
        if "accelerators" in fields and fields["accelerators"] is not None:
            fields["accelerators"] = tuple(fields["accelerators"])
        try:
            return Requirements(**fields)
        except TypeError as e:
            raise ValueError(f"config launch.{where}: {e}") from None
        except ValueError as e:
            raise ValueError(f"config launch.{where}: {e}") from None

    out: dict[str, Any] = {}
    for role in ("follower", "leader"):
        if role in block:
            out[role] = make(role, block[role])
    base = block.get("learner", {})
    if not hasattr(base, "items"):
        raise ValueError(f"config launch.learner: expected Requirements fields, got {base!r}")
    base = dict(base)
    if "learner" in block:
        out["learner"] = make("learner", base)
    if "learners" in block:
        learners = block["learners"]
        if not hasattr(learners, "items") or not all(str(j).isdigit() for j in learners):
            raise ValueError(f"config launch.learners: expected {{'J': fields}}, got {learners!r}")
        out["learners"] = {
            int(j): make(f"learners.{j}", {**base, **dict(f)}) for j, f in learners.items()
        }

    return out
