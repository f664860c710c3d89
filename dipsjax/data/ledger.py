"""Chunk ledger: which learner trains which batches of which chunk, once per epoch.

The training corpus is cut into ``num_chunks`` fixed-size chunks (many more than learners),
each of ``batches_per_chunk`` batches. The ledger counts *batches*: what it leases, settles
and releases are *pieces*, ``(chunk, start, end)``, batches ``start .. end - 1`` of a chunk.
A fresh lease is a whole chunk, ``(c, 0, batches_per_chunk)``; a learner's round may end
inside a chunk, so a push settles (or gives back) only the batches it trained, and the rest
of the chunk stays with its learner. The ledger is *pure state* (a frozen dataclass of
ints, strings and tuples, JSON-serializable) and every operation is a function returning a
new ledger, so the owner (leader process, simulator, test) decides where it lives and when
it is checkpointed.

Operations:

* :func:`lease` gives a learner one piece to train (or ``None`` when none is available now):
  a piece given back first, else the next fresh chunk whole;
* :func:`settle` records that batches of the learner's pieces entered a decided round
  (applied or rejected: they are trained for this epoch); :func:`complete` settles the
  rest of a chunk the learner holds;
* :func:`release` gives a learner's pieces (all, some batches of them, or all but some)
  back to the pool (it failed, left, was declared dead, or a push of them was dropped
  while it reads on); they are leased again before any fresh chunk, oldest first.

Epochs. Epoch ``e`` hands out chunks in a deterministic order, :func:`epoch_order` (a
permutation seeded by ``(seed, e)`` when ``shuffle``, else ``0 .. num_chunks-1``). When every
chunk of epoch ``e`` is leased or complete, further leases come from epoch ``e + 1``
(``overlap_epochs=True``, the default, so fast learners never wait at an epoch boundary) or
return ``None`` until epoch ``e`` is complete (``overlap_epochs=False``). At most two epochs
are open at once, and the older one is always served first. ``max_epochs`` (``None`` =
unbounded) stops leasing after that many.

Invariants (checked by :func:`check_invariants`, tested under random lease / settle /
release sequences): within an epoch the pieces of a chunk (leased and given back) never
overlap, so no batch is held twice; a chunk has pieces leased in at most one open epoch;
every batch of an epoch is settled exactly once; a piece given back returns to the epoch it
was leased in.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

LEDGER_FORMAT = 2

Span = tuple[int, int, int]
"""Batches ``start .. end - 1`` of a chunk: ``(chunk, start, end)``."""


class LedgerError(ValueError):
    """An invalid ledger operation (the message names the chunk, batches, learner, holder)."""


class Lease(NamedTuple):
    """A piece leased to a learner: batches ``start .. end - 1`` of ``chunk``, counted in
    ``epoch``."""

    chunk: int
    epoch: int
    start: int
    end: int

    @property
    def span(self) -> Span:
        return (self.chunk, self.start, self.end)


@dataclass(frozen=True)
class EpochState:
    """Progress of one open epoch.

    ``order[:cursor]`` (see :func:`epoch_order`) have been leased (whole, at first);
    ``returned`` are pieces of them given back (released, or a chunk skipped whole because
    it was busy in the other open epoch), leased next, in order; ``leases`` are
    ``(chunk, start, end, learner)`` pieces in lease order. A batch of a started chunk is
    settled when no piece of ``returned`` or ``leases`` holds it.
    """

    epoch: int
    cursor: int = 0
    returned: tuple[Span, ...] = ()
    leases: tuple[tuple[int, int, int, str], ...] = ()


@dataclass(frozen=True)
class ChunkLedger:
    """Ledger state; build it with :func:`new_ledger`, change it with the module functions."""

    num_chunks: int
    batches_per_chunk: int = 1
    seed: int = 0
    shuffle: bool = True
    max_epochs: int | None = None
    overlap_epochs: bool = True
    epochs_completed: int = 0
    completions: int = 0  # chunks whose last batch was settled
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
                "returned": [list(p) for p in ep.returned],
                "leases": [list(p) for p in ep.leases],
            }
            for ep in self.epochs
        ]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChunkLedger:
        """Rebuild a ledger from :meth:`to_dict` output; validates it."""
        if d.get("format") != LEDGER_FORMAT:
            raise LedgerError(f"ledger format {d.get('format')!r} is not {LEDGER_FORMAT}")
        try:
            ledger = cls(
                num_chunks=int(d["num_chunks"]),
                batches_per_chunk=int(d["batches_per_chunk"]),
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
                        returned=tuple((int(c), int(s), int(e)) for c, s, e in ep["returned"]),
                        leases=tuple(
                            (int(c), int(s), int(e), str(lr)) for c, s, e, lr in ep["leases"]
                        ),
                    )
                    for ep in d["epochs"]
                ),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LedgerError(f"ledger: malformed state ({e!r})") from e
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
    batches_per_chunk: int,
    seed: int = 0,
    shuffle: bool = True,
    max_epochs: int | None = None,
    overlap_epochs: bool = True,
) -> ChunkLedger:
    """A fresh ledger at epoch 0 with nothing leased: ``num_chunks`` chunks of
    ``batches_per_chunk`` batches each (a :class:`~dipsjax.data.pipeline.BatchStream`'s
    ``batches_per_chunk``: what a lease of a whole chunk covers)."""
    if num_chunks < 1:
        raise LedgerError(f"num_chunks must be >= 1, got {num_chunks}")
    if batches_per_chunk < 1:
        raise LedgerError(f"batches_per_chunk must be >= 1, got {batches_per_chunk}")
    if seed < 0:
        raise LedgerError(f"seed must be >= 0, got {seed}")
    if max_epochs is not None and max_epochs < 1:
        raise LedgerError(f"max_epochs must be >= 1 or None, got {max_epochs}")
    return ChunkLedger(
        num_chunks=num_chunks,
        batches_per_chunk=batches_per_chunk,
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


# -- spans ---------------------------------------------------------------------------


def subtract(pieces: Iterable[Span], spans: Iterable[Span]) -> tuple[Span, ...]:
    """``pieces`` without the batches of ``spans`` (order kept, pieces split where cut)."""
    out = list(pieces)
    for c, s, e in spans:
        cut: list[Span] = []
        for pc, ps, pe in out:
            if pc != c or e <= ps or pe <= s:
                cut.append((pc, ps, pe))
                continue
            if ps < s:
                cut.append((pc, ps, s))
            if e < pe:
                cut.append((pc, e, pe))
        out = cut
    return tuple(out)


def _check_span(ledger: ChunkLedger, span: Any) -> Span:
    try:
        c, s, e = (int(x) for x in span)
    except (TypeError, ValueError) as err:
        raise LedgerError(f"a span is (chunk, start, end), got {span!r}") from err
    if not (0 <= c < ledger.num_chunks and 0 <= s < e <= ledger.batches_per_chunk):
        raise LedgerError(
            f"span {(c, s, e)} does not fit {ledger.num_chunks} chunks of "
            f"{ledger.batches_per_chunk} batches"
        )
    return (c, s, e)


def _busy(ledger: ChunkLedger) -> dict[int, int]:
    """Chunk with a leased piece -> the epoch it is leased in."""
    return {c: ep.epoch for ep in ledger.epochs for c, _, _, _ in ep.leases}


def _take(
    ledger: ChunkLedger, ep: EpochState, busy: dict[int, int], learner: str
) -> tuple[EpochState, Span | None]:
    """Lease the first available piece of ``ep`` (given-back ones first, then fresh ones)."""
    for i, (c, s, e) in enumerate(ep.returned):
        if busy.get(c, ep.epoch) == ep.epoch:
            returned = ep.returned[:i] + ep.returned[i + 1 :]
            return replace(ep, returned=returned, leases=(*ep.leases, (c, s, e, learner))), (
                c,
                s,
                e,
            )
    order = _order(ledger.num_chunks, ep.epoch, ledger.seed, ledger.shuffle)
    whole = ledger.batches_per_chunk
    skipped: list[Span] = []
    for cursor in range(ep.cursor, ledger.num_chunks):
        c = order[cursor]
        if c not in busy:
            return replace(
                ep,
                cursor=cursor + 1,
                returned=ep.returned + tuple(skipped),
                leases=(*ep.leases, (c, 0, whole, learner)),
            ), (c, 0, whole)
        skipped.append((c, 0, whole))
    return ep, None


def lease(ledger: ChunkLedger, learner_id: str) -> tuple[ChunkLedger, Lease | None]:
    """Lease one piece to ``learner_id``: ``(new_ledger, Lease(chunk, epoch, start, end))``.

    Returns ``(ledger, None)`` unchanged when nothing can be leased now: every batch of the
    open epoch(s) is leased or settled (retry after others settle or release), or the
    ledger is :attr:`~ChunkLedger.finished`. A learner may hold several pieces.
    """
    _check_learner(learner_id)
    if ledger.finished:
        return ledger, None
    busy = _busy(ledger)
    epochs = list(ledger.epochs)
    for i, ep in enumerate(epochs):
        new_ep, got = _take(ledger, ep, busy, learner_id)
        if got is not None:
            epochs[i] = new_ep
            return replace(ledger, epochs=tuple(epochs)), Lease(got[0], ep.epoch, *got[1:])
    # Nothing available in the open epochs: open the next one if allowed.
    next_epoch = epochs[-1].epoch + 1 if epochs else ledger.epochs_completed
    may_open = not epochs or (ledger.overlap_epochs and len(epochs) == 1)
    if may_open and (ledger.max_epochs is None or next_epoch < ledger.max_epochs):
        new_ep, got = _take(ledger, EpochState(epoch=next_epoch), busy, learner_id)
        if got is not None:
            return replace(ledger, epochs=(*epochs, new_ep)), Lease(got[0], next_epoch, *got[1:])
    return ledger, None


def _check_learner(learner_id: Any) -> None:
    if not isinstance(learner_id, str) or not learner_id:
        raise LedgerError(f"learner_id must be a non-empty string, got {learner_id!r}")


def _epoch_done(ledger: ChunkLedger, ep: EpochState) -> bool:
    return ep.cursor == ledger.num_chunks and not ep.returned and not ep.leases


def _holding(ep: EpochState, learner: str, span: Span) -> int | None:
    """Index of ``learner``'s leased piece of ``ep`` that contains ``span``."""
    c, s, e = span
    for i, (pc, ps, pe, lr) in enumerate(ep.leases):
        if lr == learner and pc == c and ps <= s and e <= pe:
            return i
    return None


