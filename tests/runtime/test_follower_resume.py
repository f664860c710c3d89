"""A follower process restarted before its first checkpoint (issue 17 item 2)."""

import subprocess
import sys
import time

import pytest

from dipsjax.launch.run import make_spec
from dipsjax.sim.config import SimConfig

pytestmark = [pytest.mark.integration]


def test_resume_latest_before_the_first_checkpoint_starts_at_version_zero(tmp_path):
    """Bug: killed during the learners' compilation, before its first checkpoint, the
    follower's restart ``--resume latest`` crashed ("no checkpoint with any step"), was
    restarted 3 times, and the run failed. Now it starts at version 0, says so, writes
    that checkpoint and waits for the leader (none here); SIGTERM ends it cleanly."""
    run = tmp_path / "run"
    spec = make_spec(SimConfig(learners=2, followers=1), run)
    spec.write(run / "spec.json")
    log = (tmp_path / "follower.log").open("w")
    cmd = [sys.executable, "-m", "dipsjax.runtime.follower", str(run / "spec.json"), "0"]
    proc = subprocess.Popen(
        [*cmd, "--resume", "latest", "--port", "0"], stdout=log, stderr=subprocess.STDOUT
    )
    step0 = run / "follower0" / "ckpt" / "0"
    deadline = time.monotonic() + 180
    try:
        while not step0.is_dir() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        out = (tmp_path / "follower.log").read_text()
        assert proc.poll() is None, f"the follower ended (rc {proc.returncode}):\n{out[-2000:]}"
        assert step0.is_dir(), out[-2000:]
        assert "follower0: no checkpoint to resume from in" in out
        assert "starting at version 0" in out
    finally:
        proc.terminate()
        rc = proc.wait(60)
    assert rc == 0
