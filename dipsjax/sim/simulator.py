"""Virtual-clock simulator: real JAX training of small models, simulated time.

Learners train a real model on the real corpus with :class:`dipsjax.learner.Learner`; how
long things take comes from a model: per-learner speed (heterogeneity ``eta``: step times
spread evenly over ``[1, 1 + eta/100]`` times the base step time), step-time noise, per-link
bandwidth and latency applied to the wire size of a *virtual* model (``virtual_params``, so a
tiny model can stand in for a 1B one's communication), the followers' update time, failures
and recoveries. The syncer is the real sans-IO core: :class:`dipsjax.syncer.Leader` and
:class:`dipsjax.syncer.Follower` (the same code the runtime drives over gRPC), so every
method's outer step is the library's (:mod:`dipsjax.outer`).

Methods (same model, data, token budget):

* ``dp`` -- data parallel: one gradient all-reduce per step (a barrier every step).
* ``sync_diloco`` -- quorum of all learners, plain mean, Nesterov: a barrier every ``H``.
* ``naive_async`` -- every push is applied alone on arrival: no penalty, weighting or grace.
* ``dips`` -- Di-PS: dynamic grace, anomaly penalty, token weighting, clipping, pseudo-
  gradients against the server's current parameters.
* ``decoupled`` -- Decoupled DiLoCo: quorum ``K`` with slack-bounded grace, ``c_tok^2/c_steps``
  weights, RDA.

By default a learner waits from its push until it pulled the version its contribution went
into (Di-PS sec. 5: the round's learners pull, the others keep training). With
``overlap=True`` learners never wait for the syncer: after a push a learner goes straight on
with its next round and adopts the newest global version at its next round start (one push
in flight per learner, state at most one round stale). With the default outer optimizer
(lr 0.7, momentum 0.8) that staleness makes training worse on the tiny settings, so it is
off by default; it is there to study.

Deterministic for a seed. :func:`replay` recomputes the final parameters from the event
tape alone.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dipsjax import outer
from dipsjax.data import ByteTokenizer, LocalLedger, new_ledger, train_chunks, validation_data
from dipsjax.data.pipeline import BatchStream, StreamPosition
from dipsjax.learner import InnerOptimizerConfig, Learner
from dipsjax.learner.round import evaluate
from dipsjax.model.configs import get_config
from dipsjax.syncer import grace as grace_lib
from dipsjax.syncer import leader as L
from dipsjax.syncer.follower import Follower
from dipsjax.syncer.schedule import assign_layers

METHODS = ("dp", "sync_diloco", "naive_async", "dips", "decoupled")
WIRE_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimConfig:
    """One simulated experiment (validated; errors name the field)."""

    method: str = "dips"
    learners: int = 4
    followers: int = 2
    model: str = "tiny"
    corpus: str = "austen"
    batch_size: int = 8
    seq_len: int = 64
    chunk_len: int = 4096
    inner_steps: int = 16
    inner_lr: float = 3e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.8
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
    rda: bool = True
    overlap: bool | None = None
    alpha: float = 0.02
    beta: float = 3.0
    warmup: int = 3
    max_staleness: int | None = None
    failures: tuple[tuple[int, float, float], ...] = ()
    joins: tuple[tuple[int, float], ...] = ()
    leaves: tuple[tuple[int, float], ...] = ()
    heartbeat_interval: float = 10.0
    eval_every: int = 4
    eval_batches: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
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
            (
                self.grace in ("", "none", "fixed", "dynamic", "quorum"),
                "grace",
                "'', none, fixed, dynamic or quorum",
            ),
            (self.quorum >= 1, "quorum", ">= 1"),
            (self.eval_every >= 1, "eval_every", ">= 1"),
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

    def bandwidth(self, j: int) -> float:
        return self.bandwidth_gbps[j] if self.bandwidth_gbps else 10.0


@dataclasses.dataclass
class SimResult:
    """What one experiment measured (all times virtual seconds)."""

    config: SimConfig
    virtual_time: float
    tokens_consumed: int
    tokens_applied: int
    tokens_rejected: int
    tokens_dropped: int
    tokens_outstanding: int
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
    tokens_in_training: int = 0  # part of tokens_outstanding: rounds still training at the end
    tokens_in_training_done: float = 0.0  # of those, the share trained by the end (pro rata)

    @property
    def tokens_trained(self) -> float:
        """Tokens trained within the run: rounds still in progress at the end count pro rata
        of their elapsed virtual time (their tokens were drawn when they started)."""
        return self.tokens_consumed - self.tokens_in_training + self.tokens_in_training_done

    @property
    def tokens_per_second(self) -> float:
        """Aggregate training throughput: :attr:`tokens_trained` per virtual second."""
        return self.tokens_trained / self.virtual_time if self.virtual_time > 0 else 0.0

    @property
    def rejected_fraction(self) -> float:
        """Share of the decided tokens that the anomaly penalty (or NaN check) rejected."""
        decided = self.tokens_applied + self.tokens_rejected
        return self.tokens_rejected / decided if decided else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.config.method,
            "virtual_time": self.virtual_time,
            "tokens_per_second": self.tokens_per_second,
            "tokens_consumed": self.tokens_consumed,
            "effective_tokens": self.tokens_applied,
            "rejected_fraction": self.rejected_fraction,
            "dropped_tokens": self.tokens_dropped,
            "rounds": self.rounds,
            "outer_comm_time": self.comm_time,
            "phases": self.phases,
            "final_val_loss": self.final_loss,
            "final_val_bpb": self.final_bpb,
            "ideal_tokens_per_second": self.ideal_tokens_per_second,
            "scaling_efficiency": self.tokens_per_second / self.ideal_tokens_per_second
            if self.ideal_tokens_per_second
            else 0.0,
        }


# ------------------------------------------------------------------ method set-up


def outer_setup(cfg: SimConfig) -> tuple[Any, L.LeaderConfig, grace_lib.GracePolicy, str]:
    """The outer chain, leader config, grace policy and pseudo-gradient reference of a method."""
    lr, mom, m = cfg.outer_lr, cfg.outer_momentum, cfg.learners
    common = {"heartbeat_interval": cfg.heartbeat_interval, "max_staleness": cfg.max_staleness}
    if cfg.method == "dips":
        tx = outer.dips(lr, mom, alpha=cfg.alpha, beta=cfg.beta, warmup=cfg.warmup)
        lc = L.LeaderConfig(
            weighting="tokens",
            penalty=True,
            alpha=cfg.alpha,
            beta=cfg.beta,
            warmup=cfg.warmup,
            max_norm=1.0,
            **common,
        )
        policy = _policy(cfg, "dynamic")
        return tx, lc, policy, "server"
    if cfg.method == "decoupled":
        full = cfg.learners * cfg.inner_steps * cfg.batch_size * cfg.seq_len
        tx = outer.decoupled_diloco(lr, mom, rda=cfg.rda, full_round_tokens=full)
        lc = L.LeaderConfig(weighting="decoupled", penalty=False, max_norm=None, **common)
        return tx, lc, _policy(cfg, "quorum"), "start"
    if cfg.method == "naive_async":
        tx = outer.diloco(lr, mom)
        lc = L.LeaderConfig(
            weighting="uniform", penalty=False, max_norm=None, max_participants=1, **common
        )
        return tx, lc, _policy(cfg, "none"), "start"
    if cfg.method == "sync_diloco":
        tx = outer.diloco(lr, mom)
        lc = L.LeaderConfig(weighting="uniform", penalty=False, max_norm=None, **common)
        return tx, lc, grace_lib.QuorumGrace(k=m, grace=False), "start"
    raise ValueError(f"method {cfg.method!r} has no syncer (data parallel runs without one)")


def _policy(cfg: SimConfig, default: str) -> grace_lib.GracePolicy:
    name = cfg.grace or default
    if name == "fixed":
        return grace_lib.FixedGrace(cfg.grace_seconds)
    if name == "dynamic":
        return grace_lib.DynamicGrace()
    if name == "quorum":
        return grace_lib.QuorumGrace(k=cfg.quorum, gamma=cfg.grace_gamma, grace=True)
    return grace_lib.NoGrace()


# ------------------------------------------------------------------- shared parts


class _World:
    """Model, data and followers shared by the methods (built once per experiment)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.model_cfg = get_config(cfg.model)
        self.tok = ByteTokenizer()
        self.chunks = train_chunks(cfg.corpus, chunk_len=cfg.chunk_len, tokenizer=self.tok)
        self.ledger = LocalLedger(new_ledger(self.chunks.shape[0], seed=cfg.seed))
        val = validation_data(cfg.corpus, tokenizer=self.tok)
        n = cfg.eval_batches * cfg.batch_size * cfg.seq_len
        rows = val.tokens[: n + 1]
        self.eval_batches = [
            np.stack(
                [
                    rows[
                        (b * cfg.batch_size + i) * cfg.seq_len : (b * cfg.batch_size + i + 1)
                        * cfg.seq_len
                        + 1
                    ]
                    for i in range(cfg.batch_size)
                ]
            ).astype(np.int32)
            for b in range(cfg.eval_batches)
        ]
        self.inner_cfg = InnerOptimizerConfig(learning_rate=cfg.inner_lr, weight_decay=0.0)
        self.evaluator = Learner(
            self.model_cfg,
            self.inner_cfg,
            mesh=None,
            learner_id="eval",
            seed=cfg.seed,
            donate=False,
        )
        self.init_params = self.evaluator.params_dict()
        self.rng = np.random.default_rng(cfg.seed)
        m = cfg.learners
        self.speed = list(cfg.speeds) or [
            1.0 + cfg.eta / 100.0 * (j / (m - 1) if m > 1 else 0.0) for j in range(m)
        ]
        self.wire_bytes = cfg.virtual_params * WIRE_BYTES[cfg.wire]

    def learner(self, learner_id: Any) -> Learner:
        """A fresh learner (same initialisation for every learner, as after a first pull)."""
        return Learner(
            self.model_cfg,
            self.inner_cfg,
            mesh=None,
            learner_id=learner_id,
            seed=self.cfg.seed,
            donate=False,
        )

    def stream(self, learner_id: Any, source: Any = None, position: Any = None) -> BatchStream:
        """A batch stream leasing chunks from the shared ledger (or from ``source``)."""
        return BatchStream(
            self.chunks,
            batch_size=self.cfg.batch_size,
            seq_len=self.cfg.seq_len,
            source=self.ledger.source(str(learner_id)) if source is None else source,
            position=position,
        )

    def followers(self, tx: Any, reference: str) -> tuple[list[Follower], Callable, int]:
        """Followers holding the initial parameters, sharded by bytes; ``(fs, shard_of, n)``."""
        shard_of = _shard_fn(self.init_params, self.cfg.followers)
        n = min(self.cfg.followers, len(outer.flatten(self.init_params)))
        fs = [
            Follower(k, shard, tx, capacity=self.cfg.learners, reference=reference)
            for k, shard in enumerate(outer.split_tree(self.init_params, shard_of, n))
        ]
        return fs, shard_of, n

    @property
    def ideal_tokens_per_second(self) -> float:
        """Aggregate throughput if every learner trained alone with no outer communication."""
        per_step = self.cfg.batch_size * self.cfg.seq_len
        return sum(per_step / (self.cfg.step_time * s) for s in self.speed)

    def evaluate(self, params: dict) -> tuple[float, float]:
        self.evaluator.pull(params, version=0)
        res = evaluate(self.evaluator.inner, self.evaluator.params, self.eval_batches)
        return res.loss, res.bits_per_byte

    def train_time(self, j: int, steps: int) -> float:
        noise = (
            math.exp(self.cfg.step_noise * self.rng.standard_normal())
            if self.cfg.step_noise
            else 1.0
        )
        return steps * self.cfg.step_time * self.speed[j] * noise

    def link_time(self, j: int) -> float:
        gbps = min(self.cfg.bandwidth(j), self.cfg.follower_gbps * self.cfg.followers)
        return self.cfg.latency + self.wire_bytes * 8 / (gbps * 1e9)


