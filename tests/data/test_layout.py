"""The training layout (rows drawn across the corpus, each sequence once an epoch) and the
fixed validation set (disjoint windows spread over the held-out text, scored once)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax.data import ByteTokenizer, chunk_tokens, validation_data
from dipsjax.data.layout import (
    EVAL_ROWS,
    SpreadChunks,
    scored_bytes,
    scored_targets,
    spread_windows,
    validation_windows,
)
from dipsjax.data.pipeline import TokenChunks


@given(n=st.integers(2, 3000), seq_len=st.integers(1, 70), want=st.integers(1, 200))
def test_spread_windows_are_disjoint_and_span_the_text(n, seq_len, want):
    fits = (n - 1) // seq_len
    if fits < 1:
        with pytest.raises(ValueError, match="fewer than"):
            spread_windows(n, seq_len, want)
        return
    starts = spread_windows(n, seq_len, want)
    w = min(want, fits)
    assert starts.shape == (w,)
    assert starts[0] == 0
    if w > 1:
        assert starts[-1] + seq_len == n - 1  # the last target is the text's last token
    # Targets s+1 .. s+seq_len: disjoint, in order, inside the text.
    assert np.all(np.diff(starts) >= seq_len)
    assert starts[-1] + seq_len <= n - 1
    # Even: gaps between consecutive windows differ by at most one token.
    if w > 2:
        gaps = np.diff(starts)
        assert gaps.max() - gaps.min() <= 1


@given(
    n=st.integers(2, 2000),
    seq_len=st.integers(1, 40),
    eval_tokens=st.integers(1, 1500),
    rows=st.integers(1, 9),
)
def test_validation_windows_score_each_window_target_once(n, seq_len, eval_tokens, rows):
    if (n - 1) // seq_len < 1:
        return
    bos, pad = 1000, 1001
    tokens = np.arange(n, dtype=np.int32)
    tokens[::97] = bos  # documents start with BOS: their targets are not scored
    batches = validation_windows(
        tokens, eval_tokens=eval_tokens, seq_len=seq_len, pad_id=pad, ignore_ids=(bos,), rows=rows
    )
    windows = min(-(-eval_tokens // seq_len), (n - 1) // seq_len)
    width = min(rows, windows)
    assert all(b.tokens.shape == (width, seq_len + 1) for b in batches)
    assert all(b.mask.shape == (width, seq_len) for b in batches)
    assert len(batches) == -(-windows // width)
    # Independently: positions are the token values where no BOS was written.
    starts = spread_windows(n, seq_len, windows)
    want = np.concatenate([np.arange(s + 1, s + seq_len + 1) for s in starts])
    want = want[tokens[want] != bos]
    got = scored_targets(batches)
    np.testing.assert_array_equal(got, tokens[want])
    assert len(set(want.tolist())) == want.size  # no target twice
    # Padding rows are masked out whole; all real rows are windows of the text.
    rows_all = np.concatenate([b.tokens for b in batches])
    mask_all = np.concatenate([b.mask for b in batches])
    assert not mask_all[windows:].any() and np.all(rows_all[windows:] == pad)
    for r, s in enumerate(starts):
        np.testing.assert_array_equal(rows_all[r], tokens[s : s + seq_len + 1])


def test_austen_validation_set_spreads_over_persuasion():
    val = validation_data("austen")
    n = val.tokens.shape[0]
    batches = validation_windows(val.tokens, eval_tokens=32768, seq_len=64, pad_id=256)
    assert len(batches) == 32768 // 64 // EVAL_ROWS
    rows = np.concatenate([b.tokens for b in batches])
    assert int(sum(b.mask.sum() for b in batches)) == 32768
    text = val.tokens
    np.testing.assert_array_equal(rows[0], text[:65])  # BOS, then the title page
    np.testing.assert_array_equal(rows[-1], text[n - 65 :])  # the novel's last 64 bytes
    assert scored_bytes(batches, np.ones(260, np.int64)) == 32768


def positions(num_tokens):
    """A token stream whose tokens are their own positions: a row says where it is from."""
    return chunk_tokens(np.arange(num_tokens, dtype=np.int32), chunk_len=64)


def test_every_sequence_is_in_exactly_one_batch_of_one_chunk():
    chunks = positions(64 * 12 + 5)  # 12 chunks of 64 targets
    src = SpreadChunks(chunks, batch_size=2, seq_len=8, seed=3)
    assert (src.num_chunks, src.batches_per_chunk, src.tokens_per_batch) == (12, 4, 16)
    starts = []
    for c in range(src.num_chunks):
        for i in range(src.batches_per_chunk):
            b = src.batch(c, i)
            assert b.shape == (2, 9) and b.dtype == np.int32
            # Each row is one sequence: 9 consecutive positions starting at a multiple of 8.
            np.testing.assert_array_equal(b - b[:, :1], np.broadcast_to(np.arange(9), b.shape))
            starts.extend(b[:, 0].tolist())
    assert sorted(starts) == list(range(0, 12 * 64, 8))  # each start once, none missing
    # The rows of a chunk come from across the corpus, not from its own window.
    origins = {s // 64 for c in range(3) for i in range(4) for s in src.batch(c, i)[:, 0]}
    assert len(origins) > 3
    # Deterministic: the same seed gives the same batches, another seed others.
    again = SpreadChunks(chunks.copy(), batch_size=2, seq_len=8, seed=3)
    other = SpreadChunks(chunks, batch_size=2, seq_len=8, seed=4)
    for c, i in [(0, 0), (5, 3), (11, 1)]:
        np.testing.assert_array_equal(src.batch(c, i), again.batch(c, i))
    assert any(
        not np.array_equal(src.batch(c, i), other.batch(c, i)) for c in range(12) for i in range(4)
    )
    # A chunk reader (records) gives the batches of the array.
    reader = SpreadChunks(
        list(chunks), batch_size=2, seq_len=8, seed=3, num_chunks=12, chunk_len=64
    )
    np.testing.assert_array_equal(reader.batch(7, 2), src.batch(7, 2))
    with pytest.raises(ValueError, match="multiple of batch_size"):
        SpreadChunks(chunks, batch_size=3, seq_len=8, seed=0)
    with pytest.raises(IndexError, match="out of 12 chunks"):
        src.batch(12, 0)


def test_spread_rows_are_the_contiguous_sequences_permuted():
    chunks = positions(64 * 5 + 1)
    flat = TokenChunks(chunks, batch_size=1, seq_len=8)
    src = SpreadChunks(chunks, batch_size=4, seq_len=8, seed=0)
    for c in range(src.num_chunks):
        for i in range(src.batches_per_chunk):
            for row, k in zip(src.batch(c, i), src.sequences(c, i), strict=True):
                np.testing.assert_array_equal(row, flat.batch(*divmod(int(k), 8)).ravel())


def test_bytes_per_token_of_scored_targets():
    tok = ByteTokenizer()
    tokens = np.array([tok.bos_id, *b"abc", tok.bos_id, *b"defgh"], dtype=np.int32)
    batches = validation_windows(
        tokens, eval_tokens=100, seq_len=3, pad_id=tok.pad_id, ignore_ids=(tok.bos_id,), rows=2
    )
    # 9 targets fit 3 windows of 3: starts 0, 3, 6 -> targets abc, [BOS]de, fgh (BOS unscored).
    assert bytes(scored_targets(batches).tolist()) == b"abcdefgh"
    lengths = np.zeros(tok.vocab_size, np.int64)
    lengths[:256] = 1
    assert scored_bytes(batches, lengths) == 8
    assert len(batches) == 2 and not batches[1].mask[1].any()  # a padding row
