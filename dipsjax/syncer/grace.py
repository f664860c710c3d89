"""Grace policies: how long a round stays open for more learners after it could start.

A policy is a small sans-IO object. The leader reports what it observes (push arrivals, the
duration of each round's update + pull, quorum times) and asks for a window length in
seconds; it never reads a clock itself.

* :class:`NoGrace` -- update as soon as the round can start.
* :class:`FixedGrace` -- a constant window after the first push.
* :class:`DynamicGrace` -- Di-PS sec. 7: minimise ``C(tau) = tau + C_m exp(-lambda tau)``,
  ``tau* = (1/lambda) ln(C_m lambda)``, 0 when ``C_m lambda <= 1``; ``lambda`` (push arrival
  rate) and ``C_m`` (cost of missing the round: the update + pull that a late push must sit
  out) are estimated online with exponential moving averages.
* :class:`QuorumGrace` -- Decoupled DiLoCo: merge once ``K`` of ``M`` learners reported; after
  the quorum wait at most ``gamma * slack``, ``slack = tau * xi_step - (xi_quorum + xi_sync)``,
  the idle time the learners' own inner steps leave the syncer before the next sync is due.
  ``tau * xi_step`` is the training time the learners *report* with their pushes, never
  the gap between pushes (which, for learners that wait for their pull, already holds the
  previous window and would make the window feed on itself).

Every policy answers two questions: :meth:`quorum` (how many pushes the round needs before
its window starts) and :meth:`window` (the window length at that moment).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


class GracePolicy:
    """Base class: no quorum beyond one push, no window. Subclasses override.

    ``rearm``: every push that arrives before the update starts joins the round and re-arms
    the window (Di-PS sec. 6 pseudo-code: the wait restarts at ``tau_grace`` after each
    arrival). Decoupled DiLoCo's quorum policy waits at most its window after the quorum.
    """

    rearm: bool = True
    targeted: bool = False  # the leader asks the window again as the round goes on

    def quorum(self, members: int) -> int:
        """Pushes needed before the window starts (at least 1)."""
        del members
        return 1

    def window(self, now: float, absent: Sequence[int] = (), since: float | None = None) -> float:
        """Window length in seconds, asked when the round reaches its quorum (and, for a
        targeted window, again as the round goes on). ``absent``: the active learners not in
        the round; ``since``: when the round reached its quorum, for a window asked again."""
        del now, absent, since
        return 0.0

    def observe_push(self, learner: int, now: float, *, train_seconds: float = 0.0) -> None:
        """A push request arrived at ``now``; its round's inner steps took ``train_seconds``."""

    def observe_start(self, learner: int, now: float) -> None:
        """``learner`` finished its pull at ``now``: it trains its next round from there."""

    def observe_round(
        self, *, opened: float, quorum_at: float, closed: float, ended: float
    ) -> None:
        """A round finished: first push, quorum reached, window closed, pull done."""

    def forget_learner(self, learner: int) -> None:
        """A learner left (evicted, restarted, gone): drop what was learned about it."""

    def describe(self) -> dict:
        """JSON-able summary for the event tape."""
        return {"policy": type(self).__name__}

    def state_dict(self) -> dict:
        """Everything the policy knows, as JSON (for the leader's snapshot)."""
        fields = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            fields[f.name] = (
                [[k, v] for k, v in value.items()] if isinstance(value, dict) else value
            )
        return {"policy": type(self).__name__, "fields": fields}

    @staticmethod
    def from_state_dict(state: dict) -> GracePolicy:
        """Inverse of :meth:`state_dict`."""
        table = {c.__name__: c for c in (NoGrace, FixedGrace, DynamicGrace, QuorumGrace)}
        cls = table[state["policy"]]
        policy = cls()
        for f in dataclasses.fields(cls):
            if f.name not in state["fields"]:  # a snapshot from before the field: its default
                continue
            value = state["fields"][f.name]
            if isinstance(getattr(policy, f.name), dict):
                value = {k: v for k, v in value}
            object.__setattr__(policy, f.name, value)
        return policy


@dataclasses.dataclass
class NoGrace(GracePolicy):
    """Update as soon as the round can start (naive asynchronous DiLoCo)."""


