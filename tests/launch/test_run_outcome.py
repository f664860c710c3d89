"""How ``dipsjax run`` ends and restarts roles: a run a fault stopped short of its budget
exits non-zero with the stop's reason and stays resumable; a role that exits while the job
has not stopped is started again whatever its exit code (``Healer``)."""

import json
import types

import pytest

from dipsjax.launch import run
from dipsjax.runtime import credentials
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig
from dipsjax.syncer import Leader, LeaderConfig, NoGrace
from dipsjax.syncer import messages as L


def _run_dir(tmp_path, *, budget_reached):
    """A run folder whose leader stopped: at its budget, or for a fault short of it."""
    run_dir = tmp_path / "run"
    sim = SimConfig(learners=1, followers=1, token_budget=10)
    creds = credentials.create(run_dir / "credentials").directory
    spec = RunSpec(sim, "127.0.0.1:1", ("127.0.0.1:2",), creds, str(run_dir), (0,), 4)
    spec.write(run_dir / "spec.json")
    leader = Leader(LeaderConfig(penalty=False, token_budget=10), NoGrace())
    leader.handle(L.FollowerJoined(0.0, 0, 0))
    leader.handle(L.Join(0.0, 0))
    leader.handle(L.PullDone(0.0, 0, 0))
    leader.handle(L.PushRequested(0.0, 0, L.PushMeta(10, 1, 0)))
    leader.handle(L.TransferDone(0.0, 0, 0))
    leader.handle(L.FollowerNorms(0.0, 0, 0, (1.0,)))
    if budget_reached:
        leader.handle(L.FollowerMerged(0.0, 0, 0, 0.5))
        leader.handle(L.FollowerApplied(0.0, 0, 0, 1))
        leader.handle(L.PullDone(0.0, 0, 1))
    else:
        leader.handle(L.FollowerLost(0.0, 0, "restarted"))
        leader.handle(L.FollowerJoined(0.0, 0, 5))
    assert leader.stopped and leader.budget_reached() == budget_reached
    (run_dir / "leader").mkdir()
    (run_dir / "leader" / "snapshot.json").write_text(json.dumps(leader.snapshot()))
    return run_dir, leader


def test_only_a_run_that_reached_its_budget_is_finished_for_resume(tmp_path):
    run_dir, _ = _run_dir(tmp_path / "a", budget_reached=True)
    with pytest.raises(ValueError, match="already finished"):
        run.resumable(run_dir)
    run_dir, _ = _run_dir(tmp_path / "b", budget_reached=False)
    spec = run.resumable(run_dir)
    assert spec.run_dir == str(run_dir) and spec.leader != "127.0.0.1:1"  # fresh ports


