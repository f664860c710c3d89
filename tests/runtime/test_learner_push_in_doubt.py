"""A push request whose answer never came (the leader killed, or deposed, after it may
have written the push down): the learner counts its tokens once the leader's word says it
was booked, and never otherwise. Before, it never counted them, and the leader that
resumed had booked them: the token books did not balance (a race noted since issue 17;
a standby's takeover, issue 22, meets it too)."""

import functools
import json
import types

import pytest

from dipsjax.runtime import books
from dipsjax.runtime.client import StaleLeader
from dipsjax.runtime.learner import LearnerNode, read_books
from dipsjax.syncer import Leader, LeaderConfig, NoGrace
from dipsjax.syncer import messages as m
from dipsjax.syncer.learner import LearnerProtocol

J = 1


def _node(known_round=4):
    node = types.SimpleNamespace(
        j=J, in_doubt=0, known_round=known_round, reported=1000, written=[], booked_pushes=0
    )
    node.spec = types.SimpleNamespace(answer_pause=0.0)
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
    # The rejoin's SendModel: the leader booked one push more than this process knew of.
    node._settle_in_doubt(5, 1)
    # Written: the request before it was sent (in doubt), the count, the settled books.
    assert node.reported == 1256 and node.written == [1000, 1256, 1256] and node.in_doubt == 0
    assert node.known_round == 5 and node.booked_pushes == 1
    # A second one the leader never took: the rejoin's count is the same.
    node.in_doubt = 128
    node._settle_in_doubt(5, 1)
    assert node.reported == 1256 and node.in_doubt == 0


def test_a_plan_for_a_push_in_doubt_counts_it_once():
    node = _node()
    node.in_doubt = 64
    node._heard(m.PushShards(6, J, ()))
    assert node.reported == 1064 and node.in_doubt == 0 and node.known_round == 6
    node._settle_in_doubt(6, 1)  # the rejoin then gives the same count: nothing more
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
    assert node.reported == 1256 and node.in_doubt == 0 and node.booked_pushes == 1


class _AnswerLost:
    """A control channel whose push reaches the leader's core, which books it, and whose
    answer is then lost (the leader paused or deposed before it replied)."""

    refused = ""

    def __init__(self, leader):
        self.leader = leader

    def call(self, event):
        self.leader.handle(event)
        raise StaleLeader(1, 2)


def _sending(node, control):
    node.terminating, node.proto = False, types.SimpleNamespace(asking=lambda: True)
    node.control, node._drain = control, lambda: None
    node._call_failed = lambda e, what: []
    return node


@pytest.mark.parametrize("restarted", [False, True], ids=["rejoined", "leader-restarted"])
def test_a_push_booked_while_it_waited_for_a_round_is_counted_on_the_rejoins_word(restarted):
    """A push the leader booked but could not admit to a round yet (a follower not back,
    or the round applying) waits, with no round id; its answer was lost. The rejoin (or
    the restart's resume) drops it, as "lost" of round -1: ``last_round`` cannot name
    it. Before, the learner never counted it, and the leader had booked it:
    ``benchmarks/chaos.py --tiny --standby`` once lost 2048 tokens so (the active leader
    paused between writing a push down and answering it). The rejoin now also says how
    many pushes of the incarnation the leader booked (``SendModel.booked``). Each side
    counts on its own: the learner the pushes it sent, the leader its ledger."""
    leader = Leader(LeaderConfig(penalty=False, num_followers=1), NoGrace())
    leader.handle(m.FollowerJoined(0.0, 0, 0))
    leader.handle(m.Join(0.0, J))
    # A leader restarted once: until its follower is back, every push waits.
    leader = Leader.restore(json.loads(json.dumps(leader.snapshot())))
    leader.resume(0.2)
    leader.handle(m.Join(0.3, J, resume=True))
    leader.handle(m.PullDone(0.4, J, 0))
    node = _sending(_node(known_round=-1), _AnswerLost(leader))
    node.reported, node.booked_pushes = 0, 0
    push = m.PushRequested(0.5, J, m.PushMeta(tokens=2048, steps=4, base_version=0))
    assert LearnerNode._send(node, push) == []
    assert node.in_doubt == 2048 and leader.ledger.reported[J] == 2048
    if restarted:  # the leader restored from what it wrote down, and resumed
        leader = Leader.restore(json.loads(json.dumps(leader.snapshot())))
        leader.resume(1.0)
        assert not leader.waiting  # dropped by the resume
    (send,) = leader.handle(m.Join(2.0, J, resume=True))
    assert send.last_round == -1  # the waiting push had no round to name
    node._settle_in_doubt(send.last_round, send.booked)
    assert node.in_doubt == 0 and node.reported == 2048 == leader.ledger.reported[J]
    # The next push never reaches the leader: the same word leaves it uncounted.
    leader.handle(m.PullDone(2.1, J, 0))
    node.control = _Failing()
    assert LearnerNode._send(node, push) == []
    (send,) = leader.handle(m.Join(3.0, J, resume=True))
    node._settle_in_doubt(send.last_round, send.booked)
    assert node.in_doubt == 0 and node.reported == 2048 == leader.ledger.reported[J]


