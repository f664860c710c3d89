"""``dipsjax status``: a running job's view, read through the authenticated control plane
of a real leader process."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dipsjax.launch.run import make_spec
from dipsjax.runtime import credentials
from dipsjax.runtime import status as status_cmd
from dipsjax.runtime.client import ControlClient
from dipsjax.sim.config import SimConfig
from dipsjax.syncer import messages as m

pytestmark = [pytest.mark.integration]


@pytest.fixture
def run(tmp_path):
    """A real leader of a 2-learner, 1-follower job: ``(run_dir, spec)``."""
    run_dir = tmp_path / "run"
    spec = make_spec(SimConfig(learners=2, followers=1, token_budget=10_000), run_dir)
    spec.write(run_dir / "spec.json")
    cmd = [sys.executable, "-m", "dipsjax.runtime.leader", str(run_dir / "spec.json")]
    proc = subprocess.Popen(cmd, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    yield run_dir, spec
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def _drive_one_round(spec):
    """Learner 0 joins, pulls, pushes 6144 tokens; follower 0 carries the round out."""
    learner = ControlClient(spec, learner=0)
    follower = ControlClient(spec, follower=0)
    follower.call(m.FollowerJoined(0.0, 0, 0, address=spec.followers[0]), timeout=30)
    assert learner.call(m.Join(0.0, 0, fingerprint=spec.fingerprint), timeout=30) == []
    learner.call(m.PullDone(0.0, 0, 0))
    learner.call(m.PushRequested(0.0, 0, m.PushMeta(6144, 12, 0, train_seconds=1.0)))
    learner.call(m.TransferDone(0.0, 0, 0))
    follower.call(m.FollowerNorms(0.0, 0, 0, (1.0,)))
    follower.call(m.FollowerMerged(0.0, 0, 0, 0.5))
    follower.call(m.FollowerApplied(0.0, 0, 0, 1))
    learner.call(m.PullDone(0.0, 0, 1))
    # A second push opens round 1, still collecting.
    learner.call(m.PushRequested(0.0, 0, m.PushMeta(100, 1, 1, train_seconds=1.0)))
    for c in (learner, follower):
        c.close()


def test_status_shows_members_versions_rounds_phases_books_and_refusals(run, capsys):
    run_dir, spec = run
    _drive_one_round(spec)
    assert status_cmd.main([str(run_dir), "--json", "--timeout", "30"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["version"] == 1 and st["members"] == [0] and st["followers_up"] == [0]
    assert st["learners"]["0"]["tokens"] == 6144 + 100
    books = st["tokens"]
    assert books["applied"] == 6144 and books["rejected"] == books["dropped"] == 0
    assert books["reported"] == 6144 + 100  # the second push is in flight
    assert st["round"]["id"] == 1 and st["round"]["pushes"] == [0]
    last = st["last_round"]
    assert last["id"] == 0 and last["applied"] and last["participants"] == 1
    assert set(last["phases"]) == {"grace", "push", "update", "pull"}
    assert all(x is not None and x >= 0 for x in last["phases"].values())
    assert st["tokens_per_s"] > 0
    # The rendered view says the same.
    assert status_cmd.main([str(run_dir), "--once", "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "version 1" in out and "round 1 (" in out and "pushes from [0]" in out
    assert "last round 0 (applied, 1 pushes)" in out and "6244" in out


def test_status_shows_each_learners_phase_and_the_newest_validation(run, capsys):
    """Issue 19: besides the leader's view, the learners' phase files (a learner that is
    compiling is no member yet) and the evaluator's ``eval.jsonl``."""
    from dipsjax.runtime import progress

    run_dir, spec = run
    _drive_one_round(spec)
    progress.write_phase(run_dir, 0, "training")
    progress.write_phase(run_dir, 1, "compiling")
    point = {"version": 1, "tokens": 6144, "val_loss": 3.21, "val_bpb": 4.631, "t": 2.0}
    point["val_accuracy"] = 0.4375  # a task's own figure (its eval_metrics)
    (run_dir / progress.EVAL_FILE).write_text(json.dumps(point) + "\n" + '{"version": 2, "va')
    assert status_cmd.main([str(run_dir), "--json", "--timeout", "30"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["validation"] == [point]  # the line still being written is left out
    assert st["phases"] == {"0": "training", "1": "compiling"}
    assert status_cmd.main([str(run_dir), "--once", "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "validation: val_loss 3.2100, val_bpb 4.631, val_accuracy 0.4375 at version 1" in out
    assert "compiling" in out and "training" in out


def test_status_needs_the_jobs_credentials_and_a_running_leader(run, tmp_path, capsys):
    run_dir, spec = run
    other = credentials.create(tmp_path / "other")
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    dataclasses.replace(spec, credentials=other.directory).write(stranger / "spec.json")
    assert status_cmd.main([str(stranger), "--once", "--timeout", "3"]) == 1
    assert "no leader answered" in capsys.readouterr().err
    stolen = tmp_path / "stolen"
    (stolen / "creds").mkdir(parents=True)
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (stolen / "creds" / name).write_bytes((run_dir / "credentials" / name).read_bytes())
    (stolen / "creds" / "token").write_text("f" * 64)
    (stolen / "creds").chmod(0o700)
    for name in ("key.pem", "token"):  # as a careless copy leaves them
        (stolen / "creds" / name).chmod(0o644)
    dataclasses.replace(spec, credentials=str(stolen / "creds")).write(stolen / "spec.json")
    assert status_cmd.main([str(stolen), "--once"]) == 1  # named, not a traceback
    assert "chmod 600" in capsys.readouterr().err  # a loose key or token is refused
    for name in ("key.pem", "token"):
        (stolen / "creds" / name).chmod(0o600)
    assert status_cmd.main([str(stolen), "--once", "--timeout", "30"]) == 1
    assert "refused the job credential" in capsys.readouterr().err
    assert status_cmd.main([str(tmp_path), "--once"]) == 1
    assert "no spec.json" in capsys.readouterr().err


def test_the_files_others_read_while_the_leader_runs_are_replaced_whole(run):
    """``status.json`` and ``snapshot.json`` are read while the leader writes them (the
    launcher, ``dipsjax status``, the fault tests): each write must replace the file whole
    (a new inode), never truncate and refill it in place, where a reader in between reads
    an empty or half file (a CI run failed on an empty ``status.json``)."""
    run_dir, spec = run
    client = ControlClient(spec, follower=0)
    client.call(m.FollowerJoined(0.0, 0, 0, address=spec.followers[0]), timeout=30)
    names = ("status.json", "snapshot.json")
    before = {n: os.stat(run_dir / "leader" / n).st_ino for n in names}
    learner = ControlClient(spec, learner=0)
    assert learner.call(m.Join(0.0, 0, fingerprint=spec.fingerprint), timeout=30) == []
    after = {n: os.stat(run_dir / "leader" / n).st_ino for n in names}
    for c in (learner, client):
        c.close()
    assert all(before[n] != after[n] for n in names), (before, after)
    assert not list((run_dir / "leader").glob("*.tmp"))


def test_status_tries_again_when_the_leader_is_momentarily_unavailable(tmp_path):
    """A status call that meets a connection broken a moment before (a restarted leader:
    "Stream removed", UNAVAILABLE) is tried again within its timeout: ``Status`` only
    reads, so a retry is always safe. Stop 27's CI failed on this race."""
    from concurrent import futures

    import grpc

    from dipsjax.transport.proto import syncer_pb2, syncer_pb2_grpc

    calls = []

    class Flaky(syncer_pb2_grpc.SyncerServicer):
        def Status(self, request, context):
            calls.append(1)
            if len(calls) < 3:
                context.abort(grpc.StatusCode.UNAVAILABLE, "Stream removed")
            return syncer_pb2.StatusReply(json=json.dumps({"version": 7}))

    server = grpc.server(futures.ThreadPoolExecutor(2))
    syncer_pb2_grpc.add_SyncerServicer_to_server(Flaky(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        spec = make_spec(SimConfig(learners=1, followers=1, token_budget=1000), tmp_path / "run")
        spec = dataclasses.replace(spec, leader=f"127.0.0.1:{port}", tls=False)
        client = ControlClient(spec, learner=0)
        assert client.status(timeout=20) == {"version": 7}
        assert len(calls) == 3
        client.close()
    finally:
        server.stop(0)


def test_status_names_the_active_leader_and_the_age_of_its_lease(tmp_path, capsys):
    """With a standby (issue 22): which leader is active (epoch, address, process) and how
    long ago its lease was renewed; after the active one is killed, the standby that took
    over, asked at the same two addresses."""
    from dipsjax.launch.run import free_port
    from dipsjax.runtime import lease

    run_dir = tmp_path / "run"
    spec = make_spec(SimConfig(learners=1, followers=1, token_budget=10_000), run_dir)
    spec = dataclasses.replace(spec, standby=f"127.0.0.1:{free_port()}", leader_lease=1.0)
    spec.write(run_dir / "spec.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    base = [sys.executable, "-m", "dipsjax.runtime.leader", str(run_dir / "spec.json")]
    first = subprocess.Popen(base, env=env)
    second = subprocess.Popen([*base, "--standby", "--listen-on", "standby"], env=env)
    try:
        assert status_cmd.main([str(run_dir), "--json", "--timeout", "30"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["leader"]["epoch"] == 1 and st["leader"]["address"] == spec.leader
        assert st["leader"]["standby"] == spec.standby
        assert st["lease"]["epoch"] == 1 and 0 <= st["lease"]["age"] < 1.0
        assert status_cmd.main([str(run_dir), "--once", "--timeout", "30"]) == 0
        out = capsys.readouterr().out
        assert f"leader: epoch 1 at {spec.leader}" in out and "lease renewed" in out
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        deadline = time.monotonic() + 30
        while lease.newest_epoch(run_dir) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status_cmd.main([str(run_dir), "--json", "--timeout", "30"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["leader"]["epoch"] == 2 and st["leader"]["address"] == spec.standby
        assert "standby@" in st["leader"]["holder"] and st["lease"]["epoch"] == 2
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
