"""Token chunks as ArrayRecord files read through grain (RecordChunks), against the
in-memory indexing (MemoryChunks, BatchStream's)."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dipsjax.data import (
    BatchStream,
    MemoryChunks,
    RecordChunks,
    chunk_tokens,
    records,
    train_chunks,
    write_chunks,
)
from dipsjax.task import DataSource, check_source


@pytest.fixture(scope="module")
def austen():
    return train_chunks("austen", 4096)  # int32[868, 4097], byte tokens


def all_batches(src):
    return [src.batch(c, i) for c in range(src.num_chunks) for i in range(src.batches_per_chunk)]


def assert_same(a, b):
    assert a.num_chunks == b.num_chunks
    assert a.batches_per_chunk == b.batches_per_chunk
    assert a.tokens_per_batch == b.tokens_per_batch
    for c in range(a.num_chunks):
        for i in range(a.batches_per_chunk):
            x, y = a.batch(c, i), b.batch(c, i)
            assert x.dtype == y.dtype == np.int32, (c, i)
            assert x.shape == y.shape == (a.batch_size, a.seq_len + 1), (c, i)
            assert np.array_equal(x, y), (c, i)


def test_memory_chunks_index_as_batch_stream(austen):
    mem = MemoryChunks(austen, 8, 128)
    assert isinstance(mem, DataSource)
    check_source(mem)
    assert (mem.num_chunks, mem.batches_per_chunk, mem.tokens_per_batch) == (868, 4, 1024)
    stream = BatchStream(austen, batch_size=8, seq_len=128, source=list(range(868)))
    for c in range(868):
        for i in range(4):
            np.testing.assert_array_equal(mem.batch(c, i), stream.next_batch().tokens)


def test_austen_through_grain_equals_memory_bit_for_bit(austen, tmp_path):
    paths = write_chunks(tmp_path / "austen.array_record", austen)
    assert paths == [str(tmp_path / "austen.array_record")]
    rec = RecordChunks(paths[0], batch_size=8, seq_len=128)
    assert isinstance(rec, DataSource)
    check_source(rec)
    assert rec.chunk_len == 4096
    assert_same(rec, MemoryChunks(austen, 8, 128))
    # Random access, in any order, and the batch is the caller's (a copy).
    mem = MemoryChunks(austen, 8, 128)
    rng = np.random.default_rng(0)
    for c, i in zip(rng.integers(0, 868, 50), rng.integers(0, 4, 50), strict=True):
        np.testing.assert_array_equal(rec.batch(int(c), int(i)), mem.batch(int(c), int(i)))
    b = rec.batch(5, 1)
    b[:] = -1
    np.testing.assert_array_equal(rec.batch(5, 1), mem.batch(5, 1))


def test_shards_read_the_same(austen, tmp_path):
    chunks = austen[:37]
    paths = write_chunks(tmp_path / "train", chunks, shards=4)
    assert paths == records.shard_paths(tmp_path / "train", 4)
    assert [p.rsplit("-", 3)[-3:] for p in paths][1] == ["00001", "of", "00004"]
    mem = MemoryChunks(chunks, 4, 256)
    for given_paths in (paths, tmp_path / "train", str(tmp_path / "train")):
        rec = RecordChunks(given_paths, 4, 256)
        assert len(rec.paths) == 4 and rec.num_chunks == 37
        assert_same(rec, mem)
    # Shards of another write beside them, or one missing: refused, not mixed.
    write_chunks(tmp_path / "train", chunks, shards=2)
    with pytest.raises(ValueError, match="several writes"):
        RecordChunks(tmp_path / "train", 4, 256)
    assert_same(RecordChunks(paths, 4, 256), mem)  # named files still read
    for stale in records.shard_paths(tmp_path / "train", 2):
        Path(stale).unlink()
    Path(paths[2]).unlink()
    with pytest.raises(FileNotFoundError, match=r"shard file.*missing.*00002-of-00004"):
        RecordChunks(tmp_path / "train", 4, 256)
    paths = write_chunks(tmp_path / "train", chunks, shards=4)
    # One file read the same as the shards.
    single = write_chunks(tmp_path / "one", chunks)
    assert_same(RecordChunks(single, 4, 256), RecordChunks(paths, 4, 256))


def test_streamed_chunks_write_the_same(austen, tmp_path):
    # An iterable of chunks (a corpus larger than memory streams to disk), ids given as int64.
    gen = (c.astype(np.int64) for c in austen[:10])
    path = write_chunks(tmp_path / "streamed", gen)
    assert_same(RecordChunks(path, 2, 512), MemoryChunks(austen[:10], 2, 512))


@settings(max_examples=25)
@given(
    n=st.integers(1, 12),
    seq_len=st.integers(1, 8),
    batch_size=st.integers(1, 4),
    per_chunk=st.integers(1, 3),
    spare=st.integers(0, 5),
    shards=st.integers(1, 3),
)
def test_any_layout_equals_memory(
    tmp_path_factory, n, seq_len, batch_size, per_chunk, spare, shards
):
    # Including a chunk_len that is not a multiple of a batch: its tail is never read.
    chunk_len = batch_size * seq_len * per_chunk + spare
    tokens = np.random.default_rng(n).integers(0, 50_000, n * chunk_len + 1).astype(np.int32)
    chunks = chunk_tokens(tokens, chunk_len)
    shards = min(shards, n)
    paths = write_chunks(tmp_path_factory.mktemp("any") / "c", chunks, shards=shards)
    rec = RecordChunks(paths, batch_size, seq_len)
    assert rec.batches_per_chunk == chunk_len // (batch_size * seq_len) >= per_chunk
    assert_same(rec, MemoryChunks(chunks, batch_size, seq_len))


def test_a_chunk_is_read_once_for_its_batches(austen, tmp_path, monkeypatch):
    paths = write_chunks(tmp_path / "c", austen[:6])
    rec = RecordChunks(paths, 8, 128)
    reads = []
    source = rec.chunks._parent  # the decode map over the grain ArrayRecordDataSource
    real = type(source).__getitem__
    monkeypatch.setattr(
        type(source), "__getitem__", lambda self, k: (reads.append(k), real(self, k))[1]
    )
    for c in range(6):
        for i in range(4):
            rec.batch(c, i)
    assert reads == list(range(6))


def test_bad_paths_are_refused_clearly(austen, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no ArrayRecord file .*missing"):
        RecordChunks(tmp_path / "missing", 8, 128)
    with pytest.raises(FileNotFoundError, match="is a folder"):
        RecordChunks(tmp_path, 8, 128)
    with pytest.raises(ValueError, match="no record files"):
        RecordChunks([], 8, 128)
    junk = tmp_path / "junk.array_record"
    junk.write_bytes(b"this is not an array record file" * 10)
    with pytest.raises(ValueError, match=r"cannot read .*junk.array_record"):
        RecordChunks(junk, 8, 128)


def test_wrong_dtypes_and_shapes_are_refused_clearly(austen, tmp_path):
    with pytest.raises(TypeError, match=r"must be integers.*float32"):
        write_chunks(tmp_path / "f", austen[:2].astype(np.float32))
    with pytest.raises(TypeError, match=r"must be integers.*float64"):
        write_chunks(tmp_path / "g", [np.zeros(10, np.float64)])
    with pytest.raises(ValueError, match="do not fit int32"):
        write_chunks(tmp_path / "h", [np.full(10, 2**40, np.int64)])
    with pytest.raises(ValueError, match="chunk 1 holds 9 tokens, chunk 0 10"):
        write_chunks(tmp_path / "i", [np.zeros(10, np.int32), np.zeros(9, np.int32)])
    with pytest.raises(ValueError, match="no chunks"):
        write_chunks(tmp_path / "j", [])
    assert not (tmp_path / "j").exists()
    with pytest.raises(ValueError, match="shards > 1 needs a sized"):
        write_chunks(tmp_path / "k", iter(austen[:4]), shards=2)
    with pytest.raises(ValueError, match="3 chunks cannot fill 4 shards"):
        write_chunks(tmp_path / "l", austen[:3], shards=4)
    # Records someone else wrote: other dtypes, other lengths, not .npy at all.
    from array_record.python.array_record_module import ArrayRecordWriter

    def raw(name, records_):
        w = ArrayRecordWriter(str(tmp_path / name), "group_size:1")
        for r in records_:
            w.write(r)
        w.close()
        return tmp_path / name

    f32 = raw("f32", [_npy(np.zeros(9, "f4"))])
    with pytest.raises(TypeError, match=r"must be integers.*float32"):
        RecordChunks(f32, 2, 4)
    i64 = raw("i64", [_npy(np.zeros(9, np.int64))])
    with pytest.raises(TypeError, match="int64 tokens, not int32"):
        RecordChunks(i64, 2, 4)
    text = raw("text", [b"hello world"])
    with pytest.raises(ValueError, match="not a token chunk written by write_chunks"):
        RecordChunks(text, 2, 4)
    mixed = raw("mixed", [_npy(np.zeros(9, np.int32)), _npy(np.zeros(9, np.int64))])
    rec = RecordChunks(mixed, 2, 4)
    rec.batch(0, 0)
    with pytest.raises(TypeError, match="int64 tokens, not int32"):
        rec.batch(1, 0)
    short = raw("short", [_npy(np.zeros(9, np.int32)), _npy(np.zeros(5, np.int32))])
    with pytest.raises(ValueError, match="holds 5 tokens, the first 9"):
        RecordChunks(short, 2, 4).batch(1, 0)
    # Batches that do not fit, keys out of range.
    path = write_chunks(tmp_path / "ok", austen[:2])
    with pytest.raises(ValueError, match="does not fit a chunk of 4096"):
        RecordChunks(path, 64, 128)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        RecordChunks(path, 0, 128)
    rec = RecordChunks(path, 8, 128)
    with pytest.raises(IndexError, match=r"chunk 2 out of \[0, 2\)"):
        rec.batch(2, 0)
    with pytest.raises(IndexError, match=r"batch 4 out of \[0, 4\)"):
        rec.batch(0, 4)
    with pytest.raises(TypeError, match="integer token ids"):
        MemoryChunks(austen[:2].astype(np.float32), 8, 128)


def _npy(arr):
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()
