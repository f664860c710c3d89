"""The launch API and its local executor: jobs, requirements, teardown with real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dipsjax.launch import Experiment, Requirements, role_jobs
from dipsjax.launch import config as run_config
from dipsjax.launch.core import requirements_from_config
from dipsjax.launch.entry import command
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig

from .procs import running

ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp_path, learners=3, followers=2):
    sim = SimConfig(learners=learners, followers=followers)
    return RunSpec(
        sim,
        "127.0.0.1:5000",
        tuple(f"127.0.0.1:{6000 + k}" for k in range(followers)),
        "",
        str(tmp_path),
        (0, 1),
        10,
    )


def test_role_jobs_name_every_role_with_its_command_and_requirements(tmp_path):
    spec = _spec(tmp_path)
    fat = Requirements(cpus=2, cpu_devices=4)
    jobs = role_jobs(spec, learner=Requirements(cpu_devices=2), learners={2: fat})
    names = [j.name for j in jobs]
    assert names == ["leader", "follower0", "follower1", "learner0", "learner1", "learner2"]
    exp = Experiment("t", spec).add(jobs)
    assert exp.job("follower1").executable.command(python="py") == [
        "py",
        "-m",
        "dipsjax.runtime.follower",
        "1",
    ]
    assert exp.job("leader").executable.args == ()
    assert exp.job("learner0").requirements.env() == {
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "2",
        "DIPSJAX_PARTITION_DEVICES": "2",
    }
    assert exp.job("learner2").requirements == fat
    gpu = Requirements(platform="gpu", accelerators=(2, 3))
    assert gpu.env() == {
        "JAX_PLATFORMS": "cuda",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "DIPSJAX_PARTITION_DEVICES": "2",
    }
    # The mesh's shape reaches the learner (fsdp takes the rest); a bad one names its field.
    assert (
        Requirements(cpu_devices=4, processes=2, mesh_tensor=2).env()["DIPSJAX_PARTITION_MESH"]
        == "1,4,2"
    )
    assert "DIPSJAX_PARTITION_MESH" not in Requirements(cpu_devices=4).env()
    with pytest.raises(ValueError, match=r"Requirements.mesh_data / mesh_tensor: .*data x tensor"):
        Requirements(cpu_devices=4, mesh_data=3)
    with pytest.raises(ValueError, match="already has a job 'leader'"):
        exp.add(role_jobs(spec))
    with pytest.raises(ValueError, match=r"learners \[5\]"):
        role_jobs(spec, learners={5: fat})


def test_the_local_executor_gives_host_device_ids_and_splits_a_tpu_host():
    """Locally the ids are this host's: 8 GPUs as 2 learners see 0-3 and 4-7. A TPU host
    split between processes needs more than TPU_VISIBLE_CHIPS: the shape of each
    process's chips, a world of one process and a port each (core.tpu_split_env)."""
    from dipsjax.launch.core import tpu_split_env

    halves = [
        Requirements(platform="gpu", accelerators=tuple(range(4 * j, 4 * j + 4))) for j in (0, 1)
    ]
    assert [r.env()["CUDA_VISIBLE_DEVICES"] for r in halves] == ["0,1,2,3", "4,5,6,7"]
    assert [r.env()["DIPSJAX_PARTITION_DEVICES"] for r in halves] == ["4", "4"]
    quarters = [Requirements(platform="gpu", accelerators=(2 * j, 2 * j + 1)) for j in range(4)]
    assert [r.env()["CUDA_VISIBLE_DEVICES"] for r in quarters] == ["0,1", "2,3", "4,5", "6,7"]
    # Where a scheduler assigns the devices, no id is set (the same for CPU partitions).
    assert halves[1].env(scheduler_assigns=True) == {
        "JAX_PLATFORMS": "cuda",
        "DIPSJAX_PARTITION_DEVICES": "4",
    }
    cpu = Requirements(cpu_devices=2, processes=2)
    assert cpu.env(scheduler_assigns=True) == cpu.env()
    # TPU: an 8-chip host as 2 learners of 4 chips (2x2 each) and a 4-chip host as 4 of 1.
    for chips, bounds, port in [
        ((0, 1, 2, 3), "2,2,1", 8476),
        ((4, 5, 6, 7), "2,2,1", 8480),
        ((2, 3), "1,2,1", 8478),
        ((3,), "1,1,1", 8479),
        (tuple(range(8)), "2,4,1", 8476),
    ]:
        env = Requirements(platform="tpu", accelerators=chips).env()
        assert env == {
            "JAX_PLATFORMS": "tpu",
            "DIPSJAX_PARTITION_DEVICES": str(len(chips)),
            "TPU_VISIBLE_CHIPS": ",".join(map(str, chips)),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": bounds,
            "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_PORT": str(port),
            "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
            "CLOUD_TPU_TASK_ID": "0",
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        }
        x, y, z = map(int, bounds.split(","))
        assert x * y * z == len(chips)  # the bounds hold exactly the chips
    for bad in [(0, 1, 2), (1, 2), (0, 2), (2, 3, 4, 5)]:
        with pytest.raises(ValueError, match=r"Requirements.accelerators must be 1, 2, 4 or 8"):
            tpu_split_env(bad)


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"cpus": 0}, "Requirements.cpus must be an integer >= 1"),
        ({"platform": "gpu"}, "Requirements.accelerators must be device ids"),
        ({"accelerators": (0,)}, "Requirements.accelerators"),
        ({"cpu_devices": 0}, "Requirements.cpu_devices must be None or >= 1"),
        ({"platform": "npu"}, "Requirements.platform"),
    ],
)
def test_bad_requirements_name_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        Requirements(**fields)


