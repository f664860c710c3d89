"""The control plane lets in only the job's credential holders (a real leader process)."""

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dipsjax.runtime.client import ControlClient
from dipsjax.runtime.run import make_spec
from dipsjax.sim.config import SimConfig
from dipsjax.syncer import messages as m

pytestmark = [pytest.mark.integration]


@pytest.fixture
def leader(tmp_path):
    spec = make_spec(SimConfig(learners=2, followers=1), tmp_path / "run")
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    spec.write(tmp_path / "run" / "spec.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "dipsjax.runtime.leader", str(tmp_path / "run" / "spec.json")]
    proc = subprocess.Popen(cmd, env=env)
    yield spec
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def test_a_client_without_the_job_credential_can_neither_join_nor_watch_nor_beat(leader):
    spec = leader
    outsider = ControlClient(dataclasses.replace(spec, token="not-the-job-token"), learner=0)
    for event in (m.Join(0.0, 0), m.Heartbeat(0.0, 0), m.ChunkRequested(0.0, 0)):
        with pytest.raises(grpc.RpcError) as e:
            outsider.call(event, timeout=20)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        next(iter(outsider.watch()))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert spec.token not in str(e.value)  # the secret is never echoed
    # The leader's state did not change: the real learner 0 joins as the first one.
    member = ControlClient(spec, learner=0)
    assert member.call(m.Join(0.0, 0), timeout=20) == []
    actions = member.watch()
    assert isinstance(next(iter(actions)), m.SendModel)
    tape = Path(spec.run_dir) / "tape.jsonl"
    joins = [x for x in tape.read_text().splitlines() if '"join"' in x]
    assert len(joins) == 1
    outsider.close()
    member.close()
