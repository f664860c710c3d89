"""Byte tokenizer, document encoding and the unigram entropy helper."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax.data import (
    ByteTokenizer,
    Tokenizer,
    bits_per_byte,
    encode_documents,
    make_tokenizer,
    unigram_entropy_bits,
)


def test_byte_tokenizer_ids():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 259
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (256, 257, 258)
    ids = tok.encode("Emma £")
    assert ids.dtype == np.int32
    assert ids.tolist() == list("Emma £".encode())
    assert make_tokenizer("byte") == tok
    with pytest.raises(ValueError, match="unknown tokenizer"):
        make_tokenizer("bpe")


@given(st.text())
def test_roundtrip_and_count(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert ids.min(initial=0) >= 0 and ids.max(initial=0) < 256
    with_specials = np.concatenate([[tok.bos_id], ids, [tok.eos_id, tok.pad_id]])
    assert tok.decode(with_specials) == text


@given(st.lists(st.text(), max_size=5))
def test_encode_documents_layout(texts):
    tok = ByteTokenizer()
    stream = encode_documents(texts, tok)
    assert stream.dtype == np.int32
    assert len(stream) == sum(len(t.encode()) for t in texts) + len(texts)
    assert int((stream == tok.bos_id).sum()) == len(texts)
    assert len(encode_documents(texts, tok, bos=False)) == sum(len(t.encode()) for t in texts)
    expected = []
    for t in texts:
        expected += [tok.bos_id, *t.encode()]
    assert stream.tolist() == expected


def test_unigram_entropy_known_values():
    assert unigram_entropy_bits("aaaa") == 0.0
    assert unigram_entropy_bits(b"ab") == pytest.approx(1.0)
    assert unigram_entropy_bits(bytes(range(256))) == pytest.approx(8.0)
    assert unigram_entropy_bits(np.array([0, 0, 0, 1])) == pytest.approx(
        -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    )
    # Text and its byte ids agree.
    text = "It is a truth universally acknowledged"
    assert unigram_entropy_bits(text) == unigram_entropy_bits(ByteTokenizer().encode(text))
    with pytest.raises(ValueError):
        unigram_entropy_bits(b"")


def test_bits_per_byte():
    assert bits_per_byte(math.log(2) * 10, 10) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bits_per_byte(1.0, 0)
