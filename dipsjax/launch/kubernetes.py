"""The Kubernetes executor: a JobSet manifest (kubernetes-sigs/jobset, ``v1alpha2``).

One replicated job per role: ``leader`` (1), ``follower`` (one Job per shard) and
``learner`` (one Job per partition; learners whose requirements differ get a replicated
job each, ``learner-{j}``). A learner's pod requests its accelerators by number
(``nvidia.com/gpu`` / ``google.com/tpu``, ``len(Requirements.accelerators)``) and its
environment names no device id: the pod's runtime assigns the devices, numbered from 0
inside the pod, so learners that differ only in host ids share a replicated job. A
partition spread over ``processes`` is an Indexed Job of that many pods, joined by
``jax.distributed`` with the first pod as coordinator. Every pod runs ``python -m
dipsjax.launch.entry ROLE /dipsjax/config/spec.json``; its index is the
JobSet's job index (the downward API's ``jobset.sigs.k8s.io/job-index``). The run's spec
is a ConfigMap, its credentials a Secret (the TLS certificates name the Services), and
headless Services give the leader and each follower a stable name, ``NAME-leader`` and
``NAME-follower-K`` (selecting the pod by JobSet's labels), which the spec's addresses
use, so a restarted or replaced pod is found where it was. JobSet's own pod hostnames
(``NAME-ROLE-INDEX-0.NAME``) name a spread partition's coordinator.

Restarts: pods restart in place (``restartPolicy: OnFailure``, ``backoffLimit:
max_restarts``), as the Di-PS paper has Kubernetes restart its leader; the entry resumes a
role from the run volume (the leader from its snapshot, a follower from its checkpoint, a
learner as a new incarnation). The run ends when the leader's Job completes
(``successPolicy``: the JobSet then deletes the other Jobs). ``run_claim`` names a
PersistentVolumeClaim for the run folder (ReadWriteMany: checkpoints survive pod
replacement); without one each pod keeps its role's state in an ``emptyDir``, which
survives a container's restart but not its pod's.

No cluster is reachable from this project's machines: the manifests are validated offline
against the JobSet CRD's and Kubernetes' schemas (:mod:`dipsjax.launch.k8s_schema`), and
``kubectl apply -f`` is left to the user.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dipsjax.launch.core import Experiment, Job, Requirements
from dipsjax.runtime import permissions

CONFIG, CREDENTIALS, RUN = "/dipsjax/config", "/dipsjax/credentials", "/dipsjax/run"
ACCELERATOR_RESOURCE = {"gpu": "nvidia.com/gpu", "tpu": "google.com/tpu"}


def dns_names(name: str, followers: int) -> tuple[str, list[str]]:
    """The leader's and followers' headless Services: ``NAME-leader``, ``NAME-follower-K``
    (each selects that role's pod; the names resolve in the job's namespace)."""
    return f"{name}-leader", [f"{name}-follower-{k}" for k in range(followers)]


def service(name: str, namespace: str, role: str, port: int, index: int | None = None) -> dict:
    """A headless Service selecting one role's pod of JobSet ``name`` (by the labels JobSet
    puts on its pods), published before the pod is ready (the others find it at once)."""
    selector = {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": role,
    }
    if index is not None:
        selector["jobset.sigs.k8s.io/job-index"] = str(index)
    svc = f"{name}-{role}" if index is None else f"{name}-{role}-{index}"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": svc,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "dipsjax", "dipsjax/role": role},
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": role, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def pod_requirements(r: Requirements) -> Requirements:
    """``r`` as a pod sees it: its accelerators renumbered from 0 (a pod asks for a number
    of devices, ``nvidia.com/gpu`` / ``google.com/tpu``, and its runtime assigns them), so
    learners that differ only in host device ids share a replicated job."""
    if r.accelerators is None:
        return r
    return dataclasses.replace(r, accelerators=tuple(range(len(r.accelerators))))


@dataclasses.dataclass(frozen=True)
class Kubernetes:
    """Settings of the manifest (``namespace``, the ``image`` with dipsjax and its corpus
    installed, ports, the run volume's claim, restarts a role may take)."""

    image: str = "dipsjax:latest"
    namespace: str = "default"
    leader_port: int = 50051
    follower_port: int = 50052
    coordinator_port: int = 62000
    run_claim: str | None = None
    max_restarts: int = 3

    def cluster_spec(self, spec: Any, name: str) -> Any:
        """``spec`` as the pods see it: DNS addresses, in-pod paths, servers on all
        interfaces."""
        leader, followers = dns_names(name, len(spec.followers))
        if spec.standby and not self.run_claim:
            raise ValueError(
                "standby_leader needs launch.kubernetes.run_claim: the standby follows the "
                "leader's lease, snapshots and tape in the run folder, which both pods must "
                "share (a ReadWriteMany PersistentVolumeClaim)"
            )
        return dataclasses.replace(
            spec,
            leader=f"{leader}:{self.leader_port}",
            standby=f"{name}-standby:{self.leader_port}" if spec.standby else "",
            followers=tuple(f"{h}:{self.follower_port}" for h in followers),
            run_dir=RUN,
            credentials=CREDENTIALS,
            bind="0.0.0.0",
        )

    def _container(
        self, job: Job, port: int | None, index_arg: bool, rj_name: str, name: str
    ) -> dict[str, Any]:
        r: Requirements = job.requirements
        resources: dict[str, Any] = {"cpu": str(r.cpus)}
        if r.memory_gb is not None:
            resources["memory"] = f"{int(r.memory_gb * 1024)}Mi"
        if r.accelerators is not None:
            resources[ACCELERATOR_RESOURCE[r.platform]] = str(len(r.accelerators))
        # The pod's runtime assigns its devices (numbered from 0 inside the pod): the
        # request says how many, the environment names none (Requirements.env).
        own = r.env(scheduler_assigns=True)
        env = [{"name": k, "value": v} for k, v in sorted({**own, **job.env}.items())]
        if permissions.group_access():  # the roles' files group-readable, as here
            env.append({"name": permissions.GROUP_ACCESS_ENV, "value": "1"})
        env.append(
            {
                "name": "JOBSET_JOB_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"
                    }
                },
            }
        )
        if r.processes > 1:  # a spread partition: its pods 0..P-1 (JOB_COMPLETION_INDEX)
            first = f"{name}-{rj_name}-$(JOBSET_JOB_INDEX)-0.{name}"
            env += [
                {"name": "DIPSJAX_NUM_PROCESSES", "value": str(r.processes)},
                {"name": "DIPSJAX_COORDINATOR", "value": f"{first}:{self.coordinator_port}"},
            ]
        role = "standby" if job.name == "standby" else job.role
        container: dict[str, Any] = {
            "name": role,
            "image": self.image,
            "command": ["python", "-m", "dipsjax.launch.entry", role, f"{CONFIG}/spec.json"],
            "env": env,
            "resources": {"requests": resources, "limits": dict(resources)},
            "volumeMounts": [
                {"name": "config", "mountPath": CONFIG, "readOnly": True},
                {"name": "credentials", "mountPath": CREDENTIALS, "readOnly": True},
                {"name": "run", "mountPath": RUN},
            ],
        }
        if index_arg:  # a replicated job of its own: its job index is 0
            container["command"].append(str(job.index))
        if port is not None:
            container["ports"] = [{"name": role, "containerPort": port}]
        return container

    def _replicated_job(
        self, rj_name: str, job: Job, replicas: int, name: str, index_arg: bool = False
    ) -> dict:
        port = {"leader": self.leader_port, "follower": self.follower_port}.get(job.role)
        role = "standby" if job.name == "standby" else job.role
        pod_spec: dict[str, Any] = {}
        if role == "standby":  # never on the leader's node: a lost node takes one of them
            pod_spec["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {
                                "matchLabels": {
                                    "jobset.sigs.k8s.io/jobset-name": name,
                                    "jobset.sigs.k8s.io/replicatedjob-name": "leader",
                                }
                            },
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            }
        volumes = [
            {"name": "config", "configMap": {"name": f"{name}-spec"}},
            {
                "name": "credentials",
                "secret": {"secretName": f"{name}-credentials", "defaultMode": 0o400},
            },
            {"name": "run", "persistentVolumeClaim": {"claimName": self.run_claim}}
            if self.run_claim
            else {"name": "run", "emptyDir": {}},
        ]
        return {
            "name": rj_name,
            "replicas": replicas,
            "template": {
                "spec": {
                    "parallelism": job.requirements.processes,
                    "completions": job.requirements.processes,
                    "completionMode": "Indexed",
                    "backoffLimit": self.max_restarts,
                    "template": {
                        "metadata": {
                            "labels": {
                                "app.kubernetes.io/name": "dipsjax",
                                "dipsjax/role": role,
                            }
                        },
                        "spec": {
                            **pod_spec,
                            "restartPolicy": "OnFailure",
                            "containers": [self._container(job, port, index_arg, rj_name, name)],
                            "volumes": volumes,
                        },
                    },
                }
            },
        }

    def manifests(self, experiment: Experiment, credentials: str | Path) -> list[dict[str, Any]]:
        """The ConfigMap (spec), Secret (credentials) and JobSet of ``experiment``, whose
        spec must be :meth:`cluster_spec`'s; validated against the schemas."""
        from dipsjax.launch import k8s_schema

        name = experiment.title
        spec = experiment.spec
        if spec.run_dir != RUN or spec.credentials != CREDENTIALS:
            raise ValueError(
                "Kubernetes.manifests: the experiment's spec must come from cluster_spec()"
            )
        learners = experiment.by_role("learner")
        groups: dict[Requirements, list[Job]] = {}
        for job in learners:  # host device ids mean nothing to a pod: only their number
            groups.setdefault(pod_requirements(job.requirements), []).append(job)
        rjobs = [self._replicated_job("leader", experiment.job("leader"), 1, name)]
        standby = experiment.jobs.get("standby")
        if standby is not None:
            rjobs.append(self._replicated_job("standby", standby, 1, name))
        followers = experiment.by_role("follower")
        rjobs.append(self._replicated_job("follower", followers[0], len(followers), name))
        if len(groups) == 1:
            rjobs.append(self._replicated_job("learner", learners[0], len(learners), name))
        else:
            rjobs += [
                self._replicated_job(f"learner-{j.index}", j, 1, name, True) for j in learners
            ]
        secret = {
            f.name: base64.b64encode(f.read_bytes()).decode()
            for f in sorted(Path(credentials).iterdir())
            if f.is_file()
        }
        meta = {"namespace": self.namespace, "labels": {"app.kubernetes.io/name": "dipsjax"}}
        docs = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{name}-spec", **meta},
                "data": {"spec.json": json.dumps(spec.to_json(), indent=1)},
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"{name}-credentials", **meta},
                "type": "Opaque",
                "data": secret,
            },
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": name, **meta},
                "spec": {
                    "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": ["leader"]},
                    "failurePolicy": {"maxRestarts": 0},
                    "replicatedJobs": rjobs,
                },
            },
        ]
        docs.append(service(name, self.namespace, "leader", self.leader_port))
        if standby is not None:
            docs.append(service(name, self.namespace, "standby", self.leader_port))
        docs += [
            service(name, self.namespace, "follower", self.follower_port, k)
            for k in range(len(followers))
        ]
        k8s_schema.validate(docs)
        return docs

    def write(self, experiment: Experiment, credentials: str | Path, path: str | Path) -> Path:
        """Writes the manifests as one YAML file (``kubectl apply -f PATH``)."""
        import yaml

        path = Path(path)
        docs = self.manifests(experiment, credentials)
        path.unlink(missing_ok=True)
        # Readable by its owner only from the start: it holds the job's credentials.
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
            fh.write(yaml.safe_dump_all(docs, sort_keys=False))
        return path


