"""The learner's side of the protocol: a sans-IO state machine (DESIGN.md sec. 2, 8).

:class:`LearnerProtocol` owns every protocol decision of a learner, as
:class:`~dipsjax.syncer.leader.Leader` owns the leader's: what to do on each action of the
leader (filtered by incarnation and control stream), on a refusal or an eviction (by its
typed ``kind``, never by its reason's words), on a broken control stream, on a failed
push; which checkpoint to resume from; when to checkpoint and when to report. It has no
sockets, threads or clocks: the driver passes ``now`` and carries out the
:class:`~dipsjax.syncer.messages.Command` s it gets back, in order, then reports what
came of them (:meth:`on_trained`, :meth:`on_pushed`, :meth:`on_pulled`). The simulator's
learners (:mod:`dipsjax.sim.engine`), the learner process (:mod:`dipsjax.runtime.learner`)
and the stand-ins (:mod:`dipsjax.runtime.standin`) are such drivers, so the simulator runs
the learner that is deployed.

One round (Di-PS sec. 5), as commands::

    start(now)                  -> Send(Join)
    SendModel                   -> [Restore(step, regrant)] Pull(version, first)
    on_pulled(version)          -> Send(PullDone) [Save(start)] Train()
    on_trained(meta)            -> Send(PushRequested)
    PushShards                  -> Push(plan)
    on_pushed(round)            -> [Save(pushed)] Send(TransferDone)
    NotifyPull(round, version)  -> Pull(version)          ... and so on, until
    Stop                        -> Exit(OK)

With ``overlap`` (Decoupled DiLoCo's learners never wait), the next round starts as soon
as one is trained, and its push goes on beside it: ``on_trained -> Train(adopt=True),
Send(PushRequested)``, then ``PushShards -> Push(plan)`` whenever the plan comes (a leader
mid-round holds it until its next round opens); the round's ``NotifyPull`` pulls in the
background (``Pull(background=True)``), adopted at the next round start; one push is in
flight at a time, requested or pushed (a round trained meanwhile is held until that pull).

Faults:

* ``Evict`` of this incarnation: ``silent`` (missed heartbeats: a hang, a cut link) ->
  ``Exit(EVICTED)``, the launcher starts a new incarnation; ``restarted`` (a newer
  incarnation joined) -> ``Exit(REFUSED)``; ``left`` (it said so itself) -> nothing.
  Another incarnation's ``Evict``, ``Refuse`` or ``Unused`` is not about this one.
* ``Refuse`` by kind: ``stopped`` -> ``Exit(OK)``; ``unknown`` (not a member: evicted
  meanwhile) -> ``Exit(EVICTED)``; ``inactive`` (a restarted leader wants a pull first) ->
  rejoin; ``session`` (of a session a rejoin ended; never the one in progress, as only
  this learner ends its sessions) -> rejoin; ``pending`` (a retried request whose first
  copy was taken) -> wait for that one's plan; ``incarnation``, ``invalid``,
  ``fingerprint`` -> ``Exit(REFUSED)``.
* A broken control stream (:meth:`on_leader_lost`): with checkpoints, rejoin as the same
  incarnation (``Join(resume=True)``) and, at the ``SendModel``, restore the newest
  checkpoint or, if the leader says its last push was ``lost``, the start of that round
  (:meth:`restore_step`); without checkpoints ``Exit(EVICTED)``. Actions of an older
  stream are dropped (but a ``Stop`` still stops, and a ``SendModel`` answering one of its
  joins since its last model is taken). Each join opens a session (``Join.session``), a
  rejoin ends the one of its newest model (``Join.ends``), and push requests carry the
  session of the model they were trained from: the leader refuses one of an ended
  session, sent before a rejoin and delivered after it.
* A failed push (:meth:`on_pushed` with ``failed``): a replay refusal (the round ended
  without it) or a follower of its plan down -> wait for the round's pull (the leader
  discards or finishes that round); every follower of its plan up -> its link is down:
  ``Send(Leave)``, ``Exit(UNREACHABLE)``; refused as not finite (a follower's
  ``refuse_nonfinite``: its inner state diverged) -> ``Send(Leave)``, so the leader drops
  the push and the round goes on without it, and ``Exit(EVICTED)``: the launcher starts
  a new incarnation, which pulls the global model and trains from a fresh inner state.

Error feedback (EXTENSION, ``feedback=True``; :mod:`dipsjax.outer._feedback`): the driver
encodes a push's residual-corrected pseudo-gradient when it carries out its ``Push`` and
keeps its :class:`~dipsjax.outer.Pending`; this core says when and how to settle it, with a
``Settle(round_id, outcome)`` command (the driver calls
:func:`~dipsjax.outer.feedback_settle`):

* ``NotifyPull`` of the round: the outcome the leader says for this learner's push
  (``applied``, ``rejected``, ``nonfinite``, ``stale``, ``discarded``; ``lost`` if it says
  none), before the pull;
* ``SendModel`` of a rejoin (same incarnation): the push of ``last_round`` by
  ``last_outcome`` (``applied``, ``rejected``; ``dropped`` -> ``discarded``; ``lost``);
  any other push in flight -> ``lost``. A push still with the followers when the learner
  rejoins (the leader's norms or merge phase) is not settled yet there: it is settled
  ``lost``, and if the round then applies it, the residual it carried is sent twice (once
  in it, once again in the next push): a bounded error, one push's residual;
* a new ``PushShards`` while an older push is unsettled (no word came): that one ``lost``.

Adaptive steps (EXTENSION, :attr:`~dipsjax.syncer.leader.LeaderConfig.adaptive_steps`):
``SendModel.steps`` and ``NotifyPull.steps`` say how many inner steps this learner's rounds
train from then on; each ``Train`` carries the newest word (``steps``; 0: the job's ``H``).
An overlapping learner has started its next round when its pull notice comes: the word
counts from the round after that.

A process restarted with ``--resume`` takes back the residual and the pushes in flight of
the checkpoint it restores and settles those by :meth:`on_restored` (the same words); a new
incarnation starts from a zero residual (see :mod:`dipsjax.runtime.learner`).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import secrets
from collections.abc import Callable, Iterable

from dipsjax.syncer.messages import (
    Action,
    Command,
    Evict,
    EvictKind,
    Exit,
    ExitCode,
    Join,
    Leave,
    NotifyPull,
    Pull,
    PullDone,
    Push,
    PushMeta,
    PushRequested,
    PushShards,
    Reckon,
    Refuse,
    RefuseKind,
    Restore,
    Save,
    Send,
    SendModel,
    Settle,
    Span,
    Stop,
    Train,
    TransferDone,
    Unused,
    spans_of,
)

# Outcomes a push is settled by (``dipsjax.outer.Outcome``'s words, spelled here: the
# protocol core imports no JAX).
SETTLED = frozenset({"applied", "rejected", "stale", "discarded", "lost", "nonfinite"})


def session_base() -> int:
    """A random base for a process's join sessions (:class:`LearnerProtocol`), in
    ``[1, 2**61]``: the first 2**20 joins of two processes share a session with odds
    below 2**-39."""
    return secrets.randbelow(2**61) + 1


def settle_word(round_id: int, last_round: int, last_outcome: str) -> str:
    """The outcome a rejoined learner settles its push of ``round_id`` by, from its
    ``SendModel``'s ``last_round`` / ``last_outcome`` (``dropped`` is ``discarded``; a push
    the leader says nothing about is ``lost``)."""
    said = {"dropped": "discarded"}.get(last_outcome, last_outcome)
    return said if round_id == last_round and said in SETTLED else "lost"


# Refusals only a push gets (a join is refused as stopped, unknown, incarnation, fingerprint).
PUSH_REFUSALS = frozenset(
    {
        RefuseKind.INACTIVE,
        RefuseKind.PENDING,
        RefuseKind.INVALID,
        RefuseKind.BOUNDS,
        RefuseKind.SESSION,
    }
)
# Refusals of a push the leader wants this learner to rejoin for (it must pull first, or
# it says a rejoin ended the session of the push).
REJOIN_REFUSALS = frozenset({RefuseKind.INACTIVE, RefuseKind.SESSION})


class State(enum.StrEnum):
    """Where the learner is in its round (overlap's in-flight push is tracked apart)."""

    IDLE = "idle"  # not started
    JOINING = "joining"  # Join sent, waiting for SendModel
    PULLING = "pulling"  # a Pull in progress (a join's first model, or a round's result)
    TRAINING = "training"  # a Train in progress
    # PushRequested sent, waiting for its PushShards (an overlapping learner trains meanwhile:
    # TRAINING, with ``requesting``)
    REQUESTING = "requesting"
    PUSHING = "pushing"  # a Push in progress
    WAITING = "waiting"  # pushed, waiting for the round's NotifyPull
    HOLDING = "holding"  # overlap: trained, the push held until the one in flight is pulled
    EXITED = "exited"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A learner checkpoint the driver holds: step ``2 * rounds`` at a round's start
    (``start``; ``requested`` when the push of the previous round's batches ``spans`` still
    waited for its plan, with ``overlap``), ``2 * rounds + 1`` once that round's push is on
    the followers (``pushed``, of ``round_id``)."""

    step: int
    kind: str
    round_id: int = -1
    spans: tuple[Span, ...] = ()

    @property
    def rounds(self) -> int:
        """Rounds trained by the inner state this checkpoint holds."""
        return (self.step + 1) // 2


def start_step(rounds: int) -> int:
    return 2 * rounds


class LearnerProtocol:
    """Learner ``learner``'s incarnation ``incarnation`` (see module docstring).

    Args:
      overlap: never wait for the round's result (Decoupled DiLoCo).
      checkpoints: the driver checkpoints (``Save``) and can ``Restore``; without them a
        lost leader ends the process (a new incarnation starts afresh).
      saved: the checkpoints the driver holds already (a process started with
        ``--resume``), any order.
      feedback: error feedback (EXTENSION): ``Settle`` each push by its outcome (see the
        module docstring).
      session_base: its joins' sessions are ``session_base + 1``, ``+ 2``, ... A process
        that may share its incarnation with an earlier one (restarted with ``--resume``)
        draws it at random (:func:`session_base`), so that no two joins share a session.
      asks: an earlier incarnation of this learner whose last push request is in doubt
        (its driver's record: written down, the answer not): its joins ask the leader
        (``Join.asks``) until a model comes, whose word goes to the driver as ``Reckon``.
    """

    def __init__(
        self,
        learner: int,
        incarnation: int = 0,
        *,
        fingerprint: str = "",
        overlap: bool = False,
        checkpoints: bool = False,
        saved: Iterable[Checkpoint] = (),
        feedback: bool = False,
        session_base: int = 0,
        asks: int | None = None,
    ) -> None:
        self.learner = learner
        self.asks = asks  # an earlier incarnation whose last push is in doubt (or None)
        self.feedback = feedback
        self.unsettled: list[int] = []  # error feedback: rounds pushed, outcome not known
        self.incarnation = incarnation
        self.fingerprint = fingerprint
        self.overlap = overlap
        self.checkpoints = checkpoints
        self.saved: list[Checkpoint] = sorted(saved, key=lambda c: c.step)
        self.state = State.IDLE
        self.resume = False  # the join in progress is a resume (same incarnation)
        self.stream = 0  # the control stream actions are taken from
        self.rounds = 0  # rounds its inner state has trained and pushed (overlap: requested)
        self.round_id: int | None = None  # the round of the push in progress
        self.plan: PushShards | None = None
        self.notified: dict[int, int] = {}  # round -> version, pull notices not yet taken
        self.inflight: int | None = None  # overlap: the round whose result is not pulled
        self.requesting = False  # overlap: a PushRequested sent, its plan not come yet
        self.held: PushMeta | None = None  # overlap: a trained round, its push held
        self.version = -1  # the version it holds (-1: none yet)
        self.pulls = 0  # models pulled by this incarnation
        self.exit: Exit | None = None
        self.stopped: str | None = None  # the leader's Stop, once seen
        self.unused: collections.Counter[str] = collections.Counter()  # Unused by kind
        self.refused: collections.Counter[str] = collections.Counter()  # Refuse by kind
        self._started_round = -1  # the round whose start was checkpointed
        self.steps = 0  # inner steps of its rounds, the leader's word (0: the job's H)
        self.session_base = session_base
        self.joins = 0  # joins sent by this process
        self.session = 0  # of the join its newest model came from: tags its push requests
        self.asked: set[int] = set()  # sessions of its joins since that model

    # -- helpers -------------------------------------------------------------------

    def _exit(self, code: ExitCode, reason: str) -> list[Command]:
        self.state = State.EXITED
        self.exit = Exit(int(code), reason)
        return [self.exit]

    def _join(self, now: float, resume: bool) -> list[Command]:
        self.state, self.resume = State.JOINING, resume
        self.round_id = self.plan = self.inflight = self.held = None
        self.requesting = False
        self.notified.clear()
        self.joins += 1
        session = self.session_base + self.joins
        self.asked.add(session)
        join = Join(
            now,
            self.learner,
            self.incarnation,
            resume,
            self.fingerprint,
            session,
            self.session,
            self.asks,
        )
        return [Send(join)]

    def _train(self, requested: tuple[Span, ...] | None = None) -> list[Command]:
        """A round starts: checkpoint its start (once per round; ``requested``: while the
        push of those batches waits for its plan), then train it."""
        self.state = State.TRAINING
        out: list[Command] = []
        if self.checkpoints and self._started_round != self.rounds:
            self._started_round = self.rounds
            kind = "start" if requested is None else "requested"
            out.append(self._save(kind, -1, start_step(self.rounds), requested or ()))
        return [*out, Train(adopt=self.overlap, steps=self.steps)]

    def _told_steps(self, steps: int | None) -> None:
        """The leader's word on the inner steps of this learner's next rounds (adaptive
        steps, EXTENSION; ``None``: not said, kept; 0 or less: the job's ``H``)."""
        if steps is not None:
            self.steps = max(int(steps), 0)

    def _save(self, kind: str, round_id: int, step: int, spans: Iterable[Span] = ()) -> Save:
        spans = tuple(spans)
        self.saved = [c for c in self.saved if c.step != step]
        self.saved.append(Checkpoint(step, kind, round_id, spans))
        return Save(kind, round_id, self.version, step, spans)

    def _request(self, meta: PushMeta, now: float) -> list[Command]:
        if self.overlap:
            # The next round starts at once; the push waits for its plan beside it (the
            # inner state has trained this round: it counts, and the next start is saved).
            self.requesting = True
            self.rounds += 1
            request = PushRequested(now, self.learner, meta, self.session)
            return [*self._train(meta.spans), Send(request)]
        self.state = State.REQUESTING
        return [Send(PushRequested(now, self.learner, meta, self.session))]

    def asking(self) -> bool:
        """A push request of this learner waits for its plan."""
        return self.state is State.REQUESTING or (self.overlap and self.requesting)

    def _mine(self, action: Action) -> bool:
        if isinstance(action, NotifyPull):
            return self.learner in action.learners
        return getattr(action, "learner", self.learner) == self.learner

    # -- the driver's inputs ---------------------------------------------------------

    def start(self, now: float, resume: bool = False) -> list[Command]:
        """The process starts: join (``resume``: as the same incarnation, from its
        checkpoints, e.g. ``--resume``)."""
        return self._join(now, resume)

    def on_action(self, action: Action, now: float, stream: int | None = None) -> list[Command]:
        """An action of the leader, from control stream ``stream`` (``None``: the current
        one; a driver numbers its streams, see :meth:`on_leader_lost`)."""
        if self.state is State.EXITED or not self._mine(action):
            return []
        if isinstance(action, Stop):
            self.stopped = action.reason
            return self._exit(ExitCode.OK, f"the job stopped: {action.reason}")
        answers = isinstance(action, SendModel) and action.session in self.asked
        if stream is not None and stream != self.stream and not answers:
            return []  # what an older stream said no longer holds (but a join's answer)
        if isinstance(action, Evict | Refuse | Unused) and action.incarnation != self.incarnation:
            return []  # about another incarnation's request
        handler = getattr(self, f"_on_{type(action).__name__}", None)
        return [] if handler is None else handler(action, now)

    def _on_SendModel(self, a: SendModel, now: float) -> list[Command]:
        if self.state is not State.JOINING:
            return []  # not asked for (a retried join's second answer)
        if a.session and a.session not in self.asked:
            return []  # not its joins' (another incarnation's, say)
        # Any of its joins since its last model (the leader may take them in any order):
        # its requests carry that session, taken until a rejoin of its own ends it.
        self.session, self.asked = a.session, set()
        self.state = State.PULLING
        self._told_steps(a.steps)
        out: list[Command] = []
        if self.asks is not None:  # the leader's word on an earlier one's push in doubt
            out.append(Reckon(self.asks, a.asked))
            self.asks = None
        if self.resume:
            step = self.restore_step(a)
            self.saved = [c for c in self.saved if step is not None and c.step <= step]
            self.rounds = 0 if step is None else Checkpoint(step, "").rounds
            self._started_round = (
                self.rounds if step is not None and step == start_step(self.rounds) else -1
            )
            out.append(
                Restore(step, tuple(a.leases), a.version, a.last_round, a.last_outcome, a.booked)
            )
            out += self._settle(lambda r: settle_word(r, a.last_round, a.last_outcome))
        return [*out, Pull(a.version, first=not self.resume)]

    def on_restored(self, rounds: Iterable[int], restore: Restore) -> list[Command]:
        """Error feedback: a restarted process restored, with the checkpoint ``restore``
        chose, pushes of ``rounds`` that were in flight when it was written; they are
        settled by the leader's word, as a rejoin's are."""
        if not self.feedback:
            return []
        return [Settle(r, settle_word(r, restore.last_round, restore.last_outcome)) for r in rounds]

    def _settle(
        self, outcome_of: Callable[[int], str], rounds: Iterable[int] = ()
    ) -> list[Command]:
        """Error feedback: ``Settle`` the unsettled pushes of ``rounds`` (none given: all)."""
        if not self.feedback:
            return []
        todo = [r for r in self.unsettled if not rounds or r in rounds]
        self.unsettled = [r for r in self.unsettled if r not in todo]
        return [Settle(r, outcome_of(r)) for r in todo]

    def _on_PushShards(self, a: PushShards, now: float) -> list[Command]:
        if not self.asking():
            return []  # a plan for a push that is no longer in progress
        self.round_id, self.plan = a.round_id, a
        out = self._settle(lambda r: "lost")  # older pushes no word came for
        if self.feedback:
            self.unsettled.append(a.round_id)
        if not self.overlap:
            self.state = State.PUSHING
            return [*out, Push(a)]
        self.inflight, self.requesting = a.round_id, False  # beside the round in training
        return [*out, Push(a)]

    def _on_NotifyPull(self, a: NotifyPull, now: float) -> list[Command]:
        said = a.outcome_of(self.learner)
        self._told_steps(a.steps_of(self.learner))
        settled = self._settle(lambda r: said if said in SETTLED else "lost", rounds=(a.round_id,))
        if self.overlap:
            if a.round_id != self.inflight:
                return settled
            return [*settled, Pull(a.version, background=True)]
        if a.round_id != self.round_id:
            return settled  # a round this learner's push is not in
        if self.state is State.WAITING:
            self.state = State.PULLING
            return [*settled, Pull(a.version)]
        if self.state is State.PUSHING:  # the round ended before its push did
            self.notified[a.round_id] = a.version
        return settled

    def _on_Refuse(self, a: Refuse, now: float) -> list[Command]:
        kind = str(a.kind)
        self.refused[kind] += 1
        if kind == RefuseKind.STOPPED:
            self.stopped = a.reason
            return self._exit(ExitCode.OK, f"the job stopped: {a.reason}")
        if self.state is not State.JOINING and not self.asking():
            return []  # about a request no longer in progress
        if self.state is State.JOINING and kind in PUSH_REFUSALS:
            return []  # about a push the rejoin dropped (a restarted leader refused it)
        if kind == RefuseKind.UNKNOWN:
            return self._exit(ExitCode.EVICTED, f"not a member: {a.reason}")
        if kind == RefuseKind.PENDING:
            return []  # a retried request: the first copy's plan comes
        if kind in REJOIN_REFUSALS and self.asking():
            if not self.checkpoints:
                return self._exit(ExitCode.EVICTED, f"must pull first: {a.reason}")
            return self._join(now, resume=True)
        return self._exit(ExitCode.REFUSED, f"refused ({kind}): {a.reason}")

    def _on_Evict(self, a: Evict, now: float) -> list[Command]:
        kind = str(a.kind)
        if kind == EvictKind.LEFT:
            return []  # it left itself: its own exit follows
        if kind == EvictKind.RESTARTED:
            return self._exit(ExitCode.REFUSED, "a newer incarnation took over")
        return self._exit(ExitCode.EVICTED, a.reason)

    def _on_Unused(self, a: Unused, now: float) -> list[Command]:
        self.unused[str(a.kind)] += 1
        return []

    def on_trained(self, meta: PushMeta | None, now: float) -> list[Command]:
        """A ``Train`` finished with the round's push ``meta`` (``None``: no chunk could be
        leased now)."""
        if self.state is not State.TRAINING:
            return []
        if meta is None:
            return [Train(adopt=self.overlap, wait=0.5, steps=self.steps)]
        if meta.incarnation != self.incarnation:
            raise ValueError(
                f"learner {self.learner}: push meta of incarnation {meta.incarnation}, "
                f"not {self.incarnation}"
            )
        if self.overlap and (self.inflight is not None or self.requesting):
            self.state, self.held = State.HOLDING, meta
            return []
        return self._request(meta, now)

    def on_pushed(
        self,
        round_id: int,
        now: float,
        *,
        failed: bool = False,
        replayed: bool = False,
        nonfinite: bool = False,
        followers_up: Iterable[int] = (),
    ) -> list[Command]:
        """A ``Push`` of round ``round_id`` ended: every shard delivered, or ``failed``
        (``replayed``: a follower refused it as a replay of a round that ended;
        ``nonfinite``: a follower refused it as holding NaN or Inf; ``followers_up``: the
        followers the leader hears from, asked after the failure)."""
        plan = self.plan
        if plan is None or round_id != plan.round_id or self.state is State.EXITED:
            return []
        if failed and nonfinite:
            # No follower will take it: the leader drops it when it leaves (the round goes
            # on without it), and a new incarnation starts afresh from the global model.
            return [
                Send(Leave(now, self.learner)),
                *self._exit(ExitCode.EVICTED, f"round {round_id}: push refused as not finite"),
            ]
        if failed:
            targets = {tr.follower for tr in plan.transfers}
            if not replayed and targets <= set(followers_up):
                # Every follower of the plan is up: the link (or the push) is what fails;
                # the round goes on without it, a new incarnation gets a new link.
                return [
                    Send(Leave(now, self.learner)),
                    *self._exit(ExitCode.UNREACHABLE, f"round {round_id}: link down"),
                ]
            out: list[Command] = []  # the leader discards or finishes the round: its pull
        else:
            out = [Send(TransferDone(now, self.learner, round_id, self.incarnation))]
            if self.checkpoints and not self.overlap:
                # On disk before the leader hears of it: a learner killed after its report
                # resumes past this round, never trains its data again.
                out.insert(0, self._save("pushed", round_id, start_step(self.rounds) + 1))
        if self.overlap:
            return out
        self.state = State.WAITING
        if round_id in self.notified:
            self.state = State.PULLING
            out.append(Pull(self.notified.pop(round_id)))
        return out

    def on_pulled(self, version: int, now: float, *, background: bool = False) -> list[Command]:
        """A ``Pull`` of ``version`` ended (the learner holds it, or, ``background``, keeps
        it for its next round start)."""
        if self.state is State.EXITED:
            return []
        self.pulls += 1
        if background:
            self.inflight = None
            out: list[Command] = [Send(PullDone(now, self.learner, version))]
            if self.state is State.HOLDING and not self.requesting:
                # (held behind a request still waiting for its plan: a second word of an
                # older pull changes nothing)
                held, self.held = self.held, None
                assert held is not None
                out += self._request(held, now)
            return out
        if self.state is not State.PULLING:
            return []
        first_of_join = self.round_id is None
        rounds = self.rounds if self.resume and first_of_join else -1
        if not first_of_join:
            self.rounds += 1  # the round is over for this learner
        self.version, self.round_id, self.plan = version, None, None
        self.resume = False
        return [Send(PullDone(now, self.learner, version, rounds)), *self._train()]

    def on_leader_lost(self, now: float, stream: int | None = None) -> list[Command]:
        """Control stream ``stream`` broke (the leader died, or the connection did): the
        driver opens stream ``stream + 1``; this rejoins on it."""
        if self.state is State.EXITED:
            return []
        if stream is not None:
            if stream < self.stream:
                return []  # an older stream's end: already rejoining
            self.stream = stream + 1
        if self.stopped is not None:
            return self._exit(ExitCode.OK, f"the job stopped: {self.stopped}")
        if not self.checkpoints:
            return self._exit(ExitCode.EVICTED, "the leader was lost and there are no checkpoints")
        return self._join(now, resume=True)

    def on_gave_up(self, now: float, why: str) -> list[Command]:
        """The driver could not reach the leader within its patience."""
        del now
        if self.state is State.EXITED:
            return []
        return self._exit(ExitCode.UNREACHABLE, why)

    # -- checkpoints -----------------------------------------------------------------

    def restore_step(self, send: SendModel) -> int | None:
        """The checkpoint a resumed learner restores (``None``: none, start afresh): the
        newest, unless it is the ``pushed`` checkpoint of the push the leader says was
        ``lost`` (dropped by its restart, chunks left with the learner), or a
        ``requested`` one whose push the leader never took (its batches are still leased
        to the learner: the request never came, or was dropped): then the checkpoint
        before, and the round is trained again."""
        if not self.saved:
            return None
        newest = self.saved[-1]
        lost = send.last_outcome == "lost" and send.last_round == newest.round_id
        if newest.kind == "requested":
            leased = spans_of(send.leases)
            lost = any(
                c == lc and s < le and ls < e for c, s, e in newest.spans for lc, ls, le in leased
            )
        if newest.kind in ("pushed", "requested") and lost:
            before = [c for c in self.saved if c.step < newest.step]
            return before[-1].step if before else None
        return newest.step
