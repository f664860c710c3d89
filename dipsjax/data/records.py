"""Token chunks on disk as ArrayRecord files, read back through grain by ``(chunk, index)``.

:func:`write_chunks` writes the chunks of :func:`~dipsjax.data.pipeline.chunk_tokens`
(``int32[chunk_len + 1]`` each, from an array or any iterable, so a corpus larger than
memory streams to disk) as ArrayRecord records, one chunk a record, in one file or in
shards ``<path>-00000-of-00004`` ...; a record is the chunk as a ``.npy`` (so it says its
dtype and shape), written with ``group_size:1`` (what random access wants).

:class:`RecordChunks` is a :class:`~dipsjax.task.DataSource` on such files: ``batch(c, i)``
reads chunk ``c`` alone (random access; memory does not grow with the corpus) through a
grain pipeline::

    grain.MapDataset.source(ArrayRecordDataSource(paths))   # record c: bytes
        .map(decode)                                         # int32[chunk_len + 1]
        -> last chunk kept                                   # a chunk's batches decode it once
        -> FlatMapMapDataset(batch views)                    # item c * batches_per_chunk + i

and gives, bit for bit, what :class:`~dipsjax.data.pipeline.TokenChunks` (here also named
:class:`MemoryChunks`: the same chunks as an in-memory ``[num_chunks, chunk_len + 1]``
array) gives: batch ``i`` of chunk ``c`` is ``int32[batch_size, seq_len + 1]`` holding
sequences ``i*batch_size .. (i+1)*batch_size - 1`` of the chunk, sequence ``j`` being
``chunk[j*seq_len : (j+1)*seq_len + 1]``. ``tokens_per_batch = batch_size * seq_len`` and
``batches_per_chunk = chunk_len // (batch_size * seq_len)``, so a chunk's tokens past the
last whole batch are not read.

Example::

    from dipsjax.data import records, train_chunks
    paths = records.write_chunks("/data/austen.array_record", train_chunks("austen"), shards=4)
    source = records.RecordChunks(paths, batch_size=8, seq_len=256)   # or the path given
    tokens = source.batch(chunk=3, index=1)                           # int32[8, 257]

A :class:`~dipsjax.data.pipeline.BatchStream` over ``RecordChunks`` (as a learner reads a
task with ``records=``) reads each leased piece through a grain iterator over these
batches, whose state is its data position; with ``prefetch`` it reads ahead from a
background thread (the last decoded chunk is kept as one tuple, safe to share).

grain and array_record are imported with this module (not with :mod:`dipsjax.data`).
"""

from __future__ import annotations

import glob
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grain
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from dipsjax.data.pipeline import TokenChunks, check_batch_key, check_batch_shape

SHARD_FORMAT = "{path}-{index:05d}-of-{count:05d}"
"""The file name of shard ``index`` of ``count`` (the ArrayRecord convention)."""

WRITER_OPTIONS = "group_size:1"
"""ArrayRecord writer options: one record a group (random access), zstd level 3 (the
default; the byte-level Austen chunks take 3.1 MB instead of 14.5 MB)."""

PathArg = str | os.PathLike[str]


def shard_paths(path: PathArg, count: int) -> list[str]:
    """The file names :func:`write_chunks` gives ``count`` shards of ``path``."""
    return [SHARD_FORMAT.format(path=os.fspath(path), index=i, count=count) for i in range(count)]


def _npy_header(length: int) -> bytes:
    """The ``.npy`` bytes in front of an ``int32[length]`` chunk's data."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(length, dtype="<i4"), allow_pickle=False)
    return buf.getvalue()[: -4 * length]


def encode_chunk(chunk: np.ndarray) -> bytes:
    """The record of one chunk: an ``int32[chunk_len + 1]`` ``.npy``."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(chunk, dtype="<i4"), allow_pickle=False)
    return buf.getvalue()


def _as_int32_chunk(chunk: Any, where: str) -> np.ndarray:
    arr = np.asarray(chunk)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"{where}: token chunks must be integers (int32 ids), got dtype {arr.dtype}"
        )
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ValueError(f"{where}: a chunk must be 1-D int32[chunk_len + 1], got {arr.shape}")
    if arr.size and arr.dtype != np.int32:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < np.iinfo(np.int32).min or hi > np.iinfo(np.int32).max:
            raise ValueError(f"{where}: ids in [{lo}, {hi}] do not fit int32")
    return arr.astype("<i4", copy=False)


