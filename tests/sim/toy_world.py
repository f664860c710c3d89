"""A world cheap enough to fuzz: the simulator's :class:`~dipsjax.sim.world.World` with a
model of two tiny tensors whose "training" is deterministic NumPy arithmetic.

Everything the protocol touches is real: the method registry, the leader, the real
:class:`~dipsjax.syncer.follower.Follower` s (their outer chain is built once per method
and settings, so their programs compile once per shape, not once per run), the chunk
ledger, and :class:`~dipsjax.data.pipeline.BatchStream` s over toy chunks. The chunks are a
token stream ``0, 1, 2, ...``, so a batch's first token names it: chunk ``c``, batch ``b``
starts with token ``c * chunk_len + b * batch_size * seq_len`` (:func:`batch_id`), and the
batches a tape's push trained can be listed from its data position alone
(:func:`push_batches`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from dipsjax.data.pipeline import TokenChunks, chunk_tokens
from dipsjax.learner.round import Contribution
from dipsjax.sim.config import SimConfig
from dipsjax.sim.world import Evaluation, World
from dipsjax.syncer.schedule import assign_layers

SHAPES = {"a": (4,), "b": (3,)}
_TX_CACHE: dict[Any, Any] = {}


def toy_config(**kw: Any) -> SimConfig:
    """Small settings: 3 learners, 2 followers, rounds of 3 steps of 8 tokens, chunks of 2
    batches (so rounds straddle chunks), a budget of about 12 rounds, quick links."""
    base = dict(
        learners=3,
        followers=2,
        batch_size=2,
        seq_len=4,
        chunk_len=16,
        inner_steps=3,
        token_budget=12 * 3 * 3 * 8,
        step_time=1.0,
        step_noise=0.0,
        eta=50.0,
        wire="fp32",
        virtual_params=1e5,
        latency=0.05,
        update_seconds=0.5,
        heartbeat_interval=2.0,
        eval_every=1000,
        seed=0,
    )
    base.update(kw)
    return SimConfig(**base)


class ToyLearner:
    """The parts of :class:`dipsjax.learner.Learner` the engine uses, in NumPy.

    A step moves each tensor a little toward a target drawn from the batch's tokens."""

    def __init__(self, learner_id: Any, params: dict, lr: float = 0.05) -> None:
        self.learner_id = learner_id
        self.lr = lr
        self.params = {k: np.array(v, np.float32) for k, v in params.items()}
        self.version = 0
        self.steps_done = 0
        self.tokens_done = 0

    def params_dict(self) -> dict:
        return {k: v.copy() for k, v in self.params.items()}

    @property
    def opt_state(self) -> dict:
        return {}  # no inner optimizer state (what replay carries from round to round)

    def set_opt_state(self, state: Any) -> None:
        del state

    def pull(self, params: dict, *, version: int, reset_optimizer: bool = False) -> None:
        del reset_optimizer  # no inner state
        self.params = {k: np.array(v, np.float32) for k, v in params.items()}
        self.version = int(version)

    def run_round(self, batches: Any, *, num_steps: int, reference: str = "start") -> Any:
        start = self.params_dict()
        steps = tokens = 0
        for batch in itertools.islice(batches, num_steps):
            x = np.asarray(batch, np.float32)
            tokens += int(x.shape[0] * (x.shape[1] - 1))
            for k, v in self.params.items():
                target = np.float32(np.sin(x[:, : v.shape[0]].mean(axis=0) / 97.0))
                self.params[k] = (v - np.float32(self.lr) * (v - target[: v.shape[0]])).astype(
                    np.float32
                )
            steps += 1
        self.steps_done += steps
        self.tokens_done += tokens
        delta = {k: start[k] - self.params[k] for k in start}
        return Contribution(
            learner_id=self.learner_id,
            base_version=self.version,
            tokens=tokens,
            steps=steps,
            delta=delta,
            reference=reference,
        )


class ToyWorld(World):
    """:class:`World` with a toy model and toy chunks (see module docstring)."""

    def __init__(self, cfg: SimConfig, num_chunks: int = 400) -> None:
        self.cfg = cfg
        self.chunks = chunk_tokens(np.arange(num_chunks * cfg.chunk_len + 1), cfg.chunk_len)
        self.source = TokenChunks(self.chunks, batch_size=cfg.batch_size, seq_len=cfg.seq_len)
        self.init_params = {k: np.full(s, 0.1, np.float32) for k, s in SHAPES.items()}
        self.rng = np.random.default_rng(cfg.seed)
        m = cfg.learners
        self.speed = list(cfg.speeds) or [
            1.0 + cfg.eta / 100.0 * (j / (m - 1) if m > 1 else 0.0) for j in range(m)
        ]
        self.paths = [(k,) for k in SHAPES]
        sizes = [int(np.prod(s)) for s in SHAPES.values()]
        self.num_followers = min(cfg.followers, len(self.paths))
        self.layer_owner = assign_layers([4 * s for s in sizes], self.num_followers)
        per_value = cfg.virtual_params / sum(sizes) * 4.0
        self.layer_bytes = [s * per_value for s in sizes]
        self.wire_bytes = sum(self.layer_bytes)
        owner = dict(zip(self.paths, self.layer_owner, strict=True))
        self.shard_of = owner.__getitem__

    def learner(self, learner_id: Any) -> ToyLearner:
        return ToyLearner(learner_id, self.init_params)

    def followers(self, method: Any) -> list[Any]:
        from dipsjax.syncer.follower import Follower

        key = (method.name, dataclasses.astuple(method.settings))
        if key not in _TX_CACHE:  # one chain object: its programs compile once
            _TX_CACHE[key] = method.make_tx()
        tx = _TX_CACHE[key]
        return [
            Follower(k, shard, tx, reference=method.reference, **self.cfg.follower_options())
            for k, shard in enumerate(self.split(self.init_params))
        ]

    def evaluate(self, params: dict) -> Evaluation:
        loss = float(sum(np.sum(np.square(np.asarray(v))) for v in params.values()))
        return Evaluation(loss, {"bits_per_byte": loss}, 1)


def batch_id(cfg: SimConfig, tokens: np.ndarray) -> tuple[int, int]:
    """(chunk, batch) of a toy batch, from its first token."""
    first = int(np.asarray(tokens)[0, 0])
    return first // cfg.chunk_len, (first % cfg.chunk_len) // (cfg.batch_size * cfg.seq_len)


def push_batches(world: ToyWorld, meta: Any) -> list[tuple[int, int]]:
    """The batches a push trained, from its data position (as replay draws them)."""
    stream = world.stream(list(meta.spans))
    return [batch_id(world.cfg, b) for b in stream.take_round(meta.steps).batches]


def toy_replay(cfg: SimConfig, tape: Any) -> dict:
    """The final global parameters recomputed from ``tape`` on a fresh toy world, by the
    simulator's own :func:`dipsjax.sim.replay.replay`."""
    from dipsjax.sim.replay import replay

    return replay(cfg, tape, world=ToyWorld(cfg))
