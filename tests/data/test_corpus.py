"""The installed corpora: exact sizes, splits, checksum errors, user files.

These read the corpus installed by ``python -m dipsjax.data.fetch`` (``scripts/setup.sh``);
when it is missing they fail with the message that says how to get it.
"""

import shutil

import numpy as np
import pytest

from dipsjax.data import (
    ByteTokenizer,
    CorpusError,
    chunk_tokens,
    corpus_documents,
    data_dir,
    load_corpus,
    load_text_files,
    num_chunks,
    train_chunks,
    unigram_entropy_bits,
    validation_data,
)
from dipsjax.data.fetch import FIX_HINT

# UTF-8 bytes of each novel as extracted (lines joined by "\n", final "\n").
AUSTEN_BYTES = {
    "sensesensibility": 673_688,
    "prideprejudice": 684_768,
    "mansfieldpark": 883_280,  # one "£": 883_279 characters
    "emma": 883_028,
    "northangerabbey": 433_411,
    "persuasion": 466_854,
}


def test_austen_documents_and_sizes():
    everything = load_corpus("austen", "all")
    assert everything.doc_names == corpus_documents("austen")
    sizes = {
        n: len(t.encode()) for n, t in zip(everything.doc_names, everything.texts, strict=True)
    }
    assert sizes == AUSTEN_BYTES
    assert everything.texts[everything.doc_names.index("emma")].startswith("EMMA\n\nBy Jane Austen")


def test_austen_split_token_counts_exact():
    train = load_corpus("austen", "train")
    val = load_corpus("austen", "validation")
    assert val.doc_names == ("persuasion",)
    assert "persuasion" not in train.doc_names and len(train.doc_names) == 5
    train_bytes = sum(v for k, v in AUSTEN_BYTES.items() if k != "persuasion")
    assert train.num_bytes == train_bytes == 3_558_175
    assert train.num_chars == train_bytes - 1
    tokens = train.tokens()
    assert len(tokens) == train_bytes + 5  # one BOS per novel
    assert int((tokens == ByteTokenizer().bos_id).sum()) == 5
    assert num_chunks(len(tokens)) == (train_bytes + 4) // 4096 == 868
    chunks = train_chunks("austen")
    assert chunks.shape == (868, 4097)
    np.testing.assert_array_equal(chunks, chunk_tokens(tokens, 4096))


def test_validation_novel_is_configurable():
    val = load_corpus("austen", "validation", validation_doc="emma")
    train = load_corpus("austen", "train", validation_doc="emma")
    assert val.doc_names == ("emma",)
    assert train.num_bytes + val.num_bytes == sum(AUSTEN_BYTES.values())
    with pytest.raises(ValueError, match="not in corpus"):
        load_corpus("austen", "validation", validation_doc="ulysses")
    with pytest.raises(ValueError, match="split"):
        load_corpus("austen", "test")


def test_validation_data_bits_per_byte_inputs():
    val = validation_data("austen")
    assert val.doc_names == ("persuasion",)
    assert val.num_bytes == AUSTEN_BYTES["persuasion"]
    assert len(val.tokens) == val.num_bytes + 1
    text = load_corpus("austen", "validation").texts[0]
    assert val.unigram_bits_per_byte == pytest.approx(unigram_entropy_bits(text))
    assert 4.3 < val.unigram_bits_per_byte < 4.6  # English prose
    masked = sum(int(b.mask.sum()) for b in val.batches(batch_size=16, seq_len=512))
    assert masked == val.num_bytes  # every byte of the novel is a target exactly once


def test_shakespeare_corpus():
    train = load_corpus("shakespeare", "train")
    val = load_corpus("shakespeare", "validation")
    assert val.doc_names == ("hamlet",)
    assert len(train.doc_names) == 41
    assert val.num_bytes == 173_942
    assert train.num_bytes == 4_883_256
    assert "HAMLET" in val.texts[0][:100]


def _copy_austen(tmp_path):
    shutil.copytree(data_dir() / "austen", tmp_path / "austen")
    return tmp_path


def test_missing_file_message(tmp_path):
    root = _copy_austen(tmp_path)
    (root / "austen" / "emma.txt").unlink()
    with pytest.raises(CorpusError) as err:
        load_corpus("austen", "train", root)
    message = str(err.value)
    assert "missing file" in message and "emma.txt" in message
    assert FIX_HINT in message
    # The held-out novel alone is still loadable.
    assert load_corpus("austen", "validation", root).doc_names == ("persuasion",)


def test_corrupt_file_message(tmp_path, monkeypatch):
    root = _copy_austen(tmp_path)
    path = root / "austen" / "persuasion.txt"
    data = bytearray(path.read_bytes())
    data[1000] ^= 1
    path.write_bytes(bytes(data))
    monkeypatch.setenv("DIPSJAX_DATA", str(root))
    with pytest.raises(CorpusError, match=r"corrupt file .*persuasion\.txt.*scripts/setup\.sh"):
        load_corpus("austen", "validation")
    assert load_corpus("austen", "validation", verify=False).num_bytes == len(data)


def test_load_text_files(tmp_path):
    (tmp_path / "b.txt").write_text("second\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("first £\n", encoding="utf-8")
    corpus = load_text_files(tmp_path)
    assert corpus.doc_names == ("a", "b")
    assert corpus.num_bytes == len("first £\nsecond\n".encode())
    assert len(corpus.tokens()) == corpus.num_bytes + 2
    single = load_text_files([tmp_path / "b.txt"], name="mine")
    assert (single.name, single.texts) == ("mine", ("second\n",))
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(CorpusError, match=r"bad\.txt is not valid UTF-8"):
        load_text_files(tmp_path)
    with pytest.raises(CorpusError, match="does not exist"):
        load_text_files([tmp_path / "nope.txt"])
