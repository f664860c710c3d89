"""Who may read a run's files (issue 18 item 2): the owner alone by default, the group on
request, and credentials that others may read are refused before anything is written.
The walk over a whole real run's folder is in ``test_local_run.py``
(``assert_private``)."""

import os
import stat
from pathlib import Path

import pytest

from dipsjax.launch import run as run_mod
from dipsjax.runtime import credentials, permissions
from dipsjax.sim.config import SimConfig


@pytest.fixture(autouse=True)
def _umask(monkeypatch):
    monkeypatch.delenv(permissions.GROUP_ACCESS_ENV, raising=False)
    old = os.umask(0o022)  # as on a usual machine: what the code sets must show
    yield
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def modes(root: Path) -> dict[str, int]:
    """Every file's and folder's mode under ``root`` (``root`` itself included)."""
    return {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("loose", ["token", "key.pem"])
def test_credentials_others_may_read_are_refused_naming_the_file_and_the_fix(
    tmp_path, capsys, loose
):
    made = credentials.create(tmp_path / "creds")
    (tmp_path / "creds" / loose).chmod(0o644)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        run_mod.main(
            ["quickstart", "--arg", "ci", "--credentials", made.directory, "--out", str(out)]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    path = tmp_path / "creds" / loose
    assert f"{path} may be read by others (mode 0644)" in err
    assert f"`chmod 600 {path}`" in err and "Traceback" not in err
    assert not out.exists()  # nothing written first
    # A credentials folder others may write is refused too.
    (tmp_path / "creds" / loose).chmod(0o600)
    (tmp_path / "creds").chmod(0o777)
    with pytest.raises(PermissionError, match=r"writable by others.*chmod 700"):
        credentials.load.__wrapped__(tmp_path / "creds")
    # A sticky one (a Kubernetes secret volume is mounted 1777): others cannot replace ours.
    (tmp_path / "creds").chmod(0o1777)
    assert credentials.load.__wrapped__(tmp_path / "creds").token == made.token


@pytest.mark.parametrize("group", [False, True], ids=["owner", "group"])
def test_a_run_folder_is_the_owners_alone_or_its_groups_and_credentials_always_private(
    tmp_path, monkeypatch, group
):
    if group:
        monkeypatch.setenv(permissions.GROUP_ACCESS_ENV, "1")
    sim = SimConfig(learners=1, followers=1)
    spec = run_mod.make_spec(sim, tmp_path / "run", heartbeat_interval=1.0)
    assert os.umask(0o022) == 0o022  # the caller's umask is its own again
    permissions.private()  # as a role process does
    spec.write(Path(spec.run_dir) / "spec.json")
    (Path(spec.run_dir) / "leader").mkdir()  # as a role process makes its folder
    (Path(spec.run_dir) / "leader" / "final.npz").write_bytes(b"weights")
    got = modes(Path(spec.run_dir))
    creds = {k: v for k, v in got.items() if k.startswith("credentials")}
    rest = {k: v for k, v in got.items() if not k.startswith("credentials")}
    assert set(creds) == {"credentials", *(f"credentials/{f}" for f in credentials.FILES)}
    # The key and token are the owner's alone whatever the group may read.
    assert creds["credentials"] == 0o700
    assert creds["credentials/key.pem"] == creds["credentials/token"] == 0o600
    dirs, files = (0o750, 0o640) if group else (0o700, 0o600)
    assert rest == {".": dirs, "spec.json": files, "leader": dirs, "leader/final.npz": files}


@pytest.mark.parametrize("group", [False, True], ids=["private", "group_access"])
def test_cluster_jobs_get_the_same_umask_and_group_access(tmp_path, monkeypatch, group):
    """A SLURM batch script sets the run's umask before its steps (srun passes it on to
    their logs) and passes group access on; a Kubernetes pod gets it in its environment."""
    from dipsjax.launch import Experiment, role_jobs
    from dipsjax.launch import kubernetes as k8s
    from dipsjax.launch.slurm import Slurm
    from dipsjax.runtime.spec import RunSpec

    if group:
        monkeypatch.setenv("DIPSJAX_GROUP_ACCESS", "1")
    else:
        monkeypatch.delenv("DIPSJAX_GROUP_ACCESS", raising=False)
    sim = SimConfig(learners=1, followers=1)
    spec = RunSpec(sim, "127.0.0.1:5000", ("127.0.0.1:6000",), "", str(tmp_path), (0,), 4)
    lines = Slurm().script(Experiment("t", spec).add(role_jobs(spec))).splitlines()
    first_step = next(i for i, x in enumerate(lines) if x.startswith("role "))
    umask = lines.index("umask 027" if group else "umask 077")
    assert umask < first_step
    assert ("export DIPSJAX_GROUP_ACCESS=1" in lines[:first_step]) == group
    ex = k8s.Kubernetes()
    exp = k8s.prepare(sim, "perm", tmp_path / "k8s", ex)
    jobset = next(
        d for d in ex.manifests(exp, tmp_path / "k8s" / "credentials") if d["kind"] == "JobSet"
    )
    for rjob in jobset["spec"]["replicatedJobs"]:
        container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env.get("DIPSJAX_GROUP_ACCESS") == ("1" if group else None)


@pytest.mark.parametrize("group", [False, True], ids=["private", "group_access"])
def test_tighten_takes_the_bits_a_runs_umask_would_not_give_and_follows_no_link(tmp_path, group):
    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "leader").mkdir(parents=True)
    outside.mkdir()
    for f in (run / "spec.json", run / "leader" / "final.npz", outside / "x"):
        f.write_bytes(b"x")
        f.chmod(0o644)
    (run / "leader" / "snapshot.json").write_bytes(b"{}")
    (run / "leader" / "snapshot.json").chmod(0o600)  # already tight: left as it is
    (run / "script").write_bytes(b"")
    (run / "script").chmod(0o777)
    for d in (run, run / "leader", outside):
        d.chmod(0o755)
    (run / "to-file").symlink_to(outside / "x")
    (run / "to-folder").symlink_to(outside)
    d, f, x = (0o750, 0o640, 0o750) if group else (0o700, 0o600, 0o700)
    assert permissions.tighten(run, group) == 5
    assert {k: v for k, v in modes(run).items() if not k.startswith("to-")} == {
        ".": d,
        "spec.json": f,
        "script": x,
        "leader": d,
        "leader/final.npz": f,
        "leader/snapshot.json": 0o600,
    }
    assert modes(outside) == {".": 0o755, "x": 0o644}  # links were not followed
    assert permissions.tighten(run, group) == 0


def test_resume_tightens_a_run_folder_an_older_version_wrote_before_starting_anything(
    tmp_path, monkeypatch, capsys
):
    from dipsjax.runtime.spec import RunSpec

    run = tmp_path / "run"
    (run / "leader").mkdir(parents=True)
    sim = SimConfig(learners=1, followers=1)
    RunSpec(sim, "127.0.0.1:1", ("127.0.0.1:2",), "", str(run), (0,), 4).write(run / "spec.json")
    (run / "leader" / "snapshot.json").write_text('{"stopped": false}')
    for p in (run / "spec.json", run / "leader" / "snapshot.json"):
        p.chmod(0o644)
    for p in (run, run / "leader"):
        p.chmod(0o755)
    seen = {}

    def started(spec, *args):
        seen.update(modes(run))
        raise RuntimeError("nothing started in this test")

    monkeypatch.setattr(run_mod, "_launch", started)
    assert run_mod.main(["--resume", str(run)]) == 1
    assert seen == {
        ".": 0o700,
        "spec.json": 0o600,
        "leader": 0o700,
        "leader/snapshot.json": 0o600,
    }
    assert f"permissions: 4 entries of {run} tightened to 0700/0600" in capsys.readouterr().out


def test_credentials_not_ours_are_refused_naming_both_owners_and_the_fix(tmp_path, monkeypatch):
    made = credentials.create(tmp_path / "creds")
    assert credentials.load.__wrapped__(made.directory).token == made.token  # ours: loaded
    ours = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: ours + 4242)  # as if another user loaded it
    with pytest.raises(PermissionError) as e:
        credentials.load.__wrapped__(made.directory)
    msg = str(e.value)
    assert f"{made.directory} is owned by uid {ours}, not by us (uid {ours + 4242})" in msg
    assert f"`chown {ours + 4242} {made.directory}`" in msg and "dipsjax credentials" in msg
