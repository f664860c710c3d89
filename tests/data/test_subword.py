"""The byte-level BPE tokenizer (Hugging Face ``tokenizers``): training on the train split,
its cache, round trips, specials, user tokenizer files, specs, and exact bits per byte."""

import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax.data import (
    ByteTokenizer,
    SubwordTokenizer,
    Tokenizer,
    bits_per_byte,
    load_corpus,
    load_tokenizer,
    make_tokenizer,
    train_subword,
    validation_data,
)
from dipsjax.data import tokenizer as tokenizer_module


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(scope="module")
def bpe(cache):
    return train_subword("austen", 1024, cache_dir=cache)


@pytest.fixture
def folder(tmp_path):
    """A small user corpus: two training files and a held-out one (the last by name)."""
    root = tmp_path / "texts"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a", "b"):  # made-up words: enough pairs for 300 ids (no Q, Z or X)
        words = ["".join(rng.choice(list("abcdefghijklmnoprstuvwy"), rng.integers(1, 8)))]
        words += ["".join(rng.choice(list("abcdefghijklmnoprstuvwy"), 4)) for _ in range(3000)]
        (root / f"{name}.txt").write_text(" ".join(words) + " naïve café ☕\n")
    (root / "z_heldout.txt").write_text("QQQQ ZZZZ XXXX held out text only here QQQQ\n" * 20)
    return root


def test_trained_bpe_has_the_asked_vocabulary_and_specials(bpe):
    assert isinstance(bpe, Tokenizer)
    assert bpe.vocab_size == 1024 == bpe.hf.get_vocab_size(with_added_tokens=True)
    assert (bpe.pad_id, bpe.bos_id, bpe.eos_id, bpe.sep_id) == (0, 1, 2, 3)
    assert bpe.special_ids == (0, 1, 2, 3)
    assert [bpe.hf.id_to_token(i) for i in range(4)] == ["<pad>", "<bos>", "<eos>", "<sep>"]
    ids = bpe.encode("Emma Woodhouse, handsome, clever, and rich")
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert ids.min() >= 4 and ids.max() < 1024
    assert len(ids) < len("Emma Woodhouse, handsome, clever, and rich")  # merges are used


def test_corpus_text_round_trips(bpe):
    corpus = load_corpus("austen", "all")
    for name, text in zip(corpus.doc_names, corpus.texts, strict=True):
        ids = bpe.encode(text)
        assert bpe.decode(ids) == text, name
        assert not np.isin(ids, bpe.special_ids).any(), name


@given(st.text())
def test_any_text_round_trips(bpe, text):
    ids = bpe.encode(text)
    assert ids.dtype == np.int32
    assert bpe.decode(ids) == text
    assert ids.size == 0 or (ids.min() >= 0 and ids.max() < bpe.vocab_size)


def test_specials_are_ids_only_and_decode_drops_them(bpe):
    text = "before <bos> <pad><eos> <sep> after"
    ids = bpe.encode(text)
    assert not np.isin(ids, bpe.special_ids).any()  # the spelling of a special is text
    assert bpe.decode(ids) == text
    framed = np.concatenate([[bpe.bos_id], ids, [bpe.sep_id, bpe.eos_id, bpe.pad_id, -1, 5000]])
    assert bpe.decode(framed) == text


def test_cache_is_reused_and_training_is_deterministic(bpe, cache, tmp_path):
    path = tokenizer_module.subword_cache_path("austen", 1024, cache_dir=cache)
    assert path.name == "tokenizer.json" and path.is_file()
    assert path.parent.name.startswith("austen-bpe1024-")
    stamp = path.stat().st_mtime_ns
    again = train_subword("austen", 1024, cache_dir=cache)
    assert again == bpe and again.to_json() == bpe.to_json()
    assert path.stat().st_mtime_ns == stamp  # loaded, not written again
    assert again.source == str(path)
    fresh = train_subword("austen", 1024, cache_dir=tmp_path)  # trained again elsewhere
    assert fresh == bpe
    ids = fresh.encode("It is a truth universally acknowledged")
    np.testing.assert_array_equal(ids, bpe.encode("It is a truth universally acknowledged"))


