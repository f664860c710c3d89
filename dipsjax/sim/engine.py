"""The simulator's engine: learners that really train, on a virtual clock, around a cluster.

:class:`Engine` plays the learners: it draws batches (chunks leased from the leader), runs
real inner steps (:class:`dipsjax.learner.Learner`), charges virtual time for them, pushes
``Delta_start`` through the wire codec, pulls, fails, recovers, joins and leaves as the
config says, and heartbeats. Everything the syncer decides comes from the leader through
the :class:`~dipsjax.sim.cluster.LocalCluster`; the engine only follows the actions.

Learners wait from their push until they pulled the version their contribution went into
(Di-PS sec. 5: the round's learners pull, the others keep training). With ``overlap=True``
they never wait: after a push a learner goes straight on with its next round and adopts the
newest global version at its next round start (one push in flight per learner).

Tokens are counted on the learner side (batches drawn, rounds lost in crashes, rounds not
pushed at the end) independently of the leader's books (:class:`~dipsjax.sim.config.TokenCount`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jax

from dipsjax import outer
from dipsjax.data.pipeline import BatchStream
from dipsjax.learner import Learner
from dipsjax.learner.contribution import add_global_change, delta_to_send, push_meta, wire
from dipsjax.sim.cluster import Clock, LocalCluster
from dipsjax.sim.config import SimConfig, SimResult, TokenCount
from dipsjax.sim.world import World, figures_text
from dipsjax.syncer import messages as m
from dipsjax.syncer.leader import Leader
from dipsjax.syncer.learner import LearnerProtocol

_feedback_encode = jax.jit(
    outer.feedback_encode, static_argnames=("codec", "block_size", "embeddings", "topk")
)
_feedback_settle = jax.jit(outer.feedback_settle, static_argnames=("outcome",))


@dataclasses.dataclass
class SimLearner:
    """A simulated learner process: the deployed protocol (:class:`LearnerProtocol`) with
    real training, charged virtual time."""

    j: int
    learner: Learner
    stream: BatchStream
    proto: LearnerProtocol
    alive: bool = True
    incarnation: int = 0
    # The trained rounds' payloads, oldest first, until their Push takes them (overlap: a
    # round whose request waits for its plan, and the one held behind it).
    pending: collections.deque = dataclasses.field(default_factory=collections.deque)
    outbox: Any = None  # the pushed round's payload, until its transfer lands
    latest: Any = None  # overlap: (version, params) of the newest pulled global model
    # (start, duration, tokens) of each round trained or in training, until its push is
    # requested (the leader books it then), oldest first.
    training: collections.deque = dataclasses.field(default_factory=collections.deque)
    base: Any = None  # parameters of the version last taken (the server reference's base)
    pulled: bool = False  # the next round starts from a freshly taken version
    consumed: int = 0  # tokens of every batch drawn (learner-side count)
    lost: int = 0  # tokens of rounds a crash or leave destroyed before their push
    pushed_at: float | None = None
    feedback: Any = None  # error feedback (EXTENSION): the residual (outer.FeedbackState)
    # error feedback: its pushes whose outcome is not known, by round, and the encoded
    # rounds not pushed yet (oldest first), which get their round at their Push
    unsettled: dict = dataclasses.field(default_factory=dict)
    unassigned: collections.deque = dataclasses.field(default_factory=collections.deque)


def make_cluster(cfg: SimConfig, world: World, clock: Clock) -> LocalCluster:
    """The leader (from the method registry) and followers holding the initial model."""
    method = world.method()
    leader = Leader(method.leader, method.grace, data=world.ledger())
    return LocalCluster(world, leader, world.followers(method), clock)


class Engine:
    """One syncer-method experiment (see module docstring)."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        progress: Callable[[str], None] | None = None,
        restore_leader_at: tuple[float, ...] = (),
        world: World | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``world``: a world built elsewhere (default ``World(cfg)``; tests pass a cheap
        one); ``clock``: a virtual clock to run on (default a new :class:`Clock`; fault
        schedules pass one that injects faults at chosen events, see
        :mod:`dipsjax.sim.faults`)."""
        self.cfg = cfg
        self.progress = progress
        self.world = World(cfg) if world is None else world
        self.clock = Clock() if clock is None else clock
        self.cluster = make_cluster(cfg, self.world, self.clock)
        self.cluster.port = self
        self.overlap = bool(cfg.overlap)
        self.stopped = False
        self.phases = {"train": 0.0, "push": 0.0, "wait": 0.0, "update": 0.0, "pull": 0.0}
        self.pull_comm = 0.0
        self.curve: list[dict[str, float]] = []
        self.last_eval_round = -1
        self.learners = [self._new_learner(j, 0) for j in range(cfg.learners)]
        self.restore_leader_at = restore_leader_at
        self.scripted_joins = [t for _, t in cfg.joins] + [t for _, _, t in cfg.failures]
        self.reference = self.cluster.followers[0].reference
        self.hung: dict[int, float] = {}  # learner -> virtual time its hang ends (faults)
        # Error feedback (EXTENSION): the outcome of each push, from the leader's actions.
        self.feedback_tokens = collections.Counter()  # tokens of pushes settled, by outcome
        self.accepted: dict[int, frozenset[int]] = {}  # round -> learners its Decide accepted
        if cfg.error_feedback:
            self.cluster.round_watch = self._round_outcome

    @property
    def leader(self) -> Leader:
        return self.cluster.leader

    def _new_learner(self, j: int, incarnation: int) -> SimLearner:
        source = lambda: self.cluster.lease(j)  # noqa: E731
        # Sessions apart per incarnation (a process draws its base at random in the runtime):
        # a new process takes only its own join's model.
        proto = LearnerProtocol(
            j, incarnation, overlap=self.overlap, session_base=incarnation << 32
        )
        return SimLearner(
            j, self.world.learner(j), self.world.stream(source), proto, True, incarnation
        )

    # -- the learner's commands, carried out on the virtual clock ------------------------

    def carry_out(self, sl: SimLearner, commands: list[m.Command], t: float) -> None:
        """Carries out a learner's protocol commands at virtual time ``t``, in order."""
        for c in commands:
            if not sl.alive or self.learners[sl.j] is not sl:
                return  # the process is gone: nothing after its death happens
            if isinstance(c, m.Send):
                if isinstance(c.event, m.PushRequested):
                    if self.stopped:
                        continue  # the run is over: the round stays unpushed (counted)
                    if sl.training:
                        sl.training.popleft()  # booked: no longer the learner's to lose
                    sl.pushed_at = t
                self.cluster.feed(c.event)
            elif isinstance(c, m.Train):
                self._train(sl, t, c)
            elif isinstance(c, m.Push):
                sl.outbox = sl.pending.popleft() if sl.pending else None
                if sl.unassigned:  # error feedback: the push now has its round
                    sl.unsettled[c.plan.round_id] = sl.unassigned.popleft()
                inc = sl.incarnation
                self.cluster.push_shards(
                    c.plan,
                    t,
                    lambda j=sl.j, i=inc: self._take_payload(j, i),
                    incarnation=inc,
                    delivered=lambda t_end, why, sl=sl, r=c.plan.round_id: self._pushed(
                        sl, r, t_end, why
                    ),
                )
            elif isinstance(c, m.Pull):
                self._pull(sl, t, c)
            elif isinstance(c, m.Exit):
                if c.code in (m.ExitCode.EVICTED, m.ExitCode.UNREACHABLE):
                    self._down(sl)  # the launcher starts a new incarnation
                    self.clock.at(t, self._recover, sl.j)
                elif c.code != m.ExitCode.OK:
                    self._down(sl)
            else:  # Save, Restore: the simulator's learners keep no checkpoints
                raise TypeError(f"the simulator cannot carry out {c}")

    def _train(self, sl: SimLearner, t: float, cmd: m.Train) -> None:
        if self.stopped or cmd.wait > 0:
            return  # over, or no chunk to lease now: this learner idles
        if cmd.adopt and sl.latest is not None and sl.latest[0] > sl.learner.version:
            self._take(sl, *sl.latest, first=False)
        data = sl.stream.take_round(cmd.steps or self.cfg.inner_steps)
        batches = data.batches
        if not batches:
            self.carry_out(sl, sl.proto.on_trained(None, t), t)
            return
        drawn = data.tokens
        sl.consumed += drawn
        contrib = sl.learner.run_round(batches, num_steps=len(batches), reference="start")
        dt = self.world.train_time(sl.j, contrib.steps)
        meta = push_meta(contrib, data, sl.incarnation, dt, pulled=sl.pulled)
        sl.pulled = False
        delta = delta_to_send(self.reference, contrib, sl.learner, sl.base)
        if self.cfg.error_feedback:
            sl.pending.append(self._feedback_payload(sl, delta, contrib.tokens))
        else:
            sl.pending.append(wire(self.cfg.wire, delta, self.cfg.wire_topk))
        sl.training.append((t, dt, drawn))
        self.phases["train"] += dt
        self.clock.at(t + dt, self._trained, sl, meta)

    def _hangs(self, sl: SimLearner, fn: Callable[..., None], *args: Any) -> bool:
        """A hung learner (:attr:`hung`) does nothing until it wakes: what comes to it
        meanwhile (its round ending, a transfer done, an action) waits until then."""
        wake = self.hung.get(sl.j)
        if wake is None or self.clock.now >= wake:
            return False
        self.clock.at(wake, fn, *args)
        return True

    def _trained(self, sl: SimLearner, meta: m.PushMeta) -> None:
        if self._hangs(sl, self._trained, sl, meta):
            return
        if sl.alive and self.learners[sl.j] is sl:
            t = self.clock.now
            self.carry_out(sl, sl.proto.on_trained(meta, t), t)

    def _pushed(self, sl: SimLearner, round_id: int, t: float, refused: str | None) -> None:
        if self._hangs(sl, self._pushed, sl, round_id, self.hung.get(sl.j, t), refused):
            return
        if sl.alive and self.learners[sl.j] is sl:
            if refused is None:
                self.carry_out(sl, sl.proto.on_pushed(round_id, t), t)
            elif refused == "nonfinite":  # refuse_nonfinite: it leaves, a new one comes
                done = sl.proto.on_pushed(round_id, t, failed=True, nonfinite=True)
                self.carry_out(sl, done, t)
            else:  # a follower refused it (the round ended meanwhile): wait for its pull
                done = sl.proto.on_pushed(round_id, t, failed=True, replayed=True)
                self.carry_out(sl, done, t)

    def _take(self, sl: SimLearner, version: int, params: Any, first: bool) -> None:
        """Starts from a global version: its parameters, or, with ``adopt='delta'``, the
        learner's own plus the global change since its last one."""
        own = params
        if self.cfg.adopt == "delta" and not first and sl.base is not None:
            own = add_global_change(sl.learner.params_dict(), params, sl.base)
        sl.learner.pull(own, version=version, reset_optimizer=first)
        sl.base = params
        sl.pulled = True

    def _pull(self, sl: SimLearner, t: float, cmd: m.Pull) -> None:
        dt = self.world.pull_time(sl.j)
        if not cmd.first:
            self.pull_comm += dt
            self.phases["pull"] += dt
        self.clock.at(t + dt, self._pulled, sl, cmd)

    def _take_payload(self, j: int, incarnation: int) -> dict | None:
        sl = self.learners[j]
        if not sl.alive or sl.incarnation != incarnation or sl.outbox is None:
            return None  # died mid-transfer: nothing partial reaches a round
        payload, sl.outbox = sl.outbox, None
        return payload

    def _pulled(self, sl: SimLearner, cmd: m.Pull) -> None:
        if self._hangs(sl, self._pulled, sl, cmd):
            return
        if not sl.alive or self.learners[sl.j] is not sl:
            return
        t = self.clock.now
        v, params = self.cluster.model(cmd.version)
        if sl.pushed_at is not None:
            self.phases["wait"] += max(t - sl.pushed_at, 0.0)
            sl.pushed_at = None
        if cmd.background:
            sl.latest = (v, params)
        else:
            self._take(sl, v, params, first=cmd.first)
        self.carry_out(sl, sl.proto.on_pulled(v, t, background=cmd.background), t)
        if self.leader.next_round_id - 1 >= self.last_eval_round + self.cfg.eval_every:
            self.last_eval_round = self.leader.next_round_id - 1
            self.record(t)

    def on_action(self, a: m.Action, t: float) -> None:
        """Learner-side actions from the leader, to the learners' protocols."""
        if isinstance(a, m.Stop):
            self.stopped = True
        targets = a.learners if isinstance(a, m.NotifyPull) else (getattr(a, "learner", None),)
        if isinstance(a, m.Stop):
            targets = tuple(range(len(self.learners)))
        for j in targets:
            if j is None:
                continue
            self._to_learner(self.learners[j], a, t)

    def _to_learner(self, sl: SimLearner, a: m.Action, t: float) -> None:
        if self._hangs(sl, self._to_learner, sl, a, self.hung.get(sl.j, t)):
            return
        if sl.alive and self.learners[sl.j] is sl:
            if isinstance(a, m.Unused) and a.incarnation == sl.incarnation:
                self._settle(sl, a.round_id, a.kind)  # stale | nonfinite
            self.carry_out(sl, sl.proto.on_action(a, t), t)

    # -- error feedback (EXTENSION) -------------------------------------------------------

    def _feedback_payload(self, sl: SimLearner, delta: dict, tokens: int) -> dict:
        """What the followers receive with error feedback: ``decode(C(delta + decay e))``
        (:func:`dipsjax.outer.feedback_encode`); the push is settled by its outcome."""
        # A trained round never pushed (refused, or the run ended) delivered nothing; an
        # overlapping learner's round whose request waits for its plan is not such a one.
        while len(sl.unassigned) > int(sl.proto.requesting):
            never, never_tokens = sl.unassigned.popleft()
            sl.feedback = _feedback_settle(sl.feedback, never, outer.Outcome.LOST)
            self.feedback_tokens[str(outer.Outcome.LOST)] += never_tokens
        if sl.feedback is None:
            sl.feedback = outer.feedback_init(delta)
        sl.feedback, _, pending = _feedback_encode(
            sl.feedback,
            delta,
            codec=self.cfg.wire,
            decay=self.cfg.feedback_decay,
            topk=self.cfg.wire_topk,
        )
        sl.unassigned.append((pending, tokens))
        return pending.decoded

    def _settle(self, sl: SimLearner, round_id: int | None, outcome: str) -> None:
        if round_id in sl.unsettled:
            pending, tokens = sl.unsettled.pop(round_id)
            sl.feedback = _feedback_settle(sl.feedback, pending, outer.Outcome(outcome))
            self.feedback_tokens[str(outcome)] += tokens

    def _round_outcome(self, a: m.Action, t: float) -> None:
        """The leader's word to the followers, read for the pushes' outcomes: a ``Decide``
        rejects (the rest wait for the round's end); ``Apply`` applies those it accepted;
        ``Discard`` discards all. A push ``Unused`` names settles when its learner hears it;
        a round trained but never pushed (refused, or the run ended) settles as lost when
        the learner trains its next one (``Refuse`` does not say which request it refuses);
        a learner process that ends takes its residual along.
        (A round whose pushes were all rejected reaches the followers as a ``Discard``
        only: its pushes settle as discarded here, rejected in the leader's books; the
        residual is the same for both.)"""
        del t
        if isinstance(a, m.Decide):
            self.accepted[a.round_id] = frozenset(
                j for j, ok in zip(a.learners, a.accepted, strict=True) if ok
            )
            for j, ok in zip(a.learners, a.accepted, strict=True):
                if not ok:
                    self._settle(self.learners[j], a.round_id, outer.Outcome.REJECTED)
        elif isinstance(a, m.Apply | m.Discard):
            accepted = self.accepted.pop(a.round_id, frozenset())
            for sl in self.learners:
                ok = isinstance(a, m.Apply) and sl.j in accepted
                self._settle(sl, a.round_id, "applied" if ok else "discarded")

    # -- scripted events -----------------------------------------------------------------

    def _join(self, j: int) -> None:
        sl = self.learners[j]
        sl.alive = True
        self.carry_out(sl, sl.proto.start(self.clock.now), self.clock.now)

    def _down(self, sl: SimLearner) -> None:
        sl.alive = False
        sl.lost += sum(tr[2] for tr in sl.training)
        sl.outbox = sl.latest = None
        sl.pending.clear()
        sl.training.clear()

    def _fail(self, j: int) -> None:
        self._down(self.learners[j])
        self.cluster.feed(m.LearnerFailed(self.clock.now, j))

    def _leave(self, j: int) -> None:
        self.cluster.feed(m.Leave(self.clock.now, j))
        self._down(self.learners[j])

    def _recover(self, j: int) -> None:
        old = self.learners[j]
        sl = self._new_learner(j, old.incarnation + 1)  # a new process: fresh state
        sl.consumed, sl.lost = old.consumed, old.lost
        self.learners[j] = sl
        self.carry_out(sl, sl.proto.start(self.clock.now), self.clock.now)

    def _heartbeats(self) -> None:
        t = self.clock.now
        for sl in self.learners:
            if sl.alive and not self.hung.get(sl.j, t) > t:
                self.cluster.feed(m.Heartbeat(t, sl.j))
        self.cluster.feed(m.Tick(t))
        comeback = any(t < when for when in self.scripted_joins)
        if not self.stopped and (comeback or any(sl.alive for sl in self.learners)):
            self.clock.at(t + self.cfg.heartbeat_interval, self._heartbeats)

    def _restore_leader(self) -> None:
        snap = json.loads(json.dumps(self.leader.snapshot(), allow_nan=False))
        self.cluster.leader = Leader.restore(snap, tape=self.leader.tape)

    # -- the run -------------------------------------------------------------------------

    def record(self, t: float) -> None:
        v, params = self.cluster.model()
        totals = self.leader.ledger.totals()
        figures = self.world.evaluate(params).point()
        self.curve.append(
            {
                "t": t,
                "version": v,
                "tokens_consumed": sum(sl.consumed for sl in self.learners),
                "tokens_applied": totals["applied"],
                **figures,
            }
        )
        if self.progress is not None:
            self.progress(
                f"t={t:8.1f}s v={v:5d} tokens={self.curve[-1]['tokens_consumed']:9d} "
                f"{figures_text(figures)}"
            )

    def run(self) -> SimResult:
        cfg, clock = self.cfg, self.clock
        late = dict(cfg.joins)
        for sl in self.learners:
            if sl.j in late:
                sl.alive = False
                clock.at(late[sl.j], self._join, sl.j)
            else:
                clock.at(0.0, self._join, sl.j)
        for j, t_leave in cfg.leaves:
            clock.at(t_leave, self._leave, j)
        for j, t_fail, t_back in cfg.failures:
            clock.at(t_fail, self._fail, j)
            clock.at(t_back, self._recover, j)
        for t in self.restore_leader_at:
            clock.at(t, self._restore_leader)
        clock.at(cfg.heartbeat_interval, self._heartbeats)
        clock.run(lambda: self.stopped)
        t = clock.now
        training = [tr for sl in self.learners if sl.alive for tr in sl.training]
        done = sum(tr[2] * min(max((t - tr[0]) / tr[1], 0.0), 1.0) for tr in training)
        self.record(t)
        totals = self.leader.ledger.totals()
        tokens = TokenCount(
            consumed=sum(sl.consumed for sl in self.learners),
            unpushed=sum(tr[2] for tr in training),
            lost=sum(sl.lost for sl in self.learners),
            reported=totals["reported"],
            applied=totals["applied"],
            rejected=totals["rejected"],
            dropped=totals["dropped"],
            outstanding=self.leader.outstanding_tokens(),
        )
        phases = dict(self.phases)
        phases["push"] = self.cluster.phases["push"]
        phases["update"] = self.cluster.phases["update"]
        return SimResult(
            config=cfg,
            virtual_time=t,
            tokens=tokens,
            rounds=len(self.leader.tape.rounds()),
            comm_time=self.cluster.comm_time + self.pull_comm,
            phases=phases,
            curve=self.curve,
            final_loss=self.curve[-1]["val_loss"],
            final_bpb=self.curve[-1]["val_bpb"],
            tape=self.leader.tape,
            params=self.cluster.model()[1],
            ideal_tokens_per_second=self.world.ideal_tokens_per_second,
            chunk_ledger=self.leader.data,
            tokens_in_training_done=done,
        )
