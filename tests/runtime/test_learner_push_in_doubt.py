"""A push request whose answer never came (the leader killed, or deposed, after it may
have written the push down): the learner counts its tokens once the leader's word says it
was booked, and never otherwise. Before, it never counted them, and the leader that
resumed had booked them: the token books did not balance (a race noted since issue 17;
a standby's takeover, issue 22, meets it too)."""

import types

from dipsjax.runtime.client import StaleLeader
from dipsjax.runtime.learner import LearnerNode
from dipsjax.syncer import messages as m

J = 1


def _node(known_round=4):
    node = types.SimpleNamespace(
        j=J, in_doubt=0, known_round=known_round, reported=1000, written=[]
    )
    node._write_reported = lambda: node.written.append(node.reported)
    for name in ("_heard", "_settle_in_doubt", "_count_in_doubt"):
        setattr(node, name, getattr(LearnerNode, name).__get__(node))
    return node


class _Failing:
    refused = ""

    def call(self, event):
        raise StaleLeader(1, 2)


def test_a_failed_push_request_is_in_doubt_and_counted_only_on_the_leaders_word():
    node = _node()
    node.terminating, node.proto = False, types.SimpleNamespace(asking=lambda: True)
    node.control, node._drain = _Failing(), lambda: None
    node._call_failed = lambda e, what: [("lost", what)]
    push = m.PushRequested(0.0, J, m.PushMeta(tokens=256, steps=2, base_version=3))
    assert LearnerNode._send(node, push) == [("lost", "PushRequested")]
    assert node.in_doubt == 256 and node.reported == 1000  # not counted: unknown yet
    # The rejoin's SendModel settles round 5, newer than any round it knew: booked.
    node._settle_in_doubt(5)
    assert node.reported == 1256 and node.written == [1256] and node.in_doubt == 0
    assert node.known_round == 5
    # A second one the leader never took: the rejoin names round 5 again, known already.
    node.in_doubt = 128
    node._settle_in_doubt(5)
    assert node.reported == 1256 and node.in_doubt == 0


def test_a_plan_for_a_push_in_doubt_counts_it_once():
    node = _node()
    node.in_doubt = 64
    node._heard(m.PushShards(6, J, ()))
    assert node.reported == 1064 and node.in_doubt == 0 and node.known_round == 6
    node._settle_in_doubt(6)  # the rejoin then names the same round: nothing more
    node._heard(m.PushShards(6, J, ()))
    assert node.reported == 1064
    other = _node()
    other.in_doubt = 64
    other._heard(m.PushShards(9, J + 1, ()))  # another learner's plan says nothing of it
    assert other.reported == 1000 and other.in_doubt == 64


def test_a_push_answered_is_never_in_doubt():
    node = _node()
    node.terminating, node.proto = False, types.SimpleNamespace(asking=lambda: True)
    node.proto.on_action = lambda a, t, g: []
    node.now, node.generation, node.lost_since = (lambda: 0.0), 0, 1.0
    node._drain = lambda: None
    node.control = types.SimpleNamespace(call=lambda event: [], refused="")
    push = m.PushRequested(0.0, J, m.PushMeta(tokens=256, steps=2, base_version=3))
    assert LearnerNode._send(node, push) == []
    assert node.reported == 1256 and node.in_doubt == 0
