"""The method registry: how each syncer method is set up, shared by simulator and runtime.

A method is four things that must agree: the leader's policy (:class:`LeaderConfig`: weights,
penalty, clipping, reference, participants), its grace policy, the outer chain the
followers run, and the pseudo-gradient reference. :func:`build` makes all four from one
:class:`MethodSettings`, so the anomaly and weighting settings live in one place and the
simulator and the runtime cannot drift apart.

=================  =========  ===========  =======  =====  ========================
method             reference  weighting    penalty  clip   grace
=================  =========  ===========  =======  =====  ========================
``dips``           server     tokens       yes      1.0    Di-PS dynamic
``decoupled``      start      decoupled    no       no     quorum K + gamma * slack
``naive_async``    start      uniform      no       no     none, one push per round
``sync_diloco``    start      uniform      no       no     quorum of all M, no grace
=================  =========  ===========  =======  =====  ========================

The outer chain is built lazily (:meth:`Method.make_tx`) so that a leader process never
imports JAX.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from dipsjax import rules
from dipsjax.syncer import grace as grace_lib
from dipsjax.syncer.leader import LeaderConfig

METHODS = ("dips", "decoupled", "naive_async", "sync_diloco")
#: Each method's default outer Nesterov ``(learning rate, momentum)``, chosen by the tuning
#: ladder (``benchmarks/ladder.py``, docs/benchmarks.md "Tuning ladder"); a config's
#: ``outer_lr`` / ``outer_momentum`` override them, and ``outer_preset="dips-paper"`` gives
#: the Di-PS paper's 0.7 / 0.8 whatever the method.
OUTER_DEFAULTS: dict[str, tuple[float, float]] = {
    "dips": (0.7, 0.8),
    "decoupled": (0.4, 0.7),
    "naive_async": (0.7, 0.8),
    "sync_diloco": (0.4, 0.7),
}
CLIPS = ("", "none", "absolute", "relative")


@dataclasses.dataclass(frozen=True)
class MethodSettings:
    """Knobs of the outer optimization common to every method (validated by the parts).

    Attributes:
      learners: ``M``, the number of learners (the synchronous quorum).
      outer_lr, outer_momentum: the outer Nesterov step (``None``: the method's default,
        :data:`OUTER_DEFAULTS`).
      anomaly: the Di-PS penalty's settings.
      grace: grace policy name overriding the method's default (``''``: the default).
      grace_seconds: window of the ``fixed`` policy.
      quorum, grace_gamma: Decoupled DiLoCo's ``K`` and ``gamma``.
      grace_targeted: the quorum window waits only for the learners expected within it
        (:class:`dipsjax.syncer.grace.QuorumGrace`; off by default).
      rda: Decoupled DiLoCo merges with RDA (else the weighted mean).
      round_token_scale: EXTENSION (not in the papers, off by default): scale a round that
        merges fewer than all learners by its share of a full round's tokens
        (``full_round_tokens``); see :func:`dipsjax.outer.round_token_scale`.
      full_round_tokens: tokens of a round in which every learner reports.
      adaptive_steps, adaptive_max, inner_steps: EXTENSION (off by default): the leader
        tells each learner how many inner steps its rounds train, up to ``adaptive_max x
        inner_steps`` (see :class:`LeaderConfig`).
      max_staleness: drop contributions older than this many versions.
      version_cache: versions a follower keeps for the server reference.
      heartbeat_interval: learners' heartbeat interval (eviction after 3 missed).
      token_budget: stop after this many tokens.
      num_followers, layer_owner: the shards (see :class:`LeaderConfig`).
      deal_chunks: deal chunks in turns to this many learners (see :class:`LeaderConfig`).
      clip: the global clip of the merged update: ``""`` the method's (the table above),
        ``"none"``, ``"absolute"`` (at ``clip_norm``, as Di-PS) or ``"relative"``
        (EXTENSION: at ``clip_norm`` times the median norm of the last ``clip_history``
        merged updates; see :class:`LeaderConfig`).
      clip_norm, clip_history: the clip's threshold (or multiple) and window.
      penalty: Di-PS runs its anomaly penalty (False: every finite push is accepted; the
        other methods never run it).
      outer_optimizer: EXTENSION: ``"package.module:function"``, a function
        ``(learning_rate, momentum) -> optax transform`` whose transform takes the place of
        the chain's Nesterov step (``''``: Nesterov, as the papers).
    """

    learners: int = 4
    outer_lr: float | None = None
    outer_momentum: float | None = None
    anomaly: rules.AnomalyConfig = dataclasses.field(default_factory=rules.AnomalyConfig)
    grace: str = ""
    grace_seconds: float = 8.0
    quorum: int = 1
    grace_gamma: float = 0.9
    grace_targeted: bool = False
    rda: bool = True
    round_token_scale: bool = False
    full_round_tokens: float | None = None
    adaptive_steps: bool = False
    adaptive_max: float = 2.0
    inner_steps: int | None = None
    max_staleness: int | None = None
    version_cache: int = 8
    heartbeat_interval: float = 10.0
    token_budget: int | None = None
    num_followers: int = 1
    layer_owner: tuple[int, ...] = ()
    deal_chunks: int = 0
    outer_optimizer: str = ""
    clip: str = ""
    clip_norm: float = 1.0
    clip_history: int = 16
    penalty: bool = True

    def outer(self, method: str) -> tuple[float, float]:
        """The outer ``(learning rate, momentum)`` for ``method``: the settings' own, else the
        method's default (:data:`OUTER_DEFAULTS`)."""
        lr, mom = OUTER_DEFAULTS[method]
        return (
            lr if self.outer_lr is None else self.outer_lr,
            mom if self.outer_momentum is None else self.outer_momentum,
        )

    def __post_init__(self) -> None:
        if self.learners < 1:
            raise ValueError(f"MethodSettings.learners must be >= 1, got {self.learners}")
        if self.clip not in CLIPS:
            raise ValueError(f"MethodSettings.clip must be one of {CLIPS}, got {self.clip!r}")
        if not self.clip_norm > 0:
            raise ValueError(f"MethodSettings.clip_norm must be > 0, got {self.clip_norm!r}")
        if self.round_token_scale and not (self.full_round_tokens or 0) > 0:
            raise ValueError(
                "MethodSettings.full_round_tokens must be > 0 when round_token_scale is on, "
                f"got {self.full_round_tokens!r}"
            )


