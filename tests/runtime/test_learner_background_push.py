"""Issue 21: an overlapping learner's push streams in a thread beside its next round, and
reports its end to the protocol itself: ``TransferDone`` goes out while the main thread
trains (it lets go of the protocol's lock only then), not when that round ends. What comes
back goes to the main thread's queue, as the watch stream's does, where the pump takes it
while the round trains: the round's ``NotifyPull`` starts its background pull at once.

The driver's own methods on a real protocol core; the transfer and the control channel are
recorded stand-ins (the real ones run in ``test_local_run``'s overlapping run)."""

import collections
import queue
import threading
import types

import grpc
import pytest

from dipsjax.runtime.learner import LeaderLost, LearnerNode
from dipsjax.syncer import messages as m
from dipsjax.syncer.learner import LearnerProtocol

J = 1


class Control:
    def __init__(self, reply=(), error=None):
        self.calls, self.reply, self.error = [], list(reply), error
        self.called = threading.Event()

    def call(self, event):
        self.calls.append((event, threading.current_thread().name))
        self.called.set()
        if self.error is not None:
            raise self.error
        return self.reply


class Error(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


def _node(control):
    proto = LearnerProtocol(J, overlap=True)
    proto.start(0.0)
    proto.on_action(m.SendModel(J, 3), 0.5)
    proto.on_pulled(3, 1.0)
    proto.on_trained(m.PushMeta(tokens=100, steps=4, base_version=3), 2.0)
    plan = m.PushShards(0, J, (m.Transfer(0, 0, 0),))
    commands = proto.on_action(plan, 2.0)
    assert commands == [m.Push(plan), m.Train(adopt=True)]
    node = object.__new__(LearnerNode)
    sent = threading.Event()  # the transfer waits for it: a push still streaming
    pushed = []

    def push(plan, flat, base):
        sent.wait(10)
        pushed.append((plan.round_id, flat, base))

    node.__dict__.update(
        j=J,
        proto=proto,
        spec=types.SimpleNamespace(sim=types.SimpleNamespace(overlap=True)),
        learner=types.SimpleNamespace(version=3),
        delta={"w": 1.0},
        encoded=lambda round_id, delta: {("w",): delta["w"]},
        push=push,
        control=control,
        inputs=queue.Queue(),
        notices=queue.Queue(),
        stash=collections.deque(),
        deferred=collections.deque(),
        pump=None,
        lock=threading.Lock(),
        holder=None,
        pusher=None,
        generation=0,
        terminating=False,
        now=lambda: 9.0,
        _phase=None,
        phase=lambda name: None,
    )
    return node, plan, sent, pushed


def test_transfer_done_goes_out_while_the_main_thread_trains_not_after():
    control = Control(reply=[m.NotifyPull(0, (J,), 4)])
    node, plan, sent, pushed = _node(control)
    with node.locked():  # the main thread carries out the plan's Push: it returns at once
        assert node._one(m.Push(plan)) == []
        node.learner.version = 4  # the next round start takes a newer version
        sent.set()  # the transfer ends while the main thread still holds the protocol ...
        assert not control.called.wait(0.3)  # ... so nothing is reported yet
        with node.training():  # the round trains: the push thread reports now ...
            assert control.called.wait(10)
            # ... and the pump takes the reply, the round's NotifyPull: its pull starts.
            assert node.notices.get(timeout=10) == 4
        assert control.calls == [(m.TransferDone(9.0, J, 0, 0), "push")]
    node.pusher.join(10)
    assert pushed == [(0, {("w",): 1.0}, 3)]  # the base the round trained from
    assert node.inputs.empty() and not node.stash and not node.deferred


def test_what_may_not_run_beside_a_round_waits_for_the_main_thread():
    """The pump carries out control calls, background pulls, settles and exits; the first
    command of any other kind, and every one after it, waits for the main thread; a lost
    leader is stashed for it (the rejoin restores and pulls: the round's compute)."""
    node, _, _, _ = _node(Control(error=Error()))
    node.inputs.put(("action", m.NotifyPull(0, (J,), 4), 0))
    node.inputs.put(("lost", LeaderLost("watch ended", 0)))
    node.inputs.put(("action", m.Stop("budget"), 0))
    with node.locked(), node.training():
        assert node.notices.get(timeout=10) == 4
        while not node.stash:
            threading.Event().wait(0.01)
    assert len(node.stash) == 1 and node.stash[0][0] == "lost"
    assert str(node.stash[0][1]) == "watch ended"
    assert node.inputs.get_nowait()[1] == m.Stop("budget")  # untouched, for the main thread
    assert node._beside(m.Send(m.PullDone(1.0, J, 4))) and node._beside(m.Pull(4, background=True))
    for c in (
        m.Pull(4),
        m.Train(),
        m.Push(m.PushShards(1, J, ())),
        m.Send(m.PushRequested(1.0, J, None)),
    ):
        assert not node._beside(c), c
    node.pump = threading.get_ident()  # as if on the pump: defers from the first such
    node.execute([m.Pull(5), m.Exit(m.ExitCode.OK, "x")])
    assert list(node.deferred) == [m.Pull(5), m.Exit(m.ExitCode.OK, "x")]


def test_a_lost_leader_on_the_report_is_the_main_thread_s_to_handle():
    node, plan, sent, _ = _node(Control(error=Error()))
    sent.set()
    with node.locked():
        node._one(m.Push(plan))
    node.pusher.join(10)
    kind, lost = node.inputs.get_nowait()
    assert kind == "lost" and isinstance(lost, LeaderLost) and lost.generation == 0
    assert "TransferDone" in str(lost)


def test_a_bug_in_the_push_thread_is_raised_by_the_main_thread():
    node, plan, _, _ = _node(Control())
    node.push = lambda *a: (_ for _ in ()).throw(KeyError("no such layer"))
    with node.locked():
        node._one(m.Push(plan))
    node.pusher.join(10)
    item = node.inputs.get_nowait()
    assert item[0] == "failed"
    with pytest.raises(KeyError, match="no such layer"):
        node._input(item)
