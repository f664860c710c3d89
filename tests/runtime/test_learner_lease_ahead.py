"""The learner process leases the next round's chunks while a round trains, so a round
start does not wait for the control plane; a restart's regrant comes first, and a failed
lease is left to the round start (which leases what it lacks itself)."""

import collections
import types

import grpc

from dipsjax.runtime.learner import LearnerNode
from dipsjax.syncer.learner import State


class _Unavailable(grpc.RpcError):
    pass


def _node(grants, inner_steps=8, state=State.TRAINING, told=0):
    calls = []

    def lease():
        calls.append(len(calls))
        g = grants.pop(0) if grants else None
        if isinstance(g, Exception):
            raise g
        return g

    node = types.SimpleNamespace(
        stream=object(),
        terminating=False,
        proto=types.SimpleNamespace(state=state, steps=told),
        spec=types.SimpleNamespace(sim=types.SimpleNamespace(inner_steps=inner_steps)),
        ahead=collections.deque(),
        regrant=[],
        lease=lease,
    )
    return node, calls


def test_leases_one_rounds_batches_ahead_and_the_round_start_takes_them_in_lease_order():
    pieces = [(3, 0, 4), (5, 0, 3), (9, 2, 4), (11, 0, 4)]
    node, calls = _node(list(pieces))
    LearnerNode._lease_ahead(node)
    assert list(node.ahead) == pieces[:3]  # 4 + 3 + 2 = 9 >= 8 batches: no more
    assert len(calls) == 3
    LearnerNode._lease_ahead(node)  # enough held: no call
    assert len(calls) == 3
    node.regrant = [(1, 2, 4)]  # a restart's pieces first, then those leased ahead
    got = [LearnerNode.next_chunk(node) for _ in range(5)]
    assert got == [(1, 2, 4), *pieces]  # the last one leased at the round start
    assert len(calls) == 4


def test_stops_when_no_chunk_is_left_or_a_lease_fails_and_only_while_training():
    node, calls = _node([(3, 0, 4), None, (5, 0, 4)])
    LearnerNode._lease_ahead(node)
    assert list(node.ahead) == [(3, 0, 4)] and len(calls) == 2
    node, calls = _node([(3, 0, 4), _Unavailable(), (5, 0, 4)])
    LearnerNode._lease_ahead(node)
    assert list(node.ahead) == [(3, 0, 4)] and len(calls) == 2
    for state in (State.JOINING, State.HOLDING, State.EXITED):
        node, calls = _node([(3, 0, 4)], state=state)
        LearnerNode._lease_ahead(node)
        assert not node.ahead and not calls
    node, calls = _node([(3, 0, 4)])
    node.stream = None  # a contributor's node: the user reads their own data
    LearnerNode._lease_ahead(node)
    assert not calls


def test_a_round_a_rejoin_ended_leases_nothing_more():
    """A round still drawing its batches when a rejoin began: a piece leased then would be
    missing from the rejoin's list of leases, and never trained."""
    node, calls = _node([(3, 0, 4)], state=State.JOINING)
    node.ahead.append((5, 0, 4))
    assert LearnerNode.next_chunk(node) is None
    assert not calls and list(node.ahead) == [(5, 0, 4)]


def test_leases_ahead_the_steps_the_leader_told_it():
    """Adaptive steps (EXTENSION): the next round trains the count the leader said
    (``LearnerProtocol.steps``), so that many batches are leased ahead, not ``H``."""
    pieces = [(3, 0, 4), (5, 0, 4), (9, 0, 4), (11, 0, 4)]
    node, calls = _node(list(pieces), told=12)
    LearnerNode._lease_ahead(node)
    assert list(node.ahead) == pieces[:3] and len(calls) == 3  # 12 batches, not 8