@dataclasses.dataclass(frozen=True)
class Method:
    """One method's parts (see module docstring)."""

    name: str
    reference: str
    leader: LeaderConfig
    grace: grace_lib.GracePolicy
    settings: MethodSettings

    def make_tx(self, outer_optimizer: Any = None) -> Any:
        """The followers' outer chain (imports JAX). Methods equal in what the chain reads
        (not, e.g., their token budgets) get the same chain object: the followers' jitted
        steps take it as a static argument, so a process that builds many worlds (the
        simulator, its replays, tests) compiles them once.

        ``outer_optimizer``: EXTENSION: the task's ``(learning_rate, momentum) -> optax
        transform`` (:attr:`dipsjax.task.Task.outer_optimizer`, see
        :func:`dipsjax.task.outer_optimizer_of`) in place of the chain's Nesterov step, as
        :attr:`MethodSettings.outer_optimizer` names one; both given is a ``ValueError``.
        The same function (by identity) with equal settings gives the same chain."""
        if outer_optimizer is not None and self.settings.outer_optimizer:
            raise ValueError(
                "the task carries an outer_optimizer and the config names outer_optimizer="
                f"{self.settings.outer_optimizer!r}: set one of them"
            )
        if outer_optimizer is not None:
            try:
                hash(outer_optimizer)  # the chains are cached by it
                usable = callable(outer_optimizer)
            except TypeError:
                usable = False
        if outer_optimizer is not None and not usable:
            raise TypeError(
                "outer_optimizer must be a hashable function (learning_rate, momentum) -> "
                f"optax transform, got {outer_optimizer!r}"
            )
        s = self.settings
        # Keyed on what the chain reads only: worlds that differ elsewhere (a token budget,
        # a learner count, a heartbeat) share the chain and so the followers' compiled steps.
        full = s.full_round_tokens if self.name == "decoupled" and s.round_token_scale else None
        return _make_tx(
            self.name,
            *s.outer(self.name),
            s.anomaly,
            s.rda if self.name == "decoupled" else True,
            full,
            s.outer_optimizer,
            self.leader.max_norm,
            outer_optimizer,
        )


