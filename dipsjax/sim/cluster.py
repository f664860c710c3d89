"""An in-process transport: the leader and followers wired back to back on a virtual clock.

:class:`LocalCluster` is the reference driver of the sans-IO core (what aioquic's tests do
with two connections wired back to back): it hands events to :class:`dipsjax.syncer.Leader`,
hands the follower-side actions to each :meth:`dipsjax.syncer.Follower.handle` and carries
out the commands it returns (as the runtime's follower process does), moves shard bytes by
the leader's transfer plans, and passes learner-side actions to a *port* (the simulator's
:class:`~dipsjax.sim.engine.Engine`; a test can plug its own). It decides nothing: every
choice is the leader's or a follower's core. The network runtime must behave the same.

Timing (virtual seconds):

* a push follows its ``PushShards`` plan transfer by transfer: each tensor goes when both
  the learner's link and the follower's link are free (first come, first served), so
  learners pushing at once contend for followers;
* each follower report reaches the leader ``2 * latency`` after the request;
* an outer step takes ``update_seconds`` on every follower;
* faults are events: :meth:`LocalCluster.leader_lost` breaks a follower's control stream,
  :meth:`LocalCluster.hang` stalls a follower.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Protocol

import jax

from dipsjax import outer
from dipsjax.sim.world import World
from dipsjax.syncer import messages as m
from dipsjax.syncer.follower import Follower, PushRefused
from dipsjax.syncer.leader import Leader

TO_FOLLOWERS = (m.RequestNorms, m.Decide, m.Apply, m.Discard, m.Rejoin)


class Clock:
    """A virtual clock: callbacks ordered by time, then by scheduling order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list = []
        self._counter = itertools.count()

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heappush(self._queue, (t, next(self._counter), fn, args))

    def run(self, stopped: Callable[[], bool]) -> None:
        while self._queue and not stopped():
            t, _, fn, args = heappop(self._queue)
            self.now = t
            fn(*args)


class Port(Protocol):
    """Where the cluster delivers learner-side actions."""

    def on_action(self, action: m.Action, t: float) -> None: ...


