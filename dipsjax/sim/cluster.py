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
  :meth:`LocalCluster.hang` stalls a follower, :meth:`LocalCluster.kill` kills a follower's
  process and restarts it from its disk (after :meth:`LocalCluster.model_processes`).

Disk (:class:`FollowerDisk`, kept once :meth:`LocalCluster.model_processes` is called): what
the follower process of ``runtime/follower.py`` writes, and nothing else. Its checkpoint of
version 0 (written before it joins), then a checkpoint (version, shard, outer state, ended
rounds) for each ``Save('version')`` (every ``checkpoint_every`` versions), and its
journal: each decided round's inputs (``Decide`` and stacked batch) for each
``Save('inputs')`` and each step's ``Apply`` for each ``Save('applied')``, as copies, when
the core returns them (before the commands after them); a checkpoint frees the journal's
older entries. The report of an outer step leaves ``update_seconds`` later (the step's
time): a kill in between finds the step's ``Apply`` on disk and the report never sent; a
kill before the ``Apply`` arrives finds the round's inputs without it (the files a kill
during the step's computation leaves). A restarted follower redoes the steps since its
newest checkpoint (:meth:`~dipsjax.syncer.follower.Follower.redo`). A killed follower loses
everything else: staged shards, version cache, the actions queued to it and those sent
while it is down; pushes to it and pulls from it wait until it is back (the runtime's
learners retry them).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from dipsjax import outer
from dipsjax.sim.world import World
from dipsjax.syncer import messages as m
from dipsjax.syncer.follower import Follower, PushRefused, covered
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

    def remove(self, pred: Callable[[Callable[..., None], tuple], bool]) -> int:
        """Removes the queued callbacks for which ``pred(fn, args)`` holds; returns how many."""
        kept = [e for e in self._queue if not pred(e[2], e[3])]
        removed = len(self._queue) - len(kept)
        if removed:
            heapq.heapify(kept)
            self._queue = kept
        return removed


def _copy(tree: Any) -> Any:
    """Host copies of a tree's arrays (what a write to disk keeps: later steps donate or
    reuse the live buffers)."""
    return jax.tree.map(lambda x: np.array(x, copy=True), tree)


