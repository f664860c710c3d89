"""Folders of the user's own texts as corpora: splits, exact chunks, validation bytes, errors.

These need no installed corpus: every text is written to a temporary folder.
"""

from pathlib import Path

import numpy as np
import pytest

from dipsjax.data import (
    ByteTokenizer,
    CorpusError,
    corpus_documents,
    load_corpus,
    train_chunks,
    validation_data,
)
from dipsjax.data.corpus import corpus_folder

TEXTS = {
    "a": "Alpha: naïve café, déjà vu.\n" * 7,
    "b": "Beta — Grüße aus Köln! 🐍\n" * 5,
    "c": "Gamma: 日本語のテキスト。\n" * 6,
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "mytexts"
    root.mkdir()
    for stem in ("c", "a", "b"):  # created out of order: documents follow file names
        (root / f"{stem}.txt").write_bytes(TEXTS[stem].encode("utf-8"))
    (root / "notes.md").write_text("not a document\n", encoding="utf-8")
    (root / "sub.txt").mkdir()  # a directory is not a document, whatever its name
    return root


def _bytes(stem: str) -> bytes:
    return TEXTS[stem].encode("utf-8")


def test_train_chunks_are_the_other_files_token_stream(folder):
    chunk_len = 16
    chunks = train_chunks(str(folder), chunk_len=chunk_len, validation_doc="b")
    # Independent expectation: byte tokens, one BOS before each training document.
    bos = ByteTokenizer().bos_id
    stream = [bos, *_bytes("a"), bos, *_bytes("c")]
    n = len(_bytes("a")) + len(_bytes("c")) + 2
    assert len(stream) == n and n > len(TEXTS["a"]) + len(TEXTS["c"]) + 2  # non-ASCII
    expected_count = (n - 1) // chunk_len
    assert expected_count > 10 and (n - 1) % chunk_len  # a partial tail is dropped
    assert chunks.shape == (expected_count, chunk_len + 1)
    assert chunks.dtype == np.int32
    expected = np.array(
        [stream[i * chunk_len : (i + 1) * chunk_len + 1] for i in range(expected_count)]
    )
    np.testing.assert_array_equal(chunks, expected)


def test_validation_data_is_the_held_out_file(folder):
    val = validation_data(folder, validation_doc="b")
    assert val.doc_names == ("b",)
    assert val.num_bytes == len((folder / "b.txt").read_bytes()) == len(_bytes("b"))
    assert val.num_bytes > len(TEXTS["b"])  # bytes, not characters
    assert len(val.tokens) == val.num_bytes + 1
    assert bytes(int(t) for t in val.tokens[1:]) == _bytes("b")
    masked = sum(int(b.mask.sum()) for b in val.batches(batch_size=2, seq_len=8))
    assert masked == val.num_bytes


def test_load_corpus_folder_splits(folder):
    train = load_corpus(str(folder), "train", validation_doc="b")
    assert (train.name, train.split, train.doc_names) == (str(folder), "train", ("a", "c"))
    assert train.texts == (TEXTS["a"], TEXTS["c"])
    everything = load_corpus(folder, "all", validation_doc="b")
    assert everything.doc_names == ("a", "b", "c") == corpus_documents(folder)
    assert everything.name == str(folder)
    several = load_corpus(folder, "validation", validation_doc=["c", "a"])
    assert several.doc_names == ("a", "c")  # canonical (sorted) order, not the given one


def test_default_holds_out_the_last_file(folder):
    assert load_corpus(folder, "validation").doc_names == ("c",)
    assert load_corpus(folder, "train").doc_names == ("a", "b")
    assert validation_data(folder).num_bytes == len(_bytes("c"))


def test_how_a_folder_is_recognised(folder, monkeypatch):
    assert corpus_folder("austen") is None and corpus_folder("shakespeare") is None
    assert corpus_folder(folder) == folder  # os.PathLike
    assert corpus_folder(str(folder)) == folder  # has a separator
    monkeypatch.chdir(folder.parent)
    assert corpus_folder("mytexts") == Path("mytexts")  # bare name of an existing directory
    assert load_corpus("mytexts", "validation", validation_doc="a").texts == (TEXTS["a"],)
    assert load_corpus("mytexts", "train").name == "mytexts"
    # A built-in name wins over a folder of that name; "./austen" means the folder.
    (folder.parent / "austen").mkdir()
    assert corpus_folder("austen") is None
    assert corpus_folder("./austen") == Path("austen")


def test_unknown_validation_stem_lists_the_files(folder):
    with pytest.raises(ValueError, match=r"'chapter9'.*not in corpus.*'a', 'b', 'c'"):
        train_chunks(folder, chunk_len=16, validation_doc="chapter9")
    with pytest.raises(ValueError, match="not in corpus"):
        validation_data(folder, validation_doc="b.txt")  # stems, not file names
    with pytest.raises(ValueError, match="leaves no training document"):
        load_corpus(folder, "train", validation_doc=["a", "b", "c"])


def test_single_file_folder_has_nothing_to_train_on(tmp_path):
    (tmp_path / "only.txt").write_text("just one\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"leaves no training document.*\('only',\)"):
        train_chunks(tmp_path, chunk_len=4)


def test_unknown_name_names_both_possibilities(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="'austin'") as err:
        train_chunks("austin")
    message = str(err.value)
    assert "built-in corpus (austen, shakespeare)" in message and "folder" in message


def test_missing_folder(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CorpusError, match=r"nope does not exist.*austen, shakespeare"):
        train_chunks(str(missing), chunk_len=16)
    with pytest.raises(CorpusError, match="nope does not exist"):
        validation_data(missing)
    (tmp_path / "file.txt").write_text("text\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"file\.txt is not a folder"):
        load_corpus(tmp_path / "file.txt")


def test_empty_folder(tmp_path):
    (tmp_path / "readme.md").write_text("no texts here\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"holds no \*\.txt files"):
        train_chunks(tmp_path, chunk_len=16)


def test_invalid_or_empty_file_is_named(folder):
    (folder / "b.txt").write_bytes(b"ok \xff\xfe bad")
    with pytest.raises(CorpusError, match=r"b\.txt is not valid UTF-8"):
        validation_data(folder, validation_doc="b")
    with pytest.raises(CorpusError, match=r"b\.txt is not valid UTF-8"):
        train_chunks(folder, chunk_len=16, validation_doc="a")
    # Only the split's files are read: the training files alone are fine.
    assert train_chunks(folder, chunk_len=16, validation_doc="b").shape[0] > 0
    (folder / "a.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match=r"a\.txt is empty"):
        train_chunks(folder, chunk_len=16, validation_doc="b")
