"""From a token stream to chunks, and from chunks to training and validation batches.

Chunks. :func:`chunk_tokens` cuts a stream of ``N`` tokens into ``(N - 1) // chunk_len``
chunks; chunk ``i`` is ``tokens[i*chunk_len : (i+1)*chunk_len + 1]`` (one token of overlap
with the next chunk), so each chunk holds exactly ``chunk_len`` next-token *targets* and every
target of the stream except the last ``(N - 1) % chunk_len`` belongs to exactly one chunk.
:class:`TokenChunks` is the :class:`~dipsjax.task.DataSource` of such chunks held in memory
(:class:`~dipsjax.data.records.RecordChunks` reads the same batches from ArrayRecord files).

Training batches. :class:`BatchStream` reads *pieces* (a chunk, or batches ``start .. end - 1``
of it: a ledger's lease) in the order given by a *source* (a fixed sequence, or a callable
such as a ledger lease) and yields :class:`Batch` ``tokens`` of shape ``int32[batch_size,
seq_len + 1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``). A chunk holds ``chunk_len //
seq_len`` sequences, read in order, and ``chunk_len // (batch_size * seq_len)`` batches (a
batch never spans chunks). Each batch counts ``batch_size * seq_len`` tokens.

grain is the loader within a piece: a piece is read through a grain dataset iterator,
``grain.MapDataset.range(start, end).map(read batch i of the chunk)
.to_iter_dataset(ReadOptions(...))``, in the caller's thread or, with ``prefetch=N``, up
to ``N`` batches ahead in a background thread (never past the piece: the next piece is
the ledger's to give). The iterator's checkpointable state is the data position within
the piece: :class:`StreamPosition` keeps the books (pieces taken, batches and tokens
yielded, the piece being read and the next batch of it) and grain's ``get_state()`` of
that piece's iterator verbatim (``reader``); ``BatchStream(..., position=p)`` opens the
piece again, restores the iterator with ``set_state(p.reader)`` and continues exactly where
the stream was when ``p`` was taken (the first batch read is checked against the books).
A position is a few ints and a small dict, JSON-serializable; positions written before
grain read the pieces (``offset`` without ``reader``) are read as before.

Validation. :func:`validation_batches` covers every target of a token stream exactly once with
padded batches and a mask; :func:`validation_data` gives the held-out text of a corpus with
its byte count, so ``bits/byte = sum(nll_nats * mask) / (ln 2 * num_bytes)``.

Corpora. :func:`train_chunks` and :func:`validation_data` take a built-in corpus name
(``austen``, ``shakespeare``) or the path of a folder of UTF-8 ``*.txt`` files, with
``validation_doc`` naming the held-out file(s) by stem (see :mod:`dipsjax.data.corpus`).
grain is imported when a stream reads its first piece (not with this module).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from dipsjax.data.corpus import load_corpus
from dipsjax.data.tokenizer import ByteTokenizer, Tokenizer, unigram_entropy_bits
from dipsjax.task import DataSource, check_source

DEFAULT_CHUNK_LEN = 4096
"""Default chunk size in tokens: 868 chunks of the Austen train split."""

Piece = int | tuple[int, int, int]
"""What a source gives: a chunk id (the whole chunk) or ``(chunk, start, end)``, batches
``start .. end - 1`` of it (a ledger's lease)."""

ChunkSource = Sequence[Piece] | np.ndarray | Callable[[], Piece | None]
"""Pieces to read: a sequence (indexed by :attr:`StreamPosition.chunks_taken`) or a
callable returning the next one, or ``None`` when none is available now."""


def num_chunks(num_tokens: int, chunk_len: int = DEFAULT_CHUNK_LEN) -> int:
    """How many chunks :func:`chunk_tokens` makes from ``num_tokens`` tokens."""
    if chunk_len < 1:
        raise ValueError(f"chunk_len must be >= 1, got {chunk_len}")
    return max(0, (num_tokens - 1) // chunk_len)


def chunk_tokens(tokens: np.ndarray, chunk_len: int = DEFAULT_CHUNK_LEN) -> np.ndarray:
    """Cut a 1-D token stream into ``int32[num_chunks, chunk_len + 1]`` (see module doc)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    n = num_chunks(tokens.shape[0], chunk_len)
    if n == 0:
        return np.zeros((0, chunk_len + 1), dtype=np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, chunk_len + 1)
    return windows[: n * chunk_len : chunk_len].astype(np.int32)


def train_chunks(
    name: str | os.PathLike[str] = "austen",
    chunk_len: int = DEFAULT_CHUNK_LEN,
    tokenizer: Tokenizer | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    validation_doc: str | Sequence[str] | None = None,
) -> np.ndarray:
    """Chunks of the train split of corpus ``name`` (every learner computes the same).

    ``name`` is a built-in corpus or a folder of UTF-8 ``*.txt`` files, ``validation_doc``
    the held-out document(s), for a folder by file stem (default: its last file), e.g.
    ``train_chunks("/data/mytexts", validation_doc="chapter9")``; see
    :func:`~dipsjax.data.corpus.load_corpus`.
    """
    corpus = load_corpus(name, "train", data_dir, validation_doc=validation_doc)
    return chunk_tokens(corpus.tokens(tokenizer), chunk_len)


def reader_state(next_index: int) -> dict[str, Any]:
    """grain's iterator state (``get_state()``) for a piece iterator about to read its
    ``next_index``-th batch: what a position without a ``reader`` (written before grain read
    the pieces, or made by hand from an offset) is restored with."""
    return {"next_index": int(next_index)}


@dataclass(frozen=True)
class StreamPosition:
    """Where a :class:`BatchStream` stands; small, JSON-serializable, exact for resuming.

    The books: ``chunks_taken``: pieces taken from the source so far (the index of the next
    one in a fixed order); ``batches`` and ``tokens`` (``batches * tokens_per_batch``):
    batches and target tokens yielded so far; ``chunk``: the chunk of the piece being read
    (``None`` between pieces), ``start`` and ``end`` that piece, batches ``start .. end - 1``
    (``end`` ``None``: to the chunk's end), ``offset`` the next batch of it to read.

    ``reader``: the state of grain's iterator over that piece (its ``get_state()``, kept
    verbatim; ``None`` between pieces): a resumed stream restores the iterator with it
    (``set_state``). A position given an ``offset`` but no ``reader`` (the form written
    before grain read the pieces) gets the state of an iterator about to read ``offset``
    (:func:`reader_state`).
    """

    chunk: int | None = None
    offset: int = 0
    chunks_taken: int = 0
    batches: int = 0
    tokens: int = 0
    start: int = 0
    end: int | None = None
    reader: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.chunk is not None and self.reader is None:
            object.__setattr__(self, "reader", reader_state(self.offset - self.start))

    __hash__ = None  # type: ignore[assignment]  # ``reader`` is a dict

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamPosition:
        """The position :meth:`to_dict` gave, or one of the older form (no ``reader``)."""
        reader = d.get("reader")
        if reader is not None and not isinstance(reader, dict):
            raise ValueError(f"stream position: reader must be grain's state dict, got {reader!r}")
        return cls(
            chunk=None if d["chunk"] is None else int(d["chunk"]),
            offset=int(d["offset"]),
            chunks_taken=int(d["chunks_taken"]),
            batches=int(d["batches"]),
            tokens=int(d["tokens"]),
            start=int(d.get("start", 0)),
            end=None if d.get("end") is None else int(d["end"]),
            reader=None if reader is None else dict(reader),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StreamPosition:
        return cls.from_dict(json.loads(text))


class Batch(NamedTuple):
    """One training batch.

    ``tokens``: ``int32[batch_size, seq_len + 1]`` (rows are consecutive sequences of
    ``chunk``), batch ``offset`` of the chunk; ``finished``: true when this is the last batch
    of the piece being read, which began at batch ``start`` (settle :attr:`piece` with the
    ledger once its work is safely kept).
    """

    tokens: np.ndarray
    chunk: int
    finished: bool
    offset: int = 0
    start: int = 0

    @property
    def piece(self) -> tuple[int, int, int]:
        """The piece read up to this batch, ``(chunk, start, offset + 1)``."""
        return (self.chunk, self.start, self.offset + 1)

    @property
    def inputs(self) -> np.ndarray:
        return self.tokens[:, :-1]

    @property
    def targets(self) -> np.ndarray:
        return self.tokens[:, 1:]


class TokenChunks:
    """The :class:`~dipsjax.task.DataSource` of a token corpus cut into chunks held in memory
    (:func:`chunk_tokens`, ``int32[num_chunks, chunk_len + 1]``), read as batches
    ``int32[batch_size, seq_len + 1]``: batch ``b`` of chunk ``c`` holds sequences
    ``b*batch_size .. (b+1)*batch_size - 1`` of ``c``, sequence ``j`` being
    ``chunks[c, j*seq_len : (j+1)*seq_len + 1]``; each counts ``batch_size * seq_len``
    target tokens. A chunk holds ``batches_per_chunk = chunk_len // (batch_size *
    seq_len)`` batches (at least one): a batch never spans two chunks, and a chunk's tokens
    past its last whole batch are not read. :class:`~dipsjax.data.records.RecordChunks`
    gives the same batches from ArrayRecord files (``records.MemoryChunks`` is this class).
    """

    def __init__(self, chunks: np.ndarray, batch_size: int, seq_len: int) -> None:
        chunks = np.asarray(chunks)
        if chunks.ndim != 2 or chunks.shape[1] < 2:
            raise ValueError(f"chunks must be [num_chunks, chunk_len + 1], got {chunks.shape}")
        if chunks.dtype.kind not in "iu":
            raise TypeError(f"chunks must hold integer token ids, got dtype {chunks.dtype}")
        self.chunks = chunks
        self.chunk_len = chunks.shape[1] - 1
        self.batch_size, self.seq_len = check_batch_shape(self.chunk_len, batch_size, seq_len)
        self.num_chunks = int(chunks.shape[0])
        if self.num_chunks < 1:
            raise ValueError(f"{type(self).__name__}: no chunks")
        self.batches_per_chunk = self.chunk_len // (batch_size * seq_len)
        self.tokens_per_batch = batch_size * seq_len
        self._columns = np.arange(seq_len + 1)[None, :]

    def batch(self, chunk: int, index: int) -> np.ndarray:
        """``int32[batch_size, seq_len + 1]``: batch ``index`` of chunk ``chunk``."""
        check_batch_key(self, chunk, index)
        seqs = index * self.batch_size + np.arange(self.batch_size)[:, None]
        return self.chunks[chunk, seqs * self.seq_len + self._columns].astype(np.int32)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.num_chunks} chunks of {self.chunk_len}, "
            f"batch {self.batch_size} x {self.seq_len})"
        )


def check_batch_shape(chunk_len: int, batch_size: int, seq_len: int) -> tuple[int, int]:
    """``(batch_size, seq_len)`` as ints, or a ``ValueError`` naming what does not fit."""
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if batch_size * seq_len > chunk_len:
        raise ValueError(
            f"a batch of {batch_size} x {seq_len} tokens does not fit a chunk of {chunk_len} "
            "(a batch never spans two chunks)"
        )
    return int(batch_size), int(seq_len)


def check_batch_key(src: Any, chunk: int, index: int) -> None:
    """An ``IndexError`` unless batch ``index`` of chunk ``chunk`` is one of ``src``'s."""
    if not 0 <= chunk < src.num_chunks:
        raise IndexError(f"chunk {chunk} out of [0, {src.num_chunks})")
    if not 0 <= index < src.batches_per_chunk:
        raise IndexError(f"batch {index} out of [0, {src.batches_per_chunk}) of chunk {chunk}")


class _ReadBatch:
    """Batch ``i`` of one chunk -> ``(i, batch)`` (the map of a piece's grain dataset; the
    index comes along so that the stream checks it against its books)."""

    def __init__(self, data: DataSource, chunk: int) -> None:
        self.data, self.chunk = data, chunk

    def __call__(self, index: int) -> tuple[int, Any]:
        return index, self.data.batch(self.chunk, index)


def piece_reader(data: DataSource, chunk: int, start: int, end: int, *, prefetch: int = 0) -> Any:
    """grain's iterator over batches ``start .. end - 1`` of ``chunk`` of ``data``, yielding
    ``(index, batch)``: ``MapDataset.range(start, end).map(...).to_iter_dataset(...)``,
    read in the caller's thread (``prefetch=0``) or up to ``prefetch`` batches ahead in one
    background thread. Its ``get_state()``/``set_state()`` are the position in the piece."""
    import grain

    options = grain.ReadOptions(num_threads=1 if prefetch else 0, prefetch_buffer_size=prefetch)
    dataset = grain.MapDataset.range(start, end).map(_ReadBatch(data, chunk))
    return iter(dataset.to_iter_dataset(options))


class BatchStream:
    """Deterministic training batches from pieces in source order, read through grain;
    resumable exactly (see the module docstring).

    ``chunks``: a :class:`~dipsjax.task.DataSource`, or the output of :func:`chunk_tokens`
    (``[num_chunks, chunk_len + 1]``, read as :class:`TokenChunks` with ``batch_size`` and
    ``seq_len``). A batch never spans two chunks, so a learner holds one chunk at a time and
    can always finish it (no learner waits on a chunk held by another at an epoch boundary).

    ``prefetch``: batches of the piece being read that grain reads ahead in a background
    thread (``0``, the default: each is read when asked for, in the caller's thread; the
    source's ``batch`` is then never called from another thread). It never reads past the
    piece, and changes no batch and no position.

    :meth:`next_batch` returns ``None`` when the source has no piece now (a ledger may have
    one later: calling again retries). Iterating stops at the first ``None``.
    """

    def __init__(
        self,
        chunks: np.ndarray | DataSource,
        *,
        batch_size: int = 0,
        seq_len: int = 0,
        source: ChunkSource,
        position: StreamPosition | None = None,
        prefetch: int = 0,
    ) -> None:
        if isinstance(chunks, np.ndarray):
            chunks = TokenChunks(chunks, batch_size=batch_size, seq_len=seq_len)
        check_source(chunks, "BatchStream")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"prefetch must be an integer >= 0, got {prefetch!r}")
        self.data = chunks
        self.num_chunks = chunks.num_chunks
        self.batches_per_chunk = chunks.batches_per_chunk
        self.tokens_per_batch = chunks.tokens_per_batch
        self.source = source
        self.prefetch = prefetch
        pos = position if position is not None else StreamPosition()
        if pos.chunk is None and (pos.offset != 0 or pos.reader is not None):
            raise ValueError(f"position {pos} has an offset or a reader state but no chunk")
        if pos.chunk is not None and not (
            0 <= pos.chunk < self.num_chunks
            and pos.start <= pos.offset < (self.batches_per_chunk if pos.end is None else pos.end)
            and (pos.end is None or pos.end <= self.batches_per_chunk)
        ):
            raise ValueError(
                f"position {pos} does not fit {self.num_chunks} chunks of "
                f"{self.batches_per_chunk} batches"
            )
        if pos.reader is not None and not isinstance(pos.reader, dict):
            raise ValueError(f"position {pos}: reader must be grain's state dict")
        self._position = pos
        self._reader: Any = None  # grain's iterator over the piece being read, once opened

    @property
    def position(self) -> StreamPosition:
        """Position after the last batch returned (checkpoint this)."""
        return self._position

    @property
    def tokens_consumed(self) -> int:
        """Tokens yielded so far, ``batches * tokens_per_batch``."""
        return self._position.tokens

    def close(self) -> None:
        """Stops the reader of the piece being read (its prefetch thread); the stream reads
        on from :attr:`position` when asked for another batch."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _next_piece(self, index: int) -> tuple[int, int, int] | None:
        if callable(self.source):
            piece = self.source()
        else:
            piece = self.source[index] if index < len(self.source) else None
        if piece is None:
            return None
        if isinstance(piece, int | np.integer):
            c, s, e = int(piece), 0, self.batches_per_chunk
        else:
            c, s, e = (int(x) for x in piece)
        if not 0 <= c < self.num_chunks:
            raise ValueError(f"chunk id {c} out of [0, {self.num_chunks})")
        if not 0 <= s < e <= self.batches_per_chunk:
            raise ValueError(
                f"piece {(c, s, e)}: batches out of [0, {self.batches_per_chunk}) of chunk {c}"
            )
        return c, s, e

    def next_batch(self) -> Batch | None:
        """The next batch, or ``None`` if the source has no piece now."""
        pos = self._position
        chunk, offset, taken = pos.chunk, pos.offset, pos.chunks_taken
        start, end = pos.start, pos.end
        if chunk is None:
            piece = self._next_piece(taken)
            if piece is None:
                return None
            chunk, start, end = piece
            offset, taken = start, taken + 1
            self._reader = piece_reader(self.data, chunk, start, end, prefetch=self.prefetch)
        end = self.batches_per_chunk if end is None else end
        if self._reader is None:  # resumed inside a piece: grain's iterator from its state
            self._reader = piece_reader(self.data, chunk, start, end, prefetch=self.prefetch)
            try:
                self._reader.set_state(pos.reader)
            except (KeyError, IndexError, TypeError, ValueError) as e:
                self.close()
                raise ValueError(f"position {pos}: grain cannot restore its reader ({e})") from e
        try:
            index, tokens = next(self._reader)
        except StopIteration:
            index = end
        if index != offset:
            self.close()
            raise ValueError(
                f"position {pos}: grain's reader of piece {(chunk, start, end)} reads batch "
                f"{index}, the books say batch {offset} (a reader state of another piece?)"
            )
        finished = offset + 1 == end
        reader = None if finished else self._reader.get_state()
        if finished:
            self.close()
        self._position = StreamPosition(
            chunk=None if finished else chunk,
            offset=0 if finished else offset + 1,
            chunks_taken=taken,
            batches=pos.batches + 1,
            tokens=pos.tokens + self.tokens_per_batch,
            start=0 if finished else start,
            end=None if finished or end == self.batches_per_chunk else end,
            reader=reader,
        )
        return Batch(tokens=tokens, chunk=chunk, finished=finished, offset=offset, start=start)

    def __iter__(self) -> Iterator[Batch]:
        while (batch := self.next_batch()) is not None:
            yield batch

    def take_round(self, num_steps: int) -> RoundData:
        """Up to ``num_steps`` batches for one learner round, with the batches it read as
        ``spans`` (what the ledger settles or takes back, and what replay draws again)
        and the start position. A span never covers two pieces (each is within one lease,
        even where two leased pieces of a chunk meet). Stops early if the source runs dry."""
        start = self.position
        batches: list[np.ndarray] = []
        spans: list[tuple[int, int, int]] = []
        for _ in range(num_steps):
            b = self.next_batch()
            if b is None:
                break
            batches.append(b.tokens)
            if spans and b.offset != b.start:  # on in the piece the last span is in
                spans[-1] = (b.chunk, spans[-1][1], b.offset + 1)
            else:
                spans.append((b.chunk, b.offset, b.offset + 1))
        return RoundData(batches, start, tuple(spans), self.position.tokens - start.tokens)


class RoundData(NamedTuple):
    """One round's batches: ``batches`` (int32 ``[B, L + 1]`` each), the stream ``start``
    position, the batches read as ``spans`` (``(chunk, start, end)``, in reading order),
    and the target ``tokens`` drawn (counted at the stream)."""

    batches: list[np.ndarray]
    start: StreamPosition
    spans: tuple[tuple[int, int, int], ...]
    tokens: int


class EvalBatch(NamedTuple):
    """A validation batch: ``tokens`` ``int32[B, L + 1]`` (PAD past the end) and ``mask``
    ``bool[B, L]``, true where the target ``tokens[:, 1:]`` counts."""

    tokens: np.ndarray
    mask: np.ndarray


def validation_batches(
    tokens: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    ignore_ids: Sequence[int] = (),
) -> Iterator[EvalBatch]:
    """Non-overlapping windows covering every target of ``tokens`` exactly once.

    Window ``w`` is ``tokens[w*seq_len : (w+1)*seq_len + 1]``, right-padded with ``pad_id``;
    the last batch is filled with all-PAD rows so every batch has the same shape. ``mask`` is
    false on padding and on targets in ``ignore_ids`` (e.g. BOS, which is not text), so
    ``mask.sum()`` over all batches is ``len(tokens) - 1`` minus the ignored targets.
    """
    tokens = np.asarray(tokens, dtype=np.int32)
    num_targets = max(0, tokens.shape[0] - 1)
    num_windows = -(-num_targets // seq_len)
    num_batches = -(-num_windows // batch_size)
    padded = np.full(num_batches * batch_size * seq_len + 1, pad_id, dtype=np.int32)
    padded[: tokens.shape[0]] = tokens
    valid = np.zeros(num_batches * batch_size * seq_len, dtype=bool)
    valid[:num_targets] = True
    valid &= ~np.isin(padded[1:], np.asarray(list(ignore_ids), dtype=np.int32))
    for b in range(num_batches):
        start = b * batch_size * seq_len
        rows = start + np.arange(batch_size)[:, None] * seq_len
        yield EvalBatch(
            tokens=padded[rows + np.arange(seq_len + 1)[None, :]],
            mask=valid[rows + np.arange(seq_len)[None, :]],
        )


@dataclass(frozen=True, eq=False)
class ValidationData:
    """The held-out text as tokens, with what bits-per-byte needs.

    ``tokens`` is ``[BOS] doc ...``; every text byte is a target once. ``num_bytes`` is the
    number of UTF-8 bytes of the text: ``bits/byte = sum(nll_nats * mask) / (ln 2 *
    num_bytes)`` over :meth:`batches`. ``unigram_bits_per_byte`` is the entropy of the
    text's byte distribution (the bits/byte of a unigram model).
    """

    doc_names: tuple[str, ...]
    tokens: np.ndarray
    num_bytes: int
    unigram_bits_per_byte: float
    tokenizer: Tokenizer

    def batches(self, batch_size: int, seq_len: int) -> Iterator[EvalBatch]:
        """:func:`validation_batches` ignoring BOS targets (so the mask counts text only)."""
        return validation_batches(
            self.tokens,
            batch_size=batch_size,
            seq_len=seq_len,
            pad_id=self.tokenizer.pad_id,
            ignore_ids=(self.tokenizer.bos_id,),
        )


def validation_data(
    name: str | os.PathLike[str] = "austen",
    tokenizer: Tokenizer | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    validation_doc: str | Sequence[str] | None = None,
) -> ValidationData:
    """The validation split of corpus ``name`` (default: Austen, *Persuasion*).

    ``name`` and ``validation_doc`` as in :func:`train_chunks` (pass the same ones to both).
    """
    tok = tokenizer if tokenizer is not None else ByteTokenizer()
    corpus = load_corpus(name, "validation", data_dir, validation_doc=validation_doc)
    text_bytes = b"".join(t.encode("utf-8") for t in corpus.texts)
    return ValidationData(
        doc_names=corpus.doc_names,
        tokens=corpus.tokens(tok),
        num_bytes=len(text_bytes),
        unigram_bits_per_byte=unigram_entropy_bits(text_bytes),
        tokenizer=tok,
    )
