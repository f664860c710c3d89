"""Chip-scale goodput model: checkpoint/restart and elastic data parallelism vs Decoupled DiLoCo.

Reproduces the goodput study of Decoupled DiLoCo (arXiv 2604.21428): with a per-chip mean
time between interruptions (MTBI) of one year, how much of a fleet's chip-time turns into
training progress at 150k-2.4M chips when the job is one data-parallel (DP) program, and
when it is ``M`` decoupled learners behind an asynchronous syncer? Two DP baselines:
*elastic DP* (the paper's: drop the failed slice and go on) and *checkpoint/restart DP* (no
elasticity: every interruption kills the job, which restarts from its last checkpoint).

Goodput is the share of chip-time producing training progress, after removing outage
(detection and recovery) time, checkpoint writes and work that is lost and redone. The
paper's anchors, which the defaults below reproduce (tests check them):

==============  ===========  ============
chips           method       goodput
==============  ===========  ============
1.2M            elastic DP   58 %
1.2M            M = 8        88 %
1.2M            M = 16       93 %
2.4M            elastic DP   about 40 %
150k-2.4M       M >= 8       ~zero global downtime
==============  ===========  ============

The paper gives no checkpoint/restart figure; that row is this module's own baseline.

Model
-----
*Interruptions.* Over the horizon (default 30 days) interruptions arrive as one Poisson
process of rate ``chips / MTBI`` over the whole fleet (so ``MTBF_cluster = MTBI / chips``:
26.3 s at 1.2M chips), each hitting a uniformly random chip. A *failure domain* is the set of
chips that stops when one of its chips is interrupted: the whole job for both DP variants,
the learner that owns the chip for Decoupled DiLoCo (``M`` learners of ``chips / M`` chips
each; splitting a Poisson process by a uniform chip gives ``M`` independent Poisson
processes).

*Recovery of a domain*, identical in shape for all methods, three phases:

1. ``absorb`` seconds in which the domain is stalled and *absorbs* further interruptions:
   the controller (or scheduler) plans the new mesh from the latest health map until it
   commits, so a chip lost in this window is dropped in the same reconfiguration and costs
   nothing extra. ``absorb = detect_s +`` ``dp_rescale_s`` (elastic DP: drop the failed
   slice, switch to a pre-compiled executable for the new mesh; survivors hold the state),
   ``learner_restart_s`` (rebuild one learner and load its weights from a snapshot, peer or
   the syncer over the data-centre network) or ``job_restart_s`` (checkpoint/restart:
   relaunch every process of the job on healthy chips, then form the mesh as DP does).
2. ``commit`` seconds in which the new mesh is fixed and the job resumes: ``dp_commit_s`` /
   ``learner_commit_s`` (barrier, first collective), and for checkpoint/restart
   ``checkpoint_restore_s + dp_commit_s`` (the new incarnation reads the checkpoint, then
   commits). An interruption here invalidates the committed mesh: recovery *restarts* at
   that instant with a fresh absorb phase, i.e. the stall is extended, not merely overlapped.
3. Training resumes from the last consistent state and runs in periods of ``work`` seconds
   of training followed by ``overhead`` seconds saving that state; an interruption of a
   *training* domain loses everything since the last completed period, counted as wasted
   chip-time. Elastic DP: ``work = dp_step_s``, ``overhead = 0`` (survivors hold the state
   of the last completed step); learner: ``work = learner_snapshot_s``, ``overhead = 0``
   (Chandy-Lamport snapshots bound lost progress and are taken off the critical path);
   checkpoint/restart: ``work = checkpoint_interval_s``, ``overhead = checkpoint_write_s``
   (a blocking write of the full training state).

A domain's chips are idle while it is stalled; the other learners keep training (the syncer
never stops and nobody waits for a stalled learner, so decoupled learners pay no
synchronisation wait). *Global downtime* is the time at which no domain is training (or
writing a checkpoint): for DP the job's downtime, for Decoupled DiLoCo the time all ``M``
learners are stalled at once (about ``horizon * p**M`` with ``p`` a learner's stalled
fraction: under a second a month for ``M >= 8`` up to 1.2M chips, about ten seconds at 2.4M).

*Checkpoint interval.* Unless ``checkpoint_interval_s`` is given, checkpoint/restart uses
the Young/Daly first-order optimum ``sqrt(2 * checkpoint_write_s * MTBF_cluster)`` (the job
is one failure domain, so its MTBF is the fleet's). In the closed form below it is within
0.3 points of the best interval at every default chip count (tests: within 0.5).

*Analytic form* (renewal-reward, exact in steady state for this model). For a domain with
interruption rate ``mu`` (its chips over MTBI), an up period ``U ~ Exp(mu)``, the expected
stall is ``S = absorb * exp(mu * commit) + expm1(mu * commit) / mu``; the up period holds
``floor(U / P)`` completed periods of ``P = work + overhead``, so the expected useful time is
``W = work * E[floor(U / P)] = work / expm1(mu * P)``. The domain's goodput is
``W / (1 / mu + S)`` and its stalled fraction ``S / (1 / mu + S)``. The fleet's goodput is
the chip-weighted mean over domains. With ``overhead = 0`` and ``work -> 0`` this is the
familiar ``MTBF / (MTBF + MTTR)``; without interruptions it is ``work / P``, i.e. 1 minus
the checkpoint overhead. The Monte-Carlo differs only through the finite horizon and its
start at a period boundary (tests: within 1 point at 30 days). At the horizon the work of
an unfinished period counts as progress (the horizon is a measurement window, not the end
of training).

Deliberately left out: interrupted chips are replaced by hot spares or repaired within the
same reconfiguration, so capacity stays ``chips`` and the scale-up after a repair costs no
extra stall (decoupled learners join stale without blocking anyone anyway); interruptions
are independent and memoryless (no correlated rack or power-domain outages); the syncer and
the checkpoint store are separate, replicated services that do not fail; per-step speed and
communication overlap are the same for all methods, so only interruptions separate them;
each phase takes its mean time (no jitter).

Assumptions and the constants derived from them
-----------------------------------------------
No recovery time is a bare number: :class:`RecoveryAssumptions` holds the stated
assumptions and derives the :class:`GoodputParams` times from them (``DEFAULT_ASSUMPTIONS``;
the CLI exposes every assumption and every derived time as a flag). The paper gives only
the per-chip MTBI, the outage model's outcome (the anchors above) and the mechanisms
(elastic rescale, Chandy-Lamport snapshots, stale joins); the recovery times are ours.

==========================  =========  ===================================================
assumption                  default    source
==========================  =========  ===================================================
mtbi_years                  1          paper: per-chip MTBI of one year (365.25 days)
heartbeat_interval_s        4 s        assumption: chip/host health beat (the syncer's
                                       learner heartbeat is a separate, slower 10 s)
missed_heartbeats           3          Di-PS / DESIGN sec. 5: evict after 3 silent beats
reconfigure_s               5 s        assumption: drop failed slice, re-form collectives,
                                       load an ahead-of-time compiled executable (no
                                       compile, no state transfer)
resume_commit_s             1 s        assumption: one barrier plus the first collective
step_s                      2 s        assumption: a training step at this scale
snapshot_every_steps        1          assumption: a learner snapshot per inner step
model_params                1.1e12     assumption: a ~1T-parameter model (the paper does
                                       not state the goodput study's model)
weight_bytes_per_param      2          bf16 weights, as shipped by the syncer (Di-PS);
                                       inner AdamW moments come from the learner's own
                                       snapshot, off the critical path
reload_gb_per_s             200 GB/s   assumption: data-centre ingress into one learner,
                                       bound by the source (snapshot store/peer/syncer)
checkpoint_bytes_per_param  12         fp32 master weights + fp32 AdamW m and v
checkpoint_gb_per_s         1000 GB/s  assumption: aggregate read/write bandwidth of the
                                       persistent checkpoint store (generous)
job_relaunch_s              60 s       assumption: kill and reschedule every process of
                                       the job, re-initialise the runtime (optimistic at
                                       10^5-10^6 chips)
==========================  =========  ===================================================

======================  ==============================================  ==============
derived time            formula                                         default
======================  ==============================================  ==============
detect_s                (missed_heartbeats - 1/2) * heartbeat_interval  10 s
                        (mean: the failure is uniform within a beat)
dp_rescale_s            reconfigure_s                                   5 s
dp/learner_commit_s     resume_commit_s                                 1 s
dp_step_s               step_s                                          2 s
learner_snapshot_s      snapshot_every_steps * step_s                   2 s
learner_restart_s       reconfigure_s + model_params *                  16 s
                        weight_bytes_per_param / reload bandwidth       (5 + 11)
checkpoint_write_s (C)  model_params * checkpoint_bytes_per_param /     13.2 s
                        checkpoint bandwidth
checkpoint_restore_s    the same bytes read back, same bandwidth        13.2 s
job_restart_s           job_relaunch_s + reconfigure_s                  65 s
checkpoint_interval_s   sqrt(2 * C * MTBF_cluster) (Young/Daly)         26.3 s at 1.2M
======================  ==============================================  ==============

With these, elastic DP loses ``~16 s`` of stall plus ``~1 s`` of redone work per ``26 s`` of
mean time between interruptions at 1.2M chips: 59 %, and 40 % at 2.4M. The 2.4M anchor is
what pins down the overlap rule: if every interruption during a stall extended it (a union
of per-interruption outages, goodput ``exp(-rate * outage)``), a model matching 58 % at 1.2M
would give 34 % at 2.4M; absorbing interruptions until the commit gives 40 %. A decoupled
learner loses ``~27 s + 1 s`` per interruption but ``M`` times less often: 88 % at ``M = 8``
and 94 % at ``M = 16`` at 1.2M chips, with no global downtime. Checkpoint/restart pays
``~75 s`` of restart plus a ``~14 s`` restore (which an interruption can restart) per
interruption and a 13 s write per checkpoint: 47 % at 150k chips, 4 % at 1.2M.

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
from typing import NamedTuple

import numpy as np

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_YEAR = 365.25 * SECONDS_PER_DAY
GB = 1e9  # bytes
METHODS = ("checkpoint_dp", "elastic_dp", "decoupled")
SINGLE_DOMAIN_METHODS = ("checkpoint_dp", "elastic_dp")
DEFAULT_CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
DEFAULT_METHODS = ("checkpoint_dp", "elastic_dp", "decoupled_m8", "decoupled_m16")
MAX_EXPECTED_INTERRUPTIONS = 20_000_000  # memory guard: ~0.5 GB of event arrays

_TIME_FIELDS = (
    "detect_s",
    "dp_rescale_s",
    "dp_commit_s",
    "dp_step_s",
    "learner_restart_s",
    "learner_commit_s",
    "learner_snapshot_s",
    "checkpoint_write_s",
    "checkpoint_restore_s",
    "job_restart_s",
)


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


# --------------------------------------------------------------------------- assumptions


def _assume(default: float, doc: str) -> float:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class RecoveryAssumptions:
    """Stated assumptions from which every recovery time of the model is derived.

    Each field's ``metadata["doc"]`` says where it comes from (a paper statement or an
    explicit assumption); the module docstring tabulates them. The properties are the
    derived times, named as the :class:`GoodputParams` fields they fill (:meth:`times`).
    """

    heartbeat_interval_s: float = _assume(
        4.0,
        "assumption: chip/host health heartbeat period (the syncer's learner heartbeat, "
        "10 s, is a separate and slower membership signal)",
    )
    missed_heartbeats: int = _assume(
        3, "Di-PS paper / DESIGN sec. 5: a member missing 3 heartbeat intervals is evicted"
    )
    reconfigure_s: float = _assume(
        5.0,
        "assumption: drop the failed slice, re-form the collectives and load an "
        "ahead-of-time compiled executable for the new mesh (no compile, no state transfer)",
    )
    resume_commit_s: float = _assume(
        1.0, "assumption: commit of a new mesh, one barrier plus the first collective"
    )
    step_s: float = _assume(2.0, "assumption: one training step at 10^5-10^6 chips")
    snapshot_every_steps: int = _assume(
        1, "assumption: a learner takes a Chandy-Lamport snapshot every inner step"
    )
    model_params: float = _assume(
        1.1e12, "assumption: a ~1T-parameter model (the paper does not state the size)"
    )
    weight_bytes_per_param: float = _assume(
        2.0,
        "bf16 weights, as the syncer ships them (Di-PS); a restarted learner's inner "
        "optimizer moments come from its own snapshot, off the critical path",
    )
    reload_gb_per_s: float = _assume(
        200.0,
        "assumption: data-centre ingress into one restarting learner, bound by the "
        "source (snapshot store, peer or syncer), GB/s",
    )
    checkpoint_bytes_per_param: float = _assume(
        12.0, "full training state: fp32 master weights + fp32 AdamW first and second moments"
    )
    checkpoint_gb_per_s: float = _assume(
        1000.0,
        "assumption: aggregate write and read bandwidth of the persistent checkpoint "
        "store, GB/s (generous)",
    )
    job_relaunch_s: float = _assume(
        60.0,
        "assumption: kill and reschedule every process of the job and re-initialise the "
        "runtime before the mesh is formed (optimistic at 10^5-10^6 chips)",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("missed_heartbeats", "snapshot_every_steps"):
                if not _is_int(value) or value < 1:
                    raise ValueError(
                        f"RecoveryAssumptions.{f.name} must be an integer >= 1, got {value!r}"
                    )
            elif f.name in ("reload_gb_per_s", "checkpoint_gb_per_s"):
                if not _is_real(value) or not (0 < value < math.inf):
                    raise ValueError(
                        f"RecoveryAssumptions.{f.name} must be a positive finite number, "
                        f"got {value!r}"
                    )
            elif not _is_real(value) or not (0 <= value < math.inf):
                raise ValueError(
                    f"RecoveryAssumptions.{f.name} must be a finite number >= 0, got {value!r}"
                )

    @property
    def detect_s(self) -> float:
        """Mean detection delay: ``(missed - 1/2)`` beats, the failure uniform in a beat."""
        return (self.missed_heartbeats - 0.5) * self.heartbeat_interval_s

    @property
    def learner_reload_s(self) -> float:
        """One learner pulls a full copy of the weights."""
        return self.model_params * self.weight_bytes_per_param / (self.reload_gb_per_s * GB)

    @property
    def checkpoint_bytes(self) -> float:
        return self.model_params * self.checkpoint_bytes_per_param

    @property
    def checkpoint_write_s(self) -> float:
        """``C``: a blocking write of the full training state to the checkpoint store."""
        return self.checkpoint_bytes / (self.checkpoint_gb_per_s * GB)

    @property
    def checkpoint_restore_s(self) -> float:
        """The same bytes read back at the same bandwidth."""
        return self.checkpoint_bytes / (self.checkpoint_gb_per_s * GB)

    def times(self) -> dict[str, float]:
        """The :class:`GoodputParams` recovery times these assumptions imply."""
        return {
            "detect_s": self.detect_s,
            "dp_rescale_s": float(self.reconfigure_s),
            "dp_commit_s": float(self.resume_commit_s),
            "dp_step_s": float(self.step_s),
            "learner_restart_s": self.reconfigure_s + self.learner_reload_s,
            "learner_commit_s": float(self.resume_commit_s),
            "learner_snapshot_s": self.snapshot_every_steps * self.step_s,
            "checkpoint_write_s": self.checkpoint_write_s,
            "checkpoint_restore_s": self.checkpoint_restore_s,
            "job_restart_s": self.job_relaunch_s + self.reconfigure_s,
        }


DEFAULT_ASSUMPTIONS = RecoveryAssumptions()
_DEFAULT_TIMES = DEFAULT_ASSUMPTIONS.times()


def young_daly_interval(write_s: float, mtbf_s: float) -> float:
    """Young/Daly first-order optimal work between checkpoints: ``sqrt(2 * C * MTBF)``."""
    return math.sqrt(2.0 * write_s * mtbf_s)


class Recovery(NamedTuple):
    """Recovery and progress-saving shape of one failure domain (see the module docstring)."""

    absorb_s: float  # stalled, further interruptions absorbed
    commit_s: float  # stalled, an interruption restarts recovery
    work_s: float  # training between saved states
    overhead_s: float  # saving a state (blocking); lost if interrupted


# --------------------------------------------------------------------------------- params


@dataclass(frozen=True)
class GoodputParams:
    """Parameters of one goodput run. All times are in seconds unless named otherwise.

    The recovery times default to those derived from :data:`DEFAULT_ASSUMPTIONS`
    (:meth:`RecoveryAssumptions.times`); :meth:`from_assumptions` derives them from other
    assumptions, and any of them may be set directly (sensitivity studies, tests).

    Attributes:
      chips: number of chips in the fleet (N).
      method: ``"checkpoint_dp"`` (one job that restarts from a checkpoint on every
        interruption), ``"elastic_dp"`` (one job that rescales) or ``"decoupled"``
        (``learners`` independent failure domains of about ``chips / learners`` chips).
      learners: M, the number of decoupled learners; must be 1 for the DP methods.
      mtbi_years: per-chip mean time between interruptions, in years of 365.25 days.
      detect_s: time from an interruption to its detection (all methods).
      dp_rescale_s: elastic DP reconfiguration after detection; interruptions during
        ``detect_s + dp_rescale_s`` are absorbed into the same reconfiguration.
      dp_commit_s: DP commit/resume window; an interruption in it restarts recovery.
      dp_step_s: elastic DP step time; the in-flight step is lost on an interruption.
      learner_restart_s: rebuild and state load of one decoupled learner after detection;
        interruptions of that learner during ``detect_s + learner_restart_s`` are absorbed.
      learner_commit_s: a learner's commit/resume window; an interruption restarts recovery.
      learner_snapshot_s: interval of a learner's snapshots; work since the last is lost.
      checkpoint_write_s: checkpoint/restart DP: ``C``, the blocking write of a checkpoint.
      checkpoint_restore_s: checkpoint/restart DP: reading the checkpoint back; part of
        the commit window (``checkpoint_restore_s + dp_commit_s``).
      job_restart_s: checkpoint/restart DP: relaunch of the whole job after detection;
        interruptions during ``detect_s + job_restart_s`` are absorbed.
      checkpoint_interval_s: checkpoint/restart DP: training time between checkpoints;
        ``None`` (default) uses Young/Daly ``sqrt(2 * C * MTBF_cluster)``.
      horizon_days: simulated time.
      seed: seed of the Monte-Carlo (same seed, same result).
    """

    chips: int = 1_200_000
    method: str = "elastic_dp"
    learners: int = 1
    mtbi_years: float = 1.0
    detect_s: float = _DEFAULT_TIMES["detect_s"]
    dp_rescale_s: float = _DEFAULT_TIMES["dp_rescale_s"]
    dp_commit_s: float = _DEFAULT_TIMES["dp_commit_s"]
    dp_step_s: float = _DEFAULT_TIMES["dp_step_s"]
    learner_restart_s: float = _DEFAULT_TIMES["learner_restart_s"]
    learner_commit_s: float = _DEFAULT_TIMES["learner_commit_s"]
    learner_snapshot_s: float = _DEFAULT_TIMES["learner_snapshot_s"]
    checkpoint_write_s: float = _DEFAULT_TIMES["checkpoint_write_s"]
    checkpoint_restore_s: float = _DEFAULT_TIMES["checkpoint_restore_s"]
    job_restart_s: float = _DEFAULT_TIMES["job_restart_s"]
    checkpoint_interval_s: float | None = None
    horizon_days: float = 30.0
    seed: int = 0

    @classmethod
    def from_assumptions(
        cls, assumptions: RecoveryAssumptions | None = None, **fields: object
    ) -> GoodputParams:
        """Params whose recovery times derive from ``assumptions``; ``fields`` override."""
        times = (assumptions or DEFAULT_ASSUMPTIONS).times()
        return cls(**{**times, **fields})  # type: ignore[arg-type]

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
        if self.method in SINGLE_DOMAIN_METHODS and self.learners != 1:
            raise bad("learners", f"must be 1 for method={self.method!r} (one failure domain)")
        if self.learners > self.chips:
            raise bad("learners", f"must not exceed chips={self.chips}")
        if not _is_real(self.mtbi_years) or not (0 < self.mtbi_years < math.inf):
            raise bad("mtbi_years", "must be a positive finite number")
        for name in _TIME_FIELDS:
            value = getattr(self, name)
            if not _is_real(value) or not (0 <= value < math.inf):
                raise bad(name, "must be a finite number of seconds >= 0")
        interval = self.checkpoint_interval_s
        if interval is not None and (not _is_real(interval) or not (0 < interval < math.inf)):
            raise bad("checkpoint_interval_s", "must be None or a positive finite number")
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
    def checkpoint_interval(self) -> float:
        """Training seconds between checkpoints: as given, else Young/Daly."""
        if self.checkpoint_interval_s is not None:
            return float(self.checkpoint_interval_s)
        return young_daly_interval(float(self.checkpoint_write_s), self.mtbf_cluster_s)

    @property
    def domains(self) -> int:
        return 1 if self.method in SINGLE_DOMAIN_METHODS else int(self.learners)

    def domain_sizes(self) -> np.ndarray:
        """Chips per failure domain (sizes differ by at most one)."""
        base, extra = divmod(int(self.chips), self.domains)
        sizes = np.full(self.domains, base, dtype=np.int64)
        sizes[:extra] += 1
        return sizes

    def recovery(self) -> Recovery:
        """``(absorb_s, commit_s, work_s, overhead_s)`` of one failure domain."""
        if self.method == "elastic_dp":
            return Recovery(
                self.detect_s + self.dp_rescale_s, float(self.dp_commit_s), self.dp_step_s, 0.0
            )
        if self.method == "checkpoint_dp":
            return Recovery(
                self.detect_s + self.job_restart_s,
                self.checkpoint_restore_s + self.dp_commit_s,
                self.checkpoint_interval,
                float(self.checkpoint_write_s),
            )
        return Recovery(
            self.detect_s + self.learner_restart_s,
            float(self.learner_commit_s),
            self.learner_snapshot_s,
            0.0,
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
      lost_work_s: chip-weighted mean time of work lost and redone (including a checkpoint
        write cut short by an interruption).
      global_downtime_s: time during which no domain was training.
      analytic_global_downtime_s: ``horizon * prod(stalled fraction)`` over domains.
      horizon_s: simulated seconds.
      checkpoint_s: chip-weighted mean time spent writing checkpoints that completed (0
        unless ``checkpoint_dp``).
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
    checkpoint_s: float = field(default=0.0)


# ----------------------------------------------------------------------------- analytic


def _domain_steady_state(rate: float, recovery: Recovery) -> tuple[float, float]:
    """(goodput fraction, stalled fraction) of one domain with interruption rate ``rate``."""
    absorb, commit, work, overhead = recovery
    period = work + overhead
    if rate <= 0:
        return (work / period if period > 0 else 1.0), 0.0
    if rate * commit > 700.0:  # exp would overflow: recovery practically never completes
        return 0.0, 1.0
    up = 1.0 / rate
    stall = absorb * math.exp(rate * commit) + math.expm1(rate * commit) / rate
    x = rate * period  # useful time per up period: work * E[floor(U / P)] = work / expm1(x)
    if x <= 0:
        useful = up
    elif x > 700.0:
        useful = 0.0
    else:
        useful = work / math.expm1(x)
    return useful / (up + stall), stall / (up + stall)


def analytic(params: GoodputParams) -> tuple[float, float]:
    """Closed form: ``(goodput percent, expected global downtime in seconds)``."""
    recovery = params.recovery()
    sizes = params.domain_sizes()
    good = np.empty(sizes.size)
    stalled = np.empty(sizes.size)
    for i, size in enumerate(sizes):  # at most two distinct sizes; M is small
        good[i], stalled[i] = _domain_steady_state(float(size) / params.mtbi_s, recovery)
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


def _saving(span: np.ndarray, work: float, overhead: float) -> tuple[np.ndarray, np.ndarray]:
    """``(lost, written)`` of training spans ending in an interruption.

    A span runs periods of ``work`` then ``overhead`` (a state save); everything after the
    last completed period is lost, and each completed period wrote for ``overhead``.
    """
    period = work + overhead
    if period <= 0:
        return np.zeros_like(span), np.zeros_like(span)
    if overhead <= 0:
        return np.mod(span, period), np.zeros_like(span)
    return np.mod(span, period), np.floor_divide(span, period) * overhead


def _tail_written(span: np.ndarray, work: float, overhead: float) -> np.ndarray:
    """Checkpoint-write time of spans cut by the horizon (their unfinished work counts)."""
    period = work + overhead
    if period <= 0 or overhead <= 0:
        return np.zeros_like(span)
    done = np.floor_divide(span, period)
    return done * overhead + np.maximum(span - done * period - work, 0.0)


def simulate_events(params: GoodputParams, times: np.ndarray, domain: np.ndarray) -> GoodputResult:
    """Account one interruption stream (as from :func:`draw_events`) under ``params``."""
    horizon = params.horizon_s
    absorb, commit, work, overhead = params.recovery()
    sizes = params.domain_sizes()
    m = sizes.size
    trig = _triggers(times, domain, absorb)
    t, d = times[trig], domain[trig]
    n = times.size

    # A recovery lasts absorb + commit unless the next trigger (an interruption in the
    # commit window) restarts it; the horizon truncates the last one.
    first = np.r_[True, d[1:] != d[:-1]][: t.size]  # the domain's first trigger
    last = np.r_[d[1:] != d[:-1], True][: t.size]  # the domain's last trigger
    next_t = np.r_[t[1:], np.inf][: t.size]
    next_t[last] = np.inf
    end = np.minimum(np.minimum(t + absorb + commit, next_t), horizon)
    down = end - t

    # Work is lost only when the interruption hits a training domain; it resumed at a period
    # boundary (step, snapshot or checkpoint), at time 0 or when its previous recovery ended.
    resume = np.where(first, 0.0, np.r_[0.0, t[:-1]][: t.size] + absorb + commit)
    running = first | (t >= resume)
    lost, written = _saving(np.where(running, t - resume, 0.0), work, overhead)

    # After the domain's last recovery (or from time 0) it trains until the horizon.
    tail_start = np.zeros(m)
    tail_start[d[last]] = t[last] + absorb + commit
    tail = _tail_written(np.maximum(horizon - tail_start, 0.0), work, overhead)

    down_d = np.bincount(d, weights=down, minlength=m)
    lost_d = np.bincount(d, weights=lost, minlength=m)
    written_d = np.bincount(d, weights=written, minlength=m) + tail
    productive = np.dot(sizes, horizon - down_d - lost_d - written_d)
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
        checkpoint_s=float(np.dot(sizes, written_d)) / params.chips,
    )


def goodput(params: GoodputParams | None = None, **overrides: object) -> GoodputResult:
    """Monte-Carlo goodput of ``params`` (fields may be overridden by keyword)."""
    params = dataclasses.replace(params or GoodputParams(), **overrides)
    times, domain = draw_events(params)
    return simulate_events(params, times, domain)


# ------------------------------------------------------------------------------ sweeps

_LABEL = re.compile(r"^decoupled_m(\d+)$")


def method_label(method: str, learners: int = 1) -> str:
    """``"checkpoint_dp"``, ``"elastic_dp"`` or ``"decoupled_m<M>"``."""
    return method if method in SINGLE_DOMAIN_METHODS else f"decoupled_m{learners}"


def parse_method(label: str) -> tuple[str, int]:
    """Inverse of :func:`method_label`: ``"decoupled_m8" -> ("decoupled", 8)``."""
    if label in SINGLE_DOMAIN_METHODS:
        return label, 1
    match = _LABEL.match(label)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(
            f"unknown method {label!r}: use 'checkpoint_dp', 'elastic_dp' or "
            "'decoupled_m<M>' with M >= 1"
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

    ``methods`` are labels (``"checkpoint_dp"``, ``"elastic_dp"``, ``"decoupled_m8"``, ...);
    ``overrides`` set other :class:`GoodputParams` fields (``mtbi_years``, ``seed``,
    recovery times, ...).
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    defaults = GoodputParams()
    parser = argparse.ArgumentParser(
        prog="dipsjax goodput",
        description="Goodput of checkpoint/restart and elastic data parallelism vs Decoupled "
        "DiLoCo with M learners under per-chip interruptions (Monte-Carlo and closed form).",
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
        help="decoupled learner counts M (both DP baselines are always included)",
    )
    parser.add_argument(
        "--mtbi-years",
        type=float,
        default=defaults.mtbi_years,
        help="per-chip mean time between interruptions, years",
    )
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
    assumed = parser.add_argument_group(
        "assumptions", "the recovery times below are derived from these (module docstring)"
    )
    for f in dataclasses.fields(RecoveryAssumptions):
        doc = f.metadata["doc"].replace("%", "%%")
        assumed.add_argument(
            _flag(f.name),
            type=int if f.type == "int" else float,
            default=f.default,
            help=f"{doc} (default: {f.default:g})",
        )
    derived = parser.add_argument_group(
        "derived recovery times", "set one to override its derivation from the assumptions"
    )
    for name in _TIME_FIELDS:
        derived.add_argument(
            _flag(name),
            type=float,
            default=None,
            help=f"seconds (default: derived, {_DEFAULT_TIMES[name]:g} with default assumptions)",
        )
    derived.add_argument(
        "--checkpoint-interval-s",
        type=float,
        default=None,
        help="training seconds between checkpoints (default: Young/Daly "
        "sqrt(2 * checkpoint_write_s * MTBF_cluster))",
    )
    return parser


def _table(
    results: Mapping[str, Mapping[int, GoodputResult]], chips: Sequence[int], use_analytic: bool
) -> str:
    labels = list(results)
    any_result = next(iter(results[labels[0]].values()))
    p = any_result.params
    source = "closed form" if use_analytic else "Monte-Carlo [closed form]"
    interval = (
        "Young/Daly sqrt(2 C MTBF_cluster)"
        if p.checkpoint_interval_s is None
        else f"{p.checkpoint_interval_s:g} s"
    )
    lines = [
        f"Goodput, % of chip-time making training progress ({source})",
        f"{p.horizon_days:g} simulated days, per-chip MTBI {p.mtbi_years:g} y, seed {p.seed}",
        f"recovery (s): detect {p.detect_s:g}; elastic DP rescale {p.dp_rescale_s:g} + commit "
        f"{p.dp_commit_s:g}, step {p.dp_step_s:g}; learner restart {p.learner_restart_s:g} + "
        f"commit {p.learner_commit_s:g}, snapshot {p.learner_snapshot_s:g}",
        f"checkpoint/restart DP (s): restart {p.job_restart_s:g} + restore "
        f"{p.checkpoint_restore_s:g} + commit {p.dp_commit_s:g}, write C = "
        f"{p.checkpoint_write_s:g} every {interval}",
        "",
        f"{'chips':>7}  {'MTBF_cluster':>12}  {'ckpt_every':>10}"
        + "".join(f"  {lab:>15}" for lab in labels),
    ]
    for n in chips:
        every = dataclasses.replace(p, chips=n).checkpoint_interval
        row = f"{format_count(n):>7}  {p.mtbi_s / n:>10.1f} s  {every:>8.1f} s"
        for lab in labels:
            r = results[lab][n]
            if use_analytic:
                cell = f"{r.analytic_percent:.1f}"
            else:
                cell = f"{r.percent:.1f} [{r.analytic_percent:.1f}]"
            row += f"  {cell:>15}"
        lines.append(row)
    lines += ["", "global downtime (DP job or all learners stalled), hours over the horizon:"]
    for n in chips:
        row = f"{format_count(n):>7}  {'':>12}  {'':>10}"
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
    chips = list(dict.fromkeys(args.chips))
    methods = [("checkpoint_dp", 1), ("elastic_dp", 1)] + [
        ("decoupled", m) for m in dict.fromkeys(args.learners)
    ]
    results: dict[str, dict[int, GoodputResult]] = {}
    try:
        assumptions = RecoveryAssumptions(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(RecoveryAssumptions)}
        )
        times = assumptions.times()
        times.update({k: getattr(args, k) for k in _TIME_FIELDS if getattr(args, k) is not None})
        common = dict(
            mtbi_years=args.mtbi_years,
            checkpoint_interval_s=args.checkpoint_interval_s,
            horizon_days=args.days,
            seed=args.seed,
            **times,
        )
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