def test_a_resumed_process_takes_its_incarnations_count_from_the_rejoin():
    """A whole run's ``--resume`` restarts a learner with the same incarnation: the leader
    booked its predecessor's pushes, this process knows of none. Its first rejoin's count
    is its own from then on, so a later push that never reached the leader is not counted
    (were the counts compared as they start, every push in doubt would look booked)."""
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    push = m.PushRequested(0.2, J, m.PushMeta(tokens=100, steps=1, base_version=0))
    for _ in range(3):  # the predecessor's: one admitted, two refused as pending (booked)
        leader.handle(push)
    assert leader.members[J].booked == 3 and leader.ledger.reported[J] == 300
    node = _sending(_node(known_round=-1), _Failing())
    node.reported = 300  # its reported.json: the predecessor's answered pushes
    (send,) = leader.handle(m.Join(1.0, J, resume=True))
    node._settle_in_doubt(send.last_round, send.booked)
    assert node.booked_pushes == 3 and node.reported == 300
    leader.handle(m.PullDone(1.1, J, 0))
    assert LearnerNode._send(node, push) == [] and node.in_doubt == 100  # never reached it
    (send,) = leader.handle(m.Join(2.0, J, resume=True))
    node._settle_in_doubt(send.last_round, send.booked)
    assert node.in_doubt == 0 and node.reported == 300 == leader.ledger.reported[J]


def test_an_answered_push_counts_in_the_processs_own_count():
    """Each answered push adds to the process's count of pushes booked: without it, a
    later push that never reached the leader looked booked on the rejoin's word (the
    leader's count one higher), and its tokens were counted by the learner alone."""
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    node = _sending(_node(known_round=-1), types.SimpleNamespace(refused="", call=leader.handle))
    node.reported = 0
    node.proto.on_action = lambda a, t, g: []
    node.now, node.generation, node.lost_since = (lambda: 0.0), 0, None
    push = m.PushRequested(0.2, J, m.PushMeta(tokens=100, steps=1, base_version=0))
    LearnerNode._send(node, push)  # answered: booked
    assert node.reported == 100 == leader.ledger.reported[J] and node.booked_pushes == 1
    node.control = _Failing()  # the next one never reaches the leader
    LearnerNode._send(node, push)
    assert node.in_doubt == 100
    (send,) = leader.handle(m.Join(1.0, J, resume=True))
    node._settle_in_doubt(send.last_round, send.booked)
    assert node.in_doubt == 0 and node.reported == 100 == leader.ledger.reported[J]


def test_the_restore_command_carries_the_leaders_count_to_the_settling():
    """The driver settles a doubt with the ``Restore`` the protocol made of the rejoin's
    ``SendModel``: the count must reach ``_settle_in_doubt`` from there."""
    node = _node(known_round=4)
    node.in_doubt, node.booked_pushes = 64, 2
    node.phase = lambda state: None
    node.proto = types.SimpleNamespace(state=types.SimpleNamespace(value="joining"))
    node._on_worker = lambda fn, c: []
    node.restore = None
    LearnerNode._one(node, m.Restore(None, (), 7, last_round=-1, last_outcome="lost", booked=3))
    assert node.reported == 1064 and node.in_doubt == 0 and node.booked_pushes == 3


class _Late:
    """A control channel whose push request is late: the call fails first, and the
    request reaches the leader's core afterwards (``deliver``)."""

    refused = ""

    def __init__(self):
        self.late = []

    def call(self, event):
        self.late.append(event)
        raise StaleLeader(1, 2)


