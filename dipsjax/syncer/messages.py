"""Every event the syncer's leader consumes and every action it returns, typed.

The protocol core is sans-IO (DESIGN.md sec. 2): a driver -- the simulator's in-process
:class:`~dipsjax.sim.cluster.LocalCluster` or the network runtime -- turns what happens into
*events* (each stamped with the time ``t`` at which it happened), hands them to
:meth:`dipsjax.syncer.Leader.handle`, and carries out the *actions* it gets back. The
runtime's protobuf messages map one to one onto the classes here.

Learner-side events: :class:`Join`, :class:`Leave`, :class:`Heartbeat`,
:class:`PushRequested` (with its :class:`PushMeta`), :class:`TransferDone`,
:class:`PullDone`, :class:`ChunkRequested`, :class:`LearnerFailed`.
Follower-side events: :class:`FollowerNorms`, :class:`FollowerMerged`,
:class:`FollowerApplied`, :class:`FollowerJoined`, :class:`FollowerLost`.
Timer: :class:`Tick`.

Actions to learners: :class:`SendModel`, :class:`PushShards` (the transfer plan),
:class:`NotifyPull`, :class:`GrantChunk`, :class:`Evict`, :class:`Refuse`.
Actions to followers: :class:`RequestNorms`, :class:`Decide`, :class:`Apply`,
:class:`Discard`. To the driver: :class:`WakeAt`, :class:`Stop`.

Everything here is plain data (ints, floats, strings, tuples) and converts to and from
JSON with :func:`to_json` / :func:`from_json`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class RefuseKind(enum.StrEnum):
    """Why the leader refused a learner's request (:class:`Refuse`): the keys of its
    ``refused`` counter. Drivers match on these, never on the human-readable reason."""

    STOPPED = "stopped"  # the job has stopped
    UNKNOWN = "unknown"  # not a member (never joined, or evicted meanwhile)
    INACTIVE = "inactive"  # a member that must pull a model first
    INCARNATION = "incarnation"  # an incarnation older (or other) than the member's
    INVALID = "invalid"  # a push whose counts or version make no sense
    PENDING = "pending"  # a push of this learner is already pending
    FINGERPRINT = "fingerprint"  # a join with another model
    BOUNDS = "bounds"  # a push whose counts exceed what the job's geometry allows
    GHOST = "ghost"  # a push of an incarnation newer than any that joined (no process sent it)
    SESSION = "session"  # a push of a session a rejoin of its learner ended (a late request)


#: Refusals whose push is not booked: no process of the job sent it (an incarnation that
#: never joined), its counts are beyond what any learner of the job can train, its member
#: must pull first (``inactive``: the learner rejoins and trains those batches again from
#: its checkpoint; a request that reaches the leader after that rejoin, late, is one the
#: rejoin's ``SendModel.booked`` did not hold, so its learner never counts it), or it was
#: sent in a session a rejoin of its learner ended (``session``: a late request, as before,
#: that comes after the rejoin's pull too); so no learner counts it either. Every other refused push
#: is booked (reported and dropped), as its learner counts it: ``unknown`` too, a learner
#: of the job the leader no longer has as a member (evicted, or forgotten by a restart); a
#: learner id outside the job is refused before (``Leader.screen``) and never booked.
UNBOOKED = frozenset({RefuseKind.GHOST, RefuseKind.BOUNDS, RefuseKind.INACTIVE, RefuseKind.SESSION})


class BadKind(enum.StrEnum):
    """Why the leader's screening refused an event before handling it
    (:meth:`dipsjax.syncer.Leader.screen`): the keys of its ``refused`` counter."""

    UNKNOWN_LEARNER = "unknown_learner"  # a learner id outside the job
    UNKNOWN_FOLLOWER = "unknown_follower"  # a follower id outside the job
    UNKNOWN_ROUND = "unknown_round"  # a round never opened
    OLD_ROUND = "old_round"  # a round that ended (a late or repeated report)


@dataclasses.dataclass(frozen=True)
class BadEvent:
    """An event the leader's screening refused (not a message: never on the wire)."""

    kind: str  # a BadKind
    reason: str


#: The longest string field an event may carry into the leader (UTF-8 bytes); longer
#: ones are cut (:func:`cut_strings`) before the tape or a log sees them.
MAX_STRING = 1024