@dataclasses.dataclass
class FollowerDisk:
    """A follower's files: checkpoints by version (the ``keep`` newest, as orbax keeps
    them: ``(params, opt_state, ended rounds)``), and its journal since the newest one:
    decided rounds' inputs ``(version, Decide, stacked batch)`` and steps' ``(Apply,
    ended rounds)``, by round."""

    checkpoints: dict[int, tuple[Any, Any, list[list[int]]]]
    decided: dict[int, tuple[int, m.Decide, Any]] = dataclasses.field(default_factory=dict)
    applied: dict[int, tuple[m.Apply, list[list[int]]]] = dataclasses.field(default_factory=dict)
    keep: int = 3

    def save_version(self, f: Follower) -> None:
        st = f.state
        self.checkpoints[st.version] = (_copy(st.params), _copy(st.opt_state), f.ended_rounds())
        for v in sorted(self.checkpoints)[: -self.keep]:
            del self.checkpoints[v]
        # What the journal holds before this version, the checkpoint has.
        v = st.version
        self.decided = {r: e for r, e in self.decided.items() if not covered("decided", e[0], v)}
        self.applied = {
            r: e for r, e in self.applied.items() if not covered("applied", e[0].version, v)
        }

    def save_inputs(self, f: Follower, round_id: int, version: int) -> None:
        decision, stacked = f.round_inputs(round_id)
        self.decided[round_id] = (version, decision, _copy(stacked))

    def save_applied(self, f: Follower, round_id: int) -> None:
        _, a = f.last_applied
        assert a.round_id == round_id, (a, round_id)
        self.applied[round_id] = (a, f.ended_rounds())

    def restore(self, dead: Follower) -> Follower:
        """The follower a restarted process builds (``--resume latest``): the newest
        checkpoint, then the steps its journal holds since, redone, and the inputs of a
        round decided at its version (the core decides)."""
        v = max(self.checkpoints)
        params, opt_state, ended = self.checkpoints[v]
        f = Follower(
            dead.follower_id,
            params,
            dead.tx,
            capacity=dead.capacity,
            reference=dead.reference,
            version=v,
            opt_state=jax.tree.map(lambda x: jnp.array(x, copy=True), opt_state),
            version_cache=dead.version_cache,
            ended=ended,
            learners=dead.learners,
            refuse_nonfinite=dead.refuse_nonfinite,
            checkpoint_every=dead.checkpoint_every,
        )
        f.address = dead.address
        f.redo(self.decided.values(), self.applied.values())
        return f


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
        self.refused = 0  # pushes a follower refused (a round that ended meanwhile; NaN)
        self.exits: dict[int, m.Exit] = {}  # followers told to end (Stop)
        self.hung_until = [float("-inf")] * len(followers)
        self.deaf_until = [float("-inf")] * len(followers)
        self.lost_actions = 0  # actions sent into a follower's broken control stream
        # The followers' heartbeat threads (off: the leader never watches a follower's
        # silence; on: each one up beats at every Tick, which the engine feeds each
        # heartbeat interval; a follower's start sends a first beat either way).
        self.follower_heartbeats = False
        # Follower processes and their files (kills; see the module docstring).
        self.disk: list[FollowerDisk] | None = None
        self.down: dict[int, float] = {}  # dead follower -> when its new process starts
        self.kills = 0
        self.restarts = 0
        # Each kill: (follower, time, version restored, decided rounds it took back).
        self.restored: list[tuple[int, float, int, tuple[int, ...]]] = []
        # The report of each follower's newest outer step (leaves when the step is over).
        self.stepping: dict[int, m.Event] = {}
        # Who else hears the actions to the followers (the simulator's error feedback learns
        # from Decide, Apply and Discard how its learners' pushes ended).
        self.round_watch: Callable[[m.Action, float], None] | None = None
        # No leader listens until this time (a standby taking over, issue 22): events sent
        # meanwhile reach the new one when it listens, as a gRPC call waits for a channel
        # to be ready; a chunk request is answered with none.
        self.leader_away_until = float("-inf")
        self.held_events: list[m.Event] = []
        self.leader_losses: list[float] = []  # when the leader's host was lost
        self.takeovers: list[float] = []  # when a standby took over

    # -- the leader ------------------------------------------------------------------

    def feed(self, event: m.Event) -> list[m.Action]:
        """Hands one event to the leader and carries out its actions (with
        :attr:`follower_heartbeats`, a ``Tick`` comes after the heartbeats of the followers
        whose processes run and are not hung)."""
        if event.t <= self.leader_away_until:
            if not isinstance(event, m.Tick):  # (the new leader's own timers tick it)
                self.held_events.append(event)
            return []
        if self.follower_heartbeats and isinstance(event, m.Tick):
            for k in range(len(self.followers)):
                if k not in self.down and k not in self.exits and event.t >= self.hung_until[k]:
                    self.execute(self.leader.handle(m.FollowerHeartbeat(event.t, k)), event.t)
        actions = self.leader.handle(event)
        self.execute(actions, event.t)
        return actions

    def lease(self, learner: int) -> tuple[int, int, int] | None:
        """A learner's chunk request, answered at once (the control plane's round trip)."""
        if self.clock.now <= self.leader_away_until:
            return None  # no leader to ask: no chunk now
        for a in self.feed(m.ChunkRequested(self.clock.now, learner)):
            if isinstance(a, m.GrantChunk) and a.learner == learner:
                return a.piece
        return None

    def execute(self, actions: list[m.Action], t: float) -> None:
        for a in actions:
            if isinstance(a, m.WakeAt):
                self.clock.at(a.t, lambda t_: self.feed(m.Tick(t_)), a.t)
            elif isinstance(a, TO_FOLLOWERS):
                if self.round_watch is not None:
                    self.round_watch(a, t)
                if isinstance(a, m.Apply):
                    self.phases["update"] += self.world.cfg.update_seconds
                for k in range(len(self.followers)):
                    if isinstance(a, m.Rejoin) and a.follower != k:
                        continue
                    if k in self.down or t < self.deaf_until[k]:  # no one hears it: lost
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
        ``update_seconds`` are over); a ``Save`` is counted by kind, and written to the
        follower's disk if :meth:`model_processes` was called."""
        cfg = self.world.cfg
        for c in commands:
            if isinstance(c, m.Save):
                self.saves[c.kind] += 1
                if c.kind == "batch":
                    pass  # written with the round's inputs (the simulator's disk is instant)
                elif self.disk is not None and c.kind == "inputs":
                    self.disk[k].save_inputs(self.followers[k], c.round_id, c.version)
                elif self.disk is not None and c.kind == "applied":
                    self.disk[k].save_applied(self.followers[k], c.round_id)
                elif self.disk is not None:
                    self.disk[k].save_version(self.followers[k])
            elif isinstance(c, m.Send):
                step = isinstance(c.event, m.FollowerApplied)
                due = t + (cfg.update_seconds if step else 2 * cfg.latency)
                event = dataclasses.replace(c.event, t=due)
                if step:
                    self.stepping[k] = event
                self.clock.at(due, self.feed, event)
            elif isinstance(c, m.Exit):
                self.exits[k] = c

    # -- faults (injected as events by a test or a fault schedule) ------------------

    def leader_lost(self, k: int, t: float) -> None:
        """Follower ``k``'s control stream breaks at ``t`` (the leader stays up): the
        follower says it was lost and joins again; actions sent to it before its word
        reaches the leader went into the broken stream and are lost."""
        if k in self.down:
            return  # a dead process has no stream to break
        self.deaf_until[k] = t + 2 * self.world.cfg.latency
        self.follower_commands(k, self.followers[k].leader_lost(t), t)

    def hang(self, k: int, until: float) -> None:
        """Follower ``k`` takes no action before ``until`` (a stalled process); then it
        carries out the ones that came meanwhile, in order."""
        if k in self.down:
            return  # no process to stall
        self.hung_until[k] = max(self.hung_until[k], until)

    def model_processes(self) -> None:
        """Models the followers' processes from now on: their files (see the module
        docstring), starting with each one's checkpoint of the version it holds (the
        runtime's, before it joins), and their heartbeats (:attr:`follower_heartbeats`: a
        restarted follower's first beat makes the leader watch its silence)."""
        self.follower_heartbeats = True
        if self.disk is None:
            self.disk = [FollowerDisk({}) for _ in self.followers]
            for d, f in zip(self.disk, self.followers, strict=True):
                d.save_version(f)

    def kill(self, k: int, t: float, back_after: float) -> bool:
        """Follower ``k``'s process dies at ``t``; the launcher starts a new one
        ``back_after`` seconds later from its disk (``--resume latest``). Everything else
        it held is lost, and so are the actions queued to it (a hang's) or sent to it while
        down, and the report of an outer step not over yet. Returns False if there was no
        process to kill (down already, or it exited)."""
        if self.disk is None:
            raise RuntimeError("a kill needs the followers' disk: call model_processes() first")
        if k in self.down or k in self.exits:
            return False
        self.kills += 1
        self.clock.remove(lambda fn, args: fn == self._follower_handles and args[0] == k)
        self.hung_until[k] = self.deaf_until[k] = float("-inf")
        report = self.stepping.pop(k, None)  # not sent if its step is not over
        if report is not None:
            self.clock.remove(lambda fn, args: fn == self.feed and args[0] is report)
        self.down[k] = t + back_after
        # The object a new process builds from disk (the disk is unchanged until then).
        f = self.followers[k] = self.disk[k].restore(self.followers[k])
        self.restored.append((k, t, f.version, f.decided_rounds()))
        self.clock.at(t + back_after, self._restart, k)
        return True

    def _restart(self, k: int) -> None:
        """Follower ``k``'s new process starts: it says it was lost and joins again, and
        watches the leader's actions once the leader has its join (as the runtime's does:
        what was sent before is lost, as into a broken stream)."""
        if self.down.pop(k, None) is None:
            return
        self.restarts += 1
        t = self.clock.now
        self.deaf_until[k] = t + 2 * self.world.cfg.latency
        self.follower_commands(k, self.followers[k].start(t, restarted=True), t)

    def is_down(self, k: int) -> bool:
        return k in self.down

    def pull_ready(self, version: int) -> float | None:
        """When a pull of ``version`` can be served: ``None`` now; else a time to try again
        (a follower is down: when it is back; no version is held by every follower: a
        retry later, as the runtime's learner retries a refused pull)."""
        if self.down:
            return min(self.down.values())
        if not self.cached_versions():
            return self.clock.now + max(self.world.cfg.latency, 0.05)
        return None

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
        follower was lost), or, with ``refuse_nonfinite``, one holding NaN or Inf: counted
        in ``refused``, as the data plane would. Once delivered, ``delivered(t, refused)``
        is called (the learner's protocol reports the transfer done; ``refused``: the
        refusal's kind, ``nonfinite`` first, or ``None``), or, without it, the cluster tells
        the leader itself what the learner's protocol would (``TransferDone``; ``Leave``
        for a push refused as not finite).
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
            down = [k for tr in action.transfers if (k := tr.follower) in self.down]
            if down:
                # The learner's transfers to a dead follower fail; it sends them again,
                # whole, once that follower's new process is up.
                k = down[0]
                resend = sum(
                    w.layer_bytes[tr.layer] / w.rate(j, k)
                    for tr in action.transfers
                    if tr.follower == k
                )
                again = self.down[k] + w.cfg.latency + resend
                self.clock.at(again, deliver, again)
                return
            payload = take_payload()
            if payload is None:
                return
            refused = None
            for f, part in zip(self.followers, w.split(payload), strict=True):
                try:
                    f.receive(action.round_id, j, part, incarnation)
                except PushRefused as e:
                    if e.kind not in ("replayed", "incarnation", "nonfinite"):
                        raise  # a shard that does not fit: a bug of the simulator
                    self.refused += 1
                    refused = "nonfinite" if refused == "nonfinite" else e.kind
            if delivered is not None:
                delivered(t_end, refused)
            elif refused == "nonfinite":
                self.feed(m.Leave(t_end, j))
            else:
                self.feed(m.TransferDone(t_end, j, action.round_id, incarnation))

        self.clock.at(free, deliver, free)

    def model(self, version: int | None = None) -> tuple[int, dict]:
        """A complete model of one version (default: the newest), as host arrays."""
        common = self.cached_versions()
        if not common:
            held = {f.follower_id: f.cached_versions() for f in self.followers}
            raise RuntimeError(f"no version is held by every follower: {held}")
        v = max(common) if version is None or version not in common else version
        shards = [f.pull(v)[1] for f in self.followers]
        return v, jax.device_get(outer.merge_trees(shards))

    def cached_versions(self) -> set[int]:
        return set.intersection(*(set(f.cached_versions()) for f in self.followers))