def test_a_push_request_that_reaches_the_leader_after_its_learners_rejoin_is_booked_by_neither():
    """The request of a push in doubt can reach the leader after the learner's rejoin (a
    paused leader takes its queued calls in any order): the rejoin's count did not hold
    it, so the learner did not count it, and the member, which must pull first, was
    refused it as ``inactive``. The leader booked that refusal: its books held one push
    more than the learner's. A push refused as ``inactive`` is now booked by neither side
    (its learner trains those batches again, from its checkpoint)."""
    leader = Leader(LeaderConfig(penalty=False, num_followers=1), NoGrace())
    leader.handle(m.FollowerJoined(0.0, 0, 0))
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    late = _Late()
    node = _sending(_node(known_round=-1), late)
    node.reported, node.booked_pushes = 0, 0
    push = m.PushRequested(0.5, J, m.PushMeta(tokens=2048, steps=4, base_version=0))
    assert LearnerNode._send(node, push) == []
    assert node.in_doubt == 2048
    (send,) = leader.handle(m.Join(2.0, J, resume=True))
    node._settle_in_doubt(send.last_round, send.booked)
    assert node.reported == 0 and send.booked == 0
    (refuse,) = leader.handle(late.late[0])  # the late request, after the rejoin
    assert refuse.kind == m.RefuseKind.INACTIVE
    assert leader.ledger.reported.get(J, 0) == node.reported == 0
    assert leader.members[J].booked == 0
    # Answered (not late), the refusal is not counted by the learner either.
    node.control = types.SimpleNamespace(call=leader.handle, refused="")
    node.proto.on_action = lambda a, t, g: []
    node.now, node.generation = (lambda: 0.0), 0
    assert LearnerNode._send(node, push) == []
    assert leader.ledger.reported.get(J, 0) == node.reported == 0


def test_a_push_request_after_its_learners_rejoin_and_pull_is_booked_by_neither():
    """As above, but the late request comes after the rejoin's pull too: the member is
    active again, and the request was taken as a new push (booked: the leader's books held
    one push more than the learner's, which settled it as not booked at its rejoin). It
    carries its session (``SendModel.session`` of the join before), older than the
    rejoin's (the learner numbers its joins): refused as ``session``, booked by neither
    side."""
    leader = Leader(LeaderConfig(penalty=False, num_followers=1), NoGrace())
    leader.handle(m.FollowerJoined(0.0, 0, 0))
    (first,) = leader.handle(m.Join(0.0, J, session=1))
    leader.handle(m.PullDone(0.1, J, 0))
    late = _Late()
    node = _sending(_node(known_round=-1), late)
    node.reported, node.booked_pushes = 0, 0
    meta = m.PushMeta(tokens=2048, steps=4, base_version=0)
    assert LearnerNode._send(node, m.PushRequested(0.5, J, meta, first.session)) == []
    assert node.in_doubt == 2048
    (send,) = leader.handle(m.Join(2.0, J, resume=True, session=2, ends=1))
    node._settle_in_doubt(send.last_round, send.booked)
    assert node.reported == 0 and send.booked == 0
    leader.handle(m.PullDone(2.1, J, 0))
    (refuse,) = leader.handle(late.late[0])  # the late request, after the rejoin's pull
    assert refuse.kind == m.RefuseKind.SESSION and (first.session, send.session) == (1, 2)
    assert leader.ledger.reported.get(J, 0) == node.reported == 0
    assert leader.members[J].booked == 0


# -- a push booked as its learner died: the next incarnation settles it ---------------------


class _Died(BaseException):
    """The learner's process killed (SIGKILL): nothing after this point of it runs."""


class _BookedThenKilled:
    """A control channel whose push reaches the leader's core, which books it, and whose
    process is killed before it writes the answer down."""

    refused = ""

    def __init__(self, leader):
        self.leader = leader

    def call(self, event):
        self.leader.handle(event)
        raise _Died


class _KilledBeforeSending:
    refused = ""

    def call(self, event):
        raise _Died


def _process(path, incarnation, control, resume=False):
    """A learner process's books, as ``LearnerNode.__init__`` reads them from its
    ``reported.json`` (``path``), with its real record keeping and push sending."""
    books = read_books(path, incarnation, resume)
    node = types.SimpleNamespace(
        j=J,
        incarnation=incarnation,
        reported_path=path,
        known_round=-1,
        reported=books.tokens,
        booked_pushes=books.booked,
        in_doubt=books.doubt,
        asks=books.asks,
        unresolved=books.unresolved,
        stale_books=books.stale,
        spec=types.SimpleNamespace(answer_pause=0.0),
    )
    for name in (
        "_heard",
        "_settle_in_doubt",
        "_count_in_doubt",
        "_write_reported",
        "_reckon",
        "_one",
    ):
        setattr(node, name, getattr(LearnerNode, name).__get__(node))
    node.write_stats = lambda: None
    if not books.stale:
        node._write_reported()  # as a process writes its books when it starts
    node.phase = lambda state: None
    node.proto = LearnerProtocol(J, incarnation, asks=None if books.asks is None else books.asks[0])
    node.terminating, node._drain = False, lambda: None
    node.control, node.now, node.generation, node.lost_since = control, (lambda: 0.0), 0, None
    node._call_failed = lambda e, what: []
    return node