def _wire(cfg: SimConfig, payload: dict) -> dict:
    """What the followers receive: the payload through the configured wire codec."""
    if cfg.wire == "fp32":
        return payload
    return outer.decode_tree(outer.encode_tree(payload, cfg.wire))


def _shard_fn(params: dict, followers: int) -> Callable[[tuple[str, ...]], int]:
    paths = list(outer.flatten(params))
    sizes = [int(np.prod(np.shape(outer.flatten(params)[p]))) * 4 for p in paths]
    owner = assign_layers(sizes, min(followers, len(paths)))
    table = dict(zip(paths, owner, strict=True))
    return table.__getitem__


# ------------------------------------------------------------------ syncer methods


@dataclasses.dataclass
class _SimLearner:
    j: int
    learner: Learner
    stream: BatchStream
    alive: bool = True
    incarnation: int = 0
    pending: Any = None  # (contribution, payload, meta) trained, waiting to push
    outbox: Any = None  # the pushed round's payload, until its transfer lands
    inflight: bool = False  # overlap: a push not yet answered by a pull notice
    ready: bool = False  # overlap: a trained round waiting for the previous push
    latest: Any = None  # overlap: (version, params) of the newest pulled global model
    training_tokens: int = 0  # tokens of the round in progress (lost on a crash)
    training_span: tuple[float, float] = (0.0, 1.0)  # (start, duration) of that round