def _locate(ledger: ChunkLedger, learner: str, span: Span) -> tuple[int, int] | None:
    for k, ep in enumerate(ledger.epochs):
        i = _holding(ep, learner, span)
        if i is not None:
            return k, i
    return None


def _not_held(ledger: ChunkLedger, learner: str, span: Span, verb: str) -> LedgerError:
    c = span[0]
    others = [
        f"{(pc, ps, pe)} to {lr!r} (epoch {ep.epoch})"
        for ep in ledger.epochs
        for pc, ps, pe, lr in ep.leases
        if pc == c
    ]
    held = "; leased: " + ", ".join(others) if others else ""
    return LedgerError(
        f"learner {learner!r} cannot {verb} batches {span[1]}..{span[2] - 1} of chunk {c}: "
        f"it does not hold them (never leased, already settled, or released){held}"
    )


def _cut(ledger: ChunkLedger, learner: str, span: Span, verb: str) -> tuple[list, int]:
    """The epochs with ``span`` cut out of ``learner``'s piece, and that epoch's index."""
    found = _locate(ledger, learner, span)
    if found is None:
        raise _not_held(ledger, learner, span, verb)
    k, i = found
    ep = ledger.epochs[k]
    pc, ps, pe, lr = ep.leases[i]
    _, s, e = span
    rest = [(pc, a, b, lr) for a, b in ((ps, s), (e, pe)) if a < b]
    epochs = list(ledger.epochs)
    epochs[k] = replace(ep, leases=ep.leases[:i] + tuple(rest) + ep.leases[i + 1 :])
    return epochs, k


