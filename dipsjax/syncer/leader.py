"""The leader: a sans-IO state machine for outer rounds, membership, data and the budget.

The leader holds only small metadata (Di-PS sec. 5): membership, the round in progress, the
anomaly detector's history, the token ledger, the chunk ledger and the event tape. It never
touches tensors and never imports JAX: its decision step is NumPy (:mod:`dipsjax.rules`).
It has no sockets, threads or clocks: :meth:`Leader.handle` takes one event of
:mod:`dipsjax.syncer.messages` carrying a timestamp and returns the actions to carry out.

One round (DESIGN.md sec. 3):

1. ``PushRequested`` -> the learner joins the open round (or waits for the next one while a
   round is being updated or pulled) and gets ``PushShards``: its transfer plan (which
   tensor to which follower, in the order of the greedy schedule of Di-PS sec. 10). When
   the round reaches its quorum the grace policy sets a deadline (``WakeAt``).
2. The window closes at the deadline, or early when every active learner (or
   ``max_participants``) is in. Once every participant's ``TransferDone`` arrived, pushes
   too stale to use are dropped and ``RequestNorms`` goes to the followers.
3. Every follower's ``FollowerNorms`` -> their sum ``G`` -> anomaly penalty, weights -> ONE
   ``Decide`` (or, if nothing was accepted, ``Discard`` and a pull of the unchanged version).
4. Every follower's ``FollowerMerged`` -> ONE clip factor -> ``Apply(version + 1)``.
5. Every follower's ``FollowerApplied`` -> ``NotifyPull`` to the round's learners, saying
   what became of each one's push (``applied``, ``rejected``, ``nonfinite``, ``stale``,
   ``discarded``: a learner's error feedback settles by it); all ``PullDone`` -> the round
   ends, the next one opens with the pushes that waited.

Membership: ``Join`` -> ``SendModel`` (a new learner pulls one complete model of one version
before it trains). A ``Join`` with a higher incarnation ends the old incarnation first (its
in-flight push dropped and counted, its chunk leases released). A learner silent for
``missed_heartbeats`` intervals is evicted without stopping anyone. Each join, and each
rejoin, opens a *session* (``Join.session``, the learner's number, echoed by its
``SendModel``); the learner tags its push requests with it, a rejoin names the session it
ends (``Join.ends``), and a request of an ended session (sent before the rejoin,
delivered after it) is refused unbooked (``session``).

Data: with a chunk ledger (``Leader(data=...)``) learners lease chunks with
``ChunkRequested``; pushes complete the chunks they finished; evictions and restarts release
a learner's leases, so every chunk is trained once per epoch whatever the driver.

Accounting: ``ledger`` counts, from events only, the tokens learners reported (pushes,
refused ones included, but those refused unbooked: ``messages.UNBOOKED``) and how each
push ended (applied, rejected, dropped); :meth:`Leader.outstanding_tokens` sums the pushes
still pending. The learners count what they consumed on their side; the two must balance
(tests do that).

State is plain data: :meth:`Leader.snapshot` gives JSON (under 100 KB for 64 learners) and
:meth:`Leader.restore` rebuilds an equal leader from it.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dipsjax import rules
from dipsjax.data import ledger as chunks
from dipsjax.syncer.grace import GracePolicy, NoGrace
from dipsjax.syncer.messages import (
    UNBOOKED,
    Action,
    Apply,
    BadEvent,
    BadKind,
    ChunkRequested,
    Decide,
    Discard,
    Event,
    Evict,
    EvictKind,
    FollowerApplied,
    FollowerHeartbeat,
    FollowerJoined,
    FollowerLost,
    FollowerMerged,
    FollowerNorms,
    GrantChunk,
    Heartbeat,
    Join,
    LearnerFailed,
    Leave,
    NotifyPull,
    PullDone,
    PushMeta,
    PushOutcome,
    PushRequested,
    PushShards,
    Refuse,
    RefuseKind,
    Rejoin,
    RequestNorms,
    SendModel,
    Stop,
    Tick,
    Transfer,
    TransferDone,
    Unused,
    WakeAt,
    cut_strings,
    spans_of,
)
from dipsjax.syncer.schedule import greedy_schedule, optimal_schedule
from dipsjax.syncer.tape import (
    EventTape,
    Participant,
    RoundRecord,
    TokenLedger,
    from_strict_json,
    strict_json,
)

REFERENCES = ("start", "server")
#: Adaptive steps (EXTENSION): the weight of a push's train time in its learner's EMA.
SPEED_EMA = 0.5
#: Adaptive steps: a report counts at most this many times off its learner's estimate.
SPEED_JUMP = 2.0
#: Sessions: how many ended sessions a member keeps (a request of an older one is taken).
ENDED_SESSIONS = 16
#: Incarnations that left, per learner, whose count of pushes booked the leader keeps
#: (``Leader.left``): the word a later incarnation asks for (``Join.asks``) about a push
#: its predecessor wrote down and died before it knew the answer of.
LEFT = 8

# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class LeaderConfig:
    """Leader policy knobs (validated; errors name the field).

    Attributes:
      weighting: learner weights of the merge: ``tokens`` (Di-PS), ``decoupled``, ``uniform``.
      penalty: run the Di-PS anomaly penalty with ``anomaly``'s settings.
      anomaly: the penalty's settings (:class:`dipsjax.rules.AnomalyConfig`).
      max_norm: global clip threshold, or None for no clipping.
      clip_relative: EXTENSION (not in the papers, off by default): the threshold is
        ``max_norm`` times the median of the merged updates' norms (before clipping) of the
        last ``clip_history`` rounds that reached the merge; no clip before the first.
      clip_history: rounds in the relative clip's running median.
      reference: pseudo-gradient reference, ``start`` (Decoupled DiLoCo) or ``server``
        (Di-PS: followers rebuild ``theta_now - theta_end`` from the learner's
        ``theta_start - theta_end`` and their cache of recent versions).
      version_cache: versions each follower keeps (server reference): a push whose base
        version is ``version_cache`` or more versions old cannot be rebuilt and is dropped
        as stale before its norms are asked for.
      max_staleness: drop contributions more than this many versions old (None: keep all).
      max_participants: at most this many learners per round (1 = apply each push alone).
      heartbeat_interval, missed_heartbeats: eviction after this many silent intervals.
      rejoin_grace: seconds a :meth:`Leader.resume`-d leader gives its members to come back
        (processes restarting from checkpoints compile first) before heartbeats count.
      token_budget: stop after the round in which the tokens that entered decided rounds
        (applied or rejected; not dropped or refused) reach this many (None: never).
      num_followers: followers holding the shards (every one reports in every round).
      layer_owner: follower of each tensor, in the model's flattened order (the transfer
        plan is built from it; empty: plans carry no transfers).
      schedule: ``greedy`` (Di-PS sec. 10) or ``optimal`` (fewest steps) transfer plans.
      deal_chunks: ``0`` leases chunks on demand (whoever asks first gets the next one);
        ``N > 0`` deals them in turns to learners ``0 .. N-1`` (and any other member), so
        learner ``j``'s ``i``-th chunk is fixed whatever the timing: DiLoCo's per-worker
        data shards, which make synchronous DiLoCo's rounds independent of timing.
      min_active: a round's quorum counts at least this many learners even while fewer are
        active (0: only the active ones): synchronous DiLoCo over a fixed set of workers
        waits for all of them, also at the start and after a restart.
      fingerprint: the job's model fingerprint (its parameters' paths, shapes and dtypes);
        a learner that joins with another one is refused (empty: not checked).
      learners: the job's learner ids are ``0 .. learners - 1``: an event about another id
        is refused by :meth:`Leader.screen` (None: any id, as in the simulator).
      max_push_steps: a push reports at most this many inner steps (the job's
        ``inner_steps``; with ``adaptive_steps``, ``adaptive_max x inner_steps``), else it is
        refused (``bounds``) and not booked (None: no bound).
      step_tokens: one inner step trains at most this many tokens (``batch_size *
        seq_len``): a push reporting more than ``steps * step_tokens`` is refused
        (``bounds``) and not booked (None: no bound).
      adaptive_steps: EXTENSION (not in the papers, off by default): each learner is told
        how many inner steps its next rounds train (``SendModel.steps``,
        ``NotifyPull.steps``): as many as fit, at its seconds per step, between the end of
        its time before training and the moment every push is aimed at, the *beat*: when
        the slowest member, told now, would push after ``inner_steps`` steps (both
        estimated from its pushes: :meth:`Leader.steps_for`, :meth:`Leader._observe_speed`);
        at least one, at most ``adaptive_max x inner_steps``. A faster learner so trains
        more steps in the time the slowest trains ``inner_steps``, every learner's push
        comes at about the same moment (a quorum of 1 then gathers them all), and one left
        out of a round catches up. A learner not measured yet trains ``inner_steps``. For
        token weighting only (``weighting`` not ``uniform``: a round of more steps must
        weigh more).
      inner_steps: the job's ``H`` (needed by ``adaptive_steps``).
      adaptive_max: the most steps a round may be given, as a multiple of ``inner_steps``.
    """

    weighting: str = "tokens"
    penalty: bool = True
    anomaly: rules.AnomalyConfig = dataclasses.field(default_factory=rules.AnomalyConfig)
    max_norm: float | None = 1.0
    clip_relative: bool = False
    clip_history: int = 16
    reference: str = "start"
    version_cache: int = 8
    max_staleness: int | None = None
    max_participants: int | None = None
    heartbeat_interval: float = 10.0
    missed_heartbeats: int = 3
    rejoin_grace: float = 60.0
    token_budget: int | None = None
    num_followers: int = 1
    layer_owner: tuple[int, ...] = ()
    schedule: str = "greedy"
    deal_chunks: int = 0
    min_active: int = 0
    fingerprint: str = ""
    learners: int | None = None
    max_push_steps: int | None = None
    step_tokens: int | None = None
    adaptive_steps: bool = False
    inner_steps: int | None = None
    adaptive_max: float = 2.0

    def __post_init__(self) -> None:
        most = self.most_steps() if math.isfinite(self.adaptive_max) else math.inf
        checks = [
            (self.weighting in rules.WEIGHTINGS, "weighting", "tokens|decoupled|uniform"),
            (self.max_norm is None or self.max_norm > 0, "max_norm", "> 0 or None"),
            (
                not self.clip_relative or self.max_norm is not None,
                "max_norm",
                "a multiple of the running median norm (> 0) when clip_relative is on",
            ),
            (self.clip_history >= 1, "clip_history", ">= 1"),
            (self.reference in REFERENCES, "reference", "start|server"),
            (self.version_cache >= 1, "version_cache", ">= 1"),
            (
                self.max_staleness is None or self.max_staleness >= 0,
                "max_staleness",
                ">= 0 or None",
            ),
            (
                self.max_participants is None or self.max_participants >= 1,
                "max_participants",
                ">= 1 or None",
            ),
            (self.heartbeat_interval > 0, "heartbeat_interval", "> 0"),
            (self.missed_heartbeats >= 1, "missed_heartbeats", ">= 1"),
            (self.rejoin_grace >= 0, "rejoin_grace", ">= 0 seconds"),
            (self.token_budget is None or self.token_budget > 0, "token_budget", "> 0 or None"),
            (self.num_followers >= 1, "num_followers", ">= 1"),
            (
                all(0 <= f < self.num_followers for f in self.layer_owner),
                "layer_owner",
                f"follower ids in [0, {self.num_followers})",
            ),
            (self.schedule in ("greedy", "optimal"), "schedule", "greedy|optimal"),
            (self.deal_chunks >= 0, "deal_chunks", ">= 0"),
            (self.min_active >= 0, "min_active", ">= 0"),
            (self.learners is None or self.learners >= 1, "learners", ">= 1 or None"),
            (
                self.max_push_steps is None or self.max_push_steps >= 1,
                "max_push_steps",
                ">= 1 or None",
            ),
            (self.step_tokens is None or self.step_tokens >= 1, "step_tokens", ">= 1 or None"),
            (self.inner_steps is None or self.inner_steps >= 1, "inner_steps", ">= 1 or None"),
            (
                not self.adaptive_steps or self.inner_steps is not None,
                "inner_steps",
                "set (the job's H) when adaptive_steps is on",
            ),
            (
                not self.adaptive_steps or self.weighting != "uniform",
                "weighting",
                "tokens or decoupled when adaptive_steps is on (a round of more steps must "
                "weigh more)",
            ),
            (
                math.isfinite(self.adaptive_max) and self.adaptive_max >= 1,
                "adaptive_max",
                ">= 1 and finite",
            ),
            (
                not self.adaptive_steps
                or self.max_push_steps is None
                or self.max_push_steps >= most,
                "max_push_steps",
                f">= adaptive_max x inner_steps = {most} when adaptive_steps is on",
            ),
        ]
        for ok, name, allowed in checks:
            if not ok:
                raise ValueError(
                    f"LeaderConfig.{name} must be {allowed}, got {getattr(self, name)!r}"
                )

    def most_steps(self) -> int:
        """The most inner steps a round may be given (``adaptive_steps``), else ``H``."""
        h = self.inner_steps or 1
        return int(self.adaptive_max * h) if self.adaptive_steps else h

    def stale_limit(self) -> int | None:
        """Largest usable staleness (versions), from ``max_staleness`` and the cache."""
        limits = [] if self.max_staleness is None else [self.max_staleness]
        if self.reference == "server":
            limits.append(self.version_cache - 1)
        return min(limits) if limits else None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LeaderConfig:
        d = dict(d)
        d["anomaly"] = rules.AnomalyConfig(**d["anomaly"])
        d["layer_owner"] = tuple(d["layer_owner"])
        return cls(**d)


# ------------------------------------------------------------------------------ state


class Phase(enum.Enum):
    IDLE = "idle"
    COLLECTING = "collecting"  # accepting pushes into the open round
    TRANSFERS = "transfers"  # window closed, waiting for shards to land
    NORMS = "norms"
    MERGE = "merge"
    APPLY = "apply"
    PULL = "pull"


@dataclasses.dataclass
class Push:
    learner: int
    meta: PushMeta
    t: float
    transferred: bool = False
    outcome: str | None = None  # applied | rejected | dropped, once settled
    round_id: int = -1  # the round it was admitted to (-1: still waiting)

    @property
    def tokens(self) -> int:
        return self.meta.tokens


@dataclasses.dataclass
class Round:
    round_id: int
    opened: float
    phase: Phase = Phase.COLLECTING
    pushes: list[Push] = dataclasses.field(default_factory=list)
    quorum_at: float | None = None
    deadline: float | None = None
    closed: float | None = None
    grace: float = 0.0
    learners: tuple[int, ...] = ()
    dropped: list[Push] = dataclasses.field(default_factory=list)  # stale, before norms
    decision: Decide | None = None
    scores: list[float] = dataclasses.field(default_factory=list)
    threshold: float | None = None
    decided_version: int | None = None
    clip_factor: float | None = None
    merged_sq_norm: float | None = None
    applied: bool = False
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    norms: dict[int, list[float]] = dataclasses.field(default_factory=dict)  # per follower
    merged: dict[int, float] = dataclasses.field(default_factory=dict)
    done: list[int] = dataclasses.field(default_factory=list)  # followers that applied
    pulling: list[int] = dataclasses.field(default_factory=list)
    # Learners that rejoined (``Join(resume=True)``, or all of them after a leader restart)
    # while their push was with the followers: they pull through their ``SendModel``, not
    # through this round's pull notice.
    rejoined: list[int] = dataclasses.field(default_factory=list)
    # Learners that rejoined while the followers applied this round: their ``SendModel``
    # goes once it is applied (the version after it), not the version before it.
    awaiting: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Member:
    joined: float
    last_seen: float
    incarnation: int = 0
    active: bool = False  # pulled its first model
    last_round: int = -1  # round of its last settled push (-1: none or never admitted)
    last_outcome: str = ""  # applied | rejected | dropped
    booked: int = 0  # pushes of this incarnation booked (reported), refused ones included
    # (but those refused unbooked, messages.UNBOOKED)
    in_grace: bool = False  # resumed leader: last_seen is a deadline, until its first contact
    # Adaptive steps: EMAs of its pushes' train seconds and steps (their ratio is its
    # seconds per step; 0: none yet), of its time from a notice to its training, and when
    # it was last told its steps (-1: not since).
    train_ema: float = 0.0
    steps_ema: float = 0.0
    lead_seconds: float = 0.0
    notified: float = -1.0
    session: int = 0  # of its newest join (Join.session; 0: untagged, or from before)
    ended: list[int] = dataclasses.field(default_factory=list)  # sessions its rejoins ended
    pushed: int = 0  # the session of its newest push request taken (0: none)
    asks: int | None = None  # the earlier incarnation its joins asked about (Join.asks)

    @property
    def step_seconds(self) -> float:
        """Adaptive steps: its seconds per inner step (0: not measured)."""
        return self.train_ema / self.steps_ema if self.steps_ema > 0 else 0.0


def _member(d: dict[str, Any]) -> Member:
    """A snapshot's member (one written by the first form of adaptive steps holds its
    seconds per step as ``step_seconds``: taken as one step's EMAs)."""
    d = dict(d)
    per_step = d.pop("step_seconds", None)
    if per_step and "steps_ema" not in d:
        d["train_ema"], d["steps_ema"] = float(per_step), 1.0
    return Member(**d)


