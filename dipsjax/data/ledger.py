"""Chunk ledger: which learner trains which data chunk, exactly once per epoch.

The training corpus is cut into ``num_chunks`` fixed-size chunks (many more than learners).
The ledger is *pure state* (a frozen dataclass of ints, strings and tuples, JSON-serializable)
and every operation is a function returning a new ledger, so the owner (leader process,
simulator, test) decides where it lives and when it is checkpointed.

Operations:

* :func:`lease` gives a learner one chunk to train (or ``None`` when none is available now);
* :func:`complete` records that the learner finished that chunk;
* :func:`release` returns a learner's leased chunks to the pool (it failed, left or was
  declared dead); they are re-leased before any fresh chunk.

Epochs. Epoch ``e`` hands out chunks in a deterministic order, :func:`epoch_order` (a
permutation seeded by ``(seed, e)`` when ``shuffle``, else ``0 .. num_chunks-1``); released
chunks are re-leased first, oldest first. When every chunk of epoch ``e`` is leased or
complete, further leases come from epoch ``e + 1`` (``overlap_epochs=True``, the default,
so fast learners never wait at an epoch boundary) or return ``None`` until epoch ``e`` is
complete (``overlap_epochs=False``). At most two epochs are open at once, and the older one
is always served first. ``max_epochs`` (``None`` = unbounded) stops leasing after that many.

Invariants (checked by :func:`check_invariants`, tested under random join/leave/crash
sequences): a chunk id is leased to at most one learner at a time, across all open epochs;
within each epoch every chunk is completed exactly once; a released chunk goes back to the
pool of the epoch it was leased in.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

LEDGER_FORMAT = 1


class LedgerError(ValueError):
    """An invalid ledger operation (the message names the chunk, learner and holder)."""


class Lease(NamedTuple):
    """A chunk leased to a learner, and the epoch in which it counts."""

    chunk: int
    epoch: int


@dataclass(frozen=True)
class EpochState:
    """Progress of one open epoch.

    ``order[:cursor]`` (see :func:`epoch_order`) have been leased at least once;
    ``returned`` are among them but neither leased nor complete (released, or skipped
    because the chunk was busy in the other open epoch) and are leased next, in order;
    ``leases`` are ``(chunk, learner)`` pairs in lease order. The completed chunks are
    ``order[:cursor]`` minus ``returned`` minus the leased ones.
    """

    epoch: int
    cursor: int = 0
    returned: tuple[int, ...] = ()
    leases: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class ChunkLedger:
    """Ledger state; build it with :func:`new_ledger`, change it with the module functions."""

    num_chunks: int
    seed: int = 0
    shuffle: bool = True
    max_epochs: int | None = None
    overlap_epochs: bool = True
    epochs_completed: int = 0
    completions: int = 0
    epochs: tuple[EpochState, ...] = field(default=())

    @property
    def epoch(self) -> int:
        """The current (oldest unfinished) epoch."""
        return self.epochs_completed

    @property
    def finished(self) -> bool:
        """True once ``max_epochs`` epochs are complete (never, when unbounded)."""
        return self.max_epochs is not None and self.epochs_completed >= self.max_epochs

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible dict (inverse: :meth:`from_dict`)."""
        d = asdict(self)
        d["format"] = LEDGER_FORMAT
        d["epochs"] = [
            {
                "epoch": ep.epoch,
                "cursor": ep.cursor,
                "returned": list(ep.returned),
                "leases": [[c, learner] for c, learner in ep.leases],
            }
            for ep in self.epochs
        ]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChunkLedger:
        """Rebuild a ledger from :meth:`to_dict` output; validates it."""
        if d.get("format") != LEDGER_FORMAT:
            raise LedgerError(f"ledger format {d.get('format')!r} is not {LEDGER_FORMAT}")
        ledger = cls(
            num_chunks=int(d["num_chunks"]),
            seed=int(d["seed"]),
            shuffle=bool(d["shuffle"]),
            max_epochs=None if d["max_epochs"] is None else int(d["max_epochs"]),
            overlap_epochs=bool(d["overlap_epochs"]),
            epochs_completed=int(d["epochs_completed"]),
            completions=int(d["completions"]),
            epochs=tuple(
                EpochState(
                    epoch=int(ep["epoch"]),
                    cursor=int(ep["cursor"]),
                    returned=tuple(int(c) for c in ep["returned"]),
                    leases=tuple((int(c), str(learner)) for c, learner in ep["leases"]),
                )
                for ep in d["epochs"]
            ),
        )
        check_invariants(ledger)
        return ledger

    def to_json(self) -> str:
        """Compact JSON text (inverse: :meth:`from_json`)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ChunkLedger:
        return cls.from_dict(json.loads(text))


def new_ledger(
    num_chunks: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    max_epochs: int | None = None,
    overlap_epochs: bool = True,
) -> ChunkLedger:
    """A fresh ledger at epoch 0 with nothing leased."""
    if num_chunks < 1:
        raise LedgerError(f"num_chunks must be >= 1, got {num_chunks}")
    if seed < 0:
        raise LedgerError(f"seed must be >= 0, got {seed}")
    if max_epochs is not None and max_epochs < 1:
        raise LedgerError(f"max_epochs must be >= 1 or None, got {max_epochs}")
    return ChunkLedger(
        num_chunks=num_chunks,
        seed=seed,
        shuffle=shuffle,
        max_epochs=max_epochs,
        overlap_epochs=overlap_epochs,
    )


@functools.lru_cache(maxsize=16)
def _order(num_chunks: int, epoch: int, seed: int, shuffle: bool) -> tuple[int, ...]:
    if not shuffle:
        return tuple(range(num_chunks))
    return tuple(int(c) for c in np.random.default_rng([seed, epoch]).permutation(num_chunks))


def epoch_order(num_chunks: int, epoch: int, seed: int = 0, shuffle: bool = True) -> np.ndarray:
    """The order in which epoch ``epoch`` hands out chunks (a permutation of the chunk ids).

    Deterministic: ``numpy.random.default_rng([seed, epoch]).permutation(num_chunks)``, or
    ``arange(num_chunks)`` without ``shuffle``.
    """
    return np.asarray(_order(num_chunks, epoch, seed, shuffle), dtype=np.int64)


def fixed_order(num_chunks: int, epochs: int, seed: int = 0, shuffle: bool = True) -> np.ndarray:
    """Chunk ids of ``epochs`` consecutive epochs, for a single reader without a ledger."""
    return np.concatenate([epoch_order(num_chunks, e, seed, shuffle) for e in range(epochs)])


def _busy(ledger: ChunkLedger) -> dict[int, tuple[str, int]]:
    """Leased chunk -> (learner, epoch)."""
    return {c: (learner, ep.epoch) for ep in ledger.epochs for c, learner in ep.leases}


def _take(
    ledger: ChunkLedger, ep: EpochState, busy: dict[int, tuple[str, int]], learner: str
) -> tuple[EpochState, int | None]:
    """Lease the first available chunk of ``ep`` (returned ones first, then fresh ones)."""
    for i, c in enumerate(ep.returned):
        if c not in busy:
            returned = ep.returned[:i] + ep.returned[i + 1 :]
            return replace(ep, returned=returned, leases=(*ep.leases, (c, learner))), c
    order = _order(ledger.num_chunks, ep.epoch, ledger.seed, ledger.shuffle)
    skipped: list[int] = []
    for cursor in range(ep.cursor, ledger.num_chunks):
        c = order[cursor]
        if c not in busy:
            return replace(
                ep,
                cursor=cursor + 1,
                returned=ep.returned + tuple(skipped),
                leases=(*ep.leases, (c, learner)),
            ), c
        skipped.append(c)
    return ep, None


def lease(ledger: ChunkLedger, learner_id: str) -> tuple[ChunkLedger, Lease | None]:
    """Lease one chunk to ``learner_id``: ``(new_ledger, Lease(chunk, epoch))``.

    Returns ``(ledger, None)`` unchanged when no chunk can be leased now: every chunk of the
    open epoch(s) is leased or complete (retry after others complete or are released), or
    the ledger is :attr:`~ChunkLedger.finished`. A learner may hold several leases.
    """
    if not isinstance(learner_id, str) or not learner_id:
        raise LedgerError(f"learner_id must be a non-empty string, got {learner_id!r}")
    if ledger.finished:
        return ledger, None
    busy = _busy(ledger)
    epochs = list(ledger.epochs)
    for i, ep in enumerate(epochs):
        new_ep, chunk = _take(ledger, ep, busy, learner_id)
        if chunk is not None:
            epochs[i] = new_ep
            return replace(ledger, epochs=tuple(epochs)), Lease(chunk, ep.epoch)
    # Nothing available in the open epochs: open the next one if allowed.
    next_epoch = epochs[-1].epoch + 1 if epochs else ledger.epochs_completed
    may_open = not epochs or (ledger.overlap_epochs and len(epochs) == 1)
    if may_open and (ledger.max_epochs is None or next_epoch < ledger.max_epochs):
        new_ep, chunk = _take(ledger, EpochState(epoch=next_epoch), busy, learner_id)
        if chunk is not None:
            return replace(ledger, epochs=(*epochs, new_ep)), Lease(chunk, next_epoch)
    return ledger, None


def _epoch_done(ledger: ChunkLedger, ep: EpochState) -> bool:
    return ep.cursor == ledger.num_chunks and not ep.returned and not ep.leases


def complete(ledger: ChunkLedger, learner_id: str, chunk_id: int) -> ChunkLedger:
    """Record that ``learner_id`` finished its leased chunk ``chunk_id``.

    Raises :class:`LedgerError` if the chunk is not currently leased to that learner (never
    leased, already completed, released after a failure, or held by someone else). When this
    completes the current epoch, the epoch closes and the next one becomes current.
    """
    holder = _busy(ledger).get(chunk_id)
    if holder is None:
        raise LedgerError(
            f"learner {learner_id!r} cannot complete chunk {chunk_id}: it is not leased "
            "(never leased, already completed, or released after a failure)"
        )
    if holder[0] != learner_id:
        raise LedgerError(
            f"learner {learner_id!r} cannot complete chunk {chunk_id}: it is leased to "
            f"{holder[0]!r} (epoch {holder[1]})"
        )
    epochs = [
        replace(ep, leases=tuple(p for p in ep.leases if p[0] != chunk_id)) for ep in ledger.epochs
    ]
    done = ledger.epochs_completed
    while epochs and _epoch_done(ledger, epochs[0]):
        epochs.pop(0)
        done += 1
    return replace(
        ledger, epochs=tuple(epochs), epochs_completed=done, completions=ledger.completions + 1
    )


def release(ledger: ChunkLedger, learner_id: str, chunk_id: int | None = None) -> ChunkLedger:
    """Return ``learner_id``'s leased chunks (or just ``chunk_id``) to the pool.

    Use it when a learner fails, leaves or is declared dead: the chunks go back to the epoch
    they were leased in and are re-leased (to anyone) before any fresh chunk. Releasing a
    learner that holds nothing is a no-op, so duplicate failure reports are harmless.
    Raises :class:`LedgerError` if ``chunk_id`` is given and not leased to ``learner_id``.
    """
    if chunk_id is not None:
        holder = _busy(ledger).get(chunk_id)
        if holder is None or holder[0] != learner_id:
            who = "nobody" if holder is None else repr(holder[0])
            raise LedgerError(
                f"learner {learner_id!r} cannot release chunk {chunk_id}: it is leased to {who}"
            )

    def released(c: int, learner: str) -> bool:
        return learner == learner_id and (chunk_id is None or c == chunk_id)

    epochs = tuple(
        replace(
            ep,
            returned=ep.returned + tuple(c for c, lr in ep.leases if released(c, lr)),
            leases=tuple((c, lr) for c, lr in ep.leases if not released(c, lr)),
        )
        for ep in ledger.epochs
    )
    return replace(ledger, epochs=epochs)


def leases_of(ledger: ChunkLedger, learner_id: str) -> tuple[Lease, ...]:
    """The chunks ``learner_id`` holds now, in lease order within each epoch."""
    return tuple(
        Lease(c, ep.epoch) for ep in ledger.epochs for c, lr in ep.leases if lr == learner_id
    )


def holder(ledger: ChunkLedger, chunk_id: int) -> str | None:
    """The learner holding ``chunk_id`` now, or ``None``."""
    found = _busy(ledger).get(chunk_id)
    return None if found is None else found[0]


def completed_chunks(ledger: ChunkLedger, epoch: int) -> frozenset[int]:
    """Chunks completed in ``epoch`` (all of them for a closed epoch, none for a future one)."""
    if epoch < ledger.epochs_completed:
        return frozenset(range(ledger.num_chunks))
    for ep in ledger.epochs:
        if ep.epoch == epoch:
            order = _order(ledger.num_chunks, ep.epoch, ledger.seed, ledger.shuffle)
            leased = {c for c, _ in ep.leases}
            return frozenset(order[: ep.cursor]) - set(ep.returned) - leased
    return frozenset()


def check_invariants(ledger: ChunkLedger) -> None:
    """Raise :class:`LedgerError` if the state is inconsistent (used on load and in tests)."""
    n = ledger.num_chunks
    if n < 1 or ledger.epochs_completed < 0 or ledger.completions < 0:
        raise LedgerError("ledger: num_chunks, epochs_completed and completions out of range")
    max_open = 2 if ledger.overlap_epochs else 1
    if len(ledger.epochs) > max_open:
        raise LedgerError(f"ledger: {len(ledger.epochs)} open epochs, at most {max_open} allowed")
    seen_leases: set[int] = set()
    for i, ep in enumerate(ledger.epochs):
        if ep.epoch != ledger.epochs_completed + i:
            raise LedgerError(f"ledger: open epoch {ep.epoch} out of sequence")
        if ledger.max_epochs is not None and ep.epoch >= ledger.max_epochs:
            raise LedgerError(f"ledger: epoch {ep.epoch} beyond max_epochs {ledger.max_epochs}")
        if not 0 <= ep.cursor <= n:
            raise LedgerError(f"ledger: epoch {ep.epoch} cursor {ep.cursor} out of [0, {n}]")
        started = set(_order(n, ep.epoch, ledger.seed, ledger.shuffle)[: ep.cursor])
        leased = [c for c, _ in ep.leases]
        members = list(ep.returned) + leased
        if len(set(members)) != len(members) or not set(members) <= started:
            raise LedgerError(f"ledger: epoch {ep.epoch} returned/leased chunks are inconsistent")
        if seen_leases & set(leased):
            raise LedgerError(f"ledger: chunks {seen_leases & set(leased)} leased twice")
        seen_leases |= set(leased)
        if any(not isinstance(lr, str) or not lr for _, lr in ep.leases):
            raise LedgerError(f"ledger: epoch {ep.epoch} has an invalid learner id")
    if ledger.epochs and _epoch_done(ledger, ledger.epochs[0]):
        raise LedgerError(f"ledger: epoch {ledger.epochs[0].epoch} is complete but still open")


class LocalLedger:
    """A mutable holder of a :class:`ChunkLedger` for one process (simulator, tests).

    ``source(learner_id)`` gives a callable chunk source for
    :class:`~dipsjax.data.pipeline.BatchStream` that leases from this ledger.
    """

    def __init__(self, ledger: ChunkLedger) -> None:
        self.state = ledger

    def lease(self, learner_id: str) -> Lease | None:
        self.state, got = lease(self.state, learner_id)
        return got

    def complete(self, learner_id: str, chunk_id: int) -> None:
        self.state = complete(self.state, learner_id, chunk_id)

    def release(self, learner_id: str, chunk_id: int | None = None) -> None:
        self.state = release(self.state, learner_id, chunk_id)

    def source(self, learner_id: str) -> Callable[[], int | None]:
        def next_chunk() -> int | None:
            got = self.lease(learner_id)
            return None if got is None else got.chunk

        return next_chunk