def simulate(cfg: SimConfig, *, progress: Callable[[str], None] | None = None) -> SimResult:
    """Runs one experiment and returns its measurements, tape and final parameters."""
    if cfg.method == "dp":
        return _simulate_dp(cfg, progress)
    world = _World(cfg)
    tx, leader_cfg, policy, reference = outer_setup(cfg)
    leader_cfg = dataclasses.replace(leader_cfg, token_budget=cfg.token_budget)
    leader = L.Leader(leader_cfg, policy)
    followers, shard_of, nf = world.followers(tx, reference)

    def global_params() -> dict:
        # Host copies: the followers donate their buffers to the next outer step.
        return jax.device_get(outer.merge_trees([f.pull()[1] for f in followers]))

    learners = [_SimLearner(j, world.learner(j), world.stream(j)) for j in range(cfg.learners)]
    queue: list = []
    counter = itertools.count()

    def at(t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(queue, (t, next(counter), kind, payload))

    phases = {"train": 0.0, "push": 0.0, "wait": 0.0, "update": 0.0, "pull": 0.0}
    comm = [0.0]
    lost = [0]
    curve: list[dict[str, float]] = []
    pushed_at: dict[int, float] = {}
    stopped = [False]

    overlap = bool(cfg.overlap)

    def start_round(sl: _SimLearner, t: float, adopt: Any = None, reset: bool = False) -> None:
        if not sl.alive or stopped[0]:
            return
        if adopt is not None:
            sl.learner.pull(adopt[1], version=adopt[0], reset_optimizer=reset)
        start_pos = sl.stream.position
        chunks_before = start_pos.chunks_taken
        taken: list[int] = []
        batches = []
        finished_chunks = []
        for _ in range(cfg.inner_steps):
            b = sl.stream.next_batch()
            if b is None:
                break
            if sl.stream.position.chunks_taken != chunks_before + len(taken):
                taken.append(b.chunk)
            batches.append(b.tokens)
            if b.finished:
                finished_chunks.append(b.chunk)
        if not batches:
            return  # data exhausted
        contrib = sl.learner.run_round(batches, num_steps=len(batches), reference="start")
        payload = _wire(cfg, contrib.delta if reference == "start" else sl.learner.params_dict())
        meta = {
            "incarnation": sl.incarnation,
            "pulled": adopt is not None,
            "start": {"chunk": start_pos.chunk, "offset": start_pos.offset},
            "new_chunks": taken,
            "finished_chunks": finished_chunks,
        }
        sl.pending = (contrib, payload, meta)
        sl.training_tokens = contrib.tokens
        dt = world.train_time(sl.j, contrib.steps)
        sl.training_span = (t, dt)
        phases["train"] += dt
        at(t + dt, "trained", sl.j)

    def execute(actions: list[L.Action], t: float) -> None:
        for a in actions:
            if isinstance(a, L.SendModel):
                at(t + world.link_time(a.learner), "pulled", (a.learner, None))
            elif isinstance(a, L.Schedule):
                dt = world.link_time(a.learner)
                comm[0] += dt
                phases["push"] += dt
                at(t + dt, "transferred", (a.learner, a.round_id))
            elif isinstance(a, L.WakeAt):
                at(a.t, "tick")
            elif isinstance(a, L.RequestNorms):
                g = sum(f.partial_norms(a.round_id, a.learners) for f in followers)
                at(
                    t + 2 * cfg.latency,
                    "event",
                    L.NormsReported(t + 2 * cfg.latency, a.round_id, tuple(float(x) for x in g)),
                )
            elif isinstance(a, L.Decide):
                m = sum(f.merged_partial(a) for f in followers)
                decisions[a.round_id] = a
                at(
                    t + 2 * cfg.latency,
                    "event",
                    L.MergedNormReported(t + 2 * cfg.latency, a.round_id, m),
                )
            elif isinstance(a, L.Apply):
                for f in followers:
                    f.apply(decisions[a.round_id], a)
                done = t + cfg.update_seconds
                phases["update"] += cfg.update_seconds
                at(done, "event", L.ApplyDone(done, a.round_id, a.version))
            elif isinstance(a, L.Discard):
                for f in followers:
                    f.discard(a.round_id)
            elif isinstance(a, L.NotifyPull):
                for j in a.learners:
                    dt = world.link_time(j)
                    comm[0] += dt
                    phases["pull"] += dt
                    at(t + dt, "pulled", (j, a.version))
            elif isinstance(a, L.Evict):
                sl = learners[a.learner]
                world.ledger.release(str(a.learner))
            elif isinstance(a, L.Refuse):
                sl = learners[a.learner]
                if sl.alive:
                    at(t, "event", L.Join(t, a.learner))
            elif isinstance(a, L.Stop):
                stopped[0] = True

    decisions: dict[int, L.Decide] = {}

    def push(sl: _SimLearner, t: float) -> None:
        contrib, _, meta = sl.pending
        for c in meta["finished_chunks"]:
            world.ledger.complete(str(sl.j), c)
        sl.training_tokens = 0
        sl.outbox, sl.pending = sl.pending, None
        pushed_at[sl.j] = t
        feed(L.PushRequested(t, sl.j, contrib.tokens, contrib.steps, contrib.base_version, meta))
        if overlap and sl.alive and not stopped[0]:
            sl.inflight = True
            newer = sl.latest if sl.latest and sl.latest[0] > sl.learner.version else None
            start_round(sl, t, adopt=newer)

    def feed(ev: L.Event) -> None:
        execute(leader.handle(ev), ev.t)

    late = dict(cfg.joins)
    for sl in learners:
        if sl.j in late:
            sl.alive = False
            at(late[sl.j], "join", sl.j)
        else:
            at(0.0, "event", L.Join(0.0, sl.j))
    for j, t_leave in cfg.leaves:
        at(t_leave, "leave", j)
    for j, t_fail, t_back in cfg.failures:
        at(t_fail, "fail", j)
        at(t_back, "recover", j)
    at(cfg.heartbeat_interval, "heartbeats")
    last_eval_round = [-1]
    t = 0.0
    while queue and not stopped[0]:
        t, _, kind, payload = heapq.heappop(queue)
        if kind == "event":
            feed(payload)
        elif kind == "tick":
            feed(L.Tick(t))
        elif kind == "heartbeats":
            for sl in learners:
                if sl.alive:
                    feed(L.Heartbeat(t, sl.j))
            feed(L.Tick(t))
            if not stopped[0] and any(sl.alive for sl in learners):
                at(t + cfg.heartbeat_interval, "heartbeats")
        elif kind == "trained":
            sl = learners[payload]
            if not sl.alive or sl.pending is None:
                continue
            if overlap and sl.inflight:
                sl.ready = True  # one push in flight at a time: wait for its pull notice
                continue
            push(sl, t)
        elif kind == "transferred":
            j, round_id = payload
            sl = learners[j]
            if sl.outbox is None:
                continue  # the learner died mid-transfer: the leader will evict it
            _, data, _ = sl.outbox
            for f, part in zip(followers, outer.split_tree(data, shard_of, nf), strict=True):
                f.receive(round_id, j, part)
            sl.outbox = None
            feed(L.TransferDone(t, j, round_id))
        elif kind == "pulled":
            j, version = payload
            sl = learners[j]
            if not sl.alive:
                continue
            v, params = followers[0].version, global_params()
            if j in pushed_at:
                phases["wait"] += max(t - pushed_at.pop(j), 0.0)
            feed(L.PullDone(t, j, v))
            if overlap and version is not None:
                sl.latest, sl.inflight = (v, params), False
                if sl.ready:
                    sl.ready = False
                    push(sl, t)
            else:
                start_round(sl, t, adopt=(v, params), reset=version is None)
            if leader.next_round_id - 1 >= last_eval_round[0] + cfg.eval_every:
                last_eval_round[0] = leader.next_round_id - 1
                _record_leader(world, curve, t, leader, global_params(), progress)
        elif kind == "join":
            learners[payload].alive = True
            feed(L.Join(t, payload))
        elif kind in ("fail", "leave"):
            sl = learners[payload]
            if kind == "leave":
                feed(L.Leave(t, sl.j))
            sl.alive = False
            lost[0] += sl.training_tokens
            sl.training_tokens = 0
            sl.pending = sl.outbox = sl.latest = None
            sl.inflight = sl.ready = False
            world.ledger.release(str(sl.j))
        elif kind == "recover":
            sl = learners[payload]
            sl.alive = True
            sl.incarnation += 1
            sl.stream = world.stream(sl.j)
            feed(L.Join(t, sl.j))
    # Drain the tokens still in flight so every consumed token is accounted for.
    in_training = sum(sl.training_tokens for sl in learners if sl.alive)
    # Work done by the end on rounds still training, pro rata of their elapsed time.
    in_training_done = sum(
        sl.training_tokens * min(max((t - sl.training_span[0]) / sl.training_span[1], 0.0), 1.0)
        for sl in learners
        if sl.alive
    )
    final = global_params()
    _record_leader(world, curve, t, leader, final, progress)
    totals = leader.ledger.totals()
    return SimResult(
        config=cfg,
        virtual_time=t,
        tokens_consumed=totals["consumed"] + lost[0] + in_training,
        tokens_applied=totals["applied"],
        tokens_rejected=totals["rejected"],
        tokens_dropped=totals["dropped"] + lost[0],
        tokens_outstanding=totals["outstanding"] + in_training,
        rounds=len(leader.tape.rounds()),
        comm_time=comm[0],
        phases=phases,
        curve=curve,
        final_loss=curve[-1]["val_loss"],
        final_bpb=curve[-1]["val_bpb"],
        tape=leader.tape,
        params=final,
        ideal_tokens_per_second=world.ideal_tokens_per_second,
        chunk_ledger=world.ledger.state,
        tokens_in_training=in_training,
        tokens_in_training_done=in_training_done,
    )


def _record(
    world: _World,
    curve: list,
    t: float,
    version: int,
    consumed: int,
    applied: int,
    params: dict,
    progress: Callable[[str], None] | None,
) -> None:
    """Evaluates ``params`` and appends one point of the validation curve."""
    loss, bpb = world.evaluate(params)
    curve.append(
        {
            "t": t,
            "version": version,
            "tokens_consumed": consumed,
            "tokens_applied": applied,
            "val_loss": loss,
            "val_bpb": bpb,
        }
    )
    if progress is not None:
        progress(
            f"t={t:8.1f}s v={version:5d} tokens={consumed:9d} val_loss={loss:.4f} bpb={bpb:.3f}"
        )


def _record_leader(
    world: _World,
    curve: list,
    t: float,
    leader: L.Leader,
    params: dict,
    progress: Callable[[str], None] | None,
) -> None:
    totals = leader.ledger.totals()
    _record(
        world, curve, t, leader.version, totals["consumed"], totals["applied"], params, progress
    )


# -------------------------------------------------------------------- data parallel


def _simulate_dp(cfg: SimConfig, progress: Callable[[str], None] | None) -> SimResult:
    """Synchronous data parallel: every step all learners' gradients are averaged."""
    world = _World(cfg)
    model = world.learner("dp")
    streams = [world.stream(j) for j in range(cfg.learners)]
    min_gbps = min(cfg.bandwidth(j) for j in range(cfg.learners))
    m = cfg.learners
    allreduce = (
        0.0 if m == 1 else cfg.latency + 2 * (m - 1) / m * world.wire_bytes * 8 / (min_gbps * 1e9)
    )
    t, tokens, comm, steps = 0.0, 0, 0.0, 0
    curve: list[dict[str, float]] = []
    train_time = 0.0
    while tokens < cfg.token_budget:
        parts = [s.next_batch() for s in streams]
        if any(p is None for p in parts):
            break
        for j, p in enumerate(parts):
            if p.finished:
                world.ledger.complete(str(j), p.chunk)
        batch = np.concatenate([p.tokens for p in parts])
        model.run_round([batch], num_steps=1)
        step = max(world.train_time(j, 1) for j in range(m))
        train_time += step
        t += step + allreduce
        comm += allreduce
        tokens += batch.shape[0] * cfg.seq_len
        steps += 1
        if steps % (cfg.inner_steps * cfg.eval_every) == 0:
            _record(world, curve, t, steps, tokens, tokens, model.params_dict(), progress)
    params = model.params_dict()
    _record(world, curve, t, steps, tokens, tokens, params, progress)
    loss, bpb = curve[-1]["val_loss"], curve[-1]["val_bpb"]
    return SimResult(
        config=cfg,
        virtual_time=t,
        tokens_consumed=tokens,
        tokens_applied=tokens,
        tokens_rejected=0,
        tokens_dropped=0,
        tokens_outstanding=0,
        rounds=steps,
        comm_time=comm,
        phases={"train": train_time, "allreduce": comm},
        curve=curve,
        final_loss=loss,
        final_bpb=bpb,
        tape=None,
        params=params,
        ideal_tokens_per_second=world.ideal_tokens_per_second,
    )


# --------------------------------------------------------------------------- replay


def replay(cfg: SimConfig, tape: Any) -> dict:
    """Recomputes the final global parameters from the event tape alone.

    For each round record, in order: every participant retrains its contribution from the
    global parameters of its base version with the data recorded on the tape (its AdamW state
    continuing from its previous contribution in the same incarnation), the followers stage
    it, recompute the norms (checked against the tape) and apply the recorded decision.
    """
    if cfg.method == "dp":
        raise ValueError("replay needs a syncer method; data parallel writes no tape")
    world = _World(cfg)
    tx, _, _, reference = outer_setup(cfg)
    followers, shard_of, nf = world.followers(tx, reference)
    versions = {0: world.init_params}
    learners: dict[int, tuple[int, Learner]] = {}
    for rec in tape.rounds():
        for p in rec["participants"]:
            j, meta = p["learner"], p["meta"]
            if j not in learners or learners[j][0] != meta["incarnation"]:
                learners[j] = (meta["incarnation"], world.learner(j))
            learner = learners[j][1]
            if meta["pulled"]:
                learner.pull(versions[p["base_version"]], version=p["base_version"])
            start = meta["start"]
            pos = StreamPosition(chunk=start["chunk"], offset=start["offset"])
            stream = world.stream(j, source=list(meta["new_chunks"]), position=pos)
            batches = [b.tokens for b in itertools.islice(stream, p["steps"])]
            contrib = learner.run_round(batches, num_steps=p["steps"], reference="start")
            data = _wire(cfg, contrib.delta if reference == "start" else learner.params_dict())
            for f, part in zip(followers, outer.split_tree(data, shard_of, nf), strict=True):
                f.receive(rec["round_id"], j, part)
        learners_t = tuple(p["learner"] for p in rec["participants"])
        g = sum(f.partial_norms(rec["round_id"], learners_t) for f in followers)
        np.testing.assert_allclose(
            g,
            rec["sq_norms"],
            rtol=1e-6,
            err_msg=f"round {rec['round_id']}: norms differ from the tape",
        )
        if not rec["applied"]:
            for f in followers:
                f.discard(rec["round_id"])
            continue
        decision = L.Decide(
            rec["round_id"],
            learners_t,
            tuple(rec["accepted"]),
            tuple(p["tokens"] for p in rec["participants"]),
            tuple(p["steps"] for p in rec["participants"]),
            tuple(rec["weights"]),
            tuple(rec["sq_norms"]),
        )
        m = sum(f.merged_partial(decision) for f in followers)
        clip = rec["clip_factor"]
        apply = L.Apply(rec["round_id"], rec["version"], clip, m)
        for f in followers:
            f.apply(decision, apply)
        # Host copies: the followers donate their parameter buffers to the next update.
        versions[rec["version"]] = jax.device_get(
            outer.merge_trees([f.pull()[1] for f in followers])
        )
    return versions[max(versions)]


def tree_equal(a: Any, b: Any) -> bool:
    """Exact equality of two parameter trees."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )
