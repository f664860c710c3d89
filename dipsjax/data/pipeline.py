"""From a token stream to chunks, and from chunks to training and validation batches.

Chunks. :func:`chunk_tokens` cuts a stream of ``N`` tokens into ``(N - 1) // chunk_len``
chunks; chunk ``i`` is ``tokens[i*chunk_len : (i+1)*chunk_len + 1]`` (one token of overlap
with the next chunk), so each chunk holds exactly ``chunk_len`` next-token *targets* and every
target of the stream except the last ``(N - 1) % chunk_len`` belongs to exactly one chunk.

Training batches. :class:`BatchStream` reads chunks in the order given by a *source* (a fixed
sequence of chunk ids or pieces, or a callable such as a ledger lease) and yields :class:`Batch`
``tokens`` of shape ``int32[batch_size, seq_len + 1]`` (inputs ``[:, :-1]``, targets
``[:, 1:]``). A chunk holds ``chunk_len // seq_len`` sequences, read in order, and a whole
number of batches (a batch never spans chunks). Its :class:`StreamPosition` (a few ints) is
checkpointable, and ``BatchStream(..., position=p)`` continues exactly where the stream was
when ``p`` was taken. Each batch counts ``batch_size * seq_len`` tokens.

Validation. :func:`validation_batches` covers every target of a token stream exactly once with
padded batches and a mask; :func:`validation_data` gives the held-out text of a corpus with
its byte count, so ``bits/byte = sum(nll_nats * mask) / (ln 2 * num_bytes)``.

Corpora. :func:`train_chunks` and :func:`validation_data` take a built-in corpus name
(``austen``, ``shakespeare``) or the path of a folder of UTF-8 ``*.txt`` files, with
``validation_doc`` naming the held-out file(s) by stem (see :mod:`dipsjax.data.corpus`).
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


@dataclass(frozen=True)
class StreamPosition:
    """Where a :class:`BatchStream` stands; small, JSON-serializable, exact for resuming.

    ``chunk``: the chunk being read (``None`` between pieces); ``offset``: the next batch
    of it to read; ``start`` and ``end``: the piece being read, batches ``start .. end - 1``
    (``end`` ``None``: to the chunk's end); ``chunks_taken``: pieces taken from the source so
    far (the index of the next one in a fixed order); ``batches`` and ``tokens`` (``batches
    * batch_size * seq_len``): batches and target tokens yielded so far.
    """

    chunk: int | None = None
    offset: int = 0
    chunks_taken: int = 0
    batches: int = 0
    tokens: int = 0
    start: int = 0
    end: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamPosition:
        return cls(
            chunk=None if d["chunk"] is None else int(d["chunk"]),
            offset=int(d["offset"]),
            chunks_taken=int(d["chunks_taken"]),
            batches=int(d["batches"]),
            tokens=int(d["tokens"]),
            start=int(d.get("start", 0)),
            end=None if d.get("end") is None else int(d["end"]),
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
    """The :class:`~dipsjax.task.DataSource` of a token corpus cut into chunks
    (:func:`chunk_tokens`, ``int32[num_chunks, chunk_len + 1]``), read as batches
    ``int32[batch_size, seq_len + 1]``: batch ``b`` of chunk ``c`` holds sequences
    ``b*batch_size .. (b+1)*batch_size - 1`` of ``c``, sequence ``j`` being
    ``chunks[c, j*seq_len : (j+1)*seq_len + 1]``; each counts ``batch_size * seq_len``
    target tokens. ``chunk_len`` must be a multiple of ``batch_size * seq_len``: a batch
    never spans two chunks."""

    def __init__(self, chunks: np.ndarray, *, batch_size: int, seq_len: int) -> None:
        if chunks.ndim != 2 or chunks.shape[1] < 2:
            raise ValueError(f"chunks must be [num_chunks, chunk_len + 1], got {chunks.shape}")
        chunk_len = chunks.shape[1] - 1
        if batch_size < 1 or seq_len < 1 or chunk_len % (batch_size * seq_len):
            raise ValueError(
                f"chunk_len {chunk_len} must be a multiple of batch_size * seq_len "
                f"({batch_size} * {seq_len}) so that a batch never spans two chunks"
            )
        self.chunks = chunks
        self.batch_size, self.seq_len = batch_size, seq_len
        self.num_chunks = int(chunks.shape[0])
        self.batches_per_chunk = chunk_len // (batch_size * seq_len)
        self.tokens_per_batch = batch_size * seq_len
        self._columns = np.arange(seq_len + 1)[None, :]

    def batch(self, chunk: int, index: int) -> np.ndarray:
        seqs = index * self.batch_size + np.arange(self.batch_size)[:, None]
        return self.chunks[chunk, seqs * self.seq_len + self._columns].astype(np.int32)


class BatchStream:
    """Deterministic training batches from chunks in source order; resumable exactly.

    ``chunks`` is the output of :func:`chunk_tokens` (``[num_chunks, chunk_len + 1]``).
    ``chunk_len`` must be a multiple of ``batch_size * seq_len``: a batch never spans two
    chunks, so a learner holds one chunk at a time and can always finish it (no learner
    waits on a chunk held by another at an epoch boundary). Batch ``b`` of chunk ``c`` holds
    sequences ``b*batch_size .. (b+1)*batch_size - 1`` of ``c``, sequence ``j`` being
    ``chunks[c, j*seq_len : (j+1)*seq_len + 1]``.

    :meth:`next_batch` returns ``None`` when the source has no chunk now (a ledger may have
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
    ) -> None:
        if isinstance(chunks, np.ndarray):
            chunks = TokenChunks(chunks, batch_size=batch_size, seq_len=seq_len)
        check_source(chunks, "BatchStream")
        self.data = chunks
        self.num_chunks = chunks.num_chunks
        self.batches_per_chunk = chunks.batches_per_chunk
        self.tokens_per_batch = chunks.tokens_per_batch
        self.source = source
        pos = position if position is not None else StreamPosition()
        if pos.chunk is None and pos.offset != 0:
            raise ValueError(f"position {pos} has an offset but no chunk")
        if pos.chunk is not None and not (
            0 <= pos.chunk < self.num_chunks
            and pos.start <= pos.offset < (self.batches_per_chunk if pos.end is None else pos.end)
            and (pos.end is None or pos.end <= self.batches_per_chunk)
        ):
            raise ValueError(
                f"position {pos} does not fit {self.num_chunks} chunks of "
                f"{self.batches_per_chunk} batches"
            )
        self._position = pos

    @property
    def position(self) -> StreamPosition:
        """Position after the last batch returned (checkpoint this)."""
        return self._position

    @property
    def tokens_consumed(self) -> int:
        """Tokens yielded so far, ``batches * tokens_per_batch``."""
        return self._position.tokens

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
        end = self.batches_per_chunk if end is None else end
        tokens = self.data.batch(chunk, offset)
        finished = offset + 1 == end
        self._position = StreamPosition(
            chunk=None if finished else chunk,
            offset=0 if finished else offset + 1,
            chunks_taken=taken,
            batches=pos.batches + 1,
            tokens=pos.tokens + self.tokens_per_batch,
            start=0 if finished else start,
            end=None if finished or end == self.batches_per_chunk else end,
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