class LocalCluster:
    """Leader + followers in one process, on a virtual clock (see module docstring)."""

    def __init__(
        self, world: World, leader: Leader, followers: list[Follower], clock: Clock
    ) -> None:
        self.world = world
        self.leader = leader
        self.followers = followers
        self.clock = clock
        self.port: Port | None = None
        self.follower_free = [0.0] * len(followers)
        self.comm_time = 0.0
        self.phases = {"push": 0.0, "update": 0.0}
        # The followers' Save commands by kind (what a runtime would write).
        self.saves: collections.Counter[str] = collections.Counter()
        self.refused = 0  # pushes a follower refused (a round that ended meanwhile)
        self.exits: dict[int, m.Exit] = {}  # followers told to end (Stop)
        self.hung_until = [float("-inf")] * len(followers)
        self.deaf_until = [float("-inf")] * len(followers)
        self.lost_actions = 0  # actions sent into a follower's broken control stream

    # -- the leader ------------------------------------------------------------------

    def feed(self, event: m.Event) -> list[m.Action]:
        """Hands one event to the leader and carries out its actions."""
        actions = self.leader.handle(event)
        self.execute(actions, event.t)
        return actions

    def lease(self, learner: int) -> tuple[int, int, int] | None:
        """A learner's chunk request, answered at once (the control plane's round trip)."""
        for a in self.feed(m.ChunkRequested(self.clock.now, learner)):
            if isinstance(a, m.GrantChunk) and a.learner == learner:
                return a.piece
        return None

    def execute(self, actions: list[m.Action], t: float) -> None:
        for a in actions:
            if isinstance(a, m.WakeAt):
                self.clock.at(a.t, lambda t_: self.feed(m.Tick(t_)), a.t)
            elif isinstance(a, TO_FOLLOWERS):
                if isinstance(a, m.Apply):
                    self.phases["update"] += self.world.cfg.update_seconds
                for k in range(len(self.followers)):
                    if isinstance(a, m.Rejoin) and a.follower != k:
                        continue
                    if t < self.deaf_until[k]:  # sent into its broken stream: lost
                        self.lost_actions += 1
                        continue
                    if t < self.hung_until[k]:  # it takes its actions, in order, once awake
                        self.clock.at(self.hung_until[k], self._follower_handles, k, a)
                    else:
                        self._follower_handles(k, a, t)
            elif self.port is not None:
                self.port.on_action(a, t)

    def _follower_handles(self, k: int, action: m.Action, t: float | None = None) -> None:
        t = self.clock.now if t is None else t
        self.follower_commands(k, self.followers[k].handle(action, t), t)

    def follower_commands(self, k: int, commands: list[m.Command], t: float) -> None:
        """Carries out follower ``k``'s commands of time ``t``: each ``Send`` reaches the
        leader ``2 * latency`` later (a ``FollowerApplied`` once the outer step's
        ``update_seconds`` are over); a ``Save`` is counted by kind (nothing to write here)."""
        cfg = self.world.cfg
        for c in commands:
            if isinstance(c, m.Save):
                self.saves[c.kind] += 1
            elif isinstance(c, m.Send):
                due = t + (
                    cfg.update_seconds
                    if isinstance(c.event, m.FollowerApplied)
                    else 2 * cfg.latency
                )
                self.clock.at(due, self.feed, dataclasses.replace(c.event, t=due))
            elif isinstance(c, m.Exit):
                self.exits[k] = c

    # -- faults (injected as events by a test or a fault schedule) ------------------

    def leader_lost(self, k: int, t: float) -> None:
        """Follower ``k``'s control stream breaks at ``t`` (the leader stays up): the
        follower says it was lost and joins again; actions sent to it before its word
        reaches the leader went into the broken stream and are lost."""
        self.deaf_until[k] = t + 2 * self.world.cfg.latency
        self.follower_commands(k, self.followers[k].leader_lost(t), t)

    def hang(self, k: int, until: float) -> None:
        """Follower ``k`` takes no action before ``until`` (a stalled process); then it
        carries out the ones that came meanwhile, in order."""
        self.hung_until[k] = max(self.hung_until[k], until)

    # -- the data plane --------------------------------------------------------------

    def push_shards(
        self,
        action: m.PushShards,
        t: float,
        take_payload: Callable[[], dict | None],
        incarnation: int = 0,
        delivered: Callable[[float, str | None], None] | None = None,
    ) -> None:
        """Runs a push by its plan; at the end the followers stage it and the leader hears.

        ``take_payload`` is asked at delivery time: ``None`` means the learner died on the
        way, and nothing is delivered (no partial data enters a round). ``incarnation``: of
        the pushing learner process (staged with its shards, and in its ``TransferDone``).
        A follower refuses a push for a round that ended meanwhile (discarded after a
        follower was lost): counted in ``refused``, as the data plane would. Once
        delivered, ``delivered(t, refused)`` is called (the learner's protocol reports the
        transfer done; ``refused``: the refusal's kind, or ``None``), or, without it, the
        cluster tells the leader itself (``TransferDone``).
        """
        j, w = action.learner, self.world
        free = t + w.cfg.latency
        for tr in action.transfers:
            start = max(free, self.follower_free[tr.follower])
            free = start + w.layer_bytes[tr.layer] / w.rate(j, tr.follower)
            self.follower_free[tr.follower] = free
        self.comm_time += free - t
        self.phases["push"] += free - t

        def deliver(t_end: float) -> None:
            payload = take_payload()
            if payload is None:
                return
            refused = None
            for f, part in zip(self.followers, w.split(payload), strict=True):
                try:
                    f.receive(action.round_id, j, part, incarnation)
                except PushRefused as e:
                    if e.kind not in ("replayed", "incarnation"):
                        raise  # a shard that does not fit: a bug of the simulator
                    self.refused += 1
                    refused = e.kind
            if delivered is not None:
                delivered(t_end, refused)
            else:
                self.feed(m.TransferDone(t_end, j, action.round_id, incarnation))

        self.clock.at(free, deliver, free)

    def model(self, version: int | None = None) -> tuple[int, dict]:
        """A complete model of one version (default: the newest), as host arrays."""
        newest = self.followers[0].version
        v = newest if version is None or version not in self.cached_versions() else version
        shards = [f.pull(v)[1] for f in self.followers]
        return v, jax.device_get(outer.merge_trees(shards))

    def cached_versions(self) -> set[int]:
        return set.intersection(*(set(f.cached_versions()) for f in self.followers))
