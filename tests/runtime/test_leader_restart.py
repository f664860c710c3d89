"""A leader process restarted (``--resume``) after it persisted the job's final ``Stop``
(a real leader process)."""

import os
import subprocess
import sys
import time

import pytest

from dipsjax.launch.run import free_port
from dipsjax.runtime import credentials
from dipsjax.runtime.client import ControlClient
from dipsjax.runtime.leader import LeaderNode
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig
from dipsjax.syncer import messages as m
from dipsjax.transport import control_codec as codec
from dipsjax.transport.proto import syncer_pb2

pytestmark = [pytest.mark.integration]


def _stopped_run(run_dir):
    """A run whose leader reached its budget and persisted that (then died)."""
    sim = SimConfig(learners=1, followers=1, token_budget=100)
    creds = credentials.create(run_dir / "credentials").directory
    port = free_port()
    spec = RunSpec(
        sim, f"127.0.0.1:{port}", (f"127.0.0.1:{port + 1}",), creds, str(run_dir), (0,), 4
    )
    spec.write(run_dir / "spec.json")
    node = LeaderNode(spec)
    ld = node.leader
    for ev in (
        m.FollowerJoined(0.0, 0, 0),
        m.Join(0.0, 0),
        m.PullDone(0.0, 0, 0),
        m.PushRequested(0.0, 0, m.PushMeta(200, 1, 0)),
        m.TransferDone(0.0, 0, 0),
        m.FollowerNorms(0.0, 0, 0, (1.0,)),
        m.FollowerMerged(0.0, 0, 0, 0.5),
        m.FollowerApplied(0.0, 0, 0, 1),
    ):
        ld.handle(ev)
    assert ld.handle(m.PullDone(0.1, 0, 1)) == [m.Stop("token budget 100 reached")]
    node._persist()
    return spec


def _first_action(client, timeout=15.0):
    """The first action the leader routes to ``client``'s watch (fails after ``timeout``)."""
    req = syncer_pb2.WatchRequest(**client.peer)
    stream = client.stub.Watch(req, timeout=timeout, wait_for_ready=True, metadata=client.metadata)
    return codec.from_proto(next(iter(stream)))


def test_a_leader_restarted_after_the_final_stop_tells_whoever_watches_and_exits(tmp_path):
    """Before, it served forever (the launcher waited 30 minutes for a run that had reached
    its budget): now it delivers the ``Stop`` to whoever watches, for a short while, and
    exits 0."""
    run_dir = tmp_path / "run"
    spec = _stopped_run(run_dir)
    cmd = [sys.executable, "-m", "dipsjax.runtime.leader", str(run_dir / "spec.json"), "--resume"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        follower = ControlClient(spec, follower=0)
        assert _first_action(follower) == m.Stop("token budget 100 reached")
        learner = ControlClient(spec, learner=0)
        assert _first_action(learner) == m.Stop("token budget 100 reached")
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.monotonic() - t0 < 20


def test_no_action_leaves_before_the_state_that_made_it_is_on_disk(tmp_path, monkeypatch):
    """The leader persists, then routes (a review found routing first: a snapshot write that
    failed after an ``Apply`` was queued left followers applying a round the restarted
    leader did not know it had sent). Each routed action finds the snapshot already
    holding the event that made it; a leader that cannot persist routes nothing."""
    import json

    sim = SimConfig(learners=1, followers=1, token_budget=10_000)
    creds = credentials.create(tmp_path / "credentials").directory
    port = free_port()
    spec = RunSpec(
        sim, f"127.0.0.1:{port}", (f"127.0.0.1:{port + 1}",), creds, str(tmp_path), (0,), 4
    )
    node = LeaderNode(spec)
    seen = []

    def route(who, action):
        snap = json.loads((tmp_path / "leader" / "snapshot.json").read_text())
        seen.append((type(action).__name__, len(snap["members"]) > 0))

    monkeypatch.setattr(node, "_route", route)
    node.handle(m.FollowerJoined(0.0, 0, 0))
    node.handle(m.Join(0.0, 0))  # SendModel: routed once the snapshot has the member
    assert ("SendModel", True) in seen and ("SendModel", False) not in seen
    seen.clear()

    def full_disk():
        raise OSError(28, "No space left on device")

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(node, "_persist", full_disk)
    monkeypatch.setattr(os, "_exit", exit_now)
    node.leader.handle(m.Leave(0.0, 0))
    with pytest.raises(SystemExit) as e:
        node.handle(m.Join(0.0, 0))  # would send a SendModel
    assert e.value.code != 0 and seen == []
