"""Faults at any moment: fault schedules for the simulator's :class:`~dipsjax.sim.engine.Engine`.

A schedule is a tuple of :class:`Fault` s, each naming the event of the run before which it
strikes (``at``: the clock's event index, so two callbacks at one virtual instant can be told
apart) and a role. :class:`FaultClock` is the engine's virtual clock with the schedule in it;
it also bounds the run (a run that does not end is an error naming its schedule)::

    clock = FaultClock((Crash(at=40, learner=1, back_after=3.0), RestartLeader(at=90)))
    engine = Engine(cfg, clock=clock)
    clock.engine = engine
    result = engine.run()

Faults (the launcher restarts a dead learner as a new incarnation; the simulator's learners
keep no checkpoints):

* :class:`Crash`: a learner process dies (``tell``: the launcher tells the leader, else the
  leader finds out by heartbeats or the new incarnation's ``Join``), restarted
  ``back_after`` seconds later;
* :class:`Hang`: a learner stops (no heartbeats, no progress) for ``seconds``, then goes on
  with what reached it meanwhile (evicted if it hung past the heartbeat limit);
* :class:`Leave`: a learner leaves the run (``Leave``), back as a new incarnation after
  ``back_after`` seconds (``None``: for good);
* :class:`Cut`: a learner's control stream breaks (its protocol's ``on_leader_lost``);
* :class:`FollowerCut`: a follower's control stream breaks (``Follower.leader_lost``: lost,
  then joined with the decided rounds it holds; actions sent into the stream are lost);
* :class:`FollowerHang`: a follower stalls, then carries out what came meanwhile;
* :class:`FollowerKill`: a follower's process dies (everything in memory lost, and what was
  sent to it while down); the launcher starts a new one ``back_after`` seconds later from
  what the old one wrote to disk (:meth:`~dipsjax.sim.cluster.LocalCluster.kill`: its newest
  checkpoint and the newest decided round's inputs, as ``--resume latest`` does);
* :class:`RestoreLeader`: the leader replaced by one restored from its JSON snapshot;
* :class:`RestartLeader`: the leader process killed and restarted from its snapshot with
  :meth:`~dipsjax.syncer.leader.Leader.resume` (the runtime's ``--resume``): what was on its
  way to it is lost, every follower rejoins through its protocol (``Follower.leader_lost``),
  every learner sees its control stream break.
* :class:`Takeover`: the active leader's host lost (issue 22): a standby takes over once
  the lease lapses (``lease`` seconds later; later if the standby itself is down), restored
  from the snapshot the old one last wrote and resumed as a leader restarted alone. No
  leader listens meanwhile: what is sent to one waits until the new one listens, chunk
  requests get none, every stream broke at the loss.
* :class:`StandbyKill`: the standby's process dies; the launcher starts it again
  ``back_after`` seconds later (a takeover meanwhile waits for it).

"""

from __future__ import annotations

import dataclasses
import json
from heapq import heappop
from typing import Any

from dipsjax.sim.cluster import Clock
from dipsjax.syncer import messages as m
from dipsjax.syncer.leader import Leader


class RunawayError(RuntimeError):
    """A run that went past its event or time bound (it would not have ended)."""


@dataclasses.dataclass(frozen=True)
class Fault:
    at: int  # strikes before the clock's event number ``at``

    # Whether the run models the followers' processes from its start (their files and
    # heartbeats: LocalCluster.model_processes).
    needs_processes = False

    def strike(self, engine: Any) -> None:
        raise NotImplementedError


def _restart_later(engine: Any, j: int, delay: float) -> None:
    """The launcher restarts learner ``j``'s dead process ``delay`` seconds from now (once:
    if a new incarnation runs by then, nothing)."""
    dead = engine.learners[j]

    def restart() -> None:
        if engine.learners[j] is dead and not dead.alive and not engine.stopped:
            engine._recover(j)

    when = engine.clock.now + delay
    engine.scripted_joins.append(when)  # heartbeats go on until then, as for scripted ones
    engine.clock.at(when, restart)


