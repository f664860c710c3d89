"""An in-process transport: the leader and followers wired back to back on a virtual clock.

:class:`LocalCluster` is the reference driver of the sans-IO core (what aioquic's tests do
with two connections wired back to back): it hands events to :class:`dipsjax.syncer.Leader`,
carries out the follower-side actions by calling :class:`dipsjax.syncer.Follower` methods,
moves shard bytes by the leader's transfer plans, and passes learner-side actions to a
*port* (the simulator's :class:`~dipsjax.sim.engine.Engine`; a test can plug its own). It
decides nothing: every choice is the leader's. The network runtime must behave the same.

Timing (virtual seconds):

* a push follows its ``PushShards`` plan transfer by transfer: each tensor goes when both
  the learner's link and the follower's link are free (first come, first served), so
  learners pushing at once contend for followers;
* each follower report reaches the leader ``2 * latency`` after the request;
* an outer step takes ``update_seconds`` on every follower.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Protocol

import jax

from dipsjax import outer
from dipsjax.sim.world import World
from dipsjax.syncer import messages as m
from dipsjax.syncer.follower import Follower
from dipsjax.syncer.leader import Leader


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

    # -- the leader ------------------------------------------------------------------

    def feed(self, event: m.Event) -> list[m.Action]:
        """Hands one event to the leader and carries out its actions."""
        actions = self.leader.handle(event)
        self.execute(actions, event.t)
        return actions

    def lease(self, learner: int) -> int | None:
        """A learner's chunk request, answered at once (the control plane's round trip)."""
        for a in self.feed(m.ChunkRequested(self.clock.now, learner)):
            if isinstance(a, m.GrantChunk) and a.learner == learner:
                return a.chunk
        return None

    def execute(self, actions: list[m.Action], t: float) -> None:
        lat = self.world.cfg.latency
        for a in actions:
            if isinstance(a, m.WakeAt):
                self.clock.at(a.t, lambda t_: self.feed(m.Tick(t_)), a.t)
            elif isinstance(a, m.RequestNorms):
                for k, f in enumerate(self.followers):
                    g = f.partial_norms(a.round_id, a.learners, a.base_versions)
                    ev = m.FollowerNorms(t + 2 * lat, k, a.round_id, tuple(float(x) for x in g))
                    self.clock.at(ev.t, self.feed, ev)
            elif isinstance(a, m.Decide):
                for k, f in enumerate(self.followers):
                    ev = m.FollowerMerged(t + 2 * lat, k, a.round_id, f.merged_partial(a))
                    self.clock.at(ev.t, self.feed, ev)
            elif isinstance(a, m.Apply):
                done = t + self.world.cfg.update_seconds
                self.phases["update"] += self.world.cfg.update_seconds
                for k, f in enumerate(self.followers):
                    f.apply(f.decisions[a.round_id], a)
                    self.clock.at(
                        done, self.feed, m.FollowerApplied(done, k, a.round_id, a.version)
                    )
            elif isinstance(a, m.Discard):
                for f in self.followers:
                    f.discard(a.round_id)
            elif self.port is not None:
                self.port.on_action(a, t)

    # -- the data plane --------------------------------------------------------------

    def push_shards(
        self,
        action: m.PushShards,
        t: float,
        take_payload: Callable[[], dict | None],
        incarnation: int = 0,
        delivered: Callable[[float], None] | None = None,
    ) -> None:
        """Runs a push by its plan; at the end the followers stage it and the leader hears.

        ``take_payload`` is asked at delivery time: ``None`` means the learner died on the
        way, and nothing is delivered (no partial data enters a round). Once delivered,
        ``delivered(t)`` is called (the learner's protocol reports the transfer done), or,
        without it, the cluster tells the leader itself (``TransferDone`` of
        ``incarnation``).
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
            for f, part in zip(self.followers, w.split(payload), strict=True):
                f.receive(action.round_id, j, part)
            if delivered is not None:
                delivered(t_end)
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