def _close(ledger: ChunkLedger, epochs: list[EpochState], completions: int) -> ChunkLedger:
    done = ledger.epochs_completed
    while epochs and _epoch_done(ledger, epochs[0]):
        epochs.pop(0)
        done += 1
    return replace(ledger, epochs=tuple(epochs), epochs_completed=done, completions=completions)


def _has_pieces(ep: EpochState, chunk: int) -> bool:
    return any(c == chunk for c, _, _ in ep.returned) or any(c == chunk for c, *_ in ep.leases)


def settle(ledger: ChunkLedger, learner_id: str, spans: Iterable[Span]) -> ChunkLedger:
    """Record that ``learner_id``'s batches ``spans`` entered a decided round (applied or
    rejected): they are trained for their epoch. Raises :class:`LedgerError` if a span is
    not within a piece leased to that learner. A chunk whose last batch settles counts as
    complete; an epoch whose last batch settles closes, and the next one becomes current."""
    _check_learner(learner_id)
    completions = ledger.completions
    for given in spans:
        span = _check_span(ledger, given)
        epochs, k = _cut(ledger, learner_id, span, "settle")
        if not _has_pieces(epochs[k], span[0]):
            completions += 1
        ledger = replace(ledger, epochs=tuple(epochs))
    return _close(ledger, list(ledger.epochs), completions)


