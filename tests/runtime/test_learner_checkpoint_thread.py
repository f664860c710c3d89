"""The learner process writes its checkpoints from a thread of its own (the host copy is
taken first, so the next round may reuse the device buffers): a round start's checkpoint is
off the round's path, a pushed round's is on disk before ``save`` returns (its
``TransferDone`` comes next), and a write that failed is said, not lost."""

import concurrent.futures
import types

import numpy as np
import pytest

from dipsjax.runtime.checkpoint import Checkpoints
from dipsjax.runtime.learner import LearnerNode
from dipsjax.syncer import messages as m


def _node(tmp_path, state):
    node = types.SimpleNamespace(
        rounds=3,
        learner=types.SimpleNamespace(version=7),
        stream=types.SimpleNamespace(position=types.SimpleNamespace(to_dict=lambda: {"c": 1})),
        trained={"tokens": 123},
        compute=types.SimpleNamespace(call=lambda name: state),
        feedback=None,
        ckpt=Checkpoints(tmp_path / "ckpt"),
        saver=concurrent.futures.ThreadPoolExecutor(1),
        saving=None,
        save_error=None,
    )
    node._write = lambda *a: LearnerNode._write(node, *a)
    node.saved_wait = lambda: LearnerNode.saved_wait(node)
    return node


def test_a_pushed_checkpoint_is_on_disk_when_save_returns_and_holds_the_state_saved(tmp_path):
    state = {"mu": np.arange(6, dtype=np.float32), "nu": np.ones((2, 3), np.float32)}
    node = _node(tmp_path, state)
    LearnerNode.save(node, m.Save("start", -1, 7, 6))
    state["mu"][:] = -1  # the next round reuses the buffers: the checkpoint has a copy
    LearnerNode.save(node, m.Save("pushed", 2, 7, 7))
    on_disk = Checkpoints(tmp_path / "ckpt")  # another reader: only what is on disk
    assert on_disk.steps() == [6, 7]
    got, meta = on_disk.restore({"mu": np.zeros(6, np.float32), "nu": np.zeros((2, 3))}, 6)
    np.testing.assert_array_equal(got["mu"], np.arange(6, dtype=np.float32))
    assert meta == {
        "kind": "start",
        "rounds": 3,
        "round_id": -1,
        "version": 7,
        "position": {"c": 1},
        "tokens": 123,
        "spans": [],
    }
    node.saver.shutdown()


def test_a_failed_write_is_raised_by_the_next_save_or_the_wait(tmp_path):
    node = _node(tmp_path, {"mu": np.zeros(2, np.float32)})

    def broken(*a, **k):
        raise OSError("disk full")

    node.ckpt.save = broken
    LearnerNode.save(node, m.Save("start", -1, 0, 0))  # off the path: no error yet
    with pytest.raises(OSError, match="disk full"):
        LearnerNode.saved_wait(node)
    with pytest.raises(OSError, match="disk full"):
        LearnerNode.save(node, m.Save("pushed", 0, 0, 1))  # a pushed one waits: raised
    node.saver.shutdown()
