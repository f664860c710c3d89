"""The SLURM executor on a real SLURM cluster: Debian's slurm-wlm and munge, started here by
``scripts/slurm_cluster.sh`` (slurmctld and a slurmd per emulated node, on this machine),
a small dipsjax run submitted as one heterogeneous job, the daemons stopped by pid after."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dipsjax.launch import Experiment, Requirements, role_jobs
from dipsjax.launch.slurm import Slurm
from dipsjax.runtime.spec import RunSpec, address
from dipsjax.sim.config import SimConfig

from .procs import running

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm():
    """A 3-node cluster (a node per component of a job: the syncer and up to 2 learners)."""
    if os.geteuid() != 0 or (not shutil.which("apt-get") and not shutil.which("slurmctld")):
        pytest.skip("a SLURM cluster needs root (its daemons) and Debian's packages")
    subprocess.run(["bash", str(SCRIPT), "install"], check=True, capture_output=True)
    directory = Path(tempfile.mkdtemp(prefix="dipsjax-slurm-", dir="/tmp"))
    out = subprocess.run(
        ["bash", str(SCRIPT), "start", "--nodes", "3", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    env = {"SLURM_CONF": str(directory / "slurm.conf")}
    pids = [int(p.read_text()) for p in directory.glob("*.pid")]
    assert len(pids) >= 5, "munged, slurmctld and 3 slurmd"
    try:
        yield env
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(directory)], check=False)
        shutil.rmtree(directory, ignore_errors=True)
        assert [p for p in pids if running(p)] == [], "a daemon is still running"


def _procs_mentioning(text):
    """The command lines of running processes that mention ``text``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
            continue
        if d.name.isdigit() and text in cmd and running(int(d.name)):
            out.append(cmd)
    return out


def test_the_batch_script_is_a_heterogeneous_job_with_a_step_per_role(tmp_path):
    sim = SimConfig(learners=2, followers=2)
    spec = RunSpec(
        sim, "127.0.0.1:5000", ("127.0.0.1:6000", "127.0.0.1:6001"), "", str(tmp_path), (0, 1), 4
    )
    spread = Requirements(processes=2, cpus=2, cpu_devices=2, memory_gb=2)
    exp = Experiment("t", spec).add(role_jobs(spec, learners={1: spread}))
    script = Slurm(partition="gpu", time="00:10:00").script(exp)
    lines = script.splitlines()
    assert lines.count("#SBATCH hetjob") == 2  # 3 components: the syncer, 2 learners
    comps = " ".join(lines).split("#SBATCH hetjob")
    assert "--ntasks=3" in comps[0]  # the leader and 2 followers
    assert "--ntasks=1" in comps[1] and "--ntasks=2" in comps[2] and "--cpus-per-task=2" in comps[2]
    assert "--mem-per-cpu=1024M" in comps[2] and "--partition=gpu" in comps[2]
    steps = [x for x in lines if x.startswith("role ")]
    assert [x.split()[1] for x in steps] == [
        "leader",
        "follower0",
        "follower1",
        "learner0",
        "learner1",
    ]
    assert all("--het-group=0" in x for x in steps[:3])
    assert "--het-group=1" in steps[3] and "--het-group=2" in steps[4]
    assert "DIPSJAX_NUM_PROCESSES=2" in steps[4] and "DIPSJAX_NUM_PROCESSES" not in steps[3]
    assert steps[4].endswith(f"-m dipsjax.launch.entry learner {tmp_path}/spec.json 1 &")


def test_gpu_learners_ask_slurm_for_their_gpus_and_their_steps_name_no_device_ids(tmp_path):
    """One host of 8 GPUs as 2 learners: each learner component and its step ask for 4 GPUs
    a task; SLURM assigns them and sets CUDA_VISIBLE_DEVICES itself, so the script names no
    host device id (4,5,6,7 would be wrong wherever SLURM placed the task)."""
    sim = SimConfig(learners=2, followers=1)
    spec = RunSpec(sim, "127.0.0.1:5000", ("127.0.0.1:6000",), "", str(tmp_path), (0, 0), 4)
    gpu = {
        j: Requirements(platform="gpu", accelerators=tuple(range(4 * j, 4 * j + 4))) for j in (0, 1)
    }
    exp = Experiment("t", spec).add(role_jobs(spec, learners=gpu))
    script = Slurm().script(exp)
    comps = script.split("#SBATCH hetjob")
    assert "--gpus-per-task" not in comps[0]  # the syncer: no JAX device
    for comp in comps[1:]:
        assert "#SBATCH --gpus-per-task=4" in comp.splitlines()
    steps = {x.split()[1]: x for x in script.splitlines() if x.startswith("role ")}
    for name in ("learner0", "learner1"):
        assert " --gpus-per-task=4 " in steps[name]
        assert "JAX_PLATFORMS=cuda" in steps[name] and "DIPSJAX_PARTITION_DEVICES=4" in steps[name]
    assert "--gpus-per-task" not in steps["leader"] + steps["follower0"]
    assert "CUDA_VISIBLE_DEVICES" not in script
    # A spread GPU partition: 2 tasks of 2 GPUs each, a mesh of 4.
    spread = Requirements(platform="gpu", accelerators=(0, 1), processes=2)
    script = Slurm().script(Experiment("t", spec).add(role_jobs(spec, learner=spread)))
    step = next(x for x in script.splitlines() if x.startswith("role learner1 "))
    assert "--ntasks=2 --cpus-per-task=1 --gpus-per-task=2 " in step
    assert "DIPSJAX_PARTITION_DEVICES=4" in step
    # TPUs are not SLURM resources, and the syncer's component cannot hold GPUs: refused,
    # the field named.
    tpu = Requirements(platform="tpu", accelerators=(0, 1, 2, 3))
    with pytest.raises(
        ValueError, match=r"learner0: Requirements\.platform 'tpu' is not supported"
    ):
        Slurm().script(Experiment("t", spec).add(role_jobs(spec, learner=tpu)))
    follower = Requirements(platform="gpu", accelerators=(0,))
    with pytest.raises(ValueError, match=r"follower0: Requirements\.accelerators for the follower"):
        Slurm().script(Experiment("t", spec).add(role_jobs(spec, follower=follower)))


