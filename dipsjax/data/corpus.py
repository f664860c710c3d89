"""Text corpora as ordered, named documents, split into train and validation.

Built-in corpora (installed by ``python -m dipsjax.data.fetch``, see :mod:`.fetch`):

* ``austen``: six novels; the train split is five of them in publication order, the
  validation split the held-out one (default ``persuasion``, the shortest).
* ``shakespeare``: 42 works; validation holds out ``hamlet`` by default.

``validation_doc`` selects another held-out document (one name or several). Loading
verifies each file's sha256 and raises :class:`CorpusError` naming the missing or corrupt
file and the command that fixes it. Arbitrary user files load with :func:`load_text_files`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dipsjax.data import fetch as _fetch
from dipsjax.data.fetch import AUSTEN_NOVELS, FIX_HINT, CorpusError
from dipsjax.data.tokenizer import Tokenizer, encode_documents

DEFAULT_VALIDATION = {"austen": "persuasion", "shakespeare": "hamlet"}
"""The document each built-in corpus holds out for validation unless told otherwise."""

SPLITS = ("train", "validation", "all")


@dataclass(frozen=True)
class Corpus:
    """An ordered collection of named text documents."""

    name: str
    split: str
    doc_names: tuple[str, ...]
    texts: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.doc_names) != len(self.texts):
            raise ValueError("doc_names and texts differ in length")

    @property
    def num_chars(self) -> int:
        """Total number of characters (Unicode code points)."""
        return sum(len(t) for t in self.texts)

    @property
    def num_bytes(self) -> int:
        """Total number of UTF-8 bytes."""
        return sum(len(t.encode("utf-8")) for t in self.texts)

    def tokens(self, tokenizer: Tokenizer | None = None, *, bos: bool = True) -> np.ndarray:
        """The documents as one int32 stream: ``[BOS] doc0 [BOS] doc1 ...`` (see
        :func:`~dipsjax.data.tokenizer.encode_documents`); byte tokenizer by default, so the
        length is ``num_bytes + len(doc_names)``."""
        return encode_documents(self.texts, tokenizer, bos=bos)

    def __repr__(self) -> str:
        return (
            f"Corpus(name={self.name!r}, split={self.split!r}, docs={list(self.doc_names)}, "
            f"bytes={self.num_bytes})"
        )


def corpus_documents(name: str) -> tuple[str, ...]:
    """Document names of a built-in corpus, in their canonical order."""
    if name == "austen":
        return AUSTEN_NOVELS
    return tuple(Path(rel).stem for rel in _fetch.corpus_files(name))


def load_corpus(
    name: str = "austen",
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    *,
    validation_doc: str | Sequence[str] | None = None,
    verify: bool = True,
) -> Corpus:
    """Load the ``split`` (``train``, ``validation`` or ``all``) of built-in corpus ``name``.

    ``validation_doc`` names the held-out document(s) (default :data:`DEFAULT_VALIDATION`);
    train is every other document in canonical order. ``data_dir`` overrides the data
    directory (default ``$DIPSJAX_DATA`` or ``<repo>/data/corpus``). With ``verify`` (the
    default) every file is checked against its sha256 first.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    docs = corpus_documents(name)
    if validation_doc is None:
        held_out = (DEFAULT_VALIDATION[name],)
    elif isinstance(validation_doc, str):
        held_out = (validation_doc,)
    else:
        held_out = tuple(validation_doc)
    unknown = [d for d in held_out if d not in docs]
    if unknown or not held_out:
        raise ValueError(f"validation_doc {unknown or held_out} not in corpus {name!r}: {docs}")
    if len(set(held_out)) == len(docs):
        raise ValueError(f"validation_doc {held_out} leaves no training document in {name!r}")
    if split == "train":
        chosen = tuple(d for d in docs if d not in held_out)
    elif split == "validation":
        chosen = tuple(d for d in docs if d in held_out)
    else:
        chosen = docs
    root = _fetch.data_dir(data_dir)
    rel_paths = [f"{name}/{d}.txt" for d in chosen]
    if verify:
        _fetch.verify_texts(root, rel_paths)
    texts = []
    for rel in rel_paths:
        try:
            texts.append((root / rel).read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise CorpusError(f"cannot read {root / rel} ({e}); {FIX_HINT}") from e
    return Corpus(name=name, split=split, doc_names=chosen, texts=tuple(texts))


def load_text_files(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], *, name: str = "files"
) -> Corpus:
    """A corpus of user text files (UTF-8), one document per file, in the given order.

    A directory stands for its ``*.txt`` files in sorted order. Raises :class:`CorpusError`
    naming any file that is missing, empty or not valid UTF-8.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.txt"))
            if not found:
                raise CorpusError(f"directory {p} holds no *.txt files")
            files.extend(found)
        else:
            files.append(p)
    if not files:
        raise CorpusError("load_text_files: no files given")
    texts = []
    for f in files:
        try:
            text = f.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise CorpusError(f"text file {f} does not exist") from None
        except UnicodeDecodeError as e:
            raise CorpusError(f"text file {f} is not valid UTF-8 ({e})") from None
        if not text:
            raise CorpusError(f"text file {f} is empty")
        texts.append(text)
    return Corpus(
        name=name, split="all", doc_names=tuple(f.stem for f in files), texts=tuple(texts)
    )