def complete(ledger: ChunkLedger, learner_id: str, chunk_id: int) -> ChunkLedger:
    """Settle every batch of chunk ``chunk_id`` that ``learner_id`` holds (a reader that
    trains whole chunks). Raises :class:`LedgerError` if it holds none of them (never
    leased, already completed, released, or held by someone else)."""
    mine = [p for p in leases_of(ledger, learner_id) if p.chunk == chunk_id]
    if not mine:
        raise _not_held(ledger, learner_id, (chunk_id, 0, ledger.batches_per_chunk), "complete")
    return settle(ledger, learner_id, [p.span for p in mine])


def release(
    ledger: ChunkLedger,
    learner_id: str,
    spans: Iterable[Span] | None = None,
    *,
    keep: Iterable[Span] = (),
) -> ChunkLedger:
    """Give ``learner_id``'s batches back to the pool: ``spans`` of its pieces, or (``None``)
    all it holds except the batches of ``keep`` (a push of them is still being decided).

    Use it when a learner fails, leaves or is declared dead, or when a push of its batches
    was dropped while it reads on: they go back to the epoch they were leased in and are
    leased again (to anyone) before any fresh chunk. Releasing all of a learner that holds
    nothing is a no-op, so duplicate failure reports are harmless. Raises
    :class:`LedgerError` if one of ``spans`` is not held by ``learner_id``.
    """
    _check_learner(learner_id)
    if spans is None:
        spans = subtract((p.span for p in leases_of(ledger, learner_id)), keep)
    for given in spans:
        span = _check_span(ledger, given)
        epochs, k = _cut(ledger, learner_id, span, "release")
        epochs[k] = replace(epochs[k], returned=(*epochs[k].returned, span))
        ledger = replace(ledger, epochs=tuple(epochs))
    return ledger


def holds(ledger: ChunkLedger, learner_id: str, span: Span) -> bool:
    """Whether ``learner_id`` holds every batch of ``span`` (within one leased piece)."""
    return _locate(ledger, learner_id, tuple(span)) is not None  # type: ignore[arg-type]


def leases_of(ledger: ChunkLedger, learner_id: str) -> tuple[Lease, ...]:
    """The pieces ``learner_id`` holds now, in lease order within each epoch."""
    return tuple(
        Lease(c, ep.epoch, s, e)
        for ep in ledger.epochs
        for c, s, e, lr in ep.leases
        if lr == learner_id
    )


def holder(ledger: ChunkLedger, chunk_id: int) -> str | None:
    """A learner holding a piece of ``chunk_id`` now (the first leased), or ``None``."""
    for ep in ledger.epochs:
        for c, _, _, lr in ep.leases:
            if c == chunk_id:
                return lr
    return None


def completed_chunks(ledger: ChunkLedger, epoch: int) -> frozenset[int]:
    """Chunks every batch of which settled in ``epoch`` (all of them for a closed epoch,
    none for a future one)."""
    if epoch < ledger.epochs_completed:
        return frozenset(range(ledger.num_chunks))
    for ep in ledger.epochs:
        if ep.epoch == epoch:
            order = _order(ledger.num_chunks, ep.epoch, ledger.seed, ledger.shuffle)
            open_ = {c for c, _, _ in ep.returned} | {c for c, *_ in ep.leases}
            return frozenset(order[: ep.cursor]) - open_
    return frozenset()