class Leader:
    """The leader's state machine (see module docstring)."""

    def __init__(
        self,
        config: LeaderConfig | None = None,
        grace: GracePolicy | None = None,
        *,
        version: int = 0,
        data: chunks.ChunkLedger | None = None,
    ) -> None:
        self.config = config or LeaderConfig()
        self.grace = grace or NoGrace()
        self.version = version
        self.members: dict[int, Member] = {}
        self.clock: dict[int, int] = {}  # vector clock: accepted contributions per learner
        self.incarnations: dict[int, int] = {}  # highest incarnation seen per learner
        # Per learner, its last LEFT incarnations that left membership and how many of
        # their pushes were booked (those booked after they left included): ``[[incarnation,
        # booked], ...]``, oldest first (``SendModel.asked``).
        self.left: dict[int, list[list[int]]] = {}
        self.round: Round | None = None
        self.waiting: list[Push] = []
        self.next_round_id = 0
        self.anomaly = rules.init_history(np, self.config.anomaly.history)
        # The relative clip's window: norms of the last merged updates (before clipping).
        self.clip_norms: list[float] = []
        self.ledger = TokenLedger()
        self.data = data
        self.followers_up: dict[int, bool] = dict.fromkeys(range(self.config.num_followers), True)
        # When each follower was last heard from (any report or heartbeat), from its first
        # heartbeat on (the simulator's followers send none): one silent for
        # ``missed_heartbeats`` intervals is lost. Not snapshotted (a resumed leader waits
        # for every follower to join again).
        self.follower_seen: dict[int, float] = {}
        # Followers that heartbeat (not snapshotted): one that joins again after a loss is
        # watched from its join on, not from its next beat (a kill in between was never
        # found silent).
        self.follower_beats: set[int] = set()
        # The oldest version each follower can rebuild a stale row from (server reference),
        # when it said so on joining: a follower restarted from a checkpoint holds fewer
        # versions than the cache bound, and pushes older than what it holds are dropped.
        self.follower_oldest: dict[int, int] = {}
        # Where each follower's data plane is, as it said on joining (a replacement on a
        # new port or host takes over the shard; learners look it up in the status).
        self.follower_addresses: dict[int, str] = {}
        # Followers found lost by their silence (not snapshotted): one that beats again is
        # told to join again (``Rejoin``).
        # Followers a resumed leader waits for (``resume``): silent past its grace, they are
        # lost as if they had been up; ``follower_grace``: their ``follower_seen`` is still
        # the grace's deadline (their first contact ends it).
        self.followers_awaited: set[int] = set()
        self.follower_grace: set[int] = set()
        self.lost_by_silence: set[int] = set()
        # Of those, the ones already asked to rejoin in this episode of being lost: one
        # ``Rejoin`` each (a late second one would wipe the next round's staged shards).
        self.rejoin_asked: set[int] = set()
        self.lru: tuple[int, ...] = ()
        self.dealt: dict[int, list[chunks.Span]] = {}  # deal_chunks: dealt, not yet granted
        self.tape = EventTape()
        self.stopped = False
        self.stop_reason = ""  # what the Stop said
        self.beat: float | None = None  # adaptive steps: when the next pushes are aimed at
        # Bad input by kind: pushes refused (unknown, inactive, incarnation, invalid,
        # pending, stopped), joins refused (incarnation, fingerprint), contributions
        # rejected for a non-finite norm (nonfinite) or dropped as too stale (stale).
        self.refused: collections.Counter[str] = collections.Counter()

    # -- helpers -------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return Phase.IDLE if self.round is None else self.round.phase

    def active_members(self) -> list[int]:
        return sorted(j for j, m in self.members.items() if m.active)

    def outstanding_tokens(self) -> int:
        """Tokens of the pushes not settled yet (waiting, or in the round in progress)."""
        pending = self.waiting + (self.round.pushes if self.round is not None else [])
        return sum(p.tokens for p in pending if p.outcome is None)

    def budget_tokens(self) -> int:
        """The budget's count: tokens that entered a decided round, applied or rejected
        (from the ledger). Dropped pushes (stale, discarded rounds, lost to a restart) are
        trained again by someone and counted then."""
        tot = self.ledger.totals()
        return tot["applied"] + tot["rejected"]

    def budget_reached(self) -> bool:
        budget = self.config.token_budget
        return budget is not None and self.budget_tokens() >= budget

    def _settle(self, p: Push, outcome: str, release: bool = True) -> None:
        """Books a push's outcome once. Its batches (``meta.spans``) count as trained when
        it was applied or rejected (the data was used); a dropped push gives them back (or,
        with ``release=False``, leaves them leased to its learner, who trains them again)."""
        if p.outcome is None:
            p.outcome = outcome
            self.ledger.settle(p.learner, p.tokens, outcome)
            member = self.members.get(p.learner)
            if member is not None and member.incarnation == p.meta.incarnation:
                # "lost": dropped with its chunks kept by its learner, who trains them again.
                said = outcome if outcome != "dropped" or release else "lost"
                member.last_round, member.last_outcome = p.round_id, said
            if outcome != "dropped":
                self._settle_spans(p.learner, p.meta.spans)
            elif release:
                self._release_spans(p.learner, p.meta.spans)

    def _unused(self, p: Push, kind: str, reason: str) -> list[Unused]:
        """The word to a push's sender that its push was bad input (``Unused``), if the
        incarnation that sent it is still the member."""
        member = self.members.get(p.learner)
        if member is None or member.incarnation != p.meta.incarnation:
            return []
        return [Unused(p.learner, p.round_id, kind, reason, p.meta.incarnation)]

    def _pullers(self, rnd: Round) -> list[int]:
        """The round's learners that pull its result: the incarnations that pushed, still
        members (a restarted learner pulls through ``SendModel`` instead)."""
        return [
            p.learner
            for p in rnd.pushes + rnd.dropped
            if p.learner in self.members
            and self.members[p.learner].incarnation == p.meta.incarnation
            and p.learner not in rnd.rejoined
        ]

    def _notify(self, rnd: Round, now: float) -> NotifyPull:
        """The round's pull notice to its pullers (``rnd.pulling``), with what became of
        each one's push (:class:`~dipsjax.syncer.messages.PushOutcome`)."""
        decision = rnd.decision
        norms = dict(zip(decision.learners, decision.sq_norms, strict=True)) if decision else {}

        def outcome(j: int) -> str:
            if any(p.learner == j for p in rnd.dropped):
                return PushOutcome.STALE
            said = [p.outcome for p in rnd.pushes if p.learner == j]
            if said == ["applied"]:
                return PushOutcome.APPLIED
            if said == ["rejected"]:
                finite = np.isfinite(norms.get(j, 0.0))
                return PushOutcome.REJECTED if finite else PushOutcome.NONFINITE
            return PushOutcome.DISCARDED

        pulling = tuple(rnd.pulling)
        outcomes = tuple(str(outcome(j)) for j in pulling)
        adaptive = self.config.adaptive_steps
        steps = tuple(self.steps_for(j, now) for j in pulling) if adaptive else ()
        return NotifyPull(rnd.round_id, pulling, self.version, outcomes, steps)

    def _stop(self, reason: str) -> list[Action]:
        """The job stops (for good: a stopped leader only refuses pushes), saying why."""
        self.stopped, self.stop_reason = True, reason
        return [Stop(reason)]

    def _membership(self, t: float, event: str, learner: int, **extra: Any) -> None:
        self.tape.append(
            "membership", t=t, event=event, learner=learner, version=self.version, **extra
        )

    def _seen(self, learner: int, t: float) -> None:
        member = self.members.get(learner)
        if member is None:
            return
        if member.in_grace:  # back in touch after a resume: heartbeats count from now
            member.in_grace, member.last_seen = False, t
        else:
            member.last_seen = max(member.last_seen, t)

    # -- entry point ---------------------------------------------------------------

    def screen(self, event: Event) -> BadEvent | None:
        """Whether ``event`` is about a peer or a round the job does not have: a learner id
        outside ``config.learners``, a follower id outside ``config.num_followers``, a
        round never opened or one that has ended. :meth:`handle` refuses such an event
        (counted by kind, nothing else changes); a driver may call this first to tell the
        sender. Pure: it changes nothing."""
        for role in ("learner", "follower"):
            peer = getattr(event, role, None)
            bad = None if peer is None else self.screen_peer(role, peer)
            if bad is not None:
                return bad
        round_id = getattr(event, "round_id", None)
        if round_id is not None:
            if round_id >= self.next_round_id:
                return BadEvent(
                    BadKind.UNKNOWN_ROUND,
                    f"round {round_id} was never opened (the next is {self.next_round_id})",
                )
            if self.round is None or round_id != self.round.round_id:
                return BadEvent(BadKind.OLD_ROUND, f"round {round_id} has ended")
        return None

    def screen_peer(self, role: str, peer: int) -> BadEvent | None:
        """Whether ``peer`` is a ``role`` (``learner`` or ``follower``) id the job does not
        have (:meth:`screen`'s check of the peer an event is about; a driver's check of who
        asks to watch its actions). Pure: it changes nothing."""
        if role == "learner":
            n = self.config.learners
            if n is not None and not 0 <= peer < n:
                return BadEvent(
                    BadKind.UNKNOWN_LEARNER, f"no learner {peer}: the job has {n} learners"
                )
            return None
        k = self.config.num_followers
        if not 0 <= peer < k:
            return BadEvent(
                BadKind.UNKNOWN_FOLLOWER, f"no follower {peer}: the job has {k} followers"
            )
        return None

    def handle(self, event: Event) -> list[Action]:
        """Consumes one event and returns the actions to carry out, in order. An event
        :meth:`screen` refuses is counted and changes nothing else; string fields longer
        than :data:`~dipsjax.syncer.messages.MAX_STRING` bytes are cut first."""
        bad = self.screen(event)
        if bad is not None:
            self.refused[bad.kind] += 1
            return []
        event = cut_strings(event)
        if self.stopped:
            if isinstance(event, PushRequested):  # booked, so the learners' count balances
                too_many = self._beyond_bounds(event.meta)
                if too_many:
                    return self._refuse(event, "bounds", too_many)
                return self._refuse(event, "stopped", "the job has stopped")
            return []
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        if handler is None:
            raise TypeError(f"the leader has no handler for {type(event).__name__}")
        actions: list[Action] = handler(event)
        actions += self._check_heartbeats(event.t)
        actions += self._advance(event.t)
        return actions

    # -- membership ----------------------------------------------------------------

    def _on_Join(self, ev: Join) -> list[Action]:
        known = self.incarnations.get(ev.learner)
        if known is not None and ev.incarnation < known:
            self.refused["incarnation"] += 1
            return [
                Refuse(
                    ev.learner,
                    f"incarnation {ev.incarnation} is older than {known}",
                    RefuseKind.INCARNATION,
                    ev.incarnation,
                )
            ]
        want = self.config.fingerprint
        if want and ev.fingerprint != want:
            self.refused["fingerprint"] += 1
            return [
                Refuse(
                    ev.learner,
                    f"model fingerprint {ev.fingerprint or '(none)'} is not the job's {want}: "
                    "another model, config or code version",
                    RefuseKind.FINGERPRINT,
                    ev.incarnation,
                )
            ]
        actions: list[Action] = []
        member = self.members.get(ev.learner)
        if ev.resume and (member is None or member.incarnation != ev.incarnation):
            # Back from a checkpoint of an incarnation that is no longer a member (evicted
            # meanwhile): its leases went to others, so it must not resume; a new
            # incarnation joins afresh.
            self.refused["unknown"] += 1
            return [
                Refuse(
                    ev.learner,
                    f"incarnation {ev.incarnation} is not a member (evicted): start a new "
                    "incarnation",
                    RefuseKind.UNKNOWN,
                    ev.incarnation,
                )
            ]
        if member is not None:
            if ev.incarnation == member.incarnation:
                self._seen(ev.learner, ev.t)
                if ev.resume:
                    if ev.asks is not None:
                        member.asks = ev.asks
                    return self._rejoin(ev.learner, ev.t, ev.session, ev.ends)
                return []  # a retried join: nothing new
            # A restart before eviction: the new incarnation ends the old one.
            actions += self._remove(ev.learner, ev.t, "restarted")
        self.incarnations[ev.learner] = ev.incarnation
        member = Member(
            joined=ev.t,
            last_seen=ev.t,
            incarnation=ev.incarnation,
            session=ev.session,
            asks=ev.asks,
        )
        self.members[ev.learner] = member
        self.clock.setdefault(ev.learner, 0)
        self._membership(ev.t, "join", ev.learner, incarnation=ev.incarnation)
        asked = self.booked_of(ev.learner, ev.asks)
        return [*actions, SendModel(ev.learner, self.version, session=ev.session, asked=asked)]

    def _rejoin(self, learner: int, t: float, session: int = 0, ends: int = 0) -> list[Action]:
        """A learner resumed from its checkpoint (same incarnation): it pulls the current
        version, learns how its last push ended, and gets back, in lease order, the chunks
        still leased to it, which it regrants to itself (the ones it had leased after its
        checkpoint, or trained in a push that was dropped) before it asks for new ones."""
        member = self.members[learner]
        # A process restarted from its checkpoint knows no session of its own: its first
        # rejoin ends the member's (that of the newest join taken, its last process's).
        ends = ends or member.session
        if self._stale_rejoin(member, ends):
            return []
        member.active = False
        member.session = session
        if ends and ends not in member.ended:  # its requests are refused from now on
            member.ended = [*member.ended, ends][-ENDED_SESSIONS:]
        # Its pushes the followers do not hold yet are lost (it trains them again); one
        # already with the followers is applied or rejected as usual. It pulls through this
        # SendModel, not through the round's pull notice.
        queues = [self.waiting] + ([self.round.pushes] if self._open_pushes() else [])
        for queue in queues:
            for p in [p for p in queue if p.learner == learner]:
                queue.remove(p)
                self._settle(p, "dropped", release=False)
        rnd = self.round
        with_followers = (Phase.NORMS, Phase.MERGE, Phase.APPLY)
        if rnd is not None and rnd.phase in with_followers and learner not in rnd.rejoined:
            rnd.rejoined.append(learner)  # the round's pull notice leaves it out
        if rnd is not None and learner in rnd.pulling:
            rnd.pulling.remove(learner)
        self.dealt.pop(learner, None)  # dealt chunks are among its leases now
        self._membership(t, "resume", learner, incarnation=member.incarnation)
        if rnd is not None and rnd.phase is Phase.APPLY:
            # The outer step is under way: the learner takes the version it makes, as the
            # round's other learners do (a synchronous run stays the same run), and learns
            # how its push there ended.
            if learner not in rnd.awaiting:
                rnd.awaiting.append(learner)
            return []
        return [self._send_model(learner, t)]

    @staticmethod
    def _stale_rejoin(member: Member, ends: int) -> bool:
        """Whether a rejoin that ends session ``ends`` was sent before its learner took a
        newer model (it reached the leader late, a paused leader taking its queued calls
        in any order): a newer session was ended since, or a push request of a session
        not ended was taken (the learner's sessions end in order, each by the join whose
        model it takes next, so that one is the session it holds). Its answer would be
        useless, and taking it would make a member that trains inactive; it is ignored."""
        if not ends or ends not in member.ended:
            return False
        return ends != member.ended[-1] or (
            member.pushed != 0 and member.pushed not in member.ended
        )

    def _send_model(self, learner: int, now: float) -> SendModel:
        """A rejoined learner's model: the current version, how its last push ended, and
        the pieces still leased to it, in lease order."""
        member = self.members[learner]
        # The batches of its push with the followers are not its to train again: they
        # settle (or come back) when that push is decided.
        leases = spans_of(
            chunks.subtract(
                (lease.span for lease in chunks.leases_of(self.data, str(learner))),
                self._deciding(learner),
            )
            if self.data is not None
            else ()
        )
        return SendModel(
            learner,
            self.version,
            leases,
            member.last_round,
            member.last_outcome,
            member.booked,
            self.steps_for(learner, now),
            member.session,
            self.booked_of(learner, member.asks),
        )

    def steps_for(self, learner: int, now: float) -> int:
        """Adaptive steps (EXTENSION, ``LeaderConfig.adaptive_steps``): the inner steps of
        the round ``learner`` is told of at ``now`` (its pull notice or its model; 0: not
        said, the job's ``H``; always 0 when off). Every learner aims its push at one
        moment, the *beat*: when the slowest member, told now, would push after ``H``
        steps (the most, over the members, of their time from a notice to its training
        plus ``H`` of their steps), set by the first notice once the last beat has passed
        (and brought closer when that time shrinks, a slow member gone). A learner is given
        the steps that fit, at its speed, between the end of its own time before training
        and the beat (at least one, at most ``adaptive_max x H``; the beat after it if
        this one is less than half a step away). A learner left out of a round so catches
        up with the others at the next beat, with a shorter round, instead of keeping its
        phase behind them for good. Records the notice's time, from which the learner's
        next push measures its time before training."""
        cfg = self.config
        member = self.members.get(learner)
        if not cfg.adaptive_steps or member is None:
            return 0
        member.notified = now
        if member.step_seconds <= 0:
            return 0
        h = cfg.inner_steps or 1
        measured = [m for m in self.members.values() if m.step_seconds > 0]
        period = max(m.lead_seconds + h * m.step_seconds for m in measured)
        if self.beat is None or not now < self.beat <= now + period:
            self.beat = now + period  # the last one passed, or farther than a period now
        most = cfg.most_steps()
        steps = (self.beat - now - member.lead_seconds) / member.step_seconds
        if steps < 0.5:  # (the beat is too close: the one after it)
            steps += period / member.step_seconds
        return max(1, round(min(steps, most))) if math.isfinite(steps) else most

    def _observe_speed(self, member: Member, meta: PushMeta, t: float) -> None:
        """Adaptive steps: a push's train time and steps update its learner's seconds per
        step (the ratio of their EMAs, so a short round weighs little), and the time from
        its last notice to the push less that train time its time before training (its
        pull, mostly). EMAs of weight :data:`SPEED_EMA` on the newest; a report more than
        :data:`SPEED_JUMP` times off the estimate moves it as one that far would (a paused
        process, a pull that waited for a follower: one round cannot set the beat)."""
        notified, member.notified = member.notified, -1.0
        if not self.config.adaptive_steps or meta.steps <= 0 or not meta.train_seconds > 0:
            return
        a, jump = SPEED_EMA, SPEED_JUMP
        seconds = meta.train_seconds
        if member.step_seconds > 0:
            expect = meta.steps * member.step_seconds
            seconds = min(max(seconds, expect / jump), expect * jump)
        if member.steps_ema <= 0:
            member.train_ema, member.steps_ema = seconds, float(meta.steps)
        else:
            member.train_ema = a * seconds + (1 - a) * member.train_ema
            member.steps_ema = a * meta.steps + (1 - a) * member.steps_ema
        lead = t - notified - meta.train_seconds
        if notified >= 0 and math.isfinite(lead) and lead >= 0:
            last = member.lead_seconds
            if last > 0:
                lead = min(lead, last * jump)
            member.lead_seconds = lead if last <= 0 else a * lead + (1 - a) * last

    def _on_Leave(self, ev: Leave) -> list[Action]:
        return self._remove(ev.learner, ev.t, "left")

    def _on_LearnerFailed(self, ev: LearnerFailed) -> list[Action]:
        self._membership(ev.t, "outage", ev.learner, reason=ev.reason)
        return []

    def _on_Heartbeat(self, ev: Heartbeat) -> list[Action]:
        self._seen(ev.learner, ev.t)
        return []

    def _on_Tick(self, ev: Tick) -> list[Action]:
        del ev
        return []

    def _check_heartbeats(self, t: float) -> list[Action]:
        limit = self.config.heartbeat_interval * self.config.missed_heartbeats
        actions: list[Action] = []
        for j in sorted(self.members):
            if t - self.members[j].last_seen > limit:
                actions += self._remove(j, t, "missed heartbeats")
        for k in sorted(self.follower_seen):
            watched = self.followers_up[k] or k in self.followers_awaited
            if watched and t - self.follower_seen[k] > limit:
                actions += self._on_FollowerLost(FollowerLost(t, k, "missed heartbeats"))
                self.lost_by_silence.add(k)
        return actions

    def _follower_seen(self, k: int, t: float, heartbeat: bool = False) -> None:
        if not 0 <= k < self.config.num_followers:
            raise ValueError(f"no follower {k}: the job has {self.config.num_followers}")
        if k in self.follower_grace:  # back in touch after a resume: silence counts now
            self.follower_grace.discard(k)
            self.follower_seen[k] = t
        elif heartbeat or k in self.follower_seen or k in self.follower_beats:
            self.follower_seen[k] = max(self.follower_seen.get(k, t), t)

    def _on_FollowerHeartbeat(self, ev: FollowerHeartbeat) -> list[Action]:
        self._follower_seen(ev.follower, ev.t, heartbeat=True)
        self.follower_beats.add(ev.follower)
        if ev.follower in self.lost_by_silence and ev.follower not in self.rejoin_asked:
            # Found lost while silent (a hang), beating again: it does not know. Asked once.
            self.rejoin_asked.add(ev.follower)
            return [Rejoin(ev.follower, "found lost through missed heartbeats")]
        return []

    def _remove(self, learner: int, t: float, reason: str) -> list[Action]:
        if learner not in self.members:
            return []
        gone = self.members.pop(learner)
        incarnation = gone.incarnation
        history = [e for e in self.left.get(learner, []) if e[0] != incarnation]
        self.left[learner] = [*history, [incarnation, gone.booked]][-LEFT:]
        event = {"left": "leave", "restarted": "restart"}.get(reason, "evict")
        self._membership(t, event, learner, reason=reason)
        kind = {"left": EvictKind.LEFT, "restarted": EvictKind.RESTARTED}.get(
            reason, EvictKind.SILENT
        )
        actions: list[Action] = [Evict(learner, reason, incarnation, kind)]
        # A contribution not yet handed to the followers is dropped; later ones stay merged.
        queues = [self.waiting]
        if self.round is not None and self.round.phase in (Phase.COLLECTING, Phase.TRANSFERS):
            queues.append(self.round.pushes)
        for queue in queues:
            for p in [p for p in queue if p.learner == learner]:
                queue.remove(p)
                self._settle(p, "dropped")
        if self.round is not None and learner in self.round.pulling:
            self.round.pulling.remove(learner)
        self.grace.forget_learner(learner)
        self.dealt.pop(learner, None)
        if self.data is not None:
            # Its batches go back, except those of a push already with the followers (they
            # settle or come back when that push is decided).
            self.data = chunks.release(self.data, str(learner), keep=self._deciding(learner))
        return actions

    def _deciding(self, learner: int) -> tuple[chunks.Span, ...]:
        """The batches of ``learner``'s push in the round, not yet decided."""
        rnd = self.round
        pushes = rnd.pushes if rnd is not None else []
        mine = [p for p in pushes if p.learner == learner and p.outcome is None]
        return tuple(span for p in mine for span in p.meta.spans)

    def _on_PullDone(self, ev: PullDone) -> list[Action]:
        self._seen(ev.learner, ev.t)
        self.grace.observe_start(ev.learner, ev.t)
        member = self.members.get(ev.learner)
        if member is not None and not member.active:
            member.active = True
            extra = {} if ev.rounds < 0 else {"rounds": ev.rounds}
            self._membership(ev.t, "active", ev.learner, pulled_version=ev.version, **extra)
        rnd = self.round
        if rnd is not None and rnd.phase is Phase.PULL and ev.learner in rnd.pulling:
            rnd.pulling.remove(ev.learner)
        return []

    # -- data ------------------------------------------------------------------------

    def _on_ChunkRequested(self, ev: ChunkRequested) -> list[Action]:
        self._seen(ev.learner, ev.t)
        if self.data is None:
            raise ValueError("ChunkRequested: this leader has no chunk ledger (data=None)")
        if ev.learner not in self.members:
            return [GrantChunk(ev.learner, None)]
        if self.config.deal_chunks:
            return [self._grant(ev.learner, self._deal(ev.learner))]
        self.data, got = chunks.lease(self.data, str(ev.learner))
        return [self._grant(ev.learner, None if got is None else got.span)]

    @staticmethod
    def _grant(learner: int, span: chunks.Span | None) -> GrantChunk:
        return GrantChunk(learner, None) if span is None else GrantChunk(learner, *span)

    def _deal(self, learner: int) -> chunks.Span | None:
        """``deal_chunks``: one chunk to each learner in turn, whenever ``learner`` has none
        dealt; learner ``j``'s ``i``-th chunk comes from the ``i``-th deal."""
        assert self.data is not None
        if not self.dealt.get(learner):
            # Learners 0..N-1 until they first join (so the deal does not depend on who
            # joined first), then members only: one that left gets no more chunks.
            unseen = {j for j in range(self.config.deal_chunks) if j not in self.incarnations}
            turn = sorted(unseen | set(self.members))
            for j in turn:
                self.data, got = chunks.lease(self.data, str(j))
                if got is None:
                    break
                self.dealt.setdefault(j, []).append(got.span)
        queue = self.dealt.get(learner)
        return queue.pop(0) if queue else None

    def _settle_spans(self, learner: int, spans: tuple[chunks.Span, ...]) -> None:
        self._spans(chunks.settle, learner, spans)

    def _release_spans(self, learner: int, spans: tuple[chunks.Span, ...]) -> None:
        self._spans(chunks.release, learner, spans)

    def _spans(self, op: Callable, learner: int, spans: tuple[chunks.Span, ...]) -> None:
        """``op`` (settle or release) on the batches of ``spans`` ``learner`` still holds."""
        if self.data is not None:
            mine = [sp for sp in spans if chunks.holds(self.data, str(learner), sp)]
            self.data = op(self.data, str(learner), mine)

    # -- pushes --------------------------------------------------------------------

    def _refuse(self, ev: PushRequested, kind: str, reason: str) -> list[Action]:
        # Refused tokens are counted (reported and dropped), never lost from the books. Its
        # batches stay where they are: with its learner, who trains them again (or exits,
        # and its next incarnation's join gives them back), or already given back when an
        # older incarnation's push arrives; a retry's first copy settles them itself.
        # Not booked: a push of an incarnation that never joined (``ghost``), one claiming
        # more than the job's geometry allows (``bounds``), or one of a member that must
        # pull first (``inactive``: maybe sent before a rejoin whose count did not hold
        # it), or one of a session a rejoin ended (``session``: late, as that);
        # its sender counts none of them (``UNBOOKED``).
        self.refused[kind] += 1
        if kind not in UNBOOKED:
            self._book(ev)
            self.ledger.settle(ev.learner, max(int(ev.meta.tokens), 0), "dropped")
        return [Refuse(ev.learner, reason, RefuseKind(kind), ev.meta.incarnation)]

    def _book(self, ev: PushRequested) -> None:
        """Books a push's tokens (``reported``), and counts it for the member's incarnation
        that sent it (``Member.booked``: a rejoin's word on a push whose answer was lost)."""
        self.ledger.report(ev.learner, max(int(ev.meta.tokens), 0))
        member = self.members.get(ev.learner)
        if member is not None and member.incarnation == ev.meta.incarnation:
            member.booked += 1
            return
        for entry in self.left.get(ev.learner, []):  # a push of an incarnation that left
            if entry[0] == ev.meta.incarnation:
                entry[1] += 1

    def booked_of(self, learner: int, incarnation: int | None) -> int | None:
        """How many pushes of ``learner``'s ``incarnation`` were booked: the member's, or
        one that left (``SendModel.asked``; the audit's word on a push in doubt no later
        process settled). ``None``: not asked, or not known."""
        member = self.members.get(learner)
        if incarnation is None:
            return None
        if member is not None and member.incarnation == incarnation:
            return member.booked
        return next((n for i, n in self.left.get(learner, []) if i == incarnation), None)

    def _on_PushRequested(self, ev: PushRequested) -> list[Action]:
        member = self.members.get(ev.learner)
        meta = ev.meta
        if member is None:
            return self._refuse(ev, "unknown", "not a member: join and pull a model first")
        too_many = self._beyond_bounds(meta)  # before any refusal that books the push
        if too_many:
            return self._refuse(ev, "bounds", too_many)
        if not member.active:
            # A member that must pull first (e.g. a push sent before a leader restart and
            # delivered to the resumed leader): it keeps its batches, as it rejoins from its
            # checkpoint and trains them again.
            return self._refuse(ev, "inactive", "pull a model first")
        if meta.incarnation > member.incarnation:  # no process of it joined: not booked
            return self._refuse(
                ev,
                "ghost",
                f"incarnation {meta.incarnation} never joined (the member's is "
                f"{member.incarnation})",
            )
        if meta.incarnation != member.incarnation:  # an older process's: it counted it
            return self._refuse(
                ev,
                "incarnation",
                f"incarnation {meta.incarnation} is not the member's {member.incarnation}",
            )
        if ev.session and ev.session in member.ended:
            # Sent before a rejoin that ended its session and delivered after it (and
            # after its pull): the rejoin settled it as not booked, and the learner trains
            # its batches again. Not booked here either.
            return self._refuse(
                ev,
                "session",
                f"session {ev.session} was ended by a rejoin (a request sent before it)",
            )
        bad_time = not math.isfinite(meta.train_seconds) or meta.train_seconds < 0
        if meta.tokens < 0 or meta.steps < 0 or meta.base_version > self.version or bad_time:
            return self._refuse(ev, "invalid", f"invalid push {meta}")
        if any(p.learner == ev.learner for p in self.waiting + self._open_pushes()):
            return self._refuse(ev, "pending", "a push of this learner is already pending")
        self._seen(ev.learner, ev.t)
        self._book(ev)
        member.pushed = ev.session
        self.grace.observe_push(ev.learner, ev.t, train_seconds=meta.train_seconds)
        self._observe_speed(member, meta, ev.t)
        push = Push(ev.learner, meta, ev.t)
        # Di-PS sec. 6: a push that arrives before the update starts joins the round (the
        # pseudo-code picks up pending requests and re-arms the window on each arrival).
        open_phases = (Phase.IDLE, Phase.COLLECTING) + (
            (Phase.TRANSFERS,) if self.grace.rearm else ()
        )
        if self.phase in open_phases and not self._round_full() and self._followers_ready():
            return self._admit(push, ev.t)
        self.waiting.append(push)  # for the next round (or until every follower is back)
        return []

    def _beyond_bounds(self, meta: PushMeta) -> str:
        """Why ``meta``'s counts exceed what one round of the job can train (its field,
        value and bound), or ``""``."""
        cfg = self.config
        if cfg.max_push_steps is not None and meta.steps > cfg.max_push_steps:
            return f"steps {meta.steps} exceed max_push_steps {cfg.max_push_steps}"
        if cfg.step_tokens is not None:
            bound = max(meta.steps, 0) * cfg.step_tokens
            if meta.tokens > bound:
                return (
                    f"tokens {meta.tokens} exceed {bound} (steps {meta.steps} x step_tokens "
                    f"{cfg.step_tokens})"
                )
        return ""

    def _open_pushes(self) -> list[Push]:
        if self.round is not None and self.round.phase in (Phase.COLLECTING, Phase.TRANSFERS):
            return self.round.pushes
        return []

    def _round_full(self) -> bool:
        cap = self.config.max_participants
        return self.round is not None and cap is not None and len(self.round.pushes) >= cap

    def _plan(self, learner: int) -> tuple[Transfer, ...]:
        owner = self.config.layer_owner
        if not owner:
            return ()
        layers = {learner: list(range(len(owner)))}
        if self.config.schedule == "optimal":
            plan = optimal_schedule(layers, owner)
        else:
            plan = greedy_schedule(layers, owner, self.lru)
            self.lru = plan.lru_after
        return tuple(
            Transfer(t.layer, t.follower, s) for s, step in enumerate(plan.steps) for t in step
        )

    def _admit(self, push: Push, t: float) -> list[Action]:
        if self.round is None:
            self.round = Round(round_id=self.next_round_id, opened=t)
            self.next_round_id += 1
        rnd = self.round
        push.round_id = rnd.round_id
        rnd.pushes.append(push)
        actions: list[Action] = [PushShards(rnd.round_id, push.learner, self._plan(push.learner))]
        if rnd.phase is Phase.TRANSFERS:
            rnd.phase = Phase.COLLECTING  # reopened by a push before the update
        if rnd.quorum_at is not None and self.grace.rearm:
            rnd.deadline = max(rnd.deadline or t, t + self.grace.window(t))
            actions.append(WakeAt(rnd.deadline))
        return actions

    def _on_TransferDone(self, ev: TransferDone) -> list[Action]:
        self._seen(ev.learner, ev.t)
        if self.round is None or ev.round_id != self.round.round_id:
            return []
        for p in self.round.pushes:
            # (A dead incarnation's late word is not about the member's push.)
            if p.learner == ev.learner and p.meta.incarnation == ev.incarnation:
                p.transferred = True
        return []

    # -- followers -----------------------------------------------------------------

    def _on_FollowerLost(self, ev: FollowerLost) -> list[Action]:
        self._follower_seen(ev.follower, ev.t)
        self.follower_seen.pop(ev.follower, None)
        self.followers_awaited.discard(ev.follower)
        self.follower_grace.discard(ev.follower)
        self.lost_by_silence.discard(ev.follower)  # (a restarted one says so: it knows)
        self.rejoin_asked.discard(ev.follower)
        self.followers_up[ev.follower] = False
        self.tape.append("follower", t=ev.t, event="lost", follower=ev.follower, reason=ev.reason)
        rnd = self.round
        if rnd is not None and rnd.phase in (
            Phase.COLLECTING,
            Phase.TRANSFERS,
            Phase.NORMS,
            Phase.MERGE,
        ):
            # Its staged shards are gone and nothing is applied yet: the round is discarded
            # whole, never half applied. New pushes wait until every follower is back.
            return self._discard(rnd, ev.t, f"follower {ev.follower} lost")
        return []

    def _on_FollowerJoined(self, ev: FollowerJoined) -> list[Action]:
        self._follower_seen(ev.follower, ev.t)
        self.followers_awaited.discard(ev.follower)
        self.lost_by_silence.discard(ev.follower)
        self.rejoin_asked.discard(ev.follower)
        self.followers_up[ev.follower] = True
        if ev.address:
            self.follower_addresses[ev.follower] = ev.address
        if ev.oldest >= 0:
            self.follower_oldest[ev.follower] = ev.oldest
        else:
            self.follower_oldest.pop(ev.follower, None)
        self.tape.append(
            "follower", t=ev.t, event="joined", follower=ev.follower, version=ev.version
        )
        rnd = self.round
        if rnd is not None and rnd.phase is Phase.APPLY:
            target = self.version + 1
            if ev.version == target:  # it applied the round before it was lost
                return self._on_FollowerApplied(
                    FollowerApplied(ev.t, ev.follower, rnd.round_id, ev.version)
                )
            if ev.version == self.version and rnd.round_id in ev.rounds:
                # It still holds the round's inputs (batch and Decide): tell it again.
                # Applying is idempotent: a follower already at the target says so again.
                if ev.follower in rnd.done:
                    rnd.done.remove(ev.follower)
                assert rnd.clip_factor is not None and rnd.merged_sq_norm is not None
                return [Apply(rnd.round_id, target, rnd.clip_factor, rnd.merged_sq_norm)]
            # It lost the round's inputs mid-apply (others may have applied it): the shards
            # would disagree on the version. Fail loudly (durable inputs would redo it).
            if ev.version == self.version:
                why = (
                    f"follower {ev.follower} came back at version {ev.version} without the "
                    f"inputs of round {rnd.round_id}, which is being applied as version "
                    f"{target}: it cannot apply it"
                )
            else:
                why = (
                    f"follower {ev.follower} came back at version {ev.version} while round "
                    f"{rnd.round_id} was being applied as version {target}"
                )
            return self._stop(why)
        elif ev.version != self.version:
            # Outside an update every follower serves the leader's version; anything else
            # means checkpoints from different moments: stop rather than mix versions.
            return self._stop(
                f"follower {ev.follower} joined at version {ev.version} but the leader is "
                f"at version {self.version}: restore checkpoints of one version"
            )
        if rnd is None and self._followers_ready():
            return self._open_next(ev.t)
        return []

    def _followers_ready(self) -> bool:
        return all(self.followers_up.values())

    def _on_FollowerNorms(self, ev: FollowerNorms) -> list[Action]:
        self._follower_seen(ev.follower, ev.t)
        rnd = self.round
        if rnd is None or rnd.phase is not Phase.NORMS or ev.round_id != rnd.round_id:
            return []  # duplicate or late report: idempotent
        if len(ev.sq_norms) != len(rnd.learners):
            raise ValueError(
                f"round {rnd.round_id}: follower {ev.follower} sent {len(ev.sq_norms)} norms "
                f"for {len(rnd.learners)} learners"
            )
        rnd.norms.setdefault(ev.follower, [float(x) for x in ev.sq_norms])
        if len(rnd.norms) < self.config.num_followers:
            return []
        g = np.zeros(len(rnd.learners), np.float32)
        for k in sorted(rnd.norms):
            g = g + np.asarray(rnd.norms[k], np.float32)
        return self._decide(rnd, g, ev.t)

    def _decide(self, rnd: Round, g: np.ndarray, t: float) -> list[Action]:
        rnd.timings["norms"] = t
        cfg = self.config
        pushes = rnd.pushes
        present = np.ones(len(pushes), bool)
        if cfg.penalty:
            a = cfg.anomaly
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                dec = rules.score(
                    np,
                    self.anomaly,
                    g,
                    present,
                    beta=a.beta,
                    warmup=a.warmup,
                    min_max_score=a.min_max_score,
                    min_sigma_ratio=a.min_sigma_ratio,
                )
            accepted = np.asarray(dec.accepted)
            rnd.scores = [float(x) for x in np.asarray(dec.scores)]
            rnd.threshold = float(dec.threshold)
            with np.errstate(over="ignore", invalid="ignore"):
                self.anomaly = rules.fold(
                    np, self.anomaly, g, dec.scores, accepted, alpha=a.alpha, warmup=a.warmup
                )
        else:
            accepted = present & np.isfinite(g)
        self.refused["nonfinite"] += int(np.sum(present & ~np.isfinite(g)))
        told = [
            u
            for p, x in zip(pushes, g, strict=True)
            if not np.isfinite(x)
            for u in self._unused(p, "nonfinite", f"squared norm {x} is not finite: rejected")
        ]
        tokens = tuple(p.tokens for p in pushes)
        steps = tuple(p.meta.steps for p in pushes)
        w = rules.weights(np, accepted, weighting=cfg.weighting, tokens=tokens, steps=steps)
        rnd.decision = Decide(
            rnd.round_id,
            rnd.learners,
            tuple(bool(x) for x in accepted),
            tokens,
            steps,
            tuple(float(x) for x in w),
            tuple(float(x) for x in g),
        )
        rnd.decided_version = self.version
        for p, ok in zip(pushes, accepted, strict=True):
            if not ok:
                self._settle(p, "rejected")  # accepted ones settle when the round applies
        if not np.any(accepted):
            # Nothing to merge: skip the update (no zero step that would still move the
            # Nesterov momentum) and let the round's learners pull the current version.
            return told + self._discard(rnd, t, "nothing accepted")
        rnd.phase = Phase.MERGE
        return [rnd.decision, *told]

    def _discard(self, rnd: Round, t: float, reason: str) -> list[Action]:
        for p in rnd.pushes:  # whatever was not rejected is dropped: nothing is applied
            self._settle(p, "dropped")
        if rnd.decided_version is None:
            rnd.decided_version = self.version
        rnd.timings["discarded"] = t
        rnd.pulling = self._pullers(rnd)
        rnd.phase = Phase.PULL
        return [
            Discard(rnd.round_id, reason),
            self._notify(rnd, t),
        ]

    def _on_FollowerMerged(self, ev: FollowerMerged) -> list[Action]:
        self._follower_seen(ev.follower, ev.t)
        rnd = self.round
        if rnd is None or rnd.phase is not Phase.MERGE or ev.round_id != rnd.round_id:
            return []
        rnd.merged.setdefault(ev.follower, float(ev.merged_sq_norm))
        if len(rnd.merged) < self.config.num_followers:
            return []
        m = float(sum(np.float32(rnd.merged[k]) for k in sorted(rnd.merged)))
        rnd.timings["merged_norm"] = ev.t
        threshold = self.clip_threshold()
        factor = 1.0 if threshold is None else float(rules.clip_factor(np, m, threshold))
        if self.config.clip_relative and np.isfinite(m):
            self.clip_norms = [*self.clip_norms, float(np.sqrt(np.float32(m)))][
                -self.config.clip_history :
            ]
        rnd.clip_factor, rnd.merged_sq_norm = factor, m
        rnd.phase = Phase.APPLY
        return [Apply(rnd.round_id, self.version + 1, factor, m)]

    def clip_threshold(self) -> float | None:
        """The global clip's threshold for the next merged update (None: no clip)."""
        cfg = self.config
        if cfg.max_norm is None or not cfg.clip_relative:
            return cfg.max_norm
        if not self.clip_norms:
            return None
        return float(cfg.max_norm * np.median(np.asarray(self.clip_norms, np.float32)))

    def _on_FollowerApplied(self, ev: FollowerApplied) -> list[Action]:
        self._follower_seen(ev.follower, ev.t)
        rnd = self.round
        if rnd is None or rnd.phase is not Phase.APPLY or ev.round_id != rnd.round_id:
            return []
        if ev.version != self.version + 1:
            raise ValueError(
                f"round {rnd.round_id}: follower {ev.follower} applied version {ev.version}, "
                f"expected {self.version + 1}"
            )
        if ev.follower not in rnd.done:
            rnd.done.append(ev.follower)
        if len(rnd.done) < self.config.num_followers:
            return []
        self.version = ev.version
        for p in rnd.pushes:
            if p.outcome is None:
                self._settle(p, "applied")
                self.clock[p.learner] = self.clock.get(p.learner, 0) + 1
        rnd.applied = True
        rnd.timings["applied"] = ev.t
        rnd.pulling = self._pullers(rnd)
        rnd.phase = Phase.PULL
        models = [
            self._send_model(j, ev.t)
            for j in rnd.awaiting
            if j in self.members and not self.members[j].active
        ]
        return [self._notify(rnd, ev.t), *models]

    # -- the round's progress ------------------------------------------------------

    def _advance(self, t: float) -> list[Action]:
        rnd = self.round
        if rnd is None:
            return []
        actions: list[Action] = []
        if rnd.phase is Phase.COLLECTING:
            if not rnd.pushes:
                self.round = None  # its only learners were evicted
                return self._open_next(t)
            members = max(len(self.active_members()), self.config.min_active, 1)
            if rnd.quorum_at is None and len(rnd.pushes) >= self.grace.quorum(members):
                rnd.quorum_at = t
                rnd.grace = self.grace.window(t, self._absent(rnd))
                rnd.deadline = t + rnd.grace
                actions.append(WakeAt(rnd.deadline))
            elif rnd.deadline is not None and self.grace.targeted:
                # A targeted window only shortens as the learners it waits for arrive.
                sooner = t + self.grace.window(t, self._absent(rnd), since=rnd.quorum_at)
                if sooner < rnd.deadline:
                    rnd.deadline = sooner
                    rnd.grace = sooner - rnd.quorum_at
                    actions.append(WakeAt(sooner))
            everyone = set(self.active_members()) <= {p.learner for p in rnd.pushes}
            if rnd.deadline is not None and (t >= rnd.deadline or everyone or self._round_full()):
                rnd.closed = t
                rnd.phase = Phase.TRANSFERS
        if rnd.phase is Phase.TRANSFERS:
            if not rnd.pushes:
                self.round = None
                return self._open_next(t)
            if all(p.transferred for p in rnd.pushes) and self._followers_ready():
                actions += self._request_norms(rnd, t)
        if rnd.phase is Phase.PULL and not rnd.pulling:
            actions += self._end_round(t)
        return actions

    def _absent(self, rnd: Round) -> list[int]:
        """The active learners a round's window may wait for: not in it, and without a push
        waiting for the next round (which cannot join this one)."""
        here = {p.learner for p in rnd.pushes + self.waiting}
        return [j for j in self.active_members() if j not in here]

    def _request_norms(self, rnd: Round, t: float) -> list[Action]:
        limit = self.config.stale_limit()
        floor = -1  # the oldest base every follower holds
        if self.config.reference == "server":
            floor = max(self.follower_oldest.values(), default=-1)
        kept, told = [], []
        for p in rnd.pushes:
            staleness = self.version - p.meta.base_version
            too_old = limit is not None and staleness > limit
            if too_old or p.meta.base_version < floor:
                self.refused["stale"] += 1
                self._settle(p, "dropped")
                rnd.dropped.append(p)
                why = (
                    f"staleness {staleness} is beyond the limit {limit} "
                    f"(max_staleness {self.config.max_staleness}, "
                    f"version_cache {self.config.version_cache})"
                    if too_old
                    else f"base version {p.meta.base_version} is older than the oldest "
                    f"a follower holds ({floor})"
                )
                told += self._unused(p, "stale", f"{why}: dropped")
            else:
                kept.append(p)
        kept.sort(key=lambda p: p.learner)  # a merge order that does not depend on timing
        rnd.pushes = kept
        rnd.learners = tuple(p.learner for p in kept)
        rnd.timings["transfers_done"] = t
        if not kept:
            rnd.decided_version = self.version
            rnd.pulling = self._pullers(rnd)
            rnd.phase = Phase.PULL
            return [
                *told,
                Discard(rnd.round_id, "every push too stale"),
                self._notify(rnd, t),
            ]
        rnd.phase = Phase.NORMS
        bases = tuple(p.meta.base_version for p in kept)
        return [*told, RequestNorms(rnd.round_id, rnd.learners, bases)]

    def _end_round(self, t: float) -> list[Action]:
        rnd = self.round
        assert rnd is not None
        self.grace.observe_round(
            opened=rnd.opened,
            quorum_at=rnd.quorum_at if rnd.quorum_at is not None else rnd.opened,
            closed=rnd.closed if rnd.closed is not None else rnd.opened,
            ended=t,
        )
        self.tape.append("round", **self.round_record(rnd, t).to_json())
        self.round = None
        if self.budget_reached():
            for p in self.waiting:
                self._settle(p, "dropped")
            self.waiting = []
            return self._stop(f"token budget {self.config.token_budget} reached")
        return self._open_next(t)

    def round_record(self, rnd: Round, t: float) -> RoundRecord:
        """The typed record of a finished round (what the tape stores and replay reads)."""
        d = rnd.decision
        decided = rnd.decided_version if rnd.decided_version is not None else self.version

        def part(p: Push) -> Participant:
            return Participant(p.learner, p.t, decided - p.meta.base_version, p.meta)

        return RoundRecord(
            round_id=rnd.round_id,
            version=self.version,
            applied=rnd.applied,
            participants=[part(p) for p in rnd.pushes],
            dropped=[part(p) for p in rnd.dropped],
            vector_clock={str(j): c for j, c in sorted(self.clock.items())},
            sq_norms=list(d.sq_norms) if d else [],
            scores=rnd.scores,
            threshold=rnd.threshold,
            accepted=list(d.accepted) if d else [],
            weights=list(d.weights) if d else [],
            clip_factor=rnd.clip_factor,
            merged_sq_norm=rnd.merged_sq_norm,
            grace=rnd.grace,
            grace_policy=self.grace.describe(),
            timings={
                "opened": rnd.opened,
                "quorum": rnd.quorum_at,
                "closed": rnd.closed,
                "transfers_done": rnd.timings.get("transfers_done"),
                "norms": rnd.timings.get("norms"),
                "merged_norm": rnd.timings.get("merged_norm"),
                "applied": rnd.timings.get("applied"),
                "ended": t,
            },
        )

    def _open_next(self, t: float) -> list[Action]:
        if not self._followers_ready():
            return []  # pushes wait until every follower is back
        waiting, self.waiting = self.waiting, []
        actions: list[Action] = []
        for i, p in enumerate(waiting):
            if self._round_full():
                self.waiting = waiting[i:]
                break
            actions += self._admit(p, t)
        if self.round is not None:
            actions += self._advance(t)
        return actions

    # -- resume --------------------------------------------------------------------

    def resume(self, t: float, reopen: bool = False, alone: bool = False) -> list[Action]:
        """Continues a :meth:`restore`-d leader in a run whose processes all restarted from
        their checkpoints (``--resume``, or the leader alone restarted). A round already
        applied by every follower ends; a round the followers were applying (APPLY) is
        kept: each follower rejoins at v + 1 (applied) or at v holding its inputs (told to
        apply it again), and it ends once every follower applied it (its learners pull
        through their ``SendModel``). Every other push not applied yet is dropped
        (counted), its chunks left leased to its learner, who resumes from the checkpoint
        before that push and trains them again (its ``SendModel`` lists them); a dropped
        round that had reached the followers (NORMS, MERGE) is discarded (``Discard``) so
        they prune it. Every follower must rejoin and every learner must pull again before
        the next round; learners that do not come back are evicted by heartbeats.

        A stopped leader stays stopped (restarted after its final ``Stop``), unless
        ``reopen`` (a whole-run ``--resume`` of a run a fault stopped short of its
        budget): then it goes on. A run that reached its budget is never reopened.

        Heartbeats (learners' and followers') count again after a grace, ended early by a
        peer's first contact; a follower silent past it is lost as if it had been up:
        ``rejoin_grace`` when every process restarted (they compile first), or, ``alone``
        (only the leader restarted: its peers are up and beat again as soon as it
        listens), two heartbeat intervals."""
        reopened = self.stopped
        if self.stopped:
            if not reopen or self.budget_reached():
                return []
            self.stopped, self.stop_reason = False, ""
        self.tape.append("resume", t=t, version=self.version, reopened=reopened)
        self.beat = None  # a time of the last process's clock
        for member in self.members.values():
            member.notified = -1.0
        actions: list[Action] = []
        grace = 2 * self.config.heartbeat_interval if alone else self.config.rejoin_grace
        for k in self.followers_up:
            self.followers_up[k] = False
            self.follower_seen[k] = t + grace  # a deadline: silent past it, it is lost
        self.followers_awaited = set(self.followers_up)
        self.follower_grace = set(self.followers_up)
        self.follower_addresses.clear()  # every follower announces where it is on rejoining
        rnd, waiting, self.waiting = self.round, self.waiting, []
        if rnd is not None and rnd.applied:
            rnd.pulling = []  # its learners pull through SendModel when they rejoin
            actions += self._end_round(t)
            rnd = None
        kept = None
        if rnd is not None and rnd.phase is Phase.APPLY:
            # Followers were applying it: they come back at v + 1 (applied) or at v holding
            # its inputs (told to apply it again); the round ends once every one applied.
            kept, rnd = rnd, None
            kept.done = []  # every follower must rejoin
            kept.rejoined = sorted({p.learner for p in kept.pushes + kept.dropped})
        elif rnd is not None and rnd.phase in (Phase.NORMS, Phase.MERGE):
            # Its batch (and maybe its Decide) is with the followers: they prune it.
            actions.append(Discard(rnd.round_id, "the leader restarted"))
        lost = [p for p in waiting + (rnd.pushes if rnd is not None else []) if p.outcome is None]
        if kept is not None:
            # Pushes that waited are lost (their learners train them again); the kept
            # round's record holds them, after that learner's earlier push, for replay.
            for p in lost:
                self._settle(p, "dropped", release=False)
            kept.dropped += lost
        elif lost or rnd is not None:
            # One unapplied round on the tape holds every push lost (replay retrains them,
            # as the learners did before they stopped).
            if rnd is None:
                rnd = Round(round_id=self.next_round_id, opened=t)
                self.next_round_id += 1
            for p in lost:
                self._settle(p, "dropped", release=False)
            rnd.dropped += lost
            rnd.pushes = [p for p in rnd.pushes if p.outcome is not None]  # rejected ones
            rnd.decision = None
            rnd.decided_version = self.version
            self.tape.append("round", **self.round_record(rnd, t).to_json())
        self.round = kept
        for member in self.members.values():
            member.active = False
            member.last_seen, member.in_grace = t + grace, True  # time to come back
        return actions

    # -- snapshot ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The leader's whole state as JSON-able data (the event tape is kept apart)."""

        def push(p: Push) -> dict[str, Any]:
            return {
                "learner": p.learner,
                "meta": dataclasses.asdict(p.meta),
                "t": p.t,
                "transferred": p.transferred,
                "outcome": p.outcome,
                "round_id": p.round_id,
            }

        rnd = None
        if self.round is not None:
            r = self.round
            rnd = {
                **{
                    f.name: getattr(r, f.name)
                    for f in dataclasses.fields(r)
                    if f.name not in ("phase", "pushes", "dropped", "decision", "norms", "merged")
                },
                "phase": r.phase.value,
                "pushes": [push(p) for p in r.pushes],
                "dropped": [push(p) for p in r.dropped],
                "decision": None if r.decision is None else dataclasses.asdict(r.decision),
                "norms": [[k, v] for k, v in r.norms.items()],
                "merged": [[k, v] for k, v in r.merged.items()],
            }
        a = self.anomaly
        return strict_json(
            {
                "format": 1,
                "config": self.config.to_json(),
                "grace": self.grace.state_dict(),
                "version": self.version,
                "members": [[j, dataclasses.asdict(m)] for j, m in self.members.items()],
                "clock": [[j, c] for j, c in self.clock.items()],
                "incarnations": [[j, c] for j, c in self.incarnations.items()],
                "left": [[j, [list(e) for e in h]] for j, h in self.left.items()],
                "round": rnd,
                "waiting": [push(p) for p in self.waiting],
                "next_round_id": self.next_round_id,
                "anomaly": {
                    "mu": float(a.mu),
                    "sigma": float(a.sigma),
                    "count": int(a.count),
                    "recent_scores": [float(x) for x in a.recent_scores],
                    "recent_valid": [bool(x) for x in a.recent_valid],
                    "cursor": int(a.cursor),
                },
                "ledger": self.ledger.to_json(),
                "clip_norms": list(self.clip_norms),
                "data": None if self.data is None else self.data.to_dict(),
                "followers_up": [[k, v] for k, v in self.followers_up.items()],
                "follower_addresses": [[k, a] for k, a in self.follower_addresses.items()],
                "lru": list(self.lru),
                "dealt": [[j, list(q)] for j, q in self.dealt.items()],
                "stopped": self.stopped,
                "stop_reason": self.stop_reason,
                "beat": self.beat,
                "refused": dict(sorted(self.refused.items())),
            }
        )

    @classmethod
    def restore(cls, state: dict[str, Any], tape: EventTape | None = None) -> Leader:
        """A leader equal to the one that took :meth:`snapshot` (``tape`` continues)."""
        state = from_strict_json(json.loads(json.dumps(state)))  # own nothing
        if state.get("format") != 1:
            raise ValueError(f"leader snapshot format {state.get('format')!r} is not 1")

        def push(d: dict[str, Any]) -> Push:
            meta = dict(d["meta"])
            meta["spans"] = spans_of(meta["spans"])
            return Push(
                d["learner"],
                PushMeta(**meta),
                d["t"],
                d["transferred"],
                d["outcome"],
                d.get("round_id", -1),
            )

        leader = cls(
            LeaderConfig.from_json(state["config"]),
            GracePolicy.from_state_dict(state["grace"]),
            version=state["version"],
            data=None if state["data"] is None else chunks.ChunkLedger.from_dict(state["data"]),
        )
        leader.members = {j: _member(m) for j, m in state["members"]}
        leader.clock = {j: c for j, c in state["clock"]}
        leader.incarnations = {j: c for j, c in state["incarnations"]}
        leader.left = {j: [list(e) for e in h] for j, h in state.get("left", [])}
        if state["round"] is not None:
            r = dict(state["round"])
            r["phase"] = Phase(r["phase"])
            r["pushes"] = [push(p) for p in r["pushes"]]
            r["dropped"] = [push(p) for p in r["dropped"]]
            r["learners"] = tuple(r["learners"])
            if r["decision"] is not None:
                r["decision"] = Decide(
                    **{k: tuple(v) if isinstance(v, list) else v for k, v in r["decision"].items()}
                )
            r["norms"] = {k: v for k, v in r["norms"]}
            r["merged"] = {k: v for k, v in r["merged"]}
            leader.round = Round(**r)
        leader.waiting = [push(p) for p in state["waiting"]]
        leader.next_round_id = state["next_round_id"]
        a = state["anomaly"]
        leader.anomaly = rules.History(
            mu=np.float32(a["mu"]),
            sigma=np.float32(a["sigma"]),
            count=np.int32(a["count"]),
            recent_scores=np.asarray(a["recent_scores"], np.float32),
            recent_valid=np.asarray(a["recent_valid"], bool),
            cursor=np.int32(a["cursor"]),
        )
        leader.ledger = TokenLedger.from_json(state["ledger"])
        leader.clip_norms = [float(x) for x in state.get("clip_norms", [])]
        leader.followers_up = {k: v for k, v in state["followers_up"]}
        leader.follower_addresses = {k: a for k, a in state.get("follower_addresses", [])}
        leader.lru = tuple(state["lru"])
        leader.dealt = {j: [tuple(x) for x in q] for j, q in state.get("dealt", [])}
        leader.stopped = state["stopped"]
        leader.stop_reason = state.get("stop_reason", "")
        leader.beat = state.get("beat")
        leader.refused = collections.Counter(state.get("refused", {}))
        if tape is not None:
            leader.tape = tape
        return leader