def test_a_run_through_slurm_trains_to_its_budget_and_leaves_nothing_behind(slurm, tmp_path):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "launch/dips.py",
        "--config",
        "quickstart",
        "--executor",
        "slurm",
        "--arg",
        "ci",
        "--set",
        "sim.learners=1",
        "--set",
        "sim.speeds=()",
        "--set",
        "sim.token_budget=16384",  # 2 rounds
        "--set",
        "launch.learner.processes=2",  # jax.distributed from SLURM's environment
        "--set",
        "standby_leader=True",  # a standby leader: a component of its own (issue 22)
        "--out",
        str(run),
        "--wait",
    ]
    env = {**os.environ, **slurm}
    res = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    batch_log = run / "logs" / "batch.log"
    assert res.returncode == 0, (
        res.stdout + res.stderr + (batch_log.read_text() if batch_log.exists() else "")
    )
    job_id = (run / "slurm_job").read_text().strip()
    assert f"SLURM job {job_id} ended: COMPLETED" in res.stdout
    # The batch script pointed the spec at the syncer's node, with credentials made there.
    spec = RunSpec.read(run / "spec.json")
    assert address(spec.leader)[0] == "127.0.0.1" and spec.bind == "0.0.0.0"
    assert spec.standby and address(spec.standby)[1] != address(spec.leader)[1]
    batch = (run / "logs" / "batch.log").read_text()
    assert "prepared" in batch and "leader exited with 0" in batch
    # Every role ran as a step of the job, and the tape and the leader's books agree.
    steps = set()
    for name in ("leader", "standby", "follower0", "follower1", "learner0"):
        first = (run / "logs" / f"{name}.log").read_text().splitlines()[0]
        assert f"SLURM_JOB_ID {job_id}" in first, first
        steps.add(first.split("SLURM_STEP_ID ")[1].split(",")[0])
    assert len(steps) == 5  # a step each
    # The standby followed the lease of epoch 1 and ended when the job stopped.
    assert "the job has stopped: the standby ends" in (run / "logs" / "standby.log").read_text()
    # The learner's partition: 2 tasks of its step, one JAX world, the second serving every
    # computation the first made (counted apart, by each).
    log = (run / "logs" / "learner0.log").read_text()
    assert "SLURM_PROCID 0" in log and "SLURM_PROCID 1" in log
    stats = json.loads((run / "learner0" / "stats.json").read_text())
    served = json.loads((run / "learner0" / "process1.json").read_text())
    assert stats["processes"] == 2 and stats["partition_calls"] == served["calls"] >= 4
    summary = json.loads((run / "summary.json").read_text())
    books = summary["leader_tokens"]
    assert books["reported"] >= spec.sim.token_budget and summary["applied"] >= 2
    assert summary["tokens"] == books["applied"] + books["rejected"]
    status = json.loads((run / "leader" / "status.json").read_text())
    assert status["learners"]["0"]["accepted"] == summary["rounds"] >= 2
    assert summary["curve"][-1]["val_loss"] < summary["curve"][0]["val_loss"]
    # SLURM has let the job go, and no process of the run is left.
    squeue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, check=True)
    assert squeue.stdout.strip() == ""
    assert _procs_mentioning(str(run)) == []


def test_a_standby_leader_is_a_component_of_its_own(tmp_path):
    """Issue 22: the standby runs on another node where SLURM has one (its own component,
    group 1; the learners' groups follow), as ``entry standby``, and ``prepare`` points its
    address at that component's node, with a certificate naming both leaders' nodes."""
    sim = SimConfig(learners=1, followers=1)
    spec = RunSpec(
        sim,
        "127.0.0.1:5000",
        ("127.0.0.1:6000",),
        "",
        str(tmp_path),
        (0,),
        4,
        standby="127.0.0.1:5001",
    )
    exp = Experiment("t", spec).add(role_jobs(spec))
    lines = Slurm().script(exp).splitlines()
    assert lines.count("#SBATCH hetjob") == 2  # the syncer, the standby, the learner
    comps = " ".join(lines).split("#SBATCH hetjob")
    assert "--ntasks=2" in comps[0] and "--ntasks=1" in comps[1]
    steps = {x.split()[1]: x for x in lines if x.startswith("role ")}
    assert list(steps) == ["leader", "follower0", "standby", "learner0"]
    assert "--het-group=1" in steps["standby"] and "--het-group=2" in steps["learner0"]
    assert steps["standby"].endswith(f"-m dipsjax.launch.entry standby {tmp_path}/spec.json &")
    from dipsjax.launch.slurm import prepare
    from dipsjax.runtime import credentials

    spec.write(tmp_path / "spec.json")
    got = prepare(tmp_path / "spec.json", host="nodeA", standby_host="nodeB")
    assert got.leader == "nodeA:5000" and got.standby == "nodeB:5001"
    assert got.followers == ("nodeA:6000",)
    cert = credentials.load(got.credentials)
    assert cert is not None
    from cryptography import x509

    pem = x509.load_pem_x509_certificate((tmp_path / "credentials" / "cert.pem").read_bytes())
    sans = pem.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"nodeA", "nodeB"} <= set(sans.get_values_for_type(x509.DNSName))
