"""The learner process hands a refused push's kind to its protocol, which decides: a push
a follower refused as not finite (``refuse_nonfinite``) leaves at once, without asking the
leader which followers are up (the link is fine; the push is not)."""

import collections
import types

import pytest

from dipsjax.runtime.learner import LearnerNode
from dipsjax.syncer import messages as m
from dipsjax.syncer.learner import LearnerProtocol
from dipsjax.transport.dataplane import TransferError

J = 2


def _node(error):
    proto = LearnerProtocol(J)
    proto.start(0.0)
    proto.on_action(m.SendModel(J, 0), 0.5)
    proto.on_pulled(0, 1.0)
    proto.on_trained(m.PushMeta(tokens=100, steps=4, base_version=0), 2.0)
    plan = m.PushShards(0, J, (m.Transfer(0, 0, 0), m.Transfer(1, 1, 0)))
    assert proto.on_action(plan, 2.0) == [m.Push(plan)]

    def push(plan, delta, base):
        raise error

    def followers_up():
        pytest.fail("the leader was asked which followers are up")

    node = types.SimpleNamespace(
        j=J,
        proto=proto,
        deltas=collections.deque([(0, {})]),
        now=lambda: 9.0,
        push=push,
        _followers_up=followers_up,
    )
    return node, plan


def test_a_push_refused_as_not_finite_leaves_and_exits_for_a_new_incarnation():
    node, plan = _node(TransferError("holds NaN", refused=True, kind="nonfinite"))
    assert LearnerNode._push(node, plan) == [
        m.Send(m.Leave(9.0, J)),
        m.Exit(m.ExitCode.EVICTED, "round 0: push refused as not finite"),
    ]


def test_a_push_refused_as_a_replay_waits_for_the_rounds_pull():
    node, plan = _node(TransferError("round 0 has ended", refused=True, kind="replayed"))
    assert LearnerNode._push(node, plan) == []
    assert node.proto.on_action(m.NotifyPull(0, (J,), 1), 10.0) == [m.Pull(1)]
