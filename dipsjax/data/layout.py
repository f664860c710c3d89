"""Where batches come from: the training rows' layout over the corpus, and the fixed
validation set.

Training layout (EXTENSION: the papers read contiguous data). :class:`SpreadChunks` is a
:class:`~dipsjax.task.DataSource` over the chunks of
:class:`~dipsjax.data.pipeline.TokenChunks` (``int32[num_chunks, chunk_len + 1]``, or any
chunk reader indexable by chunk id) whose rows are drawn across the corpus. The corpus's
``S = num_chunks * spc`` sequences (``spc = chunk_len // seq_len`` a chunk; sequence ``k``
is sequence ``k % spc`` of chunk ``k // spc``) are put in the order of a fixed permutation
``perm`` seeded by ``seed``; chunk ``c`` holds sequences ``perm[c*spc : (c+1)*spc]``, and
its batch ``b`` the rows ``perm[c*spc + b*batch_size : c*spc + (b+1)*batch_size]``. So
every sequence is in exactly one batch of one chunk (the ledger's once-per-epoch guarantee
holds as for contiguous chunks), ``batch(chunk, index)`` is deterministic (leases, replay
and checkpoints work unchanged), and a batch's rows come from all over the corpus instead
of one contiguous window (``SimConfig.data_layout="spread"``; the default
``"contiguous"`` is :class:`~dipsjax.data.pipeline.TokenChunks`).

Validation set. :func:`spread_windows` places ``num_windows`` disjoint windows of
``seq_len`` targets evenly over a held-out token stream, the first at its start, the last
ending at its end; :func:`validation_windows` cuts them into :class:`EvalBatch` es of a
fixed number of rows (:data:`EVAL_ROWS`; the last one padded with masked-out rows), with a
mask that is false on padding and on targets in ``ignore_ids`` (BOS between documents),
so every window's targets are scored exactly once. The set depends only on the held-out
text, ``eval_tokens`` and ``seq_len``: not on the batch size, the number of learners, or
the method. Bits per byte are exact: ``sum(nll * mask) / (ln 2 * bytes)``, ``bytes`` the
UTF-8 bytes the scored targets spell (:func:`scored_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dipsjax.data.pipeline import EvalBatch

#: Rows of a validation batch (fewer when the set has fewer windows): fixed, so that the
#: validation loss does not depend on the training batch size.
EVAL_ROWS = 16

#: The training layouts ``SimConfig.data_layout`` names.
LAYOUTS = ("spread", "contiguous")


def spread_windows(num_tokens: int, seq_len: int, num_windows: int) -> np.ndarray:
    """``int64[W]``: the starts of ``W = min(num_windows, (num_tokens - 1) // seq_len)``
    windows ``tokens[s : s + seq_len + 1]`` spread evenly over a stream of ``num_tokens``
    tokens: ``s_w = floor(w * (num_tokens - 1 - seq_len) / (W - 1))``, so the first starts
    at 0, the last ends at the stream's last token, and their targets
    (``tokens[s + 1 : s + seq_len + 1]``) are disjoint."""
    if seq_len < 1 or num_windows < 1:
        raise ValueError(f"seq_len and num_windows must be >= 1, got {seq_len}, {num_windows}")
    fits = (num_tokens - 1) // seq_len
    if fits < 1:
        raise ValueError(
            f"the validation text has {num_tokens} tokens, fewer than the {seq_len + 1} "
            "of one window of seq_len targets"
        )
    w = min(num_windows, fits)
    if w == 1:
        return np.zeros(1, dtype=np.int64)
    span = num_tokens - 1 - seq_len
    return np.arange(w, dtype=np.int64) * span // (w - 1)


def num_windows(eval_tokens: int, seq_len: int) -> int:
    """Windows of ``seq_len`` targets that ``eval_tokens`` target tokens ask for (rounded
    up: the set holds ``eval_tokens`` targets when ``seq_len`` divides it)."""
    if eval_tokens < 1:
        raise ValueError(f"eval_tokens must be >= 1, got {eval_tokens}")
    return -(-eval_tokens // seq_len)


def validation_windows(
    tokens: np.ndarray,
    *,
    eval_tokens: int,
    seq_len: int,
    pad_id: int,
    ignore_ids: Sequence[int] = (),
    rows: int = EVAL_ROWS,
) -> list[EvalBatch]:
    """The fixed validation set of a held-out token stream (module docstring): the windows
    of :func:`spread_windows` for ``eval_tokens`` targets (all the text's whole windows if
    it is shorter), in :class:`EvalBatch` es of ``min(rows, windows)`` rows each, in order."""
    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    starts = spread_windows(tokens.shape[0], seq_len, num_windows(eval_tokens, seq_len))
    rows = max(1, min(rows, starts.shape[0]))
    windows = tokens[starts[:, None] + np.arange(seq_len + 1)[None, :]]
    mask = ~np.isin(windows[:, 1:], np.asarray(list(ignore_ids), dtype=np.int32))
    pad = -starts.shape[0] % rows
    if pad:
        windows = np.concatenate([windows, np.full((pad, seq_len + 1), pad_id, np.int32)])
        mask = np.concatenate([mask, np.zeros((pad, seq_len), bool)])
    return [
        EvalBatch(tokens=windows[i : i + rows], mask=mask[i : i + rows])
        for i in range(0, windows.shape[0], rows)
    ]


def scored_targets(batches: Sequence[EvalBatch]) -> np.ndarray:
    """The target tokens the mask scores, in order (``int32[n]``)."""
    return np.concatenate([np.asarray(b.tokens)[:, 1:][np.asarray(b.mask)] for b in batches])


def scored_bytes(batches: Sequence[EvalBatch], byte_lengths: np.ndarray) -> int:
    """The UTF-8 bytes the scored targets spell: ``sum(byte_lengths[t])`` over them
    (``byte_lengths[id]``: the bytes token ``id`` stands for, 0 for specials)."""
    return int(np.asarray(byte_lengths)[scored_targets(batches)].sum())


class SpreadChunks:
    """A :class:`~dipsjax.task.DataSource` whose batches draw their rows across the corpus
    (module docstring). ``chunks``: ``int32[num_chunks, chunk_len + 1]``, or a reader
    indexable by chunk id (``chunks[c]``, e.g. :class:`~dipsjax.data.records.RecordChunks`'s
    ``chunks``) with ``num_chunks`` and ``chunk_len`` given. ``chunk_len`` must be a multiple
    of ``batch_size * seq_len`` (as for :class:`~dipsjax.data.pipeline.TokenChunks`)."""

    def __init__(
        self,
        chunks: np.ndarray | Any,
        *,
        batch_size: int,
        seq_len: int,
        seed: int,
        num_chunks: int | None = None,
        chunk_len: int | None = None,
    ) -> None:
        if isinstance(chunks, np.ndarray):
            if chunks.ndim != 2 or chunks.shape[1] < 2:
                raise ValueError(f"chunks must be [num_chunks, chunk_len + 1], got {chunks.shape}")
            num_chunks, chunk_len = int(chunks.shape[0]), int(chunks.shape[1]) - 1
        elif num_chunks is None or chunk_len is None:
            raise ValueError("SpreadChunks: a chunk reader needs num_chunks and chunk_len")
        if batch_size < 1 or seq_len < 1 or chunk_len % (batch_size * seq_len):
            raise ValueError(
                f"chunk_len {chunk_len} must be a multiple of batch_size * seq_len "
                f"({batch_size} * {seq_len}) so that a chunk holds whole batches"
            )
        if num_chunks < 1:
            raise ValueError("SpreadChunks: no chunks")
        self._read: Callable[[int], np.ndarray] = chunks.__getitem__
        self.chunks = chunks
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.num_chunks = int(num_chunks)
        self.chunk_len = int(chunk_len)
        self.seqs_per_chunk = self.chunk_len // seq_len
        self.batches_per_chunk = self.chunk_len // (batch_size * seq_len)
        self.tokens_per_batch = batch_size * seq_len
        total = self.num_chunks * self.seqs_per_chunk
        self.order = np.random.default_rng(seed).permutation(total)
        self._columns = np.arange(seq_len + 1)

    def sequences(self, chunk: int, index: int) -> np.ndarray:
        """``int64[batch_size]``: the corpus sequences (ids ``k``, module docstring) of batch
        ``index`` of chunk ``chunk``."""
        if not (0 <= chunk < self.num_chunks and 0 <= index < self.batches_per_chunk):
            raise IndexError(
                f"batch ({chunk}, {index}) out of {self.num_chunks} chunks of "
                f"{self.batches_per_chunk} batches"
            )
        first = chunk * self.seqs_per_chunk + index * self.batch_size
        return self.order[first : first + self.batch_size]

    def batch(self, chunk: int, index: int) -> np.ndarray:
        """``int32[batch_size, seq_len + 1]``: the rows of :meth:`sequences`."""
        seqs = self.sequences(chunk, index)
        c, j = np.divmod(seqs, self.seqs_per_chunk)
        if isinstance(self.chunks, np.ndarray):
            return self.chunks[c[:, None], j[:, None] * self.seq_len + self._columns].astype(
                np.int32
            )
        out = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int32)
        for r in range(self.batch_size):
            out[r] = np.asarray(self._read(int(c[r])))[j[r] * self.seq_len + self._columns]
        return out

    def __repr__(self) -> str:
        return (
            f"SpreadChunks({self.num_chunks} chunks of {self.chunk_len}, batch "
            f"{self.batch_size} x {self.seq_len}, seed {self.seed})"
        )