def test_configs_are_overridden_from_the_command_line_and_validated_with_the_field_named():
    cfg = run_config.load(
        "quickstart",
        "ci",
        [
            "sim.learners=2",
            "sim.speeds=(1, 2)",
            "sim.outer_lr=1",  # an int where a float was: taken as 1.0
            "launch.learner.cpu_devices=2",
            "launch.learners={'1': {'cpus': 2}}",
        ],
    )
    sim = run_config.sim_config(cfg)
    assert sim.learners == 2 and sim.speeds == (1, 2) and sim.outer_lr == 1.0
    reqs = requirements_from_config(cfg)
    assert reqs["learner"] == Requirements(cpu_devices=2)
    assert reqs["learners"] == {1: Requirements(cpus=2, cpu_devices=2)}
    bad = [
        (["sim.lerners=2"], "SimConfig has no field 'lerners'"),
        (["sim.learners=two"], "expected int"),
        (["simm.learners=2"], "unknown field 'simm'"),
        (["sim.learners"], "expected FIELD=VALUE"),
        (["launch.learner.cpus=0"], None),
    ]
    for overrides, match in bad[:-1]:
        with pytest.raises(ValueError, match=match):
            run_config.load("quickstart", "ci", overrides)
    cfg = run_config.load("quickstart", "ci", bad[-1][0])
    with pytest.raises(ValueError, match=r"config launch.learner: Requirements.cpus"):
        requirements_from_config(cfg)
    cfg = run_config.load("quickstart", "ci", ["sim.learners=0"])
    with pytest.raises(ValueError, match="learners"):
        run_config.sim_config(cfg)
    for overrides, match in [
        (["sim=3"], "a block; set one of its fields"),
        (["sim.learners.x=1"], "sim.learners is not a block of fields"),
    ]:
        with pytest.raises(ValueError, match=match):
            run_config.load("quickstart", "ci", overrides)
    for launch, match in [
        ("launch.learners={'x': {'cpus': 2}}", r"launch.learners: expected \{'J': fields\}"),
        ("launch.leader=2", "launch.leader: expected Requirements fields"),
        ("launch.follower={'cpus': 'two'}", "launch.follower"),
    ]:
        cfg = run_config.load("quickstart", "ci", [launch])
        with pytest.raises(ValueError, match=match):
            requirements_from_config(cfg)


def test_a_partition_whose_devices_do_not_divide_the_batch_is_refused_before_anything_starts(
    tmp_path,
):
    spec = _spec(tmp_path)  # batch_size 8
    with pytest.raises(
        ValueError,
        match=r"learner 1: its partition splits the batch over 3 devices.*batch_size \(8\)",
    ):
        role_jobs(spec, learners={1: Requirements(cpu_devices=3)})
    spread = role_jobs(spec, learner=Requirements(processes=2))  # 1 device a process
    env = {j.name: j.requirements.env() for j in spread}
    assert env["learner0"]["DIPSJAX_PARTITION_DEVICES"] == "2"
    assert env["learner0"]["JAX_NUM_CPU_DEVICES"] == "1"
    gpu = Requirements(platform="gpu", accelerators=(0, 1), processes=2)
    exp = Experiment("t", spec).add(role_jobs(spec, learner=gpu))
    from dipsjax.launch import Local

    with pytest.raises(ValueError, match="its processes would share them"):
        Local(spec).start(exp.job("learner0"))


