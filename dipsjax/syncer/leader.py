"""The leader: a sans-IO state machine for outer rounds, membership and the token budget.

The leader holds only small metadata (Di-PS sec. 5): membership, the round in progress, the
anomaly detector's history, the token ledger and the event tape. It never touches tensors:
followers compute statistics on their shards and the transport sums them. It has no
sockets, threads or clocks: :meth:`Leader.handle` takes one event carrying a timestamp and
returns the actions to carry out. The runtime feeds it from gRPC and ``time.monotonic``;
the simulator from a virtual clock.

One round (DESIGN.md sec. 3):

1. ``PushRequested`` -> the learner joins the open round (or waits for the next one while a
   round is being updated or pulled) and gets a ``Schedule`` action (push your shards).
   When the round reaches its quorum the grace policy sets a deadline (``WakeAt``).
2. The window closes at the deadline, or early when every active learner (or
   ``max_participants``) is in. Once every participant's ``TransferDone`` arrived:
   ``RequestNorms``.
3. ``NormsReported`` (per-learner squared norms summed over followers) -> staleness filter,
   anomaly penalty, weights -> ONE ``Decide`` broadcast (or, if nothing was accepted,
   ``Discard`` and a pull of the unchanged version: an empty round is skipped).
4. ``MergedNormReported`` -> ONE clip factor -> ``Apply(version + 1)``.
5. ``ApplyDone`` -> ``NotifyPull`` to the round's learners; all ``PullDone`` -> the round
   ends, the next one opens with the pushes that waited.

Membership: ``Join`` -> ``SendModel`` (a new learner pulls one complete model of one version
before it trains); a learner silent for ``missed_heartbeats`` intervals is evicted without
stopping anyone. The job stops (``Stop``) after the round in which the consumed tokens
reach ``token_budget``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax.numpy as jnp
import numpy as np

from dipsjax import outer
from dipsjax.syncer.grace import GracePolicy, NoGrace
from dipsjax.syncer.tape import EventTape, TokenLedger

# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True)
class Event:
    t: float


@dataclasses.dataclass(frozen=True)
class Join(Event):
    learner: int


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
class PushRequested(Event):
    learner: int
    tokens: int
    steps: int
    base_version: int
    meta: dict | None = None  # opaque, recorded on the tape (e.g. the data the round used)


@dataclasses.dataclass(frozen=True)
class TransferDone(Event):
    learner: int
    round_id: int


@dataclasses.dataclass(frozen=True)
class NormsReported(Event):
    round_id: int
    sq_norms: tuple[float, ...]  # per participant, in the order of RequestNorms.learners


@dataclasses.dataclass(frozen=True)
class MergedNormReported(Event):
    round_id: int
    merged_sq_norm: float


@dataclasses.dataclass(frozen=True)
class ApplyDone(Event):
    round_id: int
    version: int


@dataclasses.dataclass(frozen=True)
class PullDone(Event):
    learner: int
    version: int


# ---------------------------------------------------------------------------- actions


@dataclasses.dataclass(frozen=True)
class Action:
    pass


@dataclasses.dataclass(frozen=True)
class SendModel(Action):
    learner: int
    version: int


@dataclasses.dataclass(frozen=True)
class Schedule(Action):
    round_id: int
    learner: int


@dataclasses.dataclass(frozen=True)
class WakeAt(Action):
    t: float


@dataclasses.dataclass(frozen=True)
class RequestNorms(Action):
    round_id: int
    learners: tuple[int, ...]


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
    round_id: int
    version: int
    clip_factor: float
    merged_sq_norm: float


@dataclasses.dataclass(frozen=True)
class Discard(Action):
    """Nothing of the round was accepted: followers drop its shards, the version stays."""

    round_id: int


@dataclasses.dataclass(frozen=True)
class NotifyPull(Action):
    round_id: int
    learners: tuple[int, ...]
    version: int


@dataclasses.dataclass(frozen=True)
class Evict(Action):
    learner: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Refuse(Action):
    learner: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Stop(Action):
    reason: str


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class LeaderConfig:
    """Leader policy knobs (validated; errors name the field).

    Attributes:
      weighting: learner weights of the merge: ``tokens`` (Di-PS), ``decoupled``, ``uniform``.
      penalty: run the Di-PS anomaly penalty (``alpha``, ``beta``, ``warmup``).
      max_norm: global clip threshold, or None for no clipping.
      max_staleness: drop contributions more than this many versions old (None: keep all).
      max_participants: at most this many learners per round (1 = apply each push alone).
      heartbeat_interval, missed_heartbeats: eviction after this many silent intervals.
      token_budget: stop once this many tokens were consumed (None: never).
    """

    weighting: str = "tokens"
    penalty: bool = True
    alpha: float = 0.02
    beta: float = 3.0
    warmup: int = 5
    max_norm: float | None = 1.0
    max_staleness: int | None = None
    max_participants: int | None = None
    heartbeat_interval: float = 10.0
    missed_heartbeats: int = 3
    token_budget: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (
                self.weighting in ("tokens", "decoupled", "uniform"),
                "weighting",
                "tokens|decoupled|uniform",
            ),
            (0 < self.alpha <= 1, "alpha", "(0, 1]"),
            (self.beta > 0, "beta", "> 0"),
            (self.warmup >= 0, "warmup", ">= 0"),
            (self.max_norm is None or self.max_norm > 0, "max_norm", "> 0 or None"),
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
            (self.token_budget is None or self.token_budget > 0, "token_budget", "> 0 or None"),
        ]
        for ok, name, allowed in checks:
            if not ok:
                raise ValueError(
                    f"LeaderConfig.{name} must be {allowed}, got {getattr(self, name)!r}"
                )


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
    tokens: int
    steps: int
    base_version: int
    t: float
    meta: dict | None = None
    transferred: bool = False


@dataclasses.dataclass
class Round:
    round_id: int
    opened: float
    pushes: list[Push] = dataclasses.field(default_factory=list)
    quorum_at: float | None = None
    deadline: float | None = None
    closed: float | None = None
    grace: float = 0.0
    learners: tuple[int, ...] = ()
    decision: Decide | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    pulling: set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class Member:
    joined: float
    last_seen: float
    active: bool = False  # pulled its first model
    contributions: int = 0  # accepted contributions (its entry of the vector clock)


class Leader:
    """The leader's state machine (see module docstring)."""

    def __init__(
        self,
        config: LeaderConfig | None = None,
        grace: GracePolicy | None = None,
        *,
        version: int = 0,
    ) -> None:
        self.config = config or LeaderConfig()
        self.grace = grace or NoGrace()
        self.version = version
        self.members: dict[int, Member] = {}
        self.round: Round | None = None
        self.waiting: list[Push] = []
        self.next_round_id = 0
        self.anomaly = outer.init_anomaly_state()
        self.ledger = TokenLedger()
        self.tape = EventTape()
        self.stopped = False
        self.budget_reached = False

    # -- helpers -------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        if self.round is None:
            return Phase.IDLE
        return self._phase

    def _set_phase(self, phase: Phase) -> None:
        self._phase = phase

    def active_members(self) -> list[int]:
        return sorted(j for j, m in self.members.items() if m.active)

    def _membership(self, t: float, event: str, learner: int, **extra: Any) -> None:
        self.tape.append(
            "membership", t=t, event=event, learner=learner, version=self.version, **extra
        )

    def _seen(self, learner: int, t: float) -> None:
        if learner in self.members:
            self.members[learner].last_seen = max(self.members[learner].last_seen, t)

    # -- entry point ---------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        """Consumes one event and returns the actions to carry out, in order."""
        if self.stopped:
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
        if ev.learner in self.members:
            self._seen(ev.learner, ev.t)
            return []
        self.members[ev.learner] = Member(joined=ev.t, last_seen=ev.t)
        self._membership(ev.t, "join", ev.learner)
        return [SendModel(ev.learner, self.version)]

    def _on_Leave(self, ev: Leave) -> list[Action]:
        return self._remove(ev.learner, ev.t, "left")

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
        return actions

    def _remove(self, learner: int, t: float, reason: str) -> list[Action]:
        if learner not in self.members:
            return []
        del self.members[learner]
        self._membership(t, "evict" if reason != "left" else "leave", learner, reason=reason)
        actions: list[Action] = [Evict(learner, reason)]
        # A contribution not yet handed to the followers is dropped; later ones stay merged.
        for queue in (self.waiting, self._open_pushes()):
            for p in [p for p in queue if p.learner == learner]:
                queue.remove(p)
                self.ledger.settle(learner, p.tokens, "dropped")
        if self.round is not None:
            self.round.pulling.discard(learner)
        return actions

    def _open_pushes(self) -> list[Push]:
        if self.round is not None and self.phase in (Phase.COLLECTING, Phase.TRANSFERS):
            return self.round.pushes
        return []

    def _on_PullDone(self, ev: PullDone) -> list[Action]:
        self._seen(ev.learner, ev.t)
        member = self.members.get(ev.learner)
        if member is not None and not member.active:
            member.active = True
            self._membership(ev.t, "active", ev.learner, pulled_version=ev.version)
        if self.round is not None and self.phase is Phase.PULL:
            self.round.pulling.discard(ev.learner)
        return []

    # -- pushes --------------------------------------------------------------------

    def _on_PushRequested(self, ev: PushRequested) -> list[Action]:
        member = self.members.get(ev.learner)
        if member is None or not member.active:
            return [Refuse(ev.learner, "not a member: join and pull a model first")]
        if ev.tokens < 0 or ev.steps < 0 or ev.base_version > self.version:
            return [Refuse(ev.learner, f"invalid push {ev}")]
        if any(p.learner == ev.learner for p in self.waiting + self._open_pushes()):
            return [Refuse(ev.learner, "a push of this learner is already pending")]
        self._seen(ev.learner, ev.t)
        self.ledger.consume(ev.learner, ev.tokens)
        self.grace.observe_push(ev.learner, ev.t)
        push = Push(ev.learner, ev.tokens, ev.steps, ev.base_version, ev.t, ev.meta)
        # Di-PS sec. 6: a push that arrives before the update starts joins the round (the
        # pseudo-code picks up pending requests and re-arms the window on each arrival).
        open_phases = (Phase.IDLE, Phase.COLLECTING) + (
            (Phase.TRANSFERS,) if self.grace.rearm else ()
        )
        if self.phase in open_phases and not self._round_full():
            return self._admit(push, ev.t)
        self.waiting.append(push)
        return []

    def _round_full(self) -> bool:
        cap = self.config.max_participants
        return self.round is not None and cap is not None and len(self.round.pushes) >= cap

    def _admit(self, push: Push, t: float) -> list[Action]:
        if self.round is None:
            self.round = Round(round_id=self.next_round_id, opened=t)
            self.next_round_id += 1
            self._set_phase(Phase.COLLECTING)
        rnd = self.round
        rnd.pushes.append(push)
        actions: list[Action] = [Schedule(rnd.round_id, push.learner)]
        if self.phase is Phase.TRANSFERS:
            self._set_phase(Phase.COLLECTING)  # reopened by a push before the update
        if rnd.quorum_at is not None and self.grace.rearm:
            rnd.deadline = max(rnd.deadline or t, t + self.grace.window(t))
            actions.append(WakeAt(rnd.deadline))
        return actions

    def _on_TransferDone(self, ev: TransferDone) -> list[Action]:
        self._seen(ev.learner, ev.t)
        if self.round is None or ev.round_id != self.round.round_id:
            return []
        for p in self.round.pushes:
            if p.learner == ev.learner:
                p.transferred = True
        return []

    # -- the round's progress ------------------------------------------------------

    def _advance(self, t: float) -> list[Action]:
        rnd = self.round
        if rnd is None:
            return []
        actions: list[Action] = []
        if self.phase is Phase.COLLECTING:
            members = max(len(self.active_members()), 1)
            if rnd.quorum_at is None and len(rnd.pushes) >= self.grace.quorum(members):
                rnd.quorum_at = t
                rnd.grace = self.grace.window(t)
                rnd.deadline = t + rnd.grace
                actions.append(WakeAt(rnd.deadline))
            everyone = set(self.active_members()) <= {p.learner for p in rnd.pushes}
            if not rnd.pushes:
                self.round = None  # its only learners were evicted
                return self._open_next(t)
            if rnd.deadline is not None and (t >= rnd.deadline or everyone or self._round_full()):
                rnd.closed = t
                self._set_phase(Phase.TRANSFERS)
        if self.phase is Phase.TRANSFERS:
            if not rnd.pushes:
                self.round = None
                return self._open_next(t)
            if all(p.transferred for p in rnd.pushes):
                rnd.learners = tuple(p.learner for p in rnd.pushes)
                rnd.timings["transfers_done"] = t
                self._set_phase(Phase.NORMS)
                actions.append(RequestNorms(rnd.round_id, rnd.learners))
        if self.phase is Phase.PULL and not rnd.pulling:
            actions += self._end_round(t)
        return actions

    def _on_NormsReported(self, ev: NormsReported) -> list[Action]:
        rnd = self.round
        if rnd is None or self.phase is not Phase.NORMS or ev.round_id != rnd.round_id:
            return []  # duplicate or late report: idempotent
        if len(ev.sq_norms) != len(rnd.learners):
            raise ValueError(
                f"round {rnd.round_id}: {len(ev.sq_norms)} norms for {len(rnd.learners)} learners"
            )
        rnd.timings["norms"] = ev.t
        pushes = rnd.pushes
        g = np.asarray(ev.sq_norms, np.float32)
        present = np.array(
            [
                self.config.max_staleness is None
                or self.version - p.base_version <= self.config.max_staleness
                for p in pushes
            ]
        )
        if self.config.penalty:
            dec = outer.score_learners(
                self.anomaly,
                jnp.asarray(g),
                jnp.asarray(present),
                beta=self.config.beta,
                warmup=self.config.warmup,
            )
            accepted = np.asarray(dec.accepted)
            scores = [float(x) for x in np.asarray(dec.scores)]
            self.anomaly = outer.fold_history(
                self.anomaly,
                jnp.asarray(g),
                dec.scores,
                jnp.asarray(accepted),
                alpha=self.config.alpha,
                warmup=self.config.warmup,
            )
            threshold = float(dec.threshold)
        else:
            accepted = present & np.isfinite(g)
            scores, threshold = [], float("inf")
        tokens = tuple(p.tokens for p in pushes)
        steps = tuple(p.steps for p in pushes)
        weights = outer.learner_weights(
            jnp.asarray(accepted),
            weighting=self.config.weighting,
            tokens=jnp.asarray(tokens, jnp.float32),
            steps=jnp.asarray(steps, jnp.float32),
        )
        rnd.decision = Decide(
            rnd.round_id,
            rnd.learners,
            tuple(bool(a) for a in accepted),
            tokens,
            steps,
            tuple(float(w) for w in np.asarray(weights)),
            tuple(float(x) for x in g),
        )
        rnd.timings["scores"] = scores  # type: ignore[assignment]
        rnd.timings["threshold"] = threshold
        for p, ok, fresh in zip(pushes, accepted, present, strict=True):
            outcome = "applied" if ok else ("rejected" if fresh else "dropped")
            self.ledger.settle(p.learner, p.tokens, outcome)
            if ok and p.learner in self.members:
                self.members[p.learner].contributions += 1
        rnd.timings["decided_version"] = self.version
        if not np.any(accepted):
            # Nothing to merge: skip the update (no zero step that would still move the
            # Nesterov momentum) and let the round's learners pull the current version.
            rnd.pulling = {j for j in rnd.learners if j in self.members}
            self._set_phase(Phase.PULL)
            return [
                Discard(rnd.round_id),
                NotifyPull(rnd.round_id, tuple(sorted(rnd.pulling)), self.version),
            ]
        self._set_phase(Phase.MERGE)
        return [rnd.decision]

    def _on_MergedNormReported(self, ev: MergedNormReported) -> list[Action]:
        rnd = self.round
        if rnd is None or self.phase is not Phase.MERGE or ev.round_id != rnd.round_id:
            return []
        rnd.timings["merged_norm"] = ev.t
        m = float(ev.merged_sq_norm)
        factor = (
            1.0
            if self.config.max_norm is None
            else float(outer.clip_factor(m, self.config.max_norm))
        )
        rnd.timings["clip_factor"] = factor
        rnd.timings["merged_sq_norm"] = m
        self._set_phase(Phase.APPLY)
        return [Apply(rnd.round_id, self.version + 1, factor, m)]

    def _on_ApplyDone(self, ev: ApplyDone) -> list[Action]:
        rnd = self.round
        if rnd is None or self.phase is not Phase.APPLY or ev.round_id != rnd.round_id:
            return []
        if ev.version != self.version + 1:
            raise ValueError(
                f"round {rnd.round_id} applied as version {ev.version}, expected {self.version + 1}"
            )
        self.version = ev.version
        rnd.timings["applied"] = ev.t
        rnd.pulling = {j for j in rnd.learners if j in self.members}
        self._set_phase(Phase.PULL)
        return [NotifyPull(rnd.round_id, tuple(sorted(rnd.pulling)), self.version)]

    def _end_round(self, t: float) -> list[Action]:
        rnd = self.round
        assert rnd is not None and rnd.decision is not None
        d = rnd.decision
        self.grace.observe_round(
            opened=rnd.opened,
            quorum_at=rnd.quorum_at if rnd.quorum_at is not None else rnd.opened,
            closed=rnd.closed if rnd.closed is not None else rnd.opened,
            ended=t,
        )
        by_learner = {p.learner: p for p in rnd.pushes}
        self.tape.append(
            "round",
            round_id=rnd.round_id,
            version=self.version,
            applied="applied" in rnd.timings,
            participants=[
                {
                    "learner": j,
                    "base_version": by_learner[j].base_version,
                    "tokens": by_learner[j].tokens,
                    "steps": by_learner[j].steps,
                    "pushed_at": by_learner[j].t,
                    "staleness": rnd.timings["decided_version"] - by_learner[j].base_version,
                    "meta": by_learner[j].meta,
                }
                for j in d.learners
            ],
            vector_clock={str(j): m.contributions for j, m in sorted(self.members.items())},
            sq_norms=list(d.sq_norms),
            scores=rnd.timings.get("scores", []),
            threshold=rnd.timings.get("threshold"),
            accepted=list(d.accepted),
            weights=list(d.weights),
            clip_factor=rnd.timings.get("clip_factor"),
            merged_sq_norm=rnd.timings.get("merged_sq_norm"),
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
        self.round = None
        actions: list[Action] = []
        if (
            self.config.token_budget is not None
            and self.ledger.totals()["consumed"] >= self.config.token_budget
        ):
            self.stopped = True
            for p in self.waiting:
                self.ledger.settle(p.learner, p.tokens, "dropped")
            self.waiting = []
            return [Stop(f"token budget {self.config.token_budget} reached")]
        return actions + self._open_next(t)

    def _open_next(self, t: float) -> list[Action]:
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