def _push(node, tokens=4096):
    node.proto.state = types.SimpleNamespace(value="training")
    node.proto.asking = lambda: True
    node.proto.on_action = lambda a, t, g: []
    return LearnerNode._send(node, m.PushRequested(0.5, J, m.PushMeta(tokens, 4, 0)))


def _join(node, leader):
    """The process's join, as its protocol makes it, and what it does with the answer
    (the predecessor's push settled; the pull it then makes is not carried out)."""
    (send,) = node.proto.start(1.0)
    answers = leader.handle(send.event)
    done = []
    for a in answers:
        for c in node.proto.on_action(a, 1.0):
            if isinstance(c, m.Reckon):
                done += node._one(c)
    return send.event, answers


@pytest.mark.parametrize("evicted", [False, True], ids=["restarted", "evicted-first"])
def test_a_push_booked_as_its_learner_died_is_counted_by_the_next_incarnation(tmp_path, evicted):
    """``benchmarks/hostile.py --tiny`` once found the books one push (4096 tokens) apart:
    a learner killed after the leader booked its push and before it wrote the answer
    down. Its next incarnation could not know (the leader's count in ``SendModel.booked``
    is of the new incarnation's pushes). Now the learner writes each push request down
    before it sends it, and the next incarnation asks the leader (``Join.asks``) how many
    of that incarnation's pushes it booked (``SendModel.asked``): more than the record
    knew of, the one in doubt was booked. Each side counts on its own: the learner its
    record, the leader its ledger."""
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    path = tmp_path / "reported.json"
    first = _process(path, 0, types.SimpleNamespace(refused="", call=leader.handle))
    _push(first)  # answered: booked, and written down
    first.control = _BookedThenKilled(leader)
    with pytest.raises(_Died):
        _push(first)
    assert leader.ledger.reported[J] == 8192 and json.loads(path.read_text())["tokens"] == 4096
    if evicted:  # found silent before its restart joins
        leader.handle(m.Tick(500.0))
        assert J not in leader.members
    second = _process(path, 1, None)
    assert second.reported == 4096 and second.asks == (0, 1, 4096)
    join, answers = _join(second, leader)
    assert join.asks == 0
    assert [a.asked for a in answers if isinstance(a, m.SendModel)] == [2]
    assert json.loads(path.read_text())["tokens"] == 8192 == leader.ledger.reported[J]
    assert second.asks is None


def test_a_push_written_down_but_never_sent_is_not_counted_by_the_next_incarnation(tmp_path):
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    path = tmp_path / "reported.json"
    first = _process(path, 0, types.SimpleNamespace(refused="", call=leader.handle))
    _push(first)
    first.control = _KilledBeforeSending()
    with pytest.raises(_Died):
        _push(first)
    second = _process(path, 1, None)
    assert second.asks == (0, 1, 4096)
    _join(second, leader)
    assert json.loads(path.read_text())["tokens"] == 4096 == leader.ledger.reported[J]


def test_an_incarnation_killed_before_its_join_was_answered_passes_the_question_on(tmp_path):
    """The incarnation that must ask can die before the leader answers: its record keeps
    the question, and the one after it asks it (the leader keeps the counts of a few
    incarnations that left, and of their pushes booked after they left, in its snapshot)."""
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    path = tmp_path / "reported.json"
    first = _process(path, 0, _BookedThenKilled(leader))
    with pytest.raises(_Died):
        _push(first)
    second = _process(path, 1, None)
    (send,) = second.proto.start(1.0)
    leader.handle(send.event)  # joined; the process killed before it took the answer
    leader = Leader.restore(json.loads(json.dumps(leader.snapshot())))  # kept across restarts
    third = _process(path, 2, None)
    assert third.asks == (0, 0, 4096)
    join, answers = _join(third, leader)
    assert join.asks == 0 and [a.asked for a in answers if isinstance(a, m.SendModel)] == [1]
    assert json.loads(path.read_text())["tokens"] == 4096 == leader.ledger.reported[J]