def cut_strings(event: Event, limit: int = MAX_STRING) -> Event:
    """``event`` with each ``str`` field longer than ``limit`` UTF-8 bytes cut to its first
    ``limit`` bytes plus a marker saying how many were cut (the same event when none is)."""
    cut = {}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if isinstance(value, str) and len(value) > limit // 4:
            data = value.encode("utf-8", "replace")
            if len(data) > limit:
                head = data[:limit].decode("utf-8", "ignore")
                cut[f.name] = f"{head}...[{len(data) - limit} more bytes cut]"
    return dataclasses.replace(event, **cut) if cut else event


class EvictKind(enum.StrEnum):
    """Why the leader stopped counting a learner's incarnation (:class:`Evict`)."""

    LEFT = "left"  # it said so (``Leave``)
    RESTARTED = "restarted"  # a newer incarnation joined
    SILENT = "silent"  # missed heartbeats


class UnusedKind(enum.StrEnum):
    """Why a push that entered a round was not used (:class:`Unused`)."""

    STALE = "stale"
    NONFINITE = "nonfinite"


# ------------------------------------------------------------------------------- base


@dataclasses.dataclass(frozen=True)
class Event:
    """Something that happened at time ``t`` (seconds, the driver's clock)."""

    t: float


@dataclasses.dataclass(frozen=True)
class Action:
    """Something the driver must do."""


# ------------------------------------------------------------------ learner -> leader


@dataclasses.dataclass(frozen=True)
class Join(Event):
    """A learner (re)starts. A higher ``incarnation`` than the leader knows ends the old one:
    its in-flight push is dropped and counted, its chunk leases are released, and the new
    incarnation pulls one complete model before it trains.

    ``session``: the session this join opens, chosen by the learner, never one an earlier
    join of the same incarnation used (a process restarted with ``--resume`` draws its
    numbers at random); its ``SendModel`` echoes it, and the push requests sent with that
    model carry it (``PushRequested.session``). ``ends``: the session a rejoin ends, that
    of the learner's newest model (0: none): the leader refuses a push request of an ended
    session from then on (one sent before the rejoin, delivered after it). 0: untagged (a
    client from before sessions).

    ``asks``: an earlier incarnation of this learner whose last push request is in doubt
    (its process wrote the request down, then died before it wrote the answer down): its
    ``SendModel.asked`` says how many of that incarnation's pushes the leader booked.
    ``None``: none."""

    learner: int
    incarnation: int = 0
    resume: bool = False  # the same incarnation, back from its checkpoint (``--resume``)
    fingerprint: str = ""  # of its model (``dipsjax.runtime.client.model_fingerprint``)
    session: int = 0
    ends: int = 0
    asks: int | None = None


@dataclasses.dataclass(frozen=True)
class Leave(Event):
    learner: int


@dataclasses.dataclass(frozen=True)
class Heartbeat(Event):
    learner: int


@dataclasses.dataclass(frozen=True)
class Tick(Event):
    """Time passed: check deadlines and heartbeats."""


@dataclasses.dataclass(frozen=True)
class Span:
    """Batches ``start .. end - 1`` of chunk ``chunk`` (the chunk ledger's unit); unpacks
    as ``chunk, start, end = span``."""

    chunk: int
    start: int
    end: int

    def __iter__(self):
        return iter((self.chunk, self.start, self.end))


def spans_of(value: Any) -> tuple[Span, ...]:
    """:class:`Span` s from ``(chunk, start, end)`` triples, JSON lists or dicts."""
    return tuple(
        Span(int(x["chunk"]), int(x["start"]), int(x["end"]))
        if isinstance(x, dict)
        else Span(*(int(v) for v in x))
        for x in value
    )


@dataclasses.dataclass(frozen=True)
class PushMeta:
    """What a learner reports with a push (Di-PS sec. 5 ``PushRequest``, < 1 KB).

    Attributes:
      tokens: tokens the round consumed (exact, counted at the learner).
      steps: inner steps taken.
      base_version: the global version the round started from.
      incarnation: the learner process's incarnation (restarts count up).
      train_seconds: time the round's inner steps took (Decoupled DiLoCo's ``tau * xi_step``).
      pulled: the round started from a freshly pulled global version (else it went on from
        where the learner was).
      start_chunk, start_offset: the learner's data position when the round started.
      spans: the batches the round trained, in order, as ``(chunk, start, end)`` (batches
        ``start .. end - 1`` of the chunk): what the leader settles in its ledger when the
        round is decided, or takes back when the push is dropped, and what replay draws.
    """

    tokens: int
    steps: int
    base_version: int
    incarnation: int = 0
    train_seconds: float = 0.0
    pulled: bool = True
    start_chunk: int | None = None
    start_offset: int = 0
    spans: tuple[Span, ...] = ()


