"""Chunking, training batch streams (exact resume, ledger-driven coverage), validation."""

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dipsjax.data import (
    BatchStream,
    LocalLedger,
    StreamPosition,
    chunk_tokens,
    fixed_order,
    new_ledger,
    num_chunks,
    validation_batches,
)


@given(n=st.integers(0, 200), chunk_len=st.integers(1, 40))
def test_chunk_tokens_layout(n, chunk_len):
    tokens = np.arange(n, dtype=np.int32) * 7
    chunks = chunk_tokens(tokens, chunk_len)
    k = num_chunks(n, chunk_len)
    assert chunks.shape == (k, chunk_len + 1) and chunks.dtype == np.int32
    assert k == max(0, (n - 1) // chunk_len)
    for i in range(k):
        np.testing.assert_array_equal(chunks[i], tokens[i * chunk_len : (i + 1) * chunk_len + 1])
    # Every target (tokens[1:]) belongs to exactly one chunk, except the short tail.
    targets = chunks[:, 1:].reshape(-1)
    np.testing.assert_array_equal(targets, tokens[1 : 1 + k * chunk_len])


def _sizes():
    return st.tuples(
        st.integers(1, 6),  # chunks
        st.integers(1, 4),  # seq_len
        st.integers(1, 3),  # batch_size
        st.integers(1, 3),  # batches per chunk
    )


def _make_chunks(num, seq_len, batch, per_chunk, seed=0):
    chunk_len = seq_len * batch * per_chunk
    tokens = np.random.default_rng(seed).integers(0, 259, num * chunk_len + 1, dtype=np.int32)
    return chunk_tokens(tokens, chunk_len)


@given(sizes=_sizes(), epochs=st.integers(1, 2), seed=st.integers(0, 5))
def test_stream_contents_and_token_count(sizes, epochs, seed):
    num, seq_len, batch, per_chunk = sizes
    chunks = _make_chunks(num, seq_len, batch, per_chunk, seed)
    order = fixed_order(num, epochs, seed)
    stream = BatchStream(chunks, batch_size=batch, seq_len=seq_len, source=order)
    batches = list(itertools.islice(stream, len(order) * per_chunk + 1))  # bounded
    assert len(batches) == len(order) * per_chunk
    assert stream.tokens_consumed == len(batches) * batch * seq_len
    assert stream.position.batches == len(batches)
    for i, b in enumerate(batches):
        assert b.tokens.shape == (batch, seq_len + 1) and b.tokens.dtype == np.int32
        assert b.chunk == order[i // per_chunk]
        assert b.finished == (i % per_chunk == per_chunk - 1)
        np.testing.assert_array_equal(b.inputs, b.tokens[:, :-1])
        np.testing.assert_array_equal(b.targets, b.tokens[:, 1:])
    # Per epoch, the targets read are exactly all chunk targets, each once.
    per_epoch = num * per_chunk
    for e in range(epochs):
        got = np.concatenate(
            [
                np.concatenate([b.chunk * np.ones((batch, 1), int), b.targets], axis=1)
                for b in batches[e * per_epoch : (e + 1) * per_epoch]
            ]
        )
        rows = sorted(map(tuple, got.tolist()))
        expected = sorted(
            (c, *chunks[c, 1:][j * seq_len : (j + 1) * seq_len].tolist())
            for c in range(num)
            for j in range(batch * per_chunk)
        )
        assert rows == expected


@given(sizes=_sizes(), data=st.data())
def test_resume_is_exact_fixed_order(sizes, data):
    num, seq_len, batch, per_chunk = sizes
    chunks = _make_chunks(num, seq_len, batch, per_chunk)
    order = fixed_order(num, 2, seed=1)

    def make(position=None):
        return BatchStream(
            chunks, batch_size=batch, seq_len=seq_len, source=order, position=position
        )

    limit = len(order) * per_chunk
    full = list(itertools.islice(make(), limit + 1))
    assert len(full) == limit
    split = data.draw(st.integers(0, len(full)))
    first = make()
    head = [first.next_batch() for _ in range(split)]
    saved = first.position.to_json()
    tail = list(itertools.islice(make(StreamPosition.from_json(saved)), limit + 1))
    resumed = head + tail
    assert len(resumed) == len(full)
    for a, b in zip(resumed, full, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert (a.chunk, a.finished) == (b.chunk, b.finished)
    assert StreamPosition.from_json(saved).tokens == split * batch * seq_len


@settings(max_examples=30)
@given(sizes=_sizes(), seed=st.integers(0, 1000), learners=st.integers(1, 4))
def test_ledger_driven_learners_cover_each_epoch_exactly_once(sizes, seed, learners):
    """Learners read concurrently through one ledger; some settle what they read in the
    middle of a chunk (a round ending there), some crash (losing what they read since, which
    the ledger leases again from where they stopped) and some restart from a checkpoint.
    Every sequence of every chunk is kept exactly once per epoch, and the kept token counts
    add up."""
    num, seq_len, batch, per_chunk = sizes
    chunks = _make_chunks(num, seq_len, batch, per_chunk, seed)
    epochs = 2
    shared = LocalLedger(new_ledger(num, batches_per_chunk=per_chunk, seed=seed, max_epochs=epochs))
    rng = random.Random(seed)
    names = [f"L{i}" for i in range(learners)]

    def fresh(name, position=None):
        return BatchStream(
            chunks,
            batch_size=batch,
            seq_len=seq_len,
            source=shared.source(name),
            position=position,
        )

    streams = {n: fresh(n) for n in names}
    pending = {n: [] for n in names}  # (epoch, chunk, seq, row) read, not yet settled
    kept = []
    tokens_kept = 0

    def keep(name):
        nonlocal tokens_kept
        spans = sorted({(c, j // batch, j // batch + 1) for _, c, j, _ in pending[name]})
        shared.settle(name, spans)
        kept.extend(pending[name])
        tokens_kept += len(pending[name]) * seq_len
        pending[name] = []

    for _ in range(10_000):
        if shared.state.finished:
            break
        name = rng.choice(names)
        action = rng.random()
        if action < 0.1:  # crash: lose unsettled work, the ledger leases it again
            shared.release(name)
            streams[name], pending[name] = fresh(name), []
            continue
        if action < 0.2:  # restart from an exact checkpoint of the current position
            streams[name] = fresh(name, StreamPosition.from_json(streams[name].position.to_json()))
            continue
        if action < 0.3:  # a round ends here, inside a chunk or not: settle what it read
            keep(name)
            continue
        b = streams[name].next_batch()
        if b is None:
            continue
        leases = {
            c: ep.epoch for ep in shared.state.epochs for c, *_, lr in ep.leases if lr == name
        }
        for r in range(batch):
            pending[name].append((leases[b.chunk], b.chunk, b.offset * batch + r, b.tokens[r]))
        if b.finished:
            keep(name)
    assert shared.state.finished
    assert tokens_kept == epochs * num * batch * per_chunk * seq_len
    keys = sorted((e, c, j) for e, c, j, _ in kept)
    assert keys == [
        (e, c, j) for e in range(epochs) for c in range(num) for j in range(batch * per_chunk)
    ]
    for _, c, j, row in kept:
        np.testing.assert_array_equal(row, chunks[c, j * seq_len : (j + 1) * seq_len + 1])


def test_stream_rejects_bad_shapes_and_ids():
    chunks = _make_chunks(2, 4, 2, 1)
    with pytest.raises(ValueError, match="never spans two chunks"):
        BatchStream(chunks, batch_size=3, seq_len=4, source=[0])
    with pytest.raises(ValueError, match="out of"):
        BatchStream(chunks, batch_size=2, seq_len=4, source=[5]).next_batch()
    with pytest.raises(ValueError, match="does not fit"):
        BatchStream(chunks, batch_size=2, seq_len=4, source=[0], position=StreamPosition(9, 0))


def test_callable_source_none_then_more():
    chunks = _make_chunks(3, 2, 1, 2)
    supply = [None, 2, None, 0]
    stream = BatchStream(chunks, batch_size=1, seq_len=2, source=lambda: supply.pop(0))
    assert stream.next_batch() is None
    assert [stream.next_batch().chunk for _ in range(2)] == [2, 2]
    assert stream.next_batch() is None
    assert stream.next_batch().chunk == 0
    assert stream.position == StreamPosition(chunk=0, offset=1, chunks_taken=2, batches=3, tokens=6)


@given(n=st.integers(0, 60), seq_len=st.integers(1, 7), batch=st.integers(1, 4))
def test_validation_batches_cover_each_target_once(n, seq_len, batch):
    bos, pad = 257, 256
    tokens = np.random.default_rng(n).integers(0, 256, n).astype(np.int32)
    if n:
        tokens[0] = bos
    if n > 10:
        tokens[7] = bos  # a second document
    out = list(
        validation_batches(tokens, batch_size=batch, seq_len=seq_len, pad_id=pad, ignore_ids=(bos,))
    )
    targets = []
    for eb in out:
        assert eb.tokens.shape == (batch, seq_len + 1) and eb.mask.shape == (batch, seq_len)
        assert eb.mask.dtype == bool
        targets += eb.tokens[:, 1:][eb.mask].tolist()
        assert np.isin(eb.tokens[:, 1:][~eb.mask], [bos, pad]).all()
    expected = [t for t in tokens[1:].tolist() if t != bos]
    assert targets == expected  # in order, every non-BOS target once
    # Inputs preceding each target are the true previous tokens.
    if out:
        flat = np.concatenate([eb.tokens[:, :-1].reshape(-1) for eb in out])
        np.testing.assert_array_equal(flat[: max(0, n - 1)], tokens[: max(0, n - 1)])


class _Recording:
    """A DataSource over TokenChunks that records every (chunk, index) read."""

    def __init__(self, inner):
        self.inner, self.reads = inner, []
        self.num_chunks = inner.num_chunks
        self.batches_per_chunk = inner.batches_per_chunk
        self.tokens_per_batch = inner.tokens_per_batch

    def batch(self, chunk, index):
        self.reads.append((chunk, index))
        return self.inner.batch(chunk, index)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_grain_reader_state_is_the_position_and_resumes_exactly(prefetch, tmp_path):
    # Pieces as a ledger leases them: whole chunks and parts, two parts of one chunk in a
    # row. A stream read to batch k and checkpointed (JSON) gives, resumed, exactly the rest
    # of the uninterrupted stream, for every k (piece boundaries included), read from memory
    # and from ArrayRecord files, with grain reading ahead or not.
    from dipsjax.data import RecordChunks, write_chunks
    from dipsjax.data.pipeline import TokenChunks

    chunks = _make_chunks(5, 4, 2, 3)  # 5 chunks of 3 batches of 2 x 4
    pieces = [(3, 0, 3), 1, (0, 1, 3), (4, 0, 1), (4, 1, 3), (2, 2, 3), 0]
    sources = [
        TokenChunks(chunks, batch_size=2, seq_len=4),
        RecordChunks(write_chunks(tmp_path / "c", chunks), 2, 4),
    ]
    # The reference: each piece's batches from the source's batch(), in order.
    want = [
        (c, i)
        for p in pieces
        for c, s, e in [(p, 0, 3) if isinstance(p, int) else p]
        for i in range(s, e)
    ]
    assert len(want) == 15
    for data in sources:

        def make(position=None, data=data):
            return BatchStream(data, source=pieces, position=position, prefetch=prefetch)

        full = list(make())
        assert [(b.chunk, b.offset) for b in full] == want
        for b, (c, i) in zip(full, want, strict=True):
            np.testing.assert_array_equal(b.tokens, sources[0].batch(c, i))
        for k in range(len(full) + 1):
            head = make()
            for _ in range(k):
                head.next_batch()
            pos = head.position
            # The books, and grain's iterator state of the piece being read, kept verbatim.
            assert pos.batches == k and pos.tokens == k * 8
            if pos.chunk is None:
                assert pos.reader is None and (k == 0 or full[k - 1].finished)
            else:
                assert pos.reader == head._reader.get_state()
                assert pos.reader == {"next_index": pos.offset - pos.start}
            text = pos.to_json()
            head.close()
            tail = list(make(StreamPosition.from_json(text)))
            assert len(tail) == len(full) - k
            for a, b in zip(tail, full[k:], strict=True):
                assert (a.chunk, a.offset, a.start, a.finished) == (
                    b.chunk,
                    b.offset,
                    b.start,
                    b.finished,
                )
                np.testing.assert_array_equal(a.tokens, b.tokens)


def test_old_positions_read_and_a_wrong_reader_state_is_refused():
    chunks = _make_chunks(3, 4, 2, 3)
    pieces = [(2, 0, 3), (1, 1, 3)]
    full = list(BatchStream(chunks, batch_size=2, seq_len=4, source=pieces))
    # A checkpoint written before grain read the pieces: offset, no reader.
    old = {
        "chunk": 1,
        "offset": 2,
        "chunks_taken": 2,
        "batches": 4,
        "tokens": 32,
        "start": 1,
        "end": None,
    }
    pos = StreamPosition.from_dict(old)
    assert pos.reader == {"next_index": 1}
    assert StreamPosition.from_json(pos.to_json()) == pos
    tail = list(BatchStream(chunks, batch_size=2, seq_len=4, source=pieces, position=pos))
    assert [(b.chunk, b.offset) for b in tail] == [(1, 2)]
    np.testing.assert_array_equal(tail[0].tokens, full[-1].tokens)
    # Oldest form (no start/end either): a whole chunk.
    older = {"chunk": 2, "offset": 1, "chunks_taken": 1, "batches": 1, "tokens": 8}
    tail = list(
        BatchStream(
            chunks, batch_size=2, seq_len=4, source=pieces, position=StreamPosition.from_dict(older)
        )
    )
    assert [(b.chunk, b.offset) for b in tail] == [(2, 1), (2, 2), (1, 1), (1, 2)]
    # grain's state and the books disagree: named, not read from the wrong batch.
    bad = StreamPosition(
        chunk=2, offset=1, chunks_taken=1, batches=1, tokens=8, reader={"next_index": 2}
    )
    with pytest.raises(ValueError, match="reads batch 2, the books say batch 1"):
        BatchStream(chunks, batch_size=2, seq_len=4, source=pieces, position=bad).next_batch()
    bad = StreamPosition(
        chunk=2, offset=1, chunks_taken=1, batches=1, tokens=8, reader={"next_index": 7}
    )
    with pytest.raises(ValueError, match="grain cannot restore its reader"):
        BatchStream(chunks, batch_size=2, seq_len=4, source=pieces, position=bad).next_batch()
    with pytest.raises(ValueError, match="reader must be grain's state dict"):
        StreamPosition.from_dict(dict(old, reader=[1]))
    with pytest.raises(ValueError, match="prefetch must be an integer >= 0"):
        BatchStream(chunks, batch_size=2, seq_len=4, source=pieces, prefetch=-1)


def test_prefetch_reads_ahead_within_the_piece_only():
    from dipsjax.data.pipeline import TokenChunks

    data = _Recording(TokenChunks(_make_chunks(4, 2, 1, 6), batch_size=1, seq_len=2))
    given = []

    def lease():  # a ledger: the next piece is given only when asked for
        piece = [(1, 1, 4), (3, 0, 6)][len(given)] if len(given) < 2 else None
        given.append(piece)
        return piece

    stream = BatchStream(data, source=lease, prefetch=8)
    got = [stream.next_batch() for _ in range(3)]
    assert [(b.chunk, b.offset, b.finished) for b in got] == [
        (1, 1, False),
        (1, 2, False),
        (1, 3, True),
    ]
    assert len(given) == 1 and sorted(data.reads) == [(1, 1), (1, 2), (1, 3)]
    assert [stream.next_batch().offset for _ in range(6)] == list(range(6))
    assert stream.next_batch() is None and stream.position.reader is None
    assert sorted(data.reads)[3:] == [(3, i) for i in range(6)]
