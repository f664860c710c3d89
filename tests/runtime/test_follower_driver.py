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


def _inputs_node(tmp_path, follower):
    node = types.SimpleNamespace(
        k=1, spec=types.SimpleNamespace(checkpoints=True, run_dir=str(tmp_path)), follower=follower
    )
    node.inputs_path = FollowerNode.inputs_path.fget(node)
    return node


def test_a_decided_rounds_inputs_round_trip_through_the_disk_bit_for_bit(tmp_path):
    """``Save("inputs")`` writes the round's BF16 batch and Decide whole (no temporary file
    left); a process restarted at the same version reads them back into its core, which
    then holds the round (and lists it when it joins), with the same bits."""
    import jax.numpy as jnp
    import numpy as np

    from dipsjax import outer
    from dipsjax.syncer import Follower

    def core():
        return Follower(1, {"w": np.zeros((2, 3), np.float32)}, outer.diloco(), capacity=2)

    f = core()
    f.receive(4, 0, {"w": jnp.full((2, 3), 0.3, jnp.bfloat16)})
    f.receive(4, 1, {"w": jnp.full((2, 3), -1.7, jnp.bfloat16)})
    f.partial_norms(4, (0, 1), (0, 0))
    d = m.Decide(4, (0, 1), (True, False), (5, 6), (2, 2), (1.0, 0.0), (0.1, 0.2))
    f.merged_partial(d)
    node = _inputs_node(tmp_path, f)
    FollowerNode._save_inputs(node, 4, 0)
    assert [p.name for p in tmp_path.glob("follower1/*")] == ["inputs"]  # not a shard file
    assert [p.name for p in tmp_path.glob("follower1/inputs/*")] == ["decided.npz"]
    again = core()
    FollowerNode._restore_inputs(_inputs_node(tmp_path, again))
    assert again.decided_rounds() == (4,)
    got_d, got = again.round_inputs(4)
    assert got_d == d
    want = f.round_inputs(4)[1]["w"]
    assert got["w"].dtype == jnp.bfloat16 and want.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(got["w"]).view(np.uint16), np.asarray(want).view(np.uint16)
    )


def test_a_failed_inputs_save_exits_non_zero_without_reporting_the_merge(tmp_path):
    node = _inputs_node(tmp_path, None)
    node.follower = types.SimpleNamespace(
        round_inputs=lambda r: (m.Decide(r, (), (), (), (), (), ()), {})
    )
    (tmp_path / "follower1").write_text("not a folder")  # the write fails
    with pytest.raises(SystemExit) as e:
        FollowerNode._save_inputs(node, 2, 0)
    assert "saving the inputs of round 2 failed, not reporting its merge" in str(e.value.code)