@dataclasses.dataclass(frozen=True)
class PushRequested(Event):
    """A learner's push request. ``session``: that of the join its model came from
    (``Join.session``): the leader refuses a request of a session a rejoin of its learner
    ended (``Join.ends``; ``RefuseKind.SESSION``, unbooked), one sent before that rejoin
    that reached it late. 0: untagged, not checked (a request written by hand, or by a
    client from before sessions)."""

    learner: int
    meta: PushMeta
    session: int = 0


@dataclasses.dataclass(frozen=True)
class TransferDone(Event):
    """The learner finished streaming its round's shards to the followers (``incarnation``:
    of the process that pushed; a dead incarnation's late word is not about the member's
    push)."""

    learner: int
    round_id: int
    incarnation: int = 0


@dataclasses.dataclass(frozen=True)
class PullDone(Event):
    """A learner holds ``version``. A resumed learner also says how many of its rounds its
    restored inner state has trained (``rounds``; ``-1``: not resuming), for replay."""

    learner: int
    version: int
    rounds: int = -1


@dataclasses.dataclass(frozen=True)
class ChunkRequested(Event):
    """A learner asks for its next data chunk (answered by :class:`GrantChunk`)."""

    learner: int


@dataclasses.dataclass(frozen=True)
class LearnerFailed(Event):
    """An outage the driver observed (a process died): recorded on the tape only; the leader
    still finds a dead learner through missed heartbeats or its next incarnation."""

    learner: int
    reason: str = "crash"


# ----------------------------------------------------------------- follower -> leader


@dataclasses.dataclass(frozen=True)
class FollowerNorms(Event):
    """One follower's partial squared norms of the round's learners (RequestNorms order)."""

    follower: int
    round_id: int
    sq_norms: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class FollowerMerged(Event):
    """One follower's partial squared norm of its merged shard."""

    follower: int
    round_id: int
    merged_sq_norm: float


@dataclasses.dataclass(frozen=True)
class FollowerApplied(Event):
    follower: int
    round_id: int
    version: int


@dataclasses.dataclass(frozen=True)
class FollowerJoined(Event):
    """A follower (re)connected, holding ``version`` of its shard and, as bases for stale
    rows, every version from ``oldest`` on (-1: all the leader's staleness bound allows;
    a follower restarted from its checkpoint holds fewer)."""

    follower: int
    version: int
    oldest: int = -1
    address: str = ""  # its data plane's ``host:port`` (empty: the one in the job's spec)
    # Decided rounds whose inputs (batch and Decide) it still holds, so it can apply them
    # if told again: a round the leader was applying when the follower lost it.
    rounds: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class FollowerHeartbeat(Event):
    """A follower is alive (sent every heartbeat interval from its own thread, so a long
    outer step never looks like a death); one silent for ``missed_heartbeats`` intervals
    is lost (:class:`FollowerLost`)."""

    follower: int


@dataclasses.dataclass(frozen=True)
class FollowerLost(Event):
    follower: int
    reason: str = "missed heartbeats"


# ---------------------------------------------------------------------------- actions