@functools.lru_cache(maxsize=64)
def _make_tx(
    name: str,
    lr: float,
    mom: float,
    a: rules.AnomalyConfig,
    rda: bool,
    full: float | None,
    named_step: str,
    max_norm: float | None,
    fn: Any = None,
) -> Any:
    """The outer chain of method ``name`` (``full``: Decoupled DiLoCo's full-round tokens
    when its rounds are scaled, else ``None``; ``named_step``: the settings'
    ``outer_optimizer``, ``fn``: the task's)."""
    from dipsjax import outer

    step = None
    if named_step:
        from dipsjax.task import resolve

        fn = resolve(named_step)
    if fn is not None:
        step = fn(lr, mom)
    if name == "dips":
        return outer.dips(
            lr,
            mom,
            step=step,
            alpha=a.alpha,
            beta=a.beta,
            history=a.history,
            warmup=a.warmup,
            min_max_score=a.min_max_score,
            min_sigma_ratio=a.min_sigma_ratio,
            max_norm=max_norm,
        )
    if name == "decoupled":
        return outer.decoupled_diloco(
            lr, mom, rda=rda, full_round_tokens=full, step=step, max_norm=max_norm
        )
    return outer.diloco(lr, mom, step=step, max_norm=max_norm)


def build(name: str, settings: MethodSettings | None = None) -> Method:
    """The parts of method ``name`` (one of :data:`METHODS`) under ``settings``."""
    s = settings or MethodSettings()
    if name not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {name!r}")
    max_norm, relative = _clip(s, default="absolute" if name == "dips" else "none")
    common = dict(
        max_norm=max_norm,
        clip_relative=relative,
        clip_history=s.clip_history,
        anomaly=s.anomaly,
        max_staleness=s.max_staleness,
        version_cache=s.version_cache,
        heartbeat_interval=s.heartbeat_interval,
        token_budget=s.token_budget,
        num_followers=s.num_followers,
        layer_owner=s.layer_owner,
        deal_chunks=s.deal_chunks,
        adaptive_steps=s.adaptive_steps,
        adaptive_max=s.adaptive_max,
        inner_steps=s.inner_steps,
    )
    if name == "dips":
        lc = LeaderConfig(weighting="tokens", penalty=s.penalty, reference="server", **common)
        return Method(name, "server", lc, _grace(s, "dynamic"), s)
    if name == "decoupled":
        lc = LeaderConfig(weighting="decoupled", penalty=False, **common)
        policy = (
            grace_lib.QuorumGrace(k=s.quorum, grace=False)
            if s.grace == "none"
            else _grace(s, "quorum")
        )
        return Method(name, "start", lc, policy, s)
    if name == "naive_async":
        lc = LeaderConfig(weighting="uniform", penalty=False, max_participants=1, **common)
        return Method(name, "start", lc, _grace(s, "none"), s)
    # With dealt chunks (a fixed set of M workers) every round waits for all M, from the
    # first round on and after a restart: rounds that do not depend on timing.
    lc = LeaderConfig(weighting="uniform", penalty=False, min_active=s.deal_chunks, **common)
    return Method(name, "start", lc, grace_lib.QuorumGrace(k=s.learners, grace=False), s)


def _clip(s: MethodSettings, default: str) -> tuple[float | None, bool]:
    """The leader's ``(max_norm, clip_relative)`` for clip mode ``s.clip`` (``default`` for
    the method's own)."""
    mode = s.clip or default
    if mode == "none":
        return None, False
    return s.clip_norm, mode == "relative"


def _grace(s: MethodSettings, default: str) -> grace_lib.GracePolicy:
    name = s.grace or default
    if s.grace_targeted and name != "quorum":
        raise ValueError(
            f"grace_targeted applies to the quorum grace policy (Decoupled DiLoCo's, or "
            f"grace='quorum'), not to {name!r}"
        )
    if name == "fixed":
        return grace_lib.FixedGrace(s.grace_seconds)
    if name == "dynamic":
        return grace_lib.DynamicGrace()
    if name == "quorum":
        return grace_lib.QuorumGrace(
            k=s.quorum, gamma=s.grace_gamma, grace=True, targeted=s.grace_targeted
        )
    if name == "none":
        return grace_lib.NoGrace()
    raise ValueError(f"grace policy must be one of none, fixed, dynamic, quorum; got {name!r}")