def prepare(
    sim: Any,
    name: str,
    out: Path,
    executor: Kubernetes,
    settings: Mapping[str, Any] | None = None,
    **requirements: Any,
) -> Experiment:
    """A run of ``sim`` for Kubernetes: credentials for the pods' DNS names (in
    ``out/credentials``), the cluster spec and its experiment. ``settings``: the run-level
    :class:`~dipsjax.runtime.spec.RunSpec` fields (``heartbeat_interval``, the data-plane
    limits: :func:`dipsjax.launch.config.spec_settings`)."""
    from dipsjax.launch.core import role_jobs
    from dipsjax.launch.run import make_spec
    from dipsjax.runtime.credentials import create

    leader, hosts = dns_names(name, sim.followers)  # make_spec may use fewer
    ns = executor.namespace
    standby = [f"{name}-standby"] if (settings or {}).get("standby_leader") else []
    names = [
        h
        for x in (leader, *standby, *hosts)
        for h in (x, f"{x}.{ns}.svc", f"{x}.{ns}.svc.cluster.local")
    ]
    creds = create(out / "credentials", hosts=[*names, "localhost", "127.0.0.1"])
    spec = make_spec(sim, out, credentials=creds.directory, **dict(settings or {}))
    spec = executor.cluster_spec(spec, name)
    return Experiment(name, spec).add(role_jobs(spec, **requirements))