def test_a_push_of_an_evicted_incarnation_booked_after_it_left_is_in_its_count():
    """An evicted incarnation's process may still live (a cut link) and push: the leader
    refuses it as ``unknown`` and books it, and its process counts it from the answer; the
    count a later incarnation is told holds it, and a push of an incarnation the leader
    does not know of is answered ``None`` (not known: not counted)."""
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    leader.handle(m.Tick(500.0))
    (refuse,) = leader.handle(m.PushRequested(501.0, J, m.PushMeta(100, 1, 0)))
    assert refuse.kind == m.RefuseKind.UNKNOWN and leader.ledger.reported[J] == 100
    (send,) = leader.handle(m.Join(502.0, J, incarnation=1, asks=0))
    assert send.asked == 1
    (send,) = leader.handle(m.Join(503.0, J + 1, incarnation=3, asks=2))
    assert send.asked is None
    (send,) = leader.handle(m.Join(504.0, J + 2))
    assert send.asked is None  # not asked


def _booked_twice(leader):
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    for t in (0.2, 0.3):  # one admitted, one refused as pending: both booked
        leader.handle(m.PushRequested(t, J, m.PushMeta(4096, 4, 0)))
    assert leader.members[J].booked == 2


def _final_word(snap):
    """The audit's word on learner J's incarnations: the leader restored from its final
    snapshot."""
    return functools.partial(Leader.restore(snap).booked_of, J)


def test_the_audit_settles_a_push_in_doubt_no_later_process_settled():
    """A learner killed with a push in doubt as the job stopped has no later process to
    ask: the audit settles it by the same rule (``books.settle``), with the count in the
    leader's final snapshot, and reports what nothing can settle as in doubt."""
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    _booked_twice(leader)
    snap = json.loads(json.dumps(leader.snapshot()))
    record = {"tokens": 4096, "incarnation": 0, "booked": 1, "doubt": 4096, "asks": None}
    assert books.settled_at_the_end(record, _final_word(snap)) == (4096, 0)  # the leader has 2
    record = {**record, "tokens": 8192, "booked": 2}  # written down, never sent
    assert books.settled_at_the_end(record, _final_word(snap)) == (0, 0)
    leader.handle(m.Join(1.0, J, incarnation=1))  # incarnation 0 left, with 2 booked
    snap = json.loads(json.dumps(leader.snapshot()))
    record = {"tokens": 4096, "incarnation": 1, "booked": 0, "doubt": 0, "asks": [0, 1, 4096]}
    assert books.settled_at_the_end(record, _final_word(snap)) == (4096, 0)
    record["asks"] = [7, 1, 4096]  # an incarnation the leader knows nothing of
    assert books.settled_at_the_end({**record, "unresolved": 10}, _final_word(snap)) == (0, 4106)


def test_a_push_the_leader_cannot_say_anything_of_is_kept_unresolved(tmp_path):
    path = tmp_path / "reported.json"
    node = _process(path, 0, None)
    node.asks = (3, 1, 4096)  # say, more incarnations left since than the leader keeps
    node._one(m.Reckon(3, None))
    got = json.loads(path.read_text())
    assert (got["tokens"], got["unresolved"], got["asks"]) == (0, 4096, None)
    assert read_books(path, 1, False).unresolved == 4096  # carried on


def test_a_process_of_an_older_incarnation_leaves_a_newer_ones_books_alone(tmp_path):
    path = tmp_path / "reported.json"
    books.write_books(path, 5, books.Books(8192, 2, 4096))
    got = read_books(path, 3, False)
    assert got.stale and got.tokens == 8192
    assert read_books(path, 5, True) == books.Books(8192, 2, 4096)


def test_a_push_sent_while_an_earlier_one_is_still_in_doubt_keeps_that_one_unresolved(tmp_path):
    """No word can settle a push in doubt once the next is sent (one is in flight at a
    time): its tokens are kept apart, not overwritten (a process of the same incarnation
    started without ``--resume`` keeps its predecessor's doubt, and a first join brings
    no rejoin's count)."""
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J))
    leader.handle(m.PullDone(0.1, J, 0))
    path = tmp_path / "reported.json"
    books.write_books(path, 0, books.Books(0, 0, 2048))
    node = _process(path, 0, types.SimpleNamespace(refused="", call=leader.handle), resume=True)
    assert node.in_doubt == 2048
    _push(node)
    got = json.loads(path.read_text())
    assert (got["tokens"], got["doubt"], got["unresolved"]) == (4096, 0, 2048)


def test_a_process_of_an_older_incarnation_never_writes_a_newer_ones_books(tmp_path):
    path = tmp_path / "reported.json"
    books.write_books(path, 5, books.Books(8192, 2, 4096))
    before = path.read_text()
    leader = Leader(LeaderConfig(penalty=False), NoGrace())
    leader.handle(m.Join(0.0, J, incarnation=3))
    leader.handle(m.PullDone(0.1, J, 0))
    node = _process(path, 3, types.SimpleNamespace(refused="", call=leader.handle))
    _push(node)
    assert path.read_text() == before
