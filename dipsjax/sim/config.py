"""What a simulated experiment is (:class:`SimConfig`) and what it measured (:class:`SimResult`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dipsjax import rules
from dipsjax.syncer import methods as methods_lib

SYNCER_METHODS = methods_lib.METHODS
CLIPS = methods_lib.CLIPS
METHODS = ("dp", "sync_diloco", "naive_async", "dips", "decoupled", "async_diloco")
#: The methods adaptive steps (EXTENSION) is for: their merges weigh each push by its tokens.
ADAPTIVE_METHODS = ("dips", "decoupled")
WIRE_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5, "stat2": 0.28125}
#: Codecs only the simulator carries so far (the runtime's data plane does not).
SIM_ONLY_WIRES: tuple[str, ...] = ()  # wire codecs `dipsjax run` refuses (none now)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimConfig:
    """One simulated experiment (validated; errors name the field).

    Methods: ``dp`` (data parallel), ``sync_diloco``, ``naive_async`` (centralized: every push
    applied alone by the syncer), ``async_diloco`` (the Di-PS paper's decentralized baseline:
    every learner sends its pseudo-gradient to every other learner and applies the outer step
    itself), ``dips`` and ``decoupled``.

    Task: ``task`` names the function that builds what is trained (model, loss, data,
    evaluation, optimizers: :class:`dipsjax.task.Task`) by import path,
    ``"package.module:function"``, called as ``function(config, **task_args)``; empty: the
    built-in LLaMA language model (``model``, ``corpus``, ``seq_len``, ``chunk_len``; its
    ``task_args``: ``tokenizer`` and ``records``, see :func:`dipsjax.tasks.lm.get_task`).

    Inner optimizer (unless the task brings its own): AdamW at ``inner_lr`` with
    ``inner_schedule`` (``constant``, ``cosine`` or ``linear`` decay over
    ``inner_decay_steps``) after ``inner_warmup`` linear warmup steps, decoupled weight decay
    ``inner_weight_decay`` on matrices, global-norm clipping at ``inner_clip`` (``None``:
    off), moment decay rates ``inner_b1`` / ``inner_b2`` and epsilon ``inner_eps``. The
    schedule counts the learner's own inner steps across rounds (its AdamW state, and so
    its step count, is kept across pulls, as DiLoCo does).

    Outer optimizer: the method's chain ends in the papers' Nesterov SGD (``outer_lr``,
    ``outer_momentum``; ``None``, the default: the method's own,
    :data:`dipsjax.syncer.methods.OUTER_DEFAULTS`, chosen by the tuning ladder);
    ``outer_optimizer`` names a function ``(learning_rate, momentum)
    -> optax transform`` to use in its place (an extension; a task may carry one instead,
    :attr:`dipsjax.task.Task.outer_optimizer`: both set is an error). The global clip of
    the merged update: ``outer_clip`` ``""`` (the method's: Di-PS clips at 1, the others not),
    ``"none"``, ``"absolute"`` (at ``outer_clip_norm``) or ``"relative"`` (EXTENSION: at
    ``outer_clip_norm`` times the median norm of the last ``outer_clip_history`` merged
    updates). ``anomaly_penalty=False`` turns Di-PS's penalty off. ``outer_preset`` names a
    set of these values (:data:`OUTER_PRESETS`, e.g. ``"dips-paper"``: Di-PS sec. 13's 0.7
    / 0.8, clip 1, penalty on); the fields it sets must then be left at their defaults.

    Data: ``corpus`` is a built-in corpus name or the path of a folder of UTF-8 ``*.txt``
    files; ``validation_doc`` names the held-out document (its file stem for a folder).
    ``data_layout``: ``"contiguous"`` (default): a batch is consecutive sequences of one
    chunk; ``"spread"`` (EXTENSION) draws a batch's rows across the corpus (a fixed
    permutation seeded by ``seed``; every sequence still in exactly one chunk;
    :mod:`dipsjax.data.layout`).

    Validation: about ``eval_tokens`` target tokens (default 32768; 32K to 64K give a
    figure worth comparing, tests use fewer), windows of ``seq_len`` spread evenly over the
    held-out text, scored in batches of a fixed size: the same set for every method, batch
    size and number of learners, in the simulator and the runtime's evaluator.

    Anomaly penalty: ``alpha``, ``beta``, ``warmup``, ``min_max_score`` and
    ``min_sigma_ratio`` (:class:`dipsjax.rules.AnomalyConfig`); ``warmup=0,
    min_max_score=None, min_sigma_ratio=0`` is the paper's rule.

    Learners wait from their push until they pulled the version it went into (Di-PS sec. 5);
    ``overlap=True`` lets them keep training and adopt the newest version at their next round
    start (Decoupled DiLoCo's learners never wait; on the tiny settings one round of
    staleness costs more than the wait saves, so it is off by default). ``adopt`` says how
    such a learner takes a new version: ``replace`` its parameters (default), or ``delta``:
    keep them and add the global change since the version it started from.

    Follower checkpoints: ``checkpoint_every`` (default 1) says which versions a follower
    checkpoints (the multiples of it). A checkpoint is written after the step is reported
    and nobody waits for it; a restarted follower redoes the steps since its newest one
    from its journal (each decided round's inputs and each step's ``Apply``, on disk
    before they are reported), :meth:`dipsjax.syncer.follower.Follower.redo`.

    Data assignment: chunks are leased on demand (the first learner to ask gets the next
    chunk); ``deal_chunks=True`` deals them in turns, so learner ``j``'s ``i``-th chunk is
    fixed (DiLoCo's per-worker data shards): synchronous DiLoCo's rounds then do not depend
    on timing, and a run stopped and resumed ends where an uninterrupted one does.

    Extensions (not in the papers, off by default): ``grace_targeted`` (Decoupled DiLoCo's
    quorum window, still at most ``gamma * slack``, waits only for the learners expected
    within it, :class:`dipsjax.syncer.grace.QuorumGrace`); ``round_token_scale`` (scale a partial
    round by its share of a full round's tokens); ``adaptive_steps`` (the leader tells each
    learner how many inner steps fit, at its speed, between the end of its time before
    training and the moment every push is aimed at, when the slowest learner, told now,
    would push after ``inner_steps`` steps; at most ``adaptive_max * inner_steps``,
    :attr:`dipsjax.syncer.leader.LeaderConfig.adaptive_steps`; for ``dips`` and
    ``decoupled`` and learners that wait for their pull only); ``refuse_nonfinite`` (each
    follower refuses a push holding NaN or Inf when it arrives, before staging it; its
    learner leaves and comes back as a new incarnation. Off: the push is staged and the
    leader rejects it in the round by its non-finite squared norm, as the papers' rule
    does);
    ``error_feedback`` (each learner keeps the residual of what the lossy ``wire`` codec
    withheld, adds ``feedback_decay`` times it to its next push and settles it by each
    push's outcome, :mod:`dipsjax.outer._feedback`; in the simulator and, settled by the
    outcomes the leader's ``NotifyPull`` says, in ``dipsjax run``, where a restarted learner
    process starts from a zero residual: :mod:`dipsjax.runtime.learner`); ``wire="stat2"``
    (the statistical 2-bit codec, :mod:`dipsjax.outer._codecs`; norms and embeddings go as
    BF16); ``wire_topk`` (a fraction in (0, 1]: only each tensor's ``ceil(wire_topk * n)``
    largest-magnitude values are coded, the others zeroed before coding,
    :func:`dipsjax.outer.top_k`; with ``error_feedback`` the withheld values stay in the
    residual, without it they are lost, which is the control of the error-feedback
    ablation. The wire is priced as the dense codec: the positions' coding is not
    implemented).
    """

    method: str = "dips"
    task: str = ""
    task_args: tuple[tuple[str, Any], ...] = ()
    learners: int = 4
    followers: int = 2
    model: str = "tiny"
    corpus: str = "austen"
    validation_doc: str | None = None
    batch_size: int = 8
    seq_len: int = 64
    chunk_len: int = 4096
    inner_steps: int = 16
    inner_lr: float = 3e-3
    inner_schedule: str = "constant"
    inner_warmup: int = 0
    inner_decay_steps: int = 0
    inner_weight_decay: float = 0.0
    inner_clip: float | None = 1.0
    inner_b1: float = 0.9
    inner_b2: float = 0.95
    inner_eps: float = 1e-8
    outer_optimizer: str = ""
    outer_lr: float | None = None
    outer_momentum: float | None = None
    outer_preset: str = ""
    outer_clip: str = ""
    outer_clip_norm: float = 1.0
    outer_clip_history: int = 16
    anomaly_penalty: bool = True
    token_budget: int = 262_144
    eta: float = 0.0
    speeds: tuple[float, ...] = ()
    step_time: float = 1.0
    step_noise: float = 0.05
    virtual_params: float = 1e9
    wire: str = "bf16"
    bandwidth_gbps: tuple[float, ...] = ()
    follower_gbps: float = 25.0
    latency: float = 0.05
    update_seconds: float = 2.0
    grace: str = ""
    grace_seconds: float = 8.0
    quorum: int = 1
    grace_gamma: float = 0.9
    grace_targeted: bool = False
    rda: bool = True
    round_token_scale: bool = False
    adaptive_steps: bool = False
    adaptive_max: float = 2.0
    refuse_nonfinite: bool = False
    overlap: bool = False
    adopt: str = "replace"
    alpha: float = rules.AnomalyConfig.alpha
    beta: float = rules.AnomalyConfig.beta
    warmup: int = rules.AnomalyConfig.warmup
    min_max_score: float | None = rules.AnomalyConfig.min_max_score
    min_sigma_ratio: float = rules.AnomalyConfig.min_sigma_ratio
    max_staleness: int | None = None
    version_cache: int = 8
    checkpoint_every: int = 1
    deal_chunks: bool = False
    schedule: str = "greedy"
    failures: tuple[tuple[int, float, float], ...] = ()
    joins: tuple[tuple[int, float], ...] = ()
    leaves: tuple[tuple[int, float], ...] = ()
    heartbeat_interval: float = 10.0
    eval_every: int = 4
    eval_tokens: int = 32768
    data_layout: str = "contiguous"
    seed: int = 0
    error_feedback: bool = False
    feedback_decay: float = 1.0
    wire_topk: float | None = None

    def __post_init__(self) -> None:
        args = self.task_args
        if isinstance(args, dict):
            args = tuple(sorted(args.items()))
        try:
            args = tuple((str(k), _frozen(v)) for k, v in args)
        except (TypeError, ValueError) as e:
            raise ValueError(
                "SimConfig.task_args must be a dict of keyword arguments whose values are "
                f"numbers, strings, booleans, None or lists of them ({e}), got "
                f"{self.task_args!r}"
            ) from None
        object.__setattr__(self, "task_args", args)
        self._apply_preset()
        checks = [
            (self.method in METHODS, "method", f"one of {METHODS}"),
            (self.learners >= 1, "learners", ">= 1"),
            (self.followers >= 1, "followers", ">= 1"),
            (self.inner_steps >= 1, "inner_steps", ">= 1"),
            (self.token_budget > 0, "token_budget", "> 0"),
            (self.eta >= 0, "eta", ">= 0 (percent)"),
            (self.step_time > 0, "step_time", "> 0"),
            (0 <= self.step_noise < 1, "step_noise", "in [0, 1)"),
            (self.wire in WIRE_BYTES, "wire", f"one of {tuple(WIRE_BYTES)}"),
            (
                not self.speeds or len(self.speeds) == self.learners,
                "speeds",
                "empty or one step-time factor per learner",
            ),
            (all(x > 0 for x in self.speeds), "speeds", "all > 0"),
            (
                not self.bandwidth_gbps or len(self.bandwidth_gbps) == self.learners,
                "bandwidth_gbps",
                "empty or one value per learner",
            ),
            (all(b > 0 for b in self.bandwidth_gbps), "bandwidth_gbps", "all > 0"),
            (self.follower_gbps > 0, "follower_gbps", "> 0"),
            (
                self.grace in ("", "none", "fixed", "dynamic", "quorum"),
                "grace",
                "'', none, fixed, dynamic or quorum",
            ),
            (self.quorum >= 1, "quorum", ">= 1"),
            (self.version_cache >= 1, "version_cache", ">= 1"),
            (self.checkpoint_every >= 1, "checkpoint_every", ">= 1"),
            (self.schedule in ("greedy", "optimal"), "schedule", "greedy or optimal"),
            (self.adopt in ("replace", "delta"), "adopt", "replace or delta"),
            (self.eval_every >= 1, "eval_every", ">= 1"),
            (self.outer_clip in methods_lib.CLIPS, "outer_clip", f"one of {methods_lib.CLIPS}"),
            (self.outer_lr is None or self.outer_lr > 0, "outer_lr", "> 0 or None"),
            (
                self.outer_momentum is None or 0 <= self.outer_momentum < 1,
                "outer_momentum",
                "in [0, 1) or None",
            ),
            (self.outer_clip_norm > 0, "outer_clip_norm", "> 0"),
            (self.outer_clip_history >= 1, "outer_clip_history", ">= 1"),
            (self.eval_tokens >= 1, "eval_tokens", ">= 1 (32K to 64K measure; fewer for tests)"),
            (self.data_layout in ("spread", "contiguous"), "data_layout", "spread or contiguous"),
            (0 <= self.feedback_decay <= 1, "feedback_decay", "in [0, 1]"),
            (
                self.wire_topk is None or 0 < self.wire_topk <= 1,
                "wire_topk",
                "a fraction in (0, 1] or None",
            ),
            (
                self.wire_topk is None or self.method not in ("dp", "async_diloco"),
                "wire_topk",
                "None with method dp or async_diloco (they do not carry it)",
            ),
            (
                not self.error_feedback or self.method not in ("dp", "async_diloco"),
                "error_feedback",
                "False with method dp or async_diloco (they do not carry it)",
            ),
            (not self.task or ":" in self.task, "task", "'package.module:function' or empty"),
            (
                not self.outer_optimizer or ":" in self.outer_optimizer,
                "outer_optimizer",
                "'package.module:function' or empty",
            ),
        ]
        for ok, name, allowed in checks:
            if not ok:
                raise ValueError(f"SimConfig.{name} must be {allowed}, got {getattr(self, name)!r}")
        for name in ("joins", "leaves"):
            for e in getattr(self, name):
                if len(e) != 2 or not 0 <= e[0] < self.learners or e[1] < 0:
                    raise ValueError(
                        f"SimConfig.{name} entries are (learner, t >= 0) with "
                        f"0 <= learner < {self.learners}, got {e!r}"
                    )
        for f in self.failures:
            if len(f) != 3 or not 0 <= f[0] < self.learners or not f[1] < f[2]:
                raise ValueError(
                    f"SimConfig.failures entries are (learner, t_fail, t_back) with "
                    f"0 <= learner < {self.learners} and t_fail < t_back, got {f!r}"
                )
        self.anomaly()  # validates alpha, beta, warmup and the floors
        self.inner_optimizer()  # validates the inner_* fields
        if self.grace_targeted and self.overlap:
            raise ValueError(
                "SimConfig.grace_targeted expects each learner at its pull plus its training "
                "time, which holds only for learners that wait for their pull: it cannot be "
                "combined with overlap=True"
            )
        if self.adaptive_steps and self.overlap:
            raise ValueError(
                "SimConfig.adaptive_steps aims each learner's next round at a moment from its "
                "pull notice, which starts that round only for learners that wait for their "
                "pull: it cannot be combined with overlap=True"
            )
        if not (math.isfinite(self.adaptive_max) and self.adaptive_max >= 1):
            raise ValueError(
                f"SimConfig.adaptive_max must be >= 1 and finite, got {self.adaptive_max!r}"
            )
        if self.adaptive_steps and self.method not in ADAPTIVE_METHODS:
            raise ValueError(
                f"SimConfig.adaptive_steps needs a method that weighs each push by its tokens "
                f"({' or '.join(ADAPTIVE_METHODS)}), got method={self.method!r}: under "
                "uniform weighting a round of 2H steps would count as one of H"
            )

    def _apply_preset(self) -> None:
        if not self.outer_preset:
            return
        if self.outer_preset not in OUTER_PRESETS:
            raise ValueError(
                f"SimConfig.outer_preset must be '' or one of {tuple(OUTER_PRESETS)}, got "
                f"{self.outer_preset!r}"
            )
        defaults = {f.name: f.default for f in dataclasses.fields(SimConfig)}
        for name, value in OUTER_PRESETS[self.outer_preset].items():
            given = getattr(self, name)
            if given != defaults[name] and given != value:
                raise ValueError(
                    f"SimConfig.outer_preset {self.outer_preset!r} sets {name}={value!r}; "
                    f"leave {name} unset (got {given!r}) or drop the preset"
                )
            object.__setattr__(self, name, value)

    def inner_optimizer(self) -> Any:
        """The learners' inner AdamW settings from the ``inner_*`` fields."""
        from dipsjax.inner import InnerOptimizerConfig

        try:
            return InnerOptimizerConfig(
                learning_rate=self.inner_lr,
                schedule=self.inner_schedule,
                warmup_steps=self.inner_warmup,
                decay_steps=self.inner_decay_steps,
                weight_decay=self.inner_weight_decay,
                clip_norm=self.inner_clip,
                b1=self.inner_b1,
                b2=self.inner_b2,
                eps=self.inner_eps,
            )
        except ValueError as e:
            raise ValueError(f"SimConfig inner optimizer: {e}") from None

    def bandwidth(self, j: int) -> float:
        return self.bandwidth_gbps[j] if self.bandwidth_gbps else 10.0

    @property
    def batches_per_chunk(self) -> int:
        """Batches of one chunk (``chunk_len / (batch_size * seq_len)``): the ledger's unit."""
        return self.chunk_len // (self.batch_size * self.seq_len)

    @property
    def full_round_tokens(self) -> int:
        """Tokens of a round in which every learner reports ``inner_steps`` steps."""
        return self.learners * self.inner_steps * self.batch_size * self.seq_len

    def anomaly(self) -> rules.AnomalyConfig:
        return rules.AnomalyConfig(
            alpha=self.alpha,
            beta=self.beta,
            warmup=self.warmup,
            min_max_score=self.min_max_score,
            min_sigma_ratio=self.min_sigma_ratio,
        )

    def follower_options(self) -> dict[str, Any]:
        """The keyword arguments every :class:`~dipsjax.syncer.follower.Follower` of this
        experiment is built with, in the simulator and in the runtime alike."""
        return {
            "capacity": self.learners,
            "learners": self.learners,  # learner ids are 0..learners-1
            "version_cache": self.version_cache,
            "refuse_nonfinite": self.refuse_nonfinite,
            "checkpoint_every": self.checkpoint_every,
        }

    def outer(self) -> tuple[float, float]:
        """The outer Nesterov ``(learning rate, momentum)`` this experiment runs: the config's
        own, else its method's default (the decentralized baseline ``async_diloco`` takes
        ``naive_async``'s; ``dp`` has no outer step and reports ``sync_diloco``'s)."""
        name = {"async_diloco": "naive_async", "dp": "sync_diloco"}.get(self.method, self.method)
        return methods_lib.MethodSettings(
            outer_lr=self.outer_lr, outer_momentum=self.outer_momentum
        ).outer(name)

    def method_settings(
        self, layer_owner: tuple[int, ...] = (), num_followers: int = 1
    ) -> methods_lib.MethodSettings:
        return methods_lib.MethodSettings(
            learners=self.learners,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
            anomaly=self.anomaly(),
            grace=self.grace,
            grace_seconds=self.grace_seconds,
            quorum=self.quorum,
            grace_gamma=self.grace_gamma,
            grace_targeted=self.grace_targeted,
            rda=self.rda,
            round_token_scale=self.round_token_scale,
            adaptive_steps=self.adaptive_steps,
            adaptive_max=self.adaptive_max,
            inner_steps=self.inner_steps,
            full_round_tokens=self.full_round_tokens,
            max_staleness=self.max_staleness,
            version_cache=self.version_cache,
            deal_chunks=self.learners if self.deal_chunks else 0,
            outer_optimizer=self.outer_optimizer,
            clip=self.outer_clip,
            clip_norm=self.outer_clip_norm,
            clip_history=self.outer_clip_history,
            penalty=self.anomaly_penalty,
            heartbeat_interval=self.heartbeat_interval,
            token_budget=self.token_budget,
            num_followers=num_followers,
            layer_owner=layer_owner,
        )


OUTER_PRESETS: dict[str, dict[str, Any]] = {
    # Di-PS sec. 13 (seed 000): Nesterov 0.7 / 0.8, global clip at 1, anomaly penalty.
    "dips-paper": {
        "outer_lr": 0.7,
        "outer_momentum": 0.8,
        "outer_clip": "",
        "outer_clip_norm": 1.0,
        "anomaly_penalty": True,
    },
    # Outer SGD at lr 1 without momentum or clip: the new version is the learners' merged
    # parameters (FedAvg / DiLoCo's "outer lr 1" control).
    "average": {
        "outer_lr": 1.0,
        "outer_momentum": 0.0,
        "outer_clip": "none",
        "anomaly_penalty": False,
    },
}
"""Named sets of outer-optimizer settings (``SimConfig.outer_preset``)."""


def _frozen(value: Any) -> Any:
    """A task argument as a hashable value: a number, string, bool or None, or a list of
    them (given as a tuple). A dict value is refused: the config keeps the arguments
    hashable and JSON-exact, and a dict would come back as pairs."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if value is not None and not isinstance(value, bool | int | float | str):
        raise ValueError(f"task argument of type {type(value).__name__}")
    return value


@dataclasses.dataclass
class TokenCount:
    """Tokens counted on each side, independently.

    Learner side: ``consumed`` (every batch drawn), ``unpushed`` (rounds still training or
    trained but not pushed at the end), ``lost`` (rounds a crash destroyed before their push).
    Leader side, from its events: ``reported``, ``applied``, ``rejected``, ``dropped`` and
    ``outstanding`` (tokens of its pending pushes).
    """

    consumed: int = 0
    unpushed: int = 0
    lost: int = 0
    reported: int = 0
    applied: int = 0
    rejected: int = 0
    dropped: int = 0
    outstanding: int = 0

    def imbalance(self) -> int:
        """``consumed - (applied + rejected + dropped + outstanding + unpushed + lost)``: 0
        when nothing disappeared and nothing was counted twice."""
        return self.consumed - (
            self.applied
            + self.rejected
            + self.dropped
            + self.outstanding
            + self.unpushed
            + self.lost
        )


@dataclasses.dataclass
class SimResult:
    """What one experiment measured (all times virtual seconds)."""

    config: SimConfig
    virtual_time: float
    tokens: TokenCount
    rounds: int
    comm_time: float
    phases: dict[str, float]
    curve: list[dict[str, float]]
    final_loss: float
    final_bpb: float
    tape: Any = None
    params: Any = None
    ideal_tokens_per_second: float = 0.0  # every learner training alone, no outer sync
    chunk_ledger: Any = None  # the data ledger's final state
    tokens_in_training_done: float = 0.0  # of the unpushed tokens, the share trained by the end

    @property
    def tokens_consumed(self) -> int:
        return self.tokens.consumed

    @property
    def tokens_applied(self) -> int:
        return self.tokens.applied

    @property
    def tokens_rejected(self) -> int:
        return self.tokens.rejected

    @property
    def tokens_dropped(self) -> int:
        """Dropped at the leader plus lost in crashes before a push."""
        return self.tokens.dropped + self.tokens.lost

    @property
    def tokens_trained(self) -> float:
        """Tokens trained within the run: rounds still in progress at the end count pro rata
        of their elapsed virtual time (their tokens were drawn when they started)."""
        return self.tokens.consumed - self.tokens.unpushed + self.tokens_in_training_done

    @property
    def tokens_per_second(self) -> float:
        """Aggregate training throughput: :attr:`tokens_trained` per virtual second."""
        return self.tokens_trained / self.virtual_time if self.virtual_time > 0 else 0.0

    @property
    def rejected_fraction(self) -> float:
        """Share of the decided tokens that the anomaly penalty (or NaN check) rejected."""
        decided = self.tokens.applied + self.tokens.rejected
        return self.tokens.rejected / decided if decided else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.config.method,
            "virtual_time": self.virtual_time,
            "tokens_per_second": self.tokens_per_second,
            "tokens_consumed": self.tokens.consumed,
            "effective_tokens": self.tokens.applied,
            "rejected_fraction": self.rejected_fraction,
            "dropped_tokens": self.tokens_dropped,
            "token_count": dataclasses.asdict(self.tokens),
            "rounds": self.rounds,
            "outer_comm_time": self.comm_time,
            "phases": self.phases,
            "final_val_loss": self.final_loss,
            "final_val_bpb": self.final_bpb,
            # The task's own figures (its eval_metrics: final_val_accuracy, ...).
            **{
                f"final_{k}": v
                for k, v in (self.curve[-1] if self.curve else {}).items()
                if k.startswith("val_") and k not in ("val_loss", "val_bpb")
            },
            "ideal_tokens_per_second": self.ideal_tokens_per_second,
            "scaling_efficiency": self.tokens_per_second / self.ideal_tokens_per_second
            if self.ideal_tokens_per_second
            else 0.0,
        }