def test_trains_on_the_train_split_only(folder, tmp_path, monkeypatch):
    seen = []
    real = tokenizer_module._train_bpe

    def spy(texts, vocab_size):
        seen.append(list(texts))
        return real(texts, vocab_size)

    monkeypatch.setattr(tokenizer_module, "_train_bpe", spy)
    tok = train_subword(folder, 300, cache_dir=tmp_path)
    assert len(seen) == 1 and len(seen[0]) == 2
    assert not any("QQQQ" in t for t in seen[0])
    assert tok.vocab_size == 300
    assert tok.decode(tok.encode("QQQQ ZZZZ")) == "QQQQ ZZZZ"  # unseen text still encodes
    # Another held-out document: other training texts, another cache entry.
    other = train_subword(folder, 300, validation_doc="a", cache_dir=tmp_path)
    assert len(seen) == 2 and any("QQQQ" in t for t in seen[1])
    assert tokenizer_module.subword_cache_path(
        folder, 300, cache_dir=tmp_path
    ) != tokenizer_module.subword_cache_path(folder, 300, "a", cache_dir=tmp_path)
    assert other != tok
    train_subword(folder, 300, cache_dir=tmp_path)
    assert len(seen) == 2  # the cache, no training


def test_bpe_spec_trains_on_the_corpus_given_and_caches_in_the_data_dir(folder, tmp_path):
    data_dir = tmp_path / "data"
    tok = load_tokenizer("bpe:300", corpus=folder, data_dir=data_dir)
    assert isinstance(tok, SubwordTokenizer) and tok.vocab_size == 300
    cached = list((data_dir / "tokenizers").glob("texts-bpe300-*/tokenizer.json"))
    assert len(cached) == 1 and tok.source == str(cached[0])
    assert make_tokenizer("bpe:300", corpus=folder, data_dir=data_dir) == tok
    assert make_tokenizer(cached[0]) == tok  # the cached file, as a user's path
    assert make_tokenizer("byte") == ByteTokenizer()


def test_a_user_tokenizer_json_loads(tmp_path):
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=["<s>", "</s>", "[PAD]"],  # no SEP: it is added
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(["hello world, hello there"] * 50, trainer)
    path = tmp_path / "mine" / "tokenizer.json"
    path.parent.mkdir()
    hf.save(str(path))
    base = hf.get_vocab_size()

    for spec in (str(path), path, str(path.parent)):
        tok = load_tokenizer(spec)
        assert isinstance(tok, SubwordTokenizer)
        assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
        assert tok.sep_id == base and tok.vocab_size == base + 1  # <sep> added at the end
        assert tok.decode(tok.encode("hello <s> wörld")) == "hello <s> wörld"
    assert make_tokenizer(str(path)) == load_tokenizer(path)
    named = SubwordTokenizer.from_file(path, sep="</s>")
    assert named.sep_id == named.eos_id == 1 and named.vocab_size == base
    copy = pickle.loads(pickle.dumps(tok))
    assert copy == tok and copy.special_ids == tok.special_ids
    np.testing.assert_array_equal(copy.encode("a <s> b"), tok.encode("a <s> b"))


def test_bad_specs_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer 'bpe'"):
        make_tokenizer("bpe")
    with pytest.raises(ValueError, match="'bpe:' takes a vocabulary size"):
        make_tokenizer("bpe:big")
    with pytest.raises(ValueError, match=r"unknown tokenizer 'wordpiece'.*'bpe:<vocab_size>'"):
        load_tokenizer("wordpiece")
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 261"):
        load_tokenizer("bpe:100")
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path)  # a folder without tokenizer.json
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError, match=r"not a Hugging Face tokenizer\.json"):
        load_tokenizer(bad)
    with pytest.raises(TypeError, match="tokenizer spec"):
        load_tokenizer(1024)  # type: ignore[arg-type]


def test_bits_per_byte_is_exact_with_bytes_per_token(bpe):
    val = validation_data("austen", bpe)
    texts = load_corpus("austen", "validation").texts
    num_tokens = sum(len(bpe.encode(t)) for t in texts)
    mask_total = sum(int(b.mask.sum()) for b in val.batches(batch_size=8, seq_len=256))
    assert mask_total == num_tokens  # every text token is a target once, BOS is not
    assert bpe.bytes_per_token(texts) == val.num_bytes / num_tokens
    assert 2.0 < bpe.bytes_per_token(texts) < 4.0  # ~2.7 for 1024 ids on Austen
    assert ByteTokenizer().bytes_per_token(texts) == 1.0
    mean_nats = 1.234  # any mean loss per target token
    expected = bits_per_byte(mean_nats * num_tokens, val.num_bytes)
    assert math.isclose(mean_nats / (math.log(2) * bpe.bytes_per_token(texts)), expected)
    with pytest.raises(ValueError, match="empty"):
        bpe.bytes_per_token("")