@dataclasses.dataclass(frozen=True)
class Crash(Fault):
    learner: int = 0
    back_after: float = 1.0
    tell: bool = False

    def strike(self, engine: Any) -> None:
        sl = engine.learners[self.learner]
        if not sl.alive:
            return  # not running (between incarnations, or left)
        engine._down(sl)
        if self.tell:
            engine.cluster.feed(m.LearnerFailed(engine.clock.now, self.learner))
        _restart_later(engine, self.learner, self.back_after)


@dataclasses.dataclass(frozen=True)
class Hang(Fault):
    learner: int = 0
    seconds: float = 1.0

    def strike(self, engine: Any) -> None:
        wake = engine.clock.now + self.seconds
        engine.hung[self.learner] = max(engine.hung.get(self.learner, wake), wake)


@dataclasses.dataclass(frozen=True)
class Leave(Fault):
    learner: int = 0
    back_after: float | None = None

    def strike(self, engine: Any) -> None:
        sl = engine.learners[self.learner]
        if not sl.alive or engine.hung.get(self.learner, -1.0) > engine.clock.now:
            return  # a hung or dead process says nothing
        engine._leave(self.learner)
        if self.back_after is not None:
            _restart_later(engine, self.learner, self.back_after)


@dataclasses.dataclass(frozen=True)
class Cut(Fault):
    """The learner's control stream breaks (the leader is up)."""

    learner: int = 0

    def strike(self, engine: Any) -> None:
        sl = engine.learners[self.learner]
        if sl.alive:
            t = engine.clock.now
            engine.carry_out(sl, sl.proto.on_leader_lost(t), t)


@dataclasses.dataclass(frozen=True)
class FollowerCut(Fault):
    """A follower's control stream breaks (the leader is up): its protocol says it was
    lost and joins again (``Follower.leader_lost``); what was sent into the broken stream
    is lost."""

    follower: int = 0

    def strike(self, engine: Any) -> None:
        engine.cluster.leader_lost(self.follower, engine.clock.now)


@dataclasses.dataclass(frozen=True)
class FollowerHang(Fault):
    """A follower stalls for ``seconds``, then carries out what came meanwhile, in order."""

    follower: int = 0
    seconds: float = 1.0

    def strike(self, engine: Any) -> None:
        engine.cluster.hang(self.follower, engine.clock.now + self.seconds)


@dataclasses.dataclass(frozen=True)
class FollowerKill(Fault):
    """A follower's process dies; a new one starts ``back_after`` seconds later from its
    disk. Struck during an outer step (its checkpoint written, its report not yet sent),
    the report is never sent. Pushes to it and pulls from it wait until it is back (the
    learners retry them)."""

    follower: int = 0
    back_after: float = 1.0

    needs_processes = True

    def strike(self, engine: Any) -> None:
        engine.cluster.kill(self.follower, engine.clock.now, self.back_after)


@dataclasses.dataclass(frozen=True)
class RestoreLeader(Fault):
    def strike(self, engine: Any) -> None:
        engine._restore_leader()


@dataclasses.dataclass(frozen=True)
class RestartLeader(Fault):
    def strike(self, engine: Any) -> None:
        t, cluster = engine.clock.now, engine.cluster
        if cluster.leader_away_until >= t:
            return  # no leader process to restart: a takeover is under way
        snap = json.loads(json.dumps(engine.leader.snapshot(), allow_nan=False))
        engine.clock.drop(lambda fn: fn == cluster.feed)  # on its way to the dead leader
        leader = Leader.restore(snap, tape=engine.leader.tape)
        cluster.leader = leader
        cluster.execute(leader.resume(t, alone=True), t)  # its peers are up
        _streams_break(engine, t, "the leader restarted")


@dataclasses.dataclass(frozen=True)
class Takeover(Fault):
    lease: float = 3.0

    def strike(self, engine: Any) -> None:
        t, cluster = engine.clock.now, engine.cluster
        if cluster.leader_away_until >= t:
            return  # no leader to lose: a takeover is under way
        # What the lost leader last wrote (it writes before any action leaves).
        snap = json.loads(json.dumps(engine.leader.snapshot(), allow_nan=False))
        tape = engine.leader.tape
        engine.clock.drop(lambda fn: fn == cluster.feed)  # on its way to the lost leader
        back = max(t + self.lease, getattr(engine, "standby_down_until", t) + self.lease)
        cluster.leader_away_until = back
        cluster.leader_losses.append(t)
        _streams_break(engine, t, "the leader's host was lost")
        engine.clock.at(back, _take_over, engine, snap, tape)