@dataclasses.dataclass
class FixedGrace(GracePolicy):
    """A constant window of ``seconds`` after the first push."""

    seconds: float = 8.0

    def __post_init__(self) -> None:
        if self.seconds < 0:
            raise ValueError(f"FixedGrace.seconds must be >= 0, got {self.seconds}")

    def window(self, now: float, absent: Sequence[int] = (), since: float | None = None) -> float:
        del now, absent, since
        return self.seconds

    def describe(self) -> dict:
        return {"policy": "FixedGrace", "seconds": self.seconds}


def optimal_grace(rate: float, miss_cost: float) -> float:
    """Di-PS sec. 7: ``tau* = (1/lambda) ln(C_m lambda)``, or 0 when ``C_m lambda <= 1``.

    Minimises the expected cost ``tau + C_m exp(-lambda tau)`` of waiting ``tau`` for a
    push that arrives as a Poisson process of rate ``lambda``.
    """
    if rate <= 0 or miss_cost <= 0:
        return 0.0
    x = miss_cost * rate
    return math.log(x) / rate if x > 1.0 else 0.0


@dataclasses.dataclass
class DynamicGrace(GracePolicy):
    """Di-PS dynamic grace time with ``lambda`` and ``C_m`` estimated online.

    Attributes:
      smoothing: EMA weight of a new observation.
      max_window: upper bound on the window (seconds); the estimate is unreliable early.
      initial_rate, initial_miss_cost: priors used before anything was observed.
    """

    smoothing: float = 0.2
    max_window: float = 60.0
    initial_rate: float = 0.0
    initial_miss_cost: float = 0.0
    _last_push: float | None = dataclasses.field(default=None, repr=False)
    _interval: float | None = dataclasses.field(default=None, repr=False)
    _miss_cost: float | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"DynamicGrace.smoothing must be in (0, 1], got {self.smoothing}")
        if self.max_window < 0:
            raise ValueError(f"DynamicGrace.max_window must be >= 0, got {self.max_window}")

    @property
    def rate(self) -> float:
        """Estimated push arrival rate ``lambda`` (pushes per second, all learners)."""
        if self._interval is None or self._interval <= 0:
            return self.initial_rate
        return 1.0 / self._interval

    @property
    def miss_cost(self) -> float:
        """Estimated ``C_m``: seconds a push that misses the round waits (update + pull)."""
        return self.initial_miss_cost if self._miss_cost is None else self._miss_cost

    def observe_push(self, learner: int, now: float, *, train_seconds: float = 0.0) -> None:
        del learner, train_seconds
        if self._last_push is not None:
            gap = max(now - self._last_push, 0.0)
            a = self.smoothing
            self._interval = gap if self._interval is None else a * gap + (1 - a) * self._interval
        self._last_push = now

    def observe_round(
        self, *, opened: float, quorum_at: float, closed: float, ended: float
    ) -> None:
        del opened, quorum_at
        cost = max(ended - closed, 0.0)
        a = self.smoothing
        self._miss_cost = cost if self._miss_cost is None else a * cost + (1 - a) * self._miss_cost

    def window(self, now: float, absent: Sequence[int] = (), since: float | None = None) -> float:
        del now, absent, since
        return min(optimal_grace(self.rate, self.miss_cost), self.max_window)

    def describe(self) -> dict:
        return {
            "policy": "DynamicGrace",
            "rate": self.rate,
            "miss_cost": self.miss_cost,
            "window": self.window(0.0),
        }


