"""Chip-scale goodput model: elastic data parallelism versus Decoupled DiLoCo.

Reproduces the goodput study of Decoupled DiLoCo (arXiv 2604.21428): with a per-chip mean
time between interruptions (MTBI) of one year, how much of a fleet's chip-time turns into
training progress at 150k-2.4M chips when the job is one elastic data-parallel (DP) program,
and when it is ``M`` decoupled learners behind an asynchronous syncer?

Goodput is the share of chip-time producing training progress, after removing outage
(detection and recovery) time and work that is lost and redone. The paper's anchors, which
the defaults below reproduce (tests check them):

==============  ===========  ============
chips           method       goodput
==============  ===========  ============
1.2M            elastic DP   58 %
1.2M            M = 8        88 %
1.2M            M = 16       93 %
2.4M            elastic DP   about 40 %
150k-2.4M       M >= 8       ~zero global downtime
==============  ===========  ============

Model
-----
*Interruptions.* Over the horizon (default 30 days) interruptions arrive as one Poisson
process of rate ``chips / MTBI`` over the whole fleet (so ``MTBF_cluster = MTBI / chips``:
26.3 s at 1.2M chips), each hitting a uniformly random chip. A *failure domain* is the set of
chips that stops when one of its chips is interrupted: the whole job for elastic DP, the
learner that owns the chip for Decoupled DiLoCo (``M`` learners of ``chips / M`` chips each;
splitting a Poisson process by a uniform chip gives ``M`` independent Poisson processes).

*Recovery of a domain*, identical in shape for both methods, three phases:

1. ``absorb = detect_s + rescale`` seconds in which the domain is stalled and *absorbs*
   further interruptions: the controller plans the new mesh from the latest health map
   until it commits, so a chip lost in this window is dropped in the same reconfiguration
   and costs nothing extra. ``rescale`` is ``dp_rescale_s`` (drop the failed slice, switch
   to a pre-compiled executable for the new mesh, restore state from healthy replicas) or
   ``learner_restart_s`` (rebuild one learner and load its state from a snapshot, peer or
   the syncer over the data-centre network).
2. ``commit`` seconds (``dp_commit_s`` / ``learner_commit_s``) in which the new mesh is fixed
   and the job resumes (barrier, first collective). An interruption here invalidates the
   committed mesh: recovery *restarts* at that instant with a fresh absorb phase, i.e. the
   stall is extended, not merely overlapped.
3. Training resumes from the last consistent state. Work done since the last step boundary
   (``dp_step_s``: survivors hold the state of the last completed step) or the learner's last
   snapshot (``learner_snapshot_s``: Chandy-Lamport snapshots bound lost progress) is lost
   when an interruption hits a *training* domain; it is counted as wasted chip-time.

A domain's chips are idle while it is stalled; the other learners keep training (the syncer
never stops and nobody waits for a stalled learner, so decoupled learners pay no
synchronisation wait). *Global downtime* is the time at which no domain is training: for
elastic DP it is the job's downtime, for Decoupled DiLoCo the time all ``M`` learners are
stalled at once (about ``horizon * p**M`` with ``p`` a learner's stalled fraction: under a
second a month for ``M >= 8`` up to 1.2M chips, about ten seconds at 2.4M).

*Analytic form* (renewal-reward, exact in steady state for this model). For a domain with
interruption rate ``mu`` (its chips over MTBI), an up period ``U ~ Exp(mu)``, the expected
stall is ``S = absorb * exp(mu * commit) + expm1(mu * commit) / mu`` and the expected lost
work is ``L = E[U mod step] = step * (1 / x - 1 / expm1(x))`` with ``x = mu * step``. Its
goodput is ``(1 / mu - L) / (1 / mu + S)`` and its stalled fraction ``S / (1 / mu + S)``.
The fleet's goodput is the chip-weighted mean over domains. Without the commit and lost-work
terms this is the familiar ``MTBF / (MTBF + MTTR)``. The Monte-Carlo differs only through
the finite horizon and its start at a step boundary (tests: within 1 point at 30 days).

Assumptions (deliberately left out): interrupted chips are replaced by hot spares or repaired
within the same reconfiguration, so capacity stays ``chips`` and the scale-up after a repair
costs no extra stall (decoupled learners join stale without blocking anyone anyway);
interruptions are independent and memoryless (no correlated rack or power-domain outages);
the syncer is a separate, replicated service that does not fail; per-step speed and
communication overlap are the same for both methods, so only interruptions separate them.

Defaults and why
----------------
* ``mtbi_years = 1`` (the paper's per-chip MTBI; a year is 365.25 days).
* ``detect_s = 10``: heartbeat-based detection, a few missed beats at a couple of seconds
  each; the same monitoring serves both methods.
* ``dp_rescale_s = 5``: elastic DP drops the failed replica and switches to an ahead-of-time
  compiled executable for the smaller mesh; no state moves between data centres because the
  surviving replicas hold the weights and optimizer state.
* ``dp_commit_s = 1`` / ``learner_commit_s = 1``: one barrier plus the first collective.
* ``dp_step_s = 2``: a training step at this scale; the in-flight step (about 1 s on
  average) is redone.
* ``learner_restart_s = 16``: one learner is rebuilt as a unit (about 5 s, as for DP) and
  then loads a full model copy from a snapshot, peer or the syncer over the data-centre
  network (about 11 s, e.g. ~2 TB of bf16 weights at ~200 GB/s aggregate ingress): slower
  than DP's in-place rescale, but nobody else waits for it.
* ``learner_snapshot_s = 2``: a snapshot per inner step, so a learner loses about as much
  work as a DP step.

With these, elastic DP loses ``~16 s`` of stall plus ``~1 s`` of redone work per ``26 s`` of
mean time between interruptions at 1.2M chips: 59 %, and 40 % at 2.4M. The 2.4M anchor is
what pins down the overlap rule: if every interruption during a stall extended it (a union
of per-interruption outages, goodput ``exp(-rate * outage)``), a model matching 58 % at 1.2M
would give 34 % at 2.4M; absorbing interruptions until the commit gives 40 %. A decoupled
learner loses ``~27 s + 1 s`` per interruption but ``M`` times less often: 88 % at ``M = 8``
and 94 % at ``M = 16`` at 1.2M chips, with no global downtime.

The CLI (``dipsjax goodput``) prints a table of Monte-Carlo (and analytic) goodput per chip
count and method, or ``{method: {chips: percent}}`` as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_YEAR = 365.25 * SECONDS_PER_DAY
METHODS = ("elastic_dp", "decoupled")
DEFAULT_CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
DEFAULT_METHODS = ("elastic_dp", "decoupled_m8", "decoupled_m16")
MAX_EXPECTED_INTERRUPTIONS = 20_000_000  # memory guard: ~0.5 GB of event arrays

_TIME_FIELDS = (
    "detect_s",
    "dp_rescale_s",
    "dp_commit_s",
    "dp_step_s",
    "learner_restart_s",
    "learner_commit_s",
    "learner_snapshot_s",
)


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


@dataclass(frozen=True)
class GoodputParams:
    """Parameters of one goodput run. All times are in seconds unless named otherwise.

    Attributes:
      chips: number of chips in the fleet (N).
      method: ``"elastic_dp"`` (one job, one failure domain) or ``"decoupled"``
        (``learners`` independent failure domains of about ``chips / learners`` chips).
      learners: M, the number of decoupled learners; must be 1 for ``"elastic_dp"``.
      mtbi_years: per-chip mean time between interruptions, in years of 365.25 days.
      detect_s: time from an interruption to its detection (both methods).
      dp_rescale_s: elastic DP reconfiguration after detection; interruptions during
        ``detect_s + dp_rescale_s`` are absorbed into the same reconfiguration.
      dp_commit_s: elastic DP commit/resume window; an interruption in it restarts recovery.
      dp_step_s: elastic DP step time; the in-flight step is lost on an interruption.
      learner_restart_s: rebuild and state load of one decoupled learner after detection;
        interruptions of that learner during ``detect_s + learner_restart_s`` are absorbed.
      learner_commit_s: a learner's commit/resume window; an interruption restarts recovery.
      learner_snapshot_s: interval of a learner's snapshots; work since the last is lost.
      horizon_days: simulated time.
      seed: seed of the Monte-Carlo (same seed, same result).
    """

    chips: int = 1_200_000
    method: str = "elastic_dp"
    learners: int = 1
    mtbi_years: float = 1.0
    detect_s: float = 10.0
    dp_rescale_s: float = 5.0
    dp_commit_s: float = 1.0
    dp_step_s: float = 2.0
    learner_restart_s: float = 16.0
    learner_commit_s: float = 1.0
    learner_snapshot_s: float = 2.0
    horizon_days: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, requirement: str) -> ValueError:
            value = getattr(self, name)
            return ValueError(f"GoodputParams.{name} {requirement}, got {value!r}")

        if not _is_int(self.chips) or self.chips < 1:
            raise bad("chips", "must be a positive integer")
        if self.method not in METHODS:
            raise bad("method", f"must be one of {METHODS}")
        if not _is_int(self.learners) or self.learners < 1:
            raise bad("learners", "must be a positive integer")
        if self.method == "elastic_dp" and self.learners != 1:
            raise bad("learners", "must be 1 for method='elastic_dp' (one failure domain)")
        if self.learners > self.chips:
            raise bad("learners", f"must not exceed chips={self.chips}")
        if not _is_real(self.mtbi_years) or not (0 < self.mtbi_years < math.inf):
            raise bad("mtbi_years", "must be a positive finite number")
        for name in _TIME_FIELDS:
            value = getattr(self, name)
            if not _is_real(value) or not (0 <= value < math.inf):
                raise bad(name, "must be a finite number of seconds >= 0")
        if not _is_real(self.horizon_days) or not (0 < self.horizon_days < math.inf):
            raise bad("horizon_days", "must be a positive finite number")
        if not _is_int(self.seed) or self.seed < 0:
            raise bad("seed", "must be a non-negative integer")
        expected = self.chips * self.horizon_s / self.mtbi_s
        if expected > MAX_EXPECTED_INTERRUPTIONS:
            raise ValueError(
                f"GoodputParams.chips/horizon_days: {expected:.3g} expected interruptions "
                f"exceed the Monte-Carlo limit {MAX_EXPECTED_INTERRUPTIONS:.3g}; lower chips "
                "or horizon_days, or raise mtbi_years"
            )

    @property
    def mtbi_s(self) -> float:
        return float(self.mtbi_years) * SECONDS_PER_YEAR

    @property
    def horizon_s(self) -> float:
        return float(self.horizon_days) * SECONDS_PER_DAY

    @property
    def mtbf_cluster_s(self) -> float:
        """Fleet-wide mean time between interruptions, ``MTBI_chip / N_chip``."""
        return self.mtbi_s / self.chips

    @property
    def domains(self) -> int:
        return 1 if self.method == "elastic_dp" else int(self.learners)

    def domain_sizes(self) -> np.ndarray:
        """Chips per failure domain (sizes differ by at most one)."""
        base, extra = divmod(int(self.chips), self.domains)
        sizes = np.full(self.domains, base, dtype=np.int64)
        sizes[:extra] += 1
        return sizes

    def recovery(self) -> tuple[float, float, float]:
        """``(absorb_s, commit_s, lost_window_s)`` of one failure domain."""
        if self.method == "elastic_dp":
            return (self.detect_s + self.dp_rescale_s, float(self.dp_commit_s), self.dp_step_s)
        return (
            self.detect_s + self.learner_restart_s,
            float(self.learner_commit_s),
            self.learner_snapshot_s,
        )

    @property
    def label(self) -> str:
        return method_label(self.method, self.learners)


@dataclass(frozen=True)
class GoodputResult:
    """Outcome of one run; percentages are of total chip-time over the horizon.

    Attributes:
      params: the inputs.
      percent: Monte-Carlo goodput.
      analytic_percent: steady-state closed form of the same model.
      interruptions: interruptions drawn over the horizon (whole fleet).
      recoveries: recoveries started by an interruption of a training domain.
      restarts: recoveries restarted by an interruption in a commit window.
      absorbed: interruptions folded into an ongoing reconfiguration at no extra cost.
      downtime_s: chip-weighted mean time a domain was stalled.
      lost_work_s: chip-weighted mean time of work lost and redone.
      global_downtime_s: time during which no domain was training.
      analytic_global_downtime_s: ``horizon * prod(stalled fraction)`` over domains.
      horizon_s: simulated seconds.
    """

    params: GoodputParams
    percent: float
    analytic_percent: float
    interruptions: int
    recoveries: int
    restarts: int
    absorbed: int
    downtime_s: float
    lost_work_s: float
    global_downtime_s: float
    analytic_global_downtime_s: float
    horizon_s: float = field(default=0.0)


# ----------------------------------------------------------------------------- analytic


def _domain_steady_state(
    rate: float, absorb: float, commit: float, step: float
) -> tuple[float, float]:
    """(goodput fraction, stalled fraction) of one domain with interruption rate ``rate``."""
    if rate <= 0:
        return 1.0, 0.0
    if rate * commit > 700.0:  # exp would overflow: recovery practically never completes
        return 0.0, 1.0
    up = 1.0 / rate
    stall = absorb * math.exp(rate * commit) + math.expm1(rate * commit) / rate
    x = rate * step  # lost work E[U mod step] = step * (1/x - 1/expm1(x)), about step / 2
    if x <= 0:
        lost = 0.0
    elif x < 1e-6:
        lost = step * (0.5 - x / 12.0)
    else:
        lost = step * (1.0 / x - 1.0 / math.expm1(x))
    return (up - lost) / (up + stall), stall / (up + stall)


def analytic(params: GoodputParams) -> tuple[float, float]:
    """Closed form: ``(goodput percent, expected global downtime in seconds)``."""
    absorb, commit, step = params.recovery()
    sizes = params.domain_sizes()
    good = np.empty(sizes.size)
    stalled = np.empty(sizes.size)
    for i, size in enumerate(sizes):  # at most two distinct sizes; M is small
        good[i], stalled[i] = _domain_steady_state(
            float(size) / params.mtbi_s, absorb, commit, step
        )
    percent = 100.0 * float(np.dot(sizes, good)) / params.chips
    return percent, params.horizon_s * float(np.prod(stalled))


def analytic_goodput(params: GoodputParams) -> float:
    """Closed-form goodput in percent (see the module docstring)."""
    return analytic(params)[0]


# --------------------------------------------------------------------------- Monte-Carlo


def draw_events(params: GoodputParams) -> tuple[np.ndarray, np.ndarray]:
    """Interruptions over the horizon as ``(time_s, domain)``, sorted by domain then time.

    A Poisson process of rate ``chips / MTBI`` on ``[0, horizon)``: a Poisson count of
    uniform times, each hitting a uniformly random chip, mapped to the domain owning it.
    """
    rng = np.random.default_rng(params.seed)
    count = rng.poisson(params.chips * params.horizon_s / params.mtbi_s)
    times = rng.uniform(0.0, params.horizon_s, count)
    chips = rng.integers(0, params.chips, count)
    domain = np.searchsorted(np.cumsum(params.domain_sizes()), chips, side="right")
    order = np.lexsort((times, domain))
    return times[order], domain[order].astype(np.int64)


def _triggers(times: np.ndarray, domain: np.ndarray, absorb: float) -> np.ndarray:
    """Indices of interruptions that start or restart a recovery (the rest are absorbed).

    Interruption ``j`` of a domain is a trigger iff it is the domain's first or comes at
    least ``absorb`` seconds after the domain's previous trigger. ``nxt[j]`` (the first
    interruption at or after ``t[j] + absorb`` in the same domain) is computed for all ``j``
    at once; the triggers are the orbits of ``nxt`` from each domain's first interruption,
    enumerated by pointer doubling in O(n log n) vectorised work.
    """
    n = times.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    stride = float(times.max()) + absorb + 1.0
    key = domain * stride + times
    nxt = np.searchsorted(key, key + absorb, side="left")
    nxt = np.maximum(nxt, np.arange(1, n + 1))  # strictly forward, even when absorb == 0
    inside = nxt < n
    inside[inside] = domain[nxt[inside]] == domain[inside]
    nxt[~inside] = n  # no later interruption of the same domain
    jump = np.append(nxt, n)  # jump[j] = nxt^(2^k)[j]; n is the absorbing sentinel
    firsts = np.flatnonzero(np.r_[True, domain[1:] != domain[:-1]])
    found = firsts  # after k rounds: orbit positions [0, 2^k) of every domain
    while True:
        ext = jump[found]
        ext = ext[ext < n]
        if ext.size == 0:
            break
        found = np.concatenate([found, ext])
        jump = jump[jump]
    found.sort()
    return found


def _global_downtime(starts: np.ndarray, ends: np.ndarray, domains: int) -> float:
    """Total time covered by ``domains`` stall intervals at once (all domains stalled)."""
    if starts.size == 0:
        return 0.0
    if domains == 1:
        return float(np.sum(ends - starts))
    points = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(starts.size, np.int64), -np.ones(ends.size, np.int64)])
    order = np.lexsort((delta, points))  # ends before starts at equal times
    points, count = points[order], np.cumsum(delta[order])
    spans = np.diff(points)
    return float(np.sum(spans[count[:-1] >= domains]))


def simulate_events(params: GoodputParams, times: np.ndarray, domain: np.ndarray) -> GoodputResult:
    """Account one interruption stream (as from :func:`draw_events`) under ``params``."""
    horizon = params.horizon_s
    absorb, commit, step = params.recovery()
    sizes = params.domain_sizes()
    trig = _triggers(times, domain, absorb)
    t, d = times[trig], domain[trig]
    n = times.size

    # A recovery lasts absorb + commit unless the next trigger (an interruption in the
    # commit window) restarts it; the horizon truncates the last one.
    next_t = np.r_[t[1:], np.inf]
    next_t[np.r_[d[1:] != d[:-1], True]] = np.inf  # the domain's last trigger
    end = np.minimum(np.minimum(t + absorb + commit, next_t), horizon)
    down = end - t

    # Work is lost only when the interruption hits a training domain; it resumed at a step
    # (snapshot) boundary, at time 0 or when its previous recovery ended.
    first = np.r_[True, d[1:] != d[:-1]]
    resume = np.where(first, 0.0, np.r_[0.0, t[:-1]] + absorb + commit)
    running = first | (t >= resume)
    if step > 0:
        lost = np.where(running, np.mod(np.maximum(t - resume, 0.0), step), 0.0)
    else:
        lost = np.zeros_like(t)

    m = sizes.size
    down_d = np.bincount(d, weights=down, minlength=m)
    lost_d = np.bincount(d, weights=lost, minlength=m)
    productive = np.dot(sizes, horizon - down_d - lost_d)
    percent, analytic_downtime = analytic(params)
    return GoodputResult(
        params=params,
        percent=100.0 * float(productive) / (params.chips * horizon),
        analytic_percent=percent,
        interruptions=int(n),
        recoveries=int(np.count_nonzero(running)),
        restarts=int(np.count_nonzero(~running)),
        absorbed=int(n - trig.size),
        downtime_s=float(np.dot(sizes, down_d)) / params.chips,
        lost_work_s=float(np.dot(sizes, lost_d)) / params.chips,
        global_downtime_s=_global_downtime(t, end, m),
        analytic_global_downtime_s=analytic_downtime,
        horizon_s=horizon,
    )


def goodput(params: GoodputParams | None = None, **overrides: object) -> GoodputResult:
    """Monte-Carlo goodput of ``params`` (fields may be overridden by keyword)."""
    params = dataclasses.replace(params or GoodputParams(), **overrides)
    times, domain = draw_events(params)
    return simulate_events(params, times, domain)


# ------------------------------------------------------------------------------ sweeps

_LABEL = re.compile(r"^decoupled_m(\d+)$")


def method_label(method: str, learners: int = 1) -> str:
    """``"elastic_dp"`` or ``"decoupled_m<M>"``."""
    return "elastic_dp" if method == "elastic_dp" else f"decoupled_m{learners}"


def parse_method(label: str) -> tuple[str, int]:
    """Inverse of :func:`method_label`: ``"decoupled_m8" -> ("decoupled", 8)``."""
    if label == "elastic_dp":
        return "elastic_dp", 1
    match = _LABEL.match(label)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(
            f"unknown method {label!r}: use 'elastic_dp' or 'decoupled_m<M>' with M >= 1"
        )
    return "decoupled", int(match.group(1))


def sweep(
    chips_list: Iterable[int] = DEFAULT_CHIPS,
    methods: Sequence[str] = DEFAULT_METHODS,
    *,
    use_analytic: bool = False,
    **overrides: object,
) -> dict[str, dict[int, float]]:
    """Goodput percent as ``{method label: {chips: percent}}``.

    ``methods`` are labels (``"elastic_dp"``, ``"decoupled_m8"``, ...); ``overrides`` set
    other :class:`GoodputParams` fields (``mtbi_years``, ``seed``, recovery times, ...).
    ``use_analytic`` returns the closed form instead of the Monte-Carlo.
    """
    chips_list = list(chips_list)
    out: dict[str, dict[int, float]] = {}
    for label in methods:
        method, learners = parse_method(label)
        row: dict[int, float] = {}
        for chips in chips_list:
            params = GoodputParams(chips=chips, method=method, learners=learners, **overrides)
            row[int(chips)] = analytic_goodput(params) if use_analytic else goodput(params).percent
        out[label] = row
    return out


# --------------------------------------------------------------------------------- CLI


def parse_count(text: str) -> int:
    """``"150k" -> 150000``, ``"1.2M" -> 1200000``, ``"2_400_000" -> 2400000``."""
    raw = text.strip().replace("_", "").replace(",", "")
    scale = {"k": 1e3, "m": 1e6}.get(raw[-1:].lower(), 1.0)
    number = raw[:-1] if scale != 1.0 else raw
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a chip count: {text!r}") from None
    if not math.isfinite(value) or value != round(value) or value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole chip count: {text!r}")
    return round(value)


def format_count(chips: int) -> str:
    """``150000 -> "150k"``, ``1200000 -> "1.2M"``; other counts as plain integers."""
    for scale, suffix in ((1_000_000, "M"), (1_000, "k")):
        if chips >= scale and (chips * 10) % scale == 0:
            return f"{chips / scale:g}{suffix}"
    return str(chips)


def build_parser() -> argparse.ArgumentParser:
    defaults = GoodputParams()
    parser = argparse.ArgumentParser(
        prog="dipsjax goodput",
        description="Goodput of elastic data parallelism vs Decoupled DiLoCo with M learners "
        "under per-chip interruptions (Monte-Carlo and closed form).",
    )
    parser.add_argument(
        "--chips",
        type=parse_count,
        nargs="+",
        default=list(DEFAULT_CHIPS),
        help="fleet sizes, e.g. 150k 1.2M (default: 150k..2.4M)",
    )
    parser.add_argument(
        "--learners",
        type=int,
        nargs="+",
        default=[8, 16],
        help="decoupled learner counts M (elastic DP is always included)",
    )
    parser.add_argument(
        "--mtbi-years",
        type=float,
        default=defaults.mtbi_years,
        help="per-chip mean time between interruptions, years",
    )
    parser.add_argument("--detect-s", type=float, default=defaults.detect_s)
    parser.add_argument("--dp-rescale-s", type=float, default=defaults.dp_rescale_s)
    parser.add_argument("--dp-commit-s", type=float, default=defaults.dp_commit_s)
    parser.add_argument("--dp-step-s", type=float, default=defaults.dp_step_s)
    parser.add_argument("--learner-restart-s", type=float, default=defaults.learner_restart_s)
    parser.add_argument("--learner-commit-s", type=float, default=defaults.learner_commit_s)
    parser.add_argument("--learner-snapshot-s", type=float, default=defaults.learner_snapshot_s)
    parser.add_argument(
        "--days", type=float, default=defaults.horizon_days, help="simulated horizon, days"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--analytic", action="store_true", help="report the closed form instead of the Monte-Carlo"
    )
    parser.add_argument(
        "--json", action="store_true", help="print {method: {chips: percent}} as JSON"
    )
    return parser


def _table(
    results: Mapping[str, Mapping[int, GoodputResult]], chips: Sequence[int], use_analytic: bool
) -> str:
    labels = list(results)
    any_result = next(iter(results[labels[0]].values()))
    p = any_result.params
    source = "closed form" if use_analytic else "Monte-Carlo [closed form]"
    lines = [
        f"Goodput, % of chip-time making training progress ({source})",
        f"{p.horizon_days:g} simulated days, per-chip MTBI {p.mtbi_years:g} y, seed {p.seed}",
        "",
        f"{'chips':>7}  {'MTBF_cluster':>12}" + "".join(f"  {lab:>15}" for lab in labels),
    ]
    for n in chips:
        row = f"{format_count(n):>7}  {p.mtbi_s / n:>10.1f} s"
        for lab in labels:
            r = results[lab][n]
            if use_analytic:
                cell = f"{r.analytic_percent:.1f}"
            else:
                cell = f"{r.percent:.1f} [{r.analytic_percent:.1f}]"
            row += f"  {cell:>15}"
        lines.append(row)
    lines += ["", "global downtime (no learner training), hours over the horizon:"]
    for n in chips:
        row = f"{format_count(n):>7}  {'':>12}"
        for lab in labels:
            r = results[lab][n]
            hours = (r.analytic_global_downtime_s if use_analytic else r.global_downtime_s) / 3600
            row += f"  {hours:>15.2f}"
        lines.append(row)
    return "\n".join(lines)


def _analytic_result(params: GoodputParams) -> GoodputResult:
    """A result carrying only the closed form (Monte-Carlo fields mirror it, counts are 0)."""
    percent, downtime = analytic(params)
    return GoodputResult(
        params=params,
        percent=percent,
        analytic_percent=percent,
        interruptions=0,
        recoveries=0,
        restarts=0,
        absorbed=0,
        downtime_s=0.0,
        lost_work_s=0.0,
        global_downtime_s=downtime,
        analytic_global_downtime_s=downtime,
        horizon_s=params.horizon_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``dipsjax goodput``: print a goodput table, or JSON with ``--json``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    common = dict(
        mtbi_years=args.mtbi_years,
        detect_s=args.detect_s,
        dp_rescale_s=args.dp_rescale_s,
        dp_commit_s=args.dp_commit_s,
        dp_step_s=args.dp_step_s,
        learner_restart_s=args.learner_restart_s,
        learner_commit_s=args.learner_commit_s,
        learner_snapshot_s=args.learner_snapshot_s,
        horizon_days=args.days,
        seed=args.seed,
    )
    chips = list(dict.fromkeys(args.chips))
    methods = [("elastic_dp", 1)] + [("decoupled", m) for m in dict.fromkeys(args.learners)]
    results: dict[str, dict[int, GoodputResult]] = {}
    try:
        for method, learners in methods:
            row: dict[int, GoodputResult] = {}
            for n in chips:
                params = GoodputParams(chips=n, method=method, learners=learners, **common)
                if args.analytic:
                    row[n] = _analytic_result(params)
                else:
                    row[n] = goodput(params)
            results[method_label(method, learners)] = row
    except ValueError as err:
        parser.error(str(err))
    if args.json:
        payload = {
            lab: {str(n): round(r.percent, 3) for n, r in row.items()}
            for lab, row in results.items()
        }
        print(json.dumps(payload, indent=2))
    else:
        print(_table(results, chips, args.analytic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