def test_cluster_executors_refuse_what_they_cannot_honour(tmp_path):
    base = [sys.executable, "-m", "dipsjax.cli", "run", "--arg", "ci", "--out", str(tmp_path / "r")]
    for extra, match in [
        (["--executor", "slurm", "--credentials", str(tmp_path)], "--credentials: the slurm"),
        (["--executor", "kubernetes", "--resume", str(tmp_path)], "--resume: the kubernetes"),
    ]:
        res = subprocess.run(
            [*base, *extra], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
        assert res.returncode == 2 and match in res.stderr, res.stderr


def test_the_entry_resumes_each_role_from_what_the_run_folder_holds(tmp_path):
    spec = _spec(tmp_path)
    spec.write(tmp_path / "spec.json")
    path = str(tmp_path / "spec.json")
    assert command("leader", path, None)[2:] == ["dipsjax.runtime.leader", path]
    assert command("follower", path, 1)[2:] == ["dipsjax.runtime.follower", path, "1"]
    # Every start of a learner after its first is a new incarnation.
    starts = [command("learner", path, 2)[-2:] for _ in range(3)]
    assert starts == [["--incarnation", "0"], ["--incarnation", "1"], ["--incarnation", "2"]]
    (tmp_path / "leader").mkdir()
    (tmp_path / "leader" / "snapshot.json").write_text("{}")
    (tmp_path / "follower1" / "ckpt" / "7").mkdir(parents=True)
    assert command("leader", path, None)[-1] == "--resume"
    assert command("follower", path, 1)[-2:] == ["--resume", "latest"]
    assert command("follower", path, 0)[-1] == "0"  # its own checkpoints only
    os.environ["DIPSJAX_INDEX"] = "1"
    try:
        assert command("learner", path, None)[4] == "1"
    finally:
        del os.environ["DIPSJAX_INDEX"]
    with pytest.raises(ValueError, match=r"follower index 2 is out of range \[0, 2\)"):
        command("follower", path, 2)


def _start_run(tmp_path, *extra):
    out = tmp_path / "run"
    log = (tmp_path / "launcher.log").open("w")
    cmd = [sys.executable, "-m", "dipsjax.cli", "run", "--arg", "ci", "--out", str(out), *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 120
    pids = {}
    while len(pids) < 7:  # the leader, 2 followers and 4 learners
        assert proc.poll() is None, (tmp_path / "launcher.log").read_text()
        assert time.monotonic() < deadline, "the run's processes did not all start"
        time.sleep(0.2)
        path = out / "pids.json"
        pids = json.loads(path.read_text()) if path.exists() else {}
    return proc, out, pids


@pytest.mark.integration
def test_the_local_executor_gives_each_learner_its_devices_and_cores_and_ctrl_c_ends_all(
    tmp_path,
):
    proc, out, pids = _start_run(
        tmp_path,
        "--set",
        "launch.learner.cpu_devices=2",
        "--set",
        "launch.learners={'3': {'cpu_devices': 1}, '2': {'mesh_tensor': 2}}",
    )
    try:
        cores = sorted(os.sched_getaffinity(0))
        for j in range(4):
            env = Path(f"/proc/{pids[f'learner{j}']}/environ").read_bytes().split(b"\0")
            want = b"JAX_NUM_CPU_DEVICES=" + (b"1" if j == 3 else b"2")
            assert want in env
            # Learner 2's mesh is tensor-parallel over its 2 devices; the others' all fsdp.
            mesh = [x for x in env if x.startswith(b"DIPSJAX_PARTITION_MESH=")]
            assert mesh == ([b"DIPSJAX_PARTITION_MESH=1,1,2"] if j == 2 else [])
            assert os.sched_getaffinity(pids[f"learner{j}"]) == {cores[j % len(cores)]}
        assert os.sched_getaffinity(pids["leader"]) == set(cores)  # not pinned
        assert (out / "logs" / "learner3.log").exists()
        saved = json.loads((out / "jobs.json").read_text())
        assert saved["learner0"]["cpu_devices"] == 2 and saved["learner3"]["cpu_devices"] == 1
        time.sleep(2)
        restarted = (out / "restarts.jsonl").exists()
        assert not restarted and all(running(p) for p in pids.values()), "a role died"
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        rc = proc.wait(60)
    assert rc == 130
    assert [n for n, pid in pids.items() if running(pid)] == []


@pytest.mark.integration
def test_a_killed_launcher_takes_every_process_it_started_with_it(tmp_path):
    proc, _, pids = _start_run(tmp_path)
    proc.kill()  # SIGKILL: no finally runs; the kernel's parent-death signal must act
    proc.wait()
    # Learners act on SIGTERM at their next safe point (after compiling, at worst).
    deadline = time.monotonic() + 120
    while [p for p in pids.values() if running(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [n for n, pid in pids.items() if running(pid)] == []