@dataclasses.dataclass
class QuorumGrace(GracePolicy):
    """Decoupled DiLoCo: quorum ``K`` then a slack-bounded grace window.

    ``slack = tau * xi_step - (xi_quorum + xi_sync)`` and the window is ``gamma * slack``
    (``gamma < 1``; 0 if the slack is negative; ``grace=False`` disables it).

    * ``tau * xi_step``: the time one learner's round of inner steps takes, from the
      ``train_seconds`` learners report with their pushes (an EMA per learner). The next
      sync is due when the soonest learner finishes its next round, so the minimum over
      learners is used.
    * ``xi_quorum``, ``xi_sync``: EMAs of the last rounds' quorum wait (first push to
      quorum) and sync time (window closed to pull done).

    The push *interval* is not used: a learner that waits for its pull pushes every
    ``train + window + sync`` seconds, so an interval-based estimate contains the previous
    window and the window converges to about ``gamma / (1 - gamma)`` times the compute.

    A *targeted* window (``targeted=True``, off by default) is never longer than that bound,
    but waits only for the learners expected within it: each absent learner is expected at
    the end of its last pull plus its reported training time (learners that wait for their
    pull, the default), and the window ends ``margin`` times that training time after the
    last arrival expected inside the bound (or within that margin past it: such a learner
    may come early, and the whole window waits for it), or at once when no absent learner
    is; it is asked again as the round goes on (the bound counted from the quorum). The
    full window waits its whole length even when every absent learner is training and
    cannot arrive in it, while the learners in the round wait for their pull
    (``docs/benchmarks.md``: at eta 50 a quorum of 1 then finishes later than a quorum of
    all).

    Attributes:
      k: learners needed to merge (1..M; values above the current membership use M).
      gamma: fraction of the slack spent waiting (default 0.9).
      grace: whether to wait at all after the quorum.
      targeted: wait only for the learners expected within the window (above).
      margin: a targeted window's allowance past an expected arrival, as a fraction of
        that learner's training time.
    """

    rearm = False
    k: int = 1
    gamma: float = 0.9
    grace: bool = True
    targeted: bool = False
    margin: float = 0.1
    smoothing: float = 0.2
    _train: dict = dataclasses.field(default_factory=dict, repr=False)
    _started: dict = dataclasses.field(default_factory=dict, repr=False)
    _quorum_wait: float = dataclasses.field(default=0.0, repr=False)
    _sync: float = dataclasses.field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"QuorumGrace.k must be >= 1, got {self.k}")
        if not 0 <= self.gamma < 1:
            raise ValueError(f"QuorumGrace.gamma must be in [0, 1), got {self.gamma}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"QuorumGrace.smoothing must be in (0, 1], got {self.smoothing}")
        if not 0 <= self.margin <= 1:
            raise ValueError(f"QuorumGrace.margin must be in [0, 1], got {self.margin}")

    def quorum(self, members: int) -> int:
        return max(1, min(self.k, members))

    @property
    def round_compute(self) -> float | None:
        """``tau * xi_step``: the shortest learner round (seconds), or None before any report."""
        return min(self._train.values()) if self._train else None

    @property
    def slack(self) -> float:
        """``tau * xi_step - (xi_quorum + xi_sync)`` from the current estimates."""
        compute = self.round_compute
        if compute is None:
            return 0.0
        return compute - (self._quorum_wait + self._sync)

    def observe_push(self, learner: int, now: float, *, train_seconds: float = 0.0) -> None:
        del now
        if train_seconds <= 0:
            return
        key = str(learner)
        last = self._train.get(key)
        a = self.smoothing
        self._train[key] = train_seconds if last is None else a * train_seconds + (1 - a) * last

    def forget_learner(self, learner: int) -> None:
        self._train.pop(str(learner), None)
        self._started.pop(str(learner), None)

    def observe_start(self, learner: int, now: float) -> None:
        self._started[str(learner)] = now

    def observe_round(
        self, *, opened: float, quorum_at: float, closed: float, ended: float
    ) -> None:
        a = self.smoothing
        self._quorum_wait = a * max(quorum_at - opened, 0.0) + (1 - a) * self._quorum_wait
        self._sync = a * max(ended - closed, 0.0) + (1 - a) * self._sync

    def window(self, now: float, absent: Sequence[int] = (), since: float | None = None) -> float:
        if not self.grace:
            return 0.0
        bound = max(self.gamma * self.slack, 0.0)
        if not self.targeted:
            return bound
        if since is not None:  # asked again: what is left of the bound set at the quorum
            bound = max(bound - (now - since), 0.0)
        waits = []
        for j in absent:
            train, start = self._train.get(str(j)), self._started.get(str(j))
            if train is None or start is None:
                return bound  # nothing to expect it by: the whole window
            due = max(start + train - now, 0.0)
            if due <= bound + self.margin * train:  # one due just past it may come early
                waits.append(due + self.margin * train)
        return min(max(waits), bound) if waits else 0.0

    def describe(self) -> dict:
        bound = max(self.gamma * self.slack, 0.0) if self.grace else 0.0
        return {
            "policy": "QuorumGrace",
            "k": self.k,
            "slack": self.slack,
            "window": bound,
            "targeted": self.targeted,
        }


def make_grace(name: str, **kwargs: object) -> GracePolicy:
    """Builds a policy by name: ``none``, ``fixed``, ``dynamic``, ``quorum``."""
    table = {"none": NoGrace, "fixed": FixedGrace, "dynamic": DynamicGrace, "quorum": QuorumGrace}
    if name not in table:
        raise ValueError(f"grace policy must be one of {sorted(table)}, got {name!r}")
    return table[name](**kwargs)