@dataclasses.dataclass(frozen=True)
class SendModel(Action):
    """The learner pulls one complete model of ``version`` before it trains.

    To a resumed learner (``Join(resume=True)``) it also says how its last push ended
    (``last_round``, ``last_outcome``: ``applied``, ``rejected``, ``dropped``, or ``lost``:
    dropped by the restart with its chunks left with the learner, who trains that round
    again; ``-1``/``''``: none), which batches are still leased to it, in lease order
    (``leases``, ``(chunk, start, end)`` pieces), and how many pushes of its incarnation
    the leader booked (``booked``, refused ones included but those refused unbooked,
    :data:`UNBOOKED`; ``-1``: not said): the word on a
    push whose answer was lost, which a round id cannot give for one that waited.
    ``steps``: the inner steps its rounds train from now on (adaptive steps, EXTENSION:
    :attr:`~dipsjax.syncer.leader.LeaderConfig.adaptive_steps`; 0: the job's ``H``).
    ``session``: that of the join it answers (``Join.session``): a learner takes only a
    model of a join it sent since its last model (from whichever stream brings it).
    ``asked``: how many pushes of the incarnation the join asked about (``Join.asks``) the
    leader booked, those booked after it left included; ``None``: not asked, or not known
    (more incarnations left since than the leader keeps, :data:`~dipsjax.syncer.leader.LEFT`)."""

    learner: int
    version: int
    leases: tuple[Span, ...] = ()
    last_round: int = -1
    last_outcome: str = ""
    booked: int = -1
    steps: int = 0
    session: int = 0
    asked: int | None = None


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Send tensor ``layer`` (its index in the model's flattened order) to ``follower``."""

    layer: int
    follower: int
    step: int = 0  # communication step of the greedy schedule (Di-PS sec. 10)


@dataclasses.dataclass(frozen=True)
class PushShards(Action):
    """Join round ``round_id``: stream these transfers, in order, then ``TransferDone``.

    ``ticket``: empty from the core; the runtime's leader signs the grant (a MAC of the
    round, learner and incarnation under a key of the job's credentials) so that a follower
    can refuse, from a push's first header, pushes for rounds the leader never opened to
    that learner process (the simulator's in-process followers need none)."""

    round_id: int
    learner: int
    transfers: tuple[Transfer, ...] = ()
    ticket: str = ""


@dataclasses.dataclass(frozen=True)
class WakeAt(Action):
    t: float


@dataclasses.dataclass(frozen=True)
class RequestNorms(Action):
    """Followers: per-learner partial squared norms of these learners' staged shards."""

    round_id: int
    learners: tuple[int, ...]
    base_versions: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Decide(Action):
    """The one decision every follower applies: merge these learners with these weights."""

    round_id: int
    learners: tuple[int, ...]  # all participants, in RequestNorms order
    accepted: tuple[bool, ...]
    tokens: tuple[int, ...]
    steps: tuple[int, ...]
    weights: tuple[float, ...]
    sq_norms: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Apply(Action):
    """Clip by ``clip_factor`` and take the outer step, producing ``version``."""

    round_id: int
    version: int
    clip_factor: float
    merged_sq_norm: float


@dataclasses.dataclass(frozen=True)
class Discard(Action):
    """Nothing of the round is applied: followers drop its shards; the version stays."""

    round_id: int
    reason: str = "nothing accepted"


class PushOutcome(enum.StrEnum):
    """What became of a learner's push in its round, as :class:`NotifyPull` says it (the
    words of :class:`dipsjax.outer.Outcome`, whose error feedback settles by them)."""

    APPLIED = "applied"  # merged into ``version``
    REJECTED = "rejected"  # judged an anomaly, not applied
    STALE = "stale"  # dropped as too stale, before the norms
    DISCARDED = "discarded"  # not applied, not judged (the round was discarded)
    NONFINITE = "nonfinite"  # its squared norm was not finite: rejected


@dataclasses.dataclass(frozen=True)
class NotifyPull(Action):
    """The round ``round_id`` ended at ``version``: its ``learners`` pull it. ``outcomes``
    (aligned with ``learners``, a :class:`PushOutcome` each; empty from an older leader)
    says what became of each one's push: a learner's error feedback (EXTENSION) settles by
    it. ``steps`` (aligned with ``learners``; empty: not said) are the inner steps each
    one's rounds train from now on (adaptive steps, EXTENSION; 0: the job's ``H``)."""

    round_id: int
    learners: tuple[int, ...]
    version: int
    outcomes: tuple[str, ...] = ()
    steps: tuple[int, ...] = ()

    def outcome_of(self, learner: int) -> str | None:
        """The outcome of ``learner``'s push (``None``: not said)."""
        if learner not in self.learners or len(self.outcomes) != len(self.learners):
            return None
        return self.outcomes[self.learners.index(learner)]

    def steps_of(self, learner: int) -> int | None:
        """The inner steps ``learner``'s rounds train from now on (``None``: not said)."""
        if learner not in self.learners or len(self.steps) != len(self.learners):
            return None
        return self.steps[self.learners.index(learner)]


@dataclasses.dataclass(frozen=True)
class GrantChunk(Action):
    """The learner's next piece, batches ``start .. end - 1`` of ``chunk``, or ``chunk``
    ``None`` when none can be leased now (ask again)."""

    learner: int
    chunk: int | None
    start: int = 0
    end: int = 0

    @property
    def piece(self) -> tuple[int, int, int] | None:
        return None if self.chunk is None else (self.chunk, self.start, self.end)


@dataclasses.dataclass(frozen=True)
class Evict(Action):
    """The leader no longer counts ``incarnation`` of ``learner`` (a newer incarnation of
    the same learner ignores it); ``kind`` is an :class:`EvictKind`."""

    learner: int
    reason: str
    incarnation: int = 0
    kind: str = EvictKind.SILENT


@dataclasses.dataclass(frozen=True)
class Refuse(Action):
    """A request the leader does not take (a refused push's tokens are counted as dropped);
    ``kind`` is a :class:`RefuseKind`, ``incarnation`` that of the refused request."""

    learner: int
    reason: str
    kind: str = RefuseKind.INVALID
    incarnation: int = 0


@dataclasses.dataclass(frozen=True)
class Rejoin(Action):
    """To a follower the leader counts as lost that beats again (a hang that ended): join
    again, as a restarted follower does (its version, the versions it holds)."""

    follower: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Unused(Action):
    """The leader's word to a learner whose push entered round ``round_id`` but was not used
    because it was bad input: dropped as too stale (``kind="stale"``) or rejected as not
    finite (``"nonfinite"``). Its tokens are booked; the learner goes on and pulls the
    round's result as usual. (A push rejected by the anomaly penalty is not bad input and
    gets no word.)"""

    learner: int
    round_id: int
    kind: str
    reason: str
    incarnation: int = 0  # of the push (a newer incarnation ignores the word)


@dataclasses.dataclass(frozen=True)
class Stop(Action):
    reason: str


# --------------------------------------------------------------- agents' commands
#
# What the learner's and the follower's protocol cores (:mod:`dipsjax.syncer.learner`,
# :meth:`dipsjax.syncer.follower.Follower.handle`) tell their drivers to do. Plain data,
# like the leader's actions; a driver carries them out in order and reports back.


class ExitCode(enum.IntEnum):
    """How a learner or follower process ends (what its launcher does next)."""

    OK = 0  # the job stopped: nothing to restart
    UNREACHABLE = 69  # EX_UNAVAILABLE: its link is down; start a new incarnation
    EVICTED = 75  # EX_TEMPFAIL: the leader no longer counts it; start a new incarnation
    REFUSED = 78  # EX_CONFIG: the same process would be refused again


@dataclasses.dataclass(frozen=True)
class Command:
    """Something a learner's or follower's driver must do."""


@dataclasses.dataclass(frozen=True)
class Send(Command):
    """Send ``event`` to the leader (control plane)."""

    event: Event


@dataclasses.dataclass(frozen=True)
class Train(Command):
    """Train one round of ``H`` inner steps from the learner's current state, then report
    :meth:`~dipsjax.syncer.learner.LearnerProtocol.on_trained`. With ``adopt`` (overlap),
    first start from the newest version pulled, if it is newer than the one held. With
    ``wait`` > 0 no chunk could be leased: try again after that many seconds. ``steps`` >
    0: train that many inner steps instead of ``H`` (the leader's word, adaptive steps)."""

    adopt: bool = False
    wait: float = 0.0
    steps: int = 0


@dataclasses.dataclass(frozen=True)
class Push(Command):
    """Stream the round's shards by ``plan`` (the leader's :class:`PushShards`), then report
    :meth:`~dipsjax.syncer.learner.LearnerProtocol.on_pushed`."""

    plan: PushShards


@dataclasses.dataclass(frozen=True)
class Pull(Command):
    """Pull one complete model of ``version`` and take it (``first``: the first model of
    this incarnation, its inner state reset; ``background``: overlap, kept for the next
    round start), then report :meth:`~dipsjax.syncer.learner.LearnerProtocol.on_pulled`."""

    version: int
    first: bool = False
    background: bool = False


@dataclasses.dataclass(frozen=True)
class Save(Command):
    """Checkpoint: a learner's inner state as checkpoint ``step`` (``kind`` ``start``: at
    a round's start, or ``pushed``: its push is on the followers, of ``round_id``); a
    follower's stacked batch of round ``round_id`` once its norms are taken (``kind``
    ``batch``: started, not waited for), its inputs of decided round ``round_id`` at
    ``version`` (``kind`` ``inputs``, on disk with the batch before the next command:
    its batch and ``Decide``, :meth:`~dipsjax.syncer.follower.Follower.round_inputs`), the
    ``Apply`` that made ``version`` of round ``round_id`` (``kind`` ``applied``: with the
    inputs, the journal a restart redoes the step from), both on disk before the next
    command; or its shard at ``version`` (``kind`` ``version``: started, not waited for,
    after the step's report). A learner's ``requested``: an overlapping learner's round start
    while the push of the batches ``spans`` waits for its plan (restored only if the leader
    took that push, see :meth:`~dipsjax.syncer.learner.LearnerProtocol.restore_step`)."""

    kind: str
    round_id: int = -1
    version: int = -1
    step: int = -1
    spans: tuple[Span, ...] = ()


@dataclasses.dataclass(frozen=True)
class Restore(Command):
    """Restore the learner's checkpoint ``step`` (``None``: none, start afresh) and first
    train the pieces still leased to it, in this order (``regrant``). The rest is what the
    leader's ``SendModel`` said (the version it resumes at, how its last push ended, how
    many of its pushes it booked)."""

    step: int | None
    regrant: tuple[Span, ...] = ()
    version: int = -1
    last_round: int = -1
    last_outcome: str = ""
    booked: int = -1


@dataclasses.dataclass(frozen=True)
class Reckon(Command):
    """The leader's word on an earlier incarnation's push in doubt (``Join.asks``):
    ``booked`` of incarnation ``incarnation``'s pushes were booked (``SendModel.asked``;
    ``None``: not known). The driver counts the push in doubt if that is more than its record
    of that incarnation knew of."""

    incarnation: int
    booked: int | None


@dataclasses.dataclass(frozen=True)
class Settle(Command):
    """Error feedback (EXTENSION): settle the residual of this learner's push of round
    ``round_id`` by ``outcome`` (a :class:`dipsjax.outer.Outcome` word:
    :func:`dipsjax.outer.feedback_settle`)."""

    round_id: int
    outcome: str


@dataclasses.dataclass(frozen=True)
class Exit(Command):
    """End the process with ``code`` (an :class:`ExitCode`), saying ``reason``."""

    code: int
    reason: str


# ------------------------------------------------------------------------------- JSON

MESSAGES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Join,
        Leave,
        Heartbeat,
        Tick,
        PushRequested,
        TransferDone,
        PullDone,
        ChunkRequested,
        LearnerFailed,
        FollowerNorms,
        FollowerMerged,
        FollowerApplied,
        FollowerJoined,
        FollowerLost,
        FollowerHeartbeat,
        SendModel,
        PushShards,
        WakeAt,
        RequestNorms,
        Decide,
        Apply,
        Discard,
        NotifyPull,
        GrantChunk,
        Evict,
        Refuse,
        Unused,
        Rejoin,
        Stop,
    )
}