def test_a_run_a_fault_stopped_exits_non_zero_with_the_reason(tmp_path, monkeypatch, capsys):
    run_dir, leader = _run_dir(tmp_path, budget_reached=False)
    seen = {}

    def fake_launch(spec, **kw):
        seen.update(kw)
        return run.finish(spec, 1.0, evaluate=False)

    monkeypatch.setattr(run, "launch", fake_launch)
    assert run.main(["--resume", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert f"stopped short of its budget: {leader.stop_reason}" in out
    assert f"dipsjax run --resume {run_dir}" in out
    assert seen == {
        "resume": True,
        "timeout": None,
        "external_learners": (),
    }  # no limit unless --timeout

    def gave_up(spec, **kw):
        raise RuntimeError("follower0 exited with code 1 after 3 restarts")

    monkeypatch.setattr(run, "launch", gave_up)
    assert run.main(["--resume", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "follower0 exited with code 1 after 3 restarts" in out
    assert f"dipsjax run --resume {run_dir}" in out


def test_the_outcome_of_a_run_that_reached_its_budget_is_zero(tmp_path, capsys):
    run_dir, _ = _run_dir(tmp_path, budget_reached=True)
    assert run.outcome(run_dir) == 0
    assert capsys.readouterr().out == ""


class _Proc:
    def __init__(self, rc):
        self.rc = rc

    def poll(self):
        return self.rc


def _healer(tmp_path, stopped, **rcs):
    run_dir = tmp_path / "run"
    (run_dir / "leader").mkdir(parents=True)
    (run_dir / "leader" / "snapshot.json").write_text(json.dumps({"stopped": stopped}))
    spec = types.SimpleNamespace(
        run_dir=str(run_dir),
        max_restarts=3,
        restart_backoff=0.0,
        move_followers=False,
        standby="",
        no_restart=(),
    )
    procs = types.SimpleNamespace(procs={n: _Proc(rc) for n, rc in rcs.items()}, logs=run_dir)
    healer = run.Healer(types.SimpleNamespace(spec=spec), procs, 0.0)
    started = []

    def start(name, *args):
        started.append((name, *args))
        procs.procs[name] = _Proc(None)  # running again

    healer.start = start
    return healer, started


def test_a_role_that_exits_while_the_job_runs_is_restarted_whatever_its_exit_code(tmp_path):
    """SIGTERM to a follower or the leader ends it with 0: before, it was never restarted
    (a follower: the job stalled; the leader: the launcher printed its table at 19% of
    the budget and exited 0). Once the job has stopped, a role that ends with 0 is done."""
    healer, started = _healer(tmp_path, False, leader=0, follower0=0, learner1=0)
    healer.check()  # noticed, and started again at once (no backoff)
    healer.check()
    assert sorted(started) == [
        ("follower0",),  # no checkpoint yet: it starts afresh (not --resume latest)
        ("leader", "--resume", "--alone"),
        ("learner1", "--incarnation", "1"),
    ]
    assert healer.count == {"leader": 1, "follower0": 1, "learner1": 1}
    healer, started = _healer(tmp_path / "b", True, leader=0, follower0=0, learner1=0)
    healer.check()
    healer.check()
    assert started == []
    assert healer.job_stopped()


def test_a_restarted_role_resumes_from_what_the_run_folder_holds(tmp_path):
    """One rule for a role's restart arguments, the entry's (``entry.start_args``): the
    leader from its snapshot, a follower from its newest checkpoint once it has one."""
    healer, _ = _healer(tmp_path, False)
    run_dir = tmp_path / "run"
    assert healer.args("leader") == ["--resume"]  # its snapshot is there
    # Restarted by itself (the launcher's healing): its peers are up, a short grace.
    assert healer.args("leader", restart=True) == ["--resume", "--alone"]
    assert healer.args("follower0") == []
    (run_dir / "follower0" / "ckpt" / "3").mkdir(parents=True)
    assert healer.args("follower0") == ["--resume", "latest"]
    healer.spec.move_followers = True
    assert healer.args("follower0") == ["--resume", "latest", "--port", "0"]


def test_the_local_launcher_and_a_cluster_count_one_learners_incarnations(tmp_path):
    """One store (``RUN_DIR/incarnations/``) and one rule (``entry.start_args``): a learner the
    local launcher restarted, then started by a cluster's machinery, continues the count;
    a run made from a snapshot starts its learners at the incarnation the snapshot gives.
    Before, the cluster counted its own starts from 0, so a learner of a run made from a
    snapshot joined as an incarnation older than the leader knew, and was refused."""
    from dipsjax.launch.entry import start_args

    healer, started = _healer(tmp_path, False, learner1=75)
    run_dir = tmp_path / "run"
    assert healer.args("learner1") == ["--incarnation", "0"]  # its first start
    healer.check()
    healer.check()
    assert started == [("learner1", "--incarnation", "1")]
    assert (run_dir / "incarnations" / "learner1").read_text() == "1"
    # A cluster's first start of it in this folder takes the recorded one, later ones count.
    assert start_args("learner", 1, run_dir) == ["--incarnation", "1"]
    assert start_args("learner", 1, run_dir) == ["--incarnation", "2"]
    assert healer.args("learner1") == ["--incarnation", "2"]  # the same store
    # Both give a follower and the leader the same arguments for the same folder.
    (run_dir / "follower0" / "ckpt" / "4").mkdir(parents=True)
    for name, role, index in (("leader", "leader", 0), ("follower0", "follower", 0)):
        assert healer.args(name) == start_args(role, index, run_dir)
    # A run made from a snapshot: its learners come back as the snapshot says.
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "incarnations.json").write_text(json.dumps({"learner0": 3}))
    assert start_args("learner", 0, snap) == ["--incarnation", "3"]


def test_a_role_failing_at_start_up_twice_with_the_same_error_stops_the_run_with_its_log(tmp_path):
    """Issue 19: a role a config error kills at start-up (the leader of ``sim.method=dp``,
    before ``dipsjax run`` refused it) was restarted until out of restarts, the launcher
    saying only "see its log". Now the second failure at start-up with the same last log
    line stops the run at once, the role's last log lines in the message; a failure with
    another error, or a death by a signal, is restarted as before."""
    import time

    healer, started = _healer(tmp_path, False, leader=1)
    log = tmp_path / "run" / "leader.log"
    error = "ValueError: method must be one of ('dips', 'decoupled'), got 'dp'"

    def dies(rc, last):
        with log.open("a") as fh:
            fh.write(f"2026-12-04 07:41:0{len(started)}.123 INFO leader: starting\n")
            fh.write(f"Traceback (most recent call last):\n  File x, line 1\n{last}\n")
        healer.procs.procs["leader"] = _Proc(rc)
        healer.started_at["leader"] = time.monotonic()

    dies(1, error)
    healer.check()  # the first failure: restarted (no backoff here)
    healer.check()
    assert started == [("leader", "--resume", "--alone")]
    dies(1, error)
    with pytest.raises(RuntimeError) as info:
        healer.check()
    message = str(info.value)
    assert "leader failed at start-up twice in a row with the same error (exit code 1)" in message
    assert error in message and "Traceback (most recent call last):" in message
    assert len(started) == 1  # not started a third time

    # Another error the second time, or a kill by a signal: restarted as before.
    healer, started = _healer(tmp_path / "b", False, leader=1)
    log = tmp_path / "b" / "run" / "leader.log"
    dies(1, error)
    healer.check()
    healer.check()
    dies(1, "OSError: [Errno 98] Address already in use")
    healer.check()
    healer.check()
    dies(-9, "OSError: [Errno 98] Address already in use")
    healer.check()
    healer.check()
    assert len(started) == 3


def test_the_console_line_shows_the_learners_phases_and_the_newest_validation(tmp_path):
    """Issue 19: while learners compile (30-70 s) the console said only ``version 0 round 0
    (idle)``; now it counts the learners by phase (their ``phase.json``), and shows the
    evaluator's newest point."""
    from dipsjax.runtime import progress

    run_dir = tmp_path / "run"
    spec = types.SimpleNamespace(
        run_dir=str(run_dir), sim=SimConfig(learners=4, followers=1, token_budget=1000)
    )
    run_dir.mkdir()
    line = run.console_line(spec, 3.0)  # nothing written yet: the leader is starting
    assert "leader starting" in line and "learners: 4 not started" in line
    for j, phase in enumerate(("compiling", "compiling", "starting")):
        progress.write_phase(run_dir, j, phase)
    assert "learners: 1 not started, 1 starting, 2 compiling" in run.console_line(spec, 9.0)
    (run_dir / "leader").mkdir()
    status = {
        "version": 3,
        "rounds": 4,
        "phase": "idle",
        "tokens": {"reported": 600, "rejected": 0},
        "budget": 1000,
        "learners": {"0": {"state": "training", "tokens": 300}},
    }
    (run_dir / "leader" / "status.json").write_text(json.dumps(status))
    for j in range(4):
        progress.write_phase(run_dir, j, "training" if j < 3 else "waiting")
    point = {"version": 2, "tokens": 400, "val_loss": 3.5, "val_bpb": 5.05, "t": 1.0}
    (run_dir / "eval.jsonl").write_text(json.dumps(point) + "\n")
    line = run.console_line(spec, 60.0)
    assert line.startswith("[  60.0s] version 3 round 4 (idle), tokens 600/1000")
    assert "| learners: 3 training, 1 waiting |" in line
    assert "val_loss 3.5000 (5.050 bpb) at version 2" in line and "L0: training 300 tok" in line


def test_runs_started_within_one_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """``dipsjax run`` names its folder by the second it started; a second run in that
    second got the first's folder and died on its credentials (the CI rehearsal saw it)."""
    monkeypatch.setattr(run.time, "strftime", lambda fmt: "20261204-080000")
    first = run.new_run_dir(tmp_path, "quickstart")
    first.mkdir()
    second = run.new_run_dir(tmp_path, "quickstart")
    second.mkdir()
    assert (first.name, second.name) == (
        "quickstart-20261204-080000",
        "quickstart-20261204-080000-2",
    )
    assert run.new_run_dir(tmp_path, "quickstart").name.endswith("-3")
