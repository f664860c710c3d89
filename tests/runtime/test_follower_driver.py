"""The follower process's driver carries out the core's commands in order, deciding
nothing: a Save is on disk before the report, and one that fails ends the process
non-zero with the report unsent."""

import types

import pytest

from dipsjax.runtime.follower import FollowerNode
from dipsjax.syncer import messages as m


class _Disk:
    def __init__(self, fail=None):
        self.fail, self.log = fail, []

    def save(self, step, state, meta):
        if self.fail:
            raise self.fail
        self.log.append(("save", step, meta["version"]))

    def wait(self):
        self.log.append(("wait",))


def _node(disk):
    sent = []
    node = types.SimpleNamespace(
        k=1,
        spec=types.SimpleNamespace(checkpoints=True),
        ckpt=disk,
        control=types.SimpleNamespace(call=lambda ev: sent.append(ev) or disk.log.append("send")),
        follower=types.SimpleNamespace(
            state=types.SimpleNamespace(version=3, params={}, opt_state=()),
            ended_rounds=lambda: [[0, 1]],
            last_applied=("decide", "apply"),
        ),
        exit_code=0,
    )
    node._save_version = lambda v: FollowerNode._save_version(node, v)
    node._after_apply = lambda *a: disk.log.append(("after", *a))
    return node, sent


APPLIED = [m.Save("version", 2, 3), m.Send(m.FollowerApplied(1.0, 1, 2, 3))]


def test_the_save_is_on_disk_before_the_report_and_the_bookkeeping_comes_last():
    disk = _Disk()
    node, sent = _node(disk)
    assert FollowerNode.carry_out(node, APPLIED, 0.25) is True
    assert disk.log == [("save", 3, 3), ("wait",), "send", ("after", "decide", "apply", 3, 0.25)]
    assert sent == [m.FollowerApplied(1.0, 1, 2, 3)]


def test_a_failed_save_exits_non_zero_without_reporting_the_step():
    node, sent = _node(_Disk(fail=OSError("No space left on device")))
    with pytest.raises(SystemExit) as e:
        FollowerNode.carry_out(node, APPLIED)
    assert "checkpoint of version 3 failed, not reporting it" in str(e.value.code)
    assert sent == []


def test_exit_ends_the_serving_loop_with_its_code():
    node, sent = _node(_Disk())
    stop = [m.Exit(m.ExitCode.OK, "budget reached"), m.Send(m.FollowerHeartbeat(0.0, 1))]
    assert FollowerNode.carry_out(node, stop) is False
    assert node.exit_code == 0 and sent == []