def settled_batches(ledger: ChunkLedger, epoch: int) -> frozenset[tuple[int, int]]:
    """``(chunk, batch)`` of ``epoch`` that settled (every batch, for a closed epoch)."""
    b = ledger.batches_per_chunk
    if epoch < ledger.epochs_completed:
        return frozenset((c, i) for c in range(ledger.num_chunks) for i in range(b))
    for ep in ledger.epochs:
        if ep.epoch == epoch:
            order = _order(ledger.num_chunks, ep.epoch, ledger.seed, ledger.shuffle)
            started = {(c, i) for c in order[: ep.cursor] for i in range(b)}
            pieces = list(ep.returned) + [(c, s, e) for c, s, e, _ in ep.leases]
            return frozenset(started - {(c, i) for c, s, e in pieces for i in range(s, e)})
    return frozenset()


def check_invariants(ledger: ChunkLedger) -> None:
    """Raise :class:`LedgerError` if the state is inconsistent (used on load and in tests)."""
    n, b = ledger.num_chunks, ledger.batches_per_chunk
    if n < 1 or b < 1 or ledger.epochs_completed < 0 or ledger.completions < 0:
        raise LedgerError(
            "ledger: num_chunks, batches_per_chunk, epochs_completed or completions out of range"
        )
    max_open = 2 if ledger.overlap_epochs else 1
    if len(ledger.epochs) > max_open:
        raise LedgerError(f"ledger: {len(ledger.epochs)} open epochs, at most {max_open} allowed")
    leased_in: dict[int, int] = {}
    for i, ep in enumerate(ledger.epochs):
        if ep.epoch != ledger.epochs_completed + i:
            raise LedgerError(f"ledger: open epoch {ep.epoch} out of sequence")
        if ledger.max_epochs is not None and ep.epoch >= ledger.max_epochs:
            raise LedgerError(f"ledger: epoch {ep.epoch} beyond max_epochs {ledger.max_epochs}")
        if not 0 <= ep.cursor <= n:
            raise LedgerError(f"ledger: epoch {ep.epoch} cursor {ep.cursor} out of [0, {n}]")
        if any(not isinstance(lr, str) or not lr for *_, lr in ep.leases):
            raise LedgerError(f"ledger: epoch {ep.epoch} has an invalid learner id")
        started = set(_order(n, ep.epoch, ledger.seed, ledger.shuffle)[: ep.cursor])
        held: set[tuple[int, int]] = set()
        pieces = list(ep.returned) + [(c, s, e) for c, s, e, _ in ep.leases]
        for c, s, e in pieces:
            if c not in started or not 0 <= s < e <= b:
                raise LedgerError(
                    f"ledger: epoch {ep.epoch} piece {(c, s, e)} is not within a started "
                    f"chunk of {b} batches"
                )
            batches = {(c, k) for k in range(s, e)}
            if held & batches:
                raise LedgerError(f"ledger: epoch {ep.epoch}: batches {held & batches} held twice")
            held |= batches
        for c, *_ in ep.leases:
            if leased_in.setdefault(c, ep.epoch) != ep.epoch:
                raise LedgerError(f"ledger: chunk {c} leased in two open epochs")
    if ledger.epochs and _epoch_done(ledger, ledger.epochs[0]):
        raise LedgerError(f"ledger: epoch {ledger.epochs[0].epoch} is complete but still open")


class LocalLedger:
    """A mutable holder of a :class:`ChunkLedger` for one process (simulator, tests).

    ``source(learner_id)`` gives a callable piece source for
    :class:`~dipsjax.data.pipeline.BatchStream` that leases from this ledger.
    """

    def __init__(self, ledger: ChunkLedger) -> None:
        self.state = ledger

    def lease(self, learner_id: str) -> Lease | None:
        self.state, got = lease(self.state, learner_id)
        return got

    def settle(self, learner_id: str, spans: Iterable[Span]) -> None:
        self.state = settle(self.state, learner_id, spans)

    def complete(self, learner_id: str, chunk_id: int) -> None:
        self.state = complete(self.state, learner_id, chunk_id)

    def release(
        self, learner_id: str, spans: Iterable[Span] | None = None, *, keep: Iterable[Span] = ()
    ) -> None:
        self.state = release(self.state, learner_id, spans, keep=keep)

    def source(self, learner_id: str) -> Callable[[], Span | None]:
        def next_piece() -> Span | None:
            got = self.lease(learner_id)
            return None if got is None else got.span

        return next_piece