def to_json(message: Event | Action) -> dict[str, Any]:
    """``{"type": name, **fields}`` with nested dataclasses as dicts and tuples as lists."""
    return {"type": type(message).__name__, **dataclasses.asdict(message)}


def from_json(data: dict[str, Any]) -> Event | Action:
    """Inverse of :func:`to_json`; raises ``ValueError`` naming an unknown type or field."""
    fields = dict(data)
    name = fields.pop("type", None)
    cls = MESSAGES.get(name)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown message type {name!r}; known: {sorted(MESSAGES)}")
    if cls is PushRequested and isinstance(fields.get("meta"), dict):
        meta = dict(fields["meta"])
        if "spans" in meta:
            meta["spans"] = spans_of(meta["spans"])
        fields["meta"] = PushMeta(**meta)
    for key in ("leases", "regrant"):
        if cls in (SendModel, Restore) and key in fields:
            fields[key] = spans_of(fields[key])
    if cls is PushShards and "transfers" in fields:
        fields["transfers"] = tuple(Transfer(**x) for x in fields["transfers"])
    for key, value in fields.items():
        if isinstance(value, list):
            fields[key] = tuple(value)
    try:
        return cls(**fields)
    except TypeError as e:
        raise ValueError(f"bad fields for {name}: {e}") from e
