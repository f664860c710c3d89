"""The Kubernetes executor's manifests: schema-valid, and naming what the pods will be."""

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from dipsjax.launch import Requirements
from dipsjax.launch import kubernetes as k8s
from dipsjax.launch.cli import k8s_name
from dipsjax.runtime.spec import RunSpec, address
from dipsjax.sim.config import SimConfig

ROOT = Path(__file__).resolve().parents[2]


def _jobset(docs):
    return next(d for d in docs if d["kind"] == "JobSet")


def _by_kind(docs, kind):
    return next(d for d in docs if d["kind"] == kind)


def test_the_jobset_names_every_role_and_the_spec_reaches_the_pods_by_their_dns_names(tmp_path):
    sim = SimConfig(learners=3, followers=2, speeds=(1.0, 1.5, 2.0))
    ex = k8s.Kubernetes(image="registry.example/dipsjax:1", max_restarts=5)
    exp = k8s.prepare(sim, "dips-run", tmp_path, ex, learner=Requirements(cpus=2, memory_gb=4))
    docs = ex.manifests(exp, tmp_path / "credentials")  # validated against the schemas
    js = _jobset(docs)
    rjobs = {r["name"]: r for r in js["spec"]["replicatedJobs"]}
    assert {n: r["replicas"] for n, r in rjobs.items()} == {
        "leader": 1,
        "follower": 2,
        "learner": 3,
    }
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["leader"]}
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    # The spec the pods read: the leader and followers at their headless Services, each
    # selecting its role's pod (and the follower's job index) by JobSet's pod labels.
    spec = RunSpec.from_json(json.loads(_by_kind(docs, "ConfigMap")["data"]["spec.json"]))
    assert address(spec.leader) == ("dips-run-leader", ex.leader_port)
    assert [address(a) for a in spec.followers] == [
        (f"dips-run-follower-{k}", ex.follower_port) for k in range(2)
    ]
    services = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Service"}
    assert set(services) == {"dips-run-leader", "dips-run-follower-0", "dips-run-follower-1"}
    label = "jobset.sigs.k8s.io/"
    for svc, want in [
        ("dips-run-leader", {"replicatedjob-name": "leader"}),
        ("dips-run-follower-1", {"replicatedjob-name": "follower", "job-index": "1"}),
    ]:
        sel = services[svc]["selector"]
        assert sel == {label + "jobset-name": "dips-run", **{label + k: v for k, v in want.items()}}
        assert services[svc]["clusterIP"] == "None"  # headless: the name is the pod's address
    assert services["dips-run-leader"]["ports"][0]["port"] == ex.leader_port
    assert spec.run_dir == k8s.RUN and spec.credentials == k8s.CREDENTIALS
    assert spec.bind == "0.0.0.0" and spec.sim == sim
    # The Secret holds the credentials, and the certificate names those hosts.
    secret = {k: base64.b64decode(v) for k, v in _by_kind(docs, "Secret")["data"].items()}
    assert secret == {f.name: f.read_bytes() for f in (tmp_path / "credentials").iterdir()}
    cert = x509.load_pem_x509_certificate(secret["cert.pem"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = set(sans.get_values_for_type(x509.DNSName))
    assert {address(spec.leader)[0], *(address(a)[0] for a in spec.followers)} <= names
    # Pods: the one entry per role, restarted in place, the learners' resources.
    for name, r in rjobs.items():
        job = r["template"]["spec"]
        pod = job["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"][:4] == ["python", "-m", "dipsjax.launch.entry", name]
        assert pod["restartPolicy"] == "OnFailure" and job["backoffLimit"] == 5
        env = {e["name"]: e for e in container["env"]}
        assert (
            "jobset.sigs.k8s.io/job-index"
            in env["JOBSET_JOB_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        )
    learner = rjobs["learner"]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert learner["resources"]["requests"] == {"cpu": "2", "memory": "4096Mi"}
    leader = rjobs["leader"]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert leader["ports"] == [{"name": "leader", "containerPort": ex.leader_port}]


def test_learners_with_their_own_requirements_get_a_replicated_job_each(tmp_path):
    sim = SimConfig(learners=2, followers=1)
    ex = k8s.Kubernetes()
    gpu = Requirements(platform="gpu", accelerators=(0, 1), processes=2)
    exp = k8s.prepare(sim, "het", tmp_path, ex, learners={1: gpu})
    js = _jobset(ex.manifests(exp, tmp_path / "credentials"))
    rjobs = {r["name"]: r for r in js["spec"]["replicatedJobs"]}
    assert sorted(rjobs) == ["follower", "leader", "learner-0", "learner-1"]
    c1 = rjobs["learner-1"]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert c1["command"][-1] == "1"  # its own replicated job: the index is given
    assert c1["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = {e["name"]: e.get("value") for e in c1["env"]}
    assert "CUDA_VISIBLE_DEVICES" not in env and env["JAX_PLATFORMS"] == "cuda"
    # Spread over 2 pods (an Indexed Job), the first the partition's JAX coordinator; the
    # variable it names must come before it (Kubernetes expands $(VAR) of earlier ones).
    job1 = rjobs["learner-1"]["template"]["spec"]
    assert job1["parallelism"] == job1["completions"] == 2
    assert job1["completionMode"] == "Indexed"
    assert env["DIPSJAX_NUM_PROCESSES"] == "2" and env["DIPSJAX_PARTITION_DEVICES"] == "4"
    assert (
        env["DIPSJAX_COORDINATOR"]
        == f"het-learner-1-$(JOBSET_JOB_INDEX)-0.het:{ex.coordinator_port}"
    )
    names = [e["name"] for e in c1["env"]]
    assert names.index("JOBSET_JOB_INDEX") < names.index("DIPSJAX_COORDINATOR")
    c0 = rjobs["learner-0"]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert "DIPSJAX_NUM_PROCESSES" not in {e["name"] for e in c0["env"]}


def test_gpu_and_tpu_pods_request_their_devices_and_name_no_host_device_ids(tmp_path):
    """One host of 8 GPUs as 2 learners: each learner pod requests 4 GPUs and its runtime
    assigns them (numbered 0-3 inside the pod), so no host id is set: CUDA_VISIBLE_DEVICES
    =4,5,6,7 inside a pod of 4 GPUs would hide all of them. The learners differ only in
    host ids, so they share one replicated job of 2."""
    sim = SimConfig(learners=2, followers=1)
    ex = k8s.Kubernetes()
    gpu = {
        j: Requirements(platform="gpu", accelerators=tuple(range(4 * j, 4 * j + 4))) for j in (0, 1)
    }
    exp = k8s.prepare(sim, "gpus", tmp_path / "g", ex, learners=gpu)
    rjobs = {
        r["name"]: r
        for r in _jobset(ex.manifests(exp, tmp_path / "g" / "credentials"))["spec"][
            "replicatedJobs"
        ]
    }
    assert rjobs["learner"]["replicas"] == 2 and "learner-1" not in rjobs
    (c,) = rjobs["learner"]["template"]["spec"]["template"]["spec"]["containers"]
    assert (
        c["resources"]["requests"]["nvidia.com/gpu"]
        == c["resources"]["limits"]["nvidia.com/gpu"]
        == "4"
    )
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["JAX_PLATFORMS"] == "cuda" and env["DIPSJAX_PARTITION_DEVICES"] == "4"
    assert not {"CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS"} & set(env)
    # A TPU slice per learner: the pod requests its chips; GKE's TPU runtime sets the rest.
    tpu = Requirements(platform="tpu", accelerators=(0, 1, 2, 3))
    exp = k8s.prepare(sim, "tpus", tmp_path / "t", ex, learner=tpu)
    rjobs = {
        r["name"]: r
        for r in _jobset(ex.manifests(exp, tmp_path / "t" / "credentials"))["spec"][
            "replicatedJobs"
        ]
    }
    (c,) = rjobs["learner"]["template"]["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["google.com/tpu"] == "4"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["JAX_PLATFORMS"] == "tpu" and env["DIPSJAX_PARTITION_DEVICES"] == "4"
    assert not [k for k in env if k.startswith("TPU_") or k == "CUDA_VISIBLE_DEVICES"]


def test_a_manifest_the_schemas_refuse_is_not_written(tmp_path):
    sim = SimConfig(learners=1, followers=1)
    ex = k8s.Kubernetes()
    exp = k8s.prepare(sim, "Bad_Name", tmp_path, ex)  # not an RFC 1035 label
    with pytest.raises(ValueError, match="JobSet/Bad_Name"):
        ex.write(exp, tmp_path / "credentials", tmp_path / "jobset.yaml")
    assert not (tmp_path / "jobset.yaml").exists()
    assert k8s_name("paper_1b") == "paper-1b" and k8s_name("1b") == "dipsjax-1b"


def test_the_launch_script_writes_a_valid_jobset_for_a_config(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "launch/dips.py",
        "--config",
        "quickstart",
        "--executor",
        "kubernetes",
        "--arg",
        "ci",
        "--out",
        str(out),
        "--set",
        "launch.kubernetes.image=registry.example/dipsjax:2",
    ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "kubectl apply -f" in res.stdout
    docs = list(yaml.safe_load_all((out / "jobset.yaml").read_text()))
    from dipsjax.launch import k8s_schema

    k8s_schema.validate(docs)
    assert (out / "jobset.yaml").stat().st_mode & 0o077 == 0  # it holds the credentials
    js = _jobset(docs)
    pods = [r["template"]["spec"]["template"]["spec"] for r in js["spec"]["replicatedJobs"]]
    assert {p["containers"][0]["image"] for p in pods} == {"registry.example/dipsjax:2"}
    bad = subprocess.run(
        [*cmd[:-1], "launch.kubernetes.imag=x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "launch.kubernetes.imag: must be a known field" in bad.stderr


def test_a_standby_leader_is_a_replicated_job_of_its_own_on_another_node(tmp_path):
    """Issue 22: the standby's pod (``entry standby``) never shares the leader's node, has
    a headless Service of its own that the spec and the certificate name, and needs a run
    folder both pods share (``run_claim``), else the run is refused naming the field."""
    sim = SimConfig(learners=1, followers=1)
    with pytest.raises(ValueError, match="run_claim"):
        k8s.prepare(sim, "sb", tmp_path / "a", k8s.Kubernetes(image="i"), {"standby_leader": True})
    ex = k8s.Kubernetes(image="i", run_claim="runs")
    exp = k8s.prepare(sim, "sb", tmp_path / "b", ex, {"standby_leader": True})
    docs = ex.manifests(exp, tmp_path / "b" / "credentials")  # validated against the schemas
    rjobs = {r["name"]: r for r in _jobset(docs)["spec"]["replicatedJobs"]}
    assert set(rjobs) == {"leader", "standby", "follower", "learner"}
    pod = rjobs["standby"]["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][3:] == ["standby", f"{k8s.CONFIG}/spec.json"]
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "leader"
    spec = RunSpec.from_json(json.loads(_by_kind(docs, "ConfigMap")["data"]["spec.json"]))
    assert address(spec.standby) == ("sb-standby", ex.leader_port)
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert "sb-standby" in services
    secret = _by_kind(docs, "Secret")["data"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["cert.pem"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"sb-leader", "sb-standby"} <= set(sans.get_values_for_type(x509.DNSName))