def write_chunks(
    path: PathArg,
    chunks: np.ndarray | Iterable[np.ndarray],
    *,
    shards: int = 1,
    options: str = WRITER_OPTIONS,
) -> list[str]:
    """Writes token chunks as ArrayRecord records; returns the files written, in order.

    ``chunks``: an ``[num_chunks, chunk_len + 1]`` integer array or an iterable of
    ``[chunk_len + 1]`` ones (written as int32; all of one length; at least one).
    ``shards > 1`` splits them into that many files of consecutive chunks (named by
    :func:`shard_paths`; reading the files in order gives the chunks in order), which
    needs ``len(chunks)``. Parent folders are made; a file there is replaced.
    """
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an integer >= 1, got {shards!r}")
    if isinstance(chunks, np.ndarray):
        if chunks.ndim != 2:
            raise ValueError(
                f"chunks must be [num_chunks, chunk_len + 1] or an iterable of chunks, "
                f"got an array of shape {chunks.shape}"
            )
        if chunks.dtype.kind not in "iu":
            raise TypeError(
                f"write_chunks: token chunks must be integers (int32 ids), got {chunks.dtype}"
            )
    if shards == 1:
        paths = [os.fspath(path)]
        bounds = None
    else:
        if not hasattr(chunks, "__len__"):
            raise ValueError("write_chunks: shards > 1 needs a sized chunks (an array or list)")
        n = len(chunks)  # type: ignore[arg-type]
        if n < shards:
            raise ValueError(f"write_chunks: {n} chunks cannot fill {shards} shards")
        paths = shard_paths(path, shards)
        bounds = [(k * n) // shards for k in range(shards + 1)]
    Path(paths[0]).parent.mkdir(parents=True, exist_ok=True)
    length = None
    count = 0
    shard = 0
    writer = ArrayRecordWriter(paths[0], options)
    try:
        for chunk in chunks:
            arr = _as_int32_chunk(chunk, f"write_chunks: chunk {count}")
            if length is None:
                length = arr.shape[0]
            elif arr.shape[0] != length:
                raise ValueError(
                    f"write_chunks: chunk {count} holds {arr.shape[0]} tokens, "
                    f"chunk 0 {length} (chunks are all chunk_len + 1 long)"
                )
            if bounds is not None and count == bounds[shard + 1]:
                writer.close()
                shard += 1
                writer = ArrayRecordWriter(paths[shard], options)
            writer.write(encode_chunk(arr))
            count += 1
    finally:
        writer.close()
    if count == 0:
        for p in paths:
            Path(p).unlink(missing_ok=True)
        raise ValueError("write_chunks: no chunks to write")
    return paths


def resolve_paths(paths: PathArg | Sequence[PathArg]) -> list[str]:
    """The files ``paths`` names: a file, a list of files, or a path given to
    :func:`write_chunks` with ``shards > 1`` (its ``-NNNNN-of-NNNNN`` files, in order).
    ``FileNotFoundError`` naming what is missing."""
    given = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not given:
        raise ValueError("RecordChunks: no record files given")
    files: list[str] = []
    for p in map(os.fspath, given):
        if os.path.isfile(p):
            files.append(p)
            continue
        found = sorted(glob.glob(glob.escape(p) + "-[0-9][0-9][0-9][0-9][0-9]-of-[0-9]*"))
        counts = {f.rsplit("-of-", 1)[1] for f in found}
        if len(counts) > 1:
            raise ValueError(
                f"shards of {p} of several writes ({', '.join(sorted(counts))} shards): "
                "remove the stale ones or name the files"
            )
        if found:
            expected = shard_paths(p, int(counts.pop()))
            missing = sorted(set(expected) - set(found))
            if missing:
                raise FileNotFoundError(f"shard file(s) missing: {', '.join(missing)}")
            files.extend(expected)
        elif os.path.isdir(p):
            raise FileNotFoundError(f"{p} is a folder, not an ArrayRecord file of token chunks")
        else:
            raise FileNotFoundError(
                f"no ArrayRecord file {p} (nor shards {p}-NNNNN-of-NNNNN); write it with "
                "dipsjax.data.records.write_chunks"
            )
    return files


MemoryChunks = TokenChunks
"""The in-memory source :class:`RecordChunks` is checked against: it is
:class:`~dipsjax.data.pipeline.TokenChunks` (the same class, under the name this module
has always given it)."""


class _Decode:
    """Record bytes -> ``int32[chunk_len + 1]`` (a grain map); a clear error for anything
    else."""

    def __init__(self, length: int, files: Sequence[str]) -> None:
        self.length = length
        self.files = list(files)
        self._header = _npy_header(length)

    def __call__(self, record: bytes) -> np.ndarray:
        if record.startswith(self._header) and len(record) == len(self._header) + 4 * self.length:
            return np.frombuffer(record, dtype="<i4", offset=len(self._header))
        arr = _parse(record, self.files)
        _as_int32_chunk(arr, f"a record of {', '.join(self.files)}")
        if arr.dtype != np.int32:
            raise TypeError(
                f"a record of {', '.join(self.files)} holds {arr.dtype} tokens, not int32 "
                "(write the chunks with write_chunks)"
            )
        raise ValueError(
            f"a record of {', '.join(self.files)} holds {arr.shape[0]} tokens, the first "
            f"{self.length}: every chunk is chunk_len + 1 long"
        )


def _parse(record: bytes, files: Sequence[str]) -> np.ndarray:
    try:
        return np.lib.format.read_array(io.BytesIO(record), allow_pickle=False)
    except ValueError as e:
        raise ValueError(
            f"{', '.join(files)}: a record is not a token chunk written by write_chunks ({e})"
        ) from None


class _LastChunk(grain.MapDataset):
    """Keeps the last item read: a chunk's batches, read in turn, decode it once."""

    def __init__(self, parent: grain.MapDataset) -> None:
        super().__init__(parent)
        self._last: tuple[int, Any] | None = None

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        last = self._last  # one tuple, swapped whole: safe to share between threads
        if last is not None and last[0] == index:
            return last[1]
        item = self._parent[index]
        self._last = (index, item)
        return item

    def __str__(self) -> str:
        return "LastChunk"


class _BatchViews(grain.experimental.FlatMapTransform):
    """A chunk -> its ``batches_per_chunk`` batches (views of it, no copy)."""

    def __init__(self, batches: int, batch_size: int, seq_len: int) -> None:
        self.max_fan_out = batches
        self.batch_size, self.seq_len = batch_size, seq_len

    def flat_map(self, chunk: np.ndarray) -> np.ndarray:
        # Sequence j of the chunk is chunk[j*L : (j+1)*L + 1]: overlapping windows, a view.
        chunk = np.ascontiguousarray(chunk, dtype=np.int32)
        step = chunk.itemsize * self.seq_len
        return np.ndarray(
            (self.max_fan_out, self.batch_size, self.seq_len + 1),
            dtype=np.int32,
            buffer=chunk,
            strides=(step * self.batch_size, step, chunk.itemsize),
        )


class RecordChunks:
    """:class:`~dipsjax.task.DataSource` on ArrayRecord files of token chunks
    (:func:`write_chunks`), read through grain one chunk at a time (module docstring).

    ``paths``: a file, a list of files (their chunks in order), or a path written with
    shards. Raises ``FileNotFoundError`` for a missing file, ``TypeError``/``ValueError``
    for records that are not ``int32`` chunks of one length or a batch that does not fit
    a chunk. Reading a chunk's batches in order reads and decodes it once.
    """

    def __init__(self, paths: PathArg | Sequence[PathArg], batch_size: int, seq_len: int):
        self.paths = resolve_paths(paths)
        try:
            source = grain.sources.ArrayRecordDataSource(self.paths)
        except Exception as e:  # the reader raises a bare RuntimeError/ValueError
            raise ValueError(
                f"cannot read {', '.join(self.paths)} as ArrayRecord files ({e})"
            ) from None
        self.num_chunks = len(source)
        if self.num_chunks < 1:
            raise ValueError(f"{', '.join(self.paths)} hold no chunks")
        try:
            first = source[0]
        except Exception as e:
            raise ValueError(f"cannot read a record of {self.paths[0]} ({e})") from None
        arr = _parse(first, self.paths[:1])
        _as_int32_chunk(arr, f"{self.paths[0]}, record 0")
        if arr.dtype != np.int32:
            raise TypeError(
                f"{self.paths[0]}: records hold {arr.dtype} tokens, not int32 "
                "(write the chunks with write_chunks)"
            )
        self.chunk_len = arr.shape[0] - 1
        self.batch_size, self.seq_len = check_batch_shape(self.chunk_len, batch_size, seq_len)
        self.batches_per_chunk = self.chunk_len // (batch_size * seq_len)
        self.tokens_per_batch = batch_size * seq_len
        self.chunks = _LastChunk(
            grain.MapDataset.source(source).map(_Decode(self.chunk_len + 1, self.paths))
        )
        self.dataset = grain.experimental.FlatMapMapDataset(
            self.chunks, _BatchViews(self.batches_per_chunk, batch_size, seq_len)
        )

    def batch(self, chunk: int, index: int) -> np.ndarray:
        """``int32[batch_size, seq_len + 1]``: batch ``index`` of chunk ``chunk`` (a copy:
        the caller owns it)."""
        check_batch_key(self, chunk, index)
        return np.array(self.dataset[chunk * self.batches_per_chunk + index], dtype=np.int32)

    def __repr__(self) -> str:
        return (
            f"RecordChunks({len(self.paths)} file(s), {self.num_chunks} chunks of "
            f"{self.chunk_len}, batch {self.batch_size} x {self.seq_len})"
        )