@dataclasses.dataclass(frozen=True)
class StandbyKill(Fault):
    back_after: float = 1.0

    def strike(self, engine: Any) -> None:
        t = engine.clock.now
        was = getattr(engine, "standby_down_until", t)
        engine.standby_down_until = max(was, t + self.back_after)


def _streams_break(engine: Any, t: float, why: str) -> None:
    """Every follower's and learner's control stream breaks at ``t``: their protocols
    rejoin (a follower down now joins when its new process starts)."""
    cluster = engine.cluster
    for k, f in enumerate(cluster.followers):
        if cluster.is_down(k):
            continue
        for c in f.leader_lost(t, why):
            if isinstance(c, m.Send):
                cluster.feed(dataclasses.replace(c.event, t=t))
    for sl in list(engine.learners):
        if sl.alive:
            engine.carry_out(sl, sl.proto.on_leader_lost(t), t)


def _take_over(engine: Any, snap: dict, tape: Any) -> None:
    """The standby listens: restored, resumed alone, then given what waited for it."""
    t, cluster = engine.clock.now, engine.cluster
    leader = Leader.restore(snap, tape=tape)
    cluster.leader = leader
    cluster.leader_away_until = float("-inf")
    cluster.takeovers.append(t)
    cluster.execute(leader.resume(t, alone=True), t)
    held, cluster.held_events = cluster.held_events, []
    for event in held:
        cluster.feed(dataclasses.replace(event, t=t))


class FaultClock(Clock):
    """A :class:`Clock` that strikes a schedule's faults before the events they name and
    bounds the run (``max_events`` callbacks, ``max_time`` virtual seconds).

    With a follower kill in the schedule, the cluster keeps its followers' files from the
    start, and a learner's pull (the engine's ``_pulled``) waits while the cluster cannot
    serve it (:meth:`~dipsjax.sim.cluster.LocalCluster.pull_ready`: a follower is down), as
    the runtime's learner retries a pull until every follower answers; each wait counts as
    an event."""

    def __init__(
        self, schedule: tuple[Fault, ...] = (), max_events: int = 20_000, max_time: float = 1e4
    ) -> None:
        super().__init__()
        self.schedule = tuple(schedule)
        self.engine: Any = None
        self.events = 0
        self.max_events = max_events
        self.max_time = max_time
        self.struck: list[tuple[int, float, Fault]] = []

    def drop(self, pred: Any) -> None:
        """Removes the queued callbacks whose function satisfies ``pred``."""
        self.remove(lambda fn, args: pred(fn))

    def run(self, stopped: Any) -> None:
        due: dict[int, list[Fault]] = {}
        for f in self.schedule:
            due.setdefault(f.at, []).append(f)
        pulled = None
        if any(f.needs_processes for f in self.schedule):
            self.engine.cluster.model_processes()
            pulled = self.engine._pulled
        while self._queue and not stopped():
            for fault in due.pop(self.events, ()):
                self.struck.append((self.events, self.now, fault))
                fault.strike(self.engine)
                if stopped():
                    return
            if not self._queue:
                break
            t, _, fn, args = heappop(self._queue)
            self.now = t
            retry = None if pulled is None or fn != pulled else self._pull_wait(args)
            if retry is not None:
                self.at(retry, fn, *args)
            else:
                fn(*args)
            self.events += 1
            if self.events > self.max_events or t > self.max_time:
                raise RunawayError(
                    f"the run did not end within {self.max_events} events / {self.max_time} "
                    f"virtual seconds (now {self.events} events, t={t:.1f}); schedule "
                    f"{self.schedule!r}"
                )

    def _pull_wait(self, args: tuple) -> float | None:
        """When to try a learner's pull again (``None``: now)."""
        _, cmd = args
        return self.engine.cluster.pull_ready(cmd.version)
