"""Text corpora as ordered, named documents, split into train and validation.

A corpus is named either by a built-in name or by the path of a folder of your own texts.

Built-in corpora (installed by ``python -m dipsjax.data.fetch``, see :mod:`.fetch`):

* ``austen``: six novels; the train split is five of them in publication order, the
  validation split the held-out one (default ``persuasion``, the shortest).
* ``shakespeare``: 42 works; validation holds out ``hamlet`` by default.

User folders (``load_corpus("/data/mytexts", "train", validation_doc="chapter9")``): the
documents are the folder's UTF-8 ``*.txt`` files sorted by file name, each named by its
stem; validation holds out the last one unless ``validation_doc`` says otherwise. A string
is a folder when it is not a built-in name and contains a path separator or names an
existing directory (see :func:`corpus_folder`); an ``os.PathLike`` always is.

``validation_doc`` selects another held-out document (one name or several). Loading a
built-in corpus verifies each file's sha256 and raises :class:`CorpusError` naming the
missing or corrupt file and the command that fixes it; a user file that is empty or not
valid UTF-8 raises :class:`CorpusError` naming it. Arbitrary lists of user files load as one
corpus (no split) with :func:`load_text_files`.
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

BUILTIN_CORPORA = tuple(DEFAULT_VALIDATION)
"""Names of the built-in corpora."""

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


def corpus_folder(name: str | os.PathLike[str]) -> Path | None:
    """The folder of user texts that corpus ``name`` stands for; ``None`` for a built-in one.

    A built-in name (:data:`BUILTIN_CORPORA`) wins; otherwise ``name`` is a folder if it is
    an ``os.PathLike``, contains a path separator, or is an existing directory (so a folder
    called ``austen`` in the working directory is ``"./austen"``). Any other string raises
    ``ValueError`` naming both possibilities. The folder is not checked here.
    """
    if isinstance(name, os.PathLike):
        return Path(name)
    if not isinstance(name, str):
        raise TypeError(f"corpus name must be a str or os.PathLike, got {type(name).__name__}")
    if name in BUILTIN_CORPORA:
        return None
    if any(sep in name for sep in (os.sep, os.altsep) if sep) or Path(name).is_dir():
        return Path(name)
    raise ValueError(
        f"unknown corpus {name!r}: neither a built-in corpus ({', '.join(BUILTIN_CORPORA)}) "
        f"nor an existing folder of *.txt files (relative to {Path.cwd()})"
    )


def _folder_files(folder: Path) -> list[Path]:
    """The ``*.txt`` files of a user folder, sorted by name; :class:`CorpusError` if none."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise CorpusError(
            f"corpus folder {folder} {what} (a corpus is a built-in name, one of "
            f"{', '.join(BUILTIN_CORPORA)}, or a folder of UTF-8 *.txt files)"
        )
    files = sorted((p for p in folder.glob("*.txt") if p.is_file()), key=lambda p: p.name)
    if not files:
        raise CorpusError(f"corpus folder {folder} holds no *.txt files")
    return files


def _read_text_file(path: Path) -> str:
    """A user text file's contents; :class:`CorpusError` naming it if missing, empty or not
    valid UTF-8."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise CorpusError(f"text file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise CorpusError(f"text file {path} is not valid UTF-8 ({e})") from None
    except OSError as e:
        raise CorpusError(f"cannot read text file {path} ({e})") from None
    if not text:
        raise CorpusError(f"text file {path} is empty")
    return text


def corpus_documents(name: str | os.PathLike[str]) -> tuple[str, ...]:
    """Document names of corpus ``name`` in their canonical order: for a built-in corpus its
    fixed order, for a folder the stems of its ``*.txt`` files sorted by file name."""
    folder = corpus_folder(name)
    if folder is not None:
        return tuple(p.stem for p in _folder_files(folder))
    if name == "austen":
        return AUSTEN_NOVELS
    return tuple(Path(rel).stem for rel in _fetch.corpus_files(str(name)))


def _held_out(
    name: str, docs: tuple[str, ...], validation_doc: str | Sequence[str] | None
) -> tuple[str, ...]:
    """The held-out document names, checked against ``docs``."""
    if validation_doc is None:
        held_out = (DEFAULT_VALIDATION.get(name, docs[-1]),)
    elif isinstance(validation_doc, str):
        held_out = (validation_doc,)
    else:
        held_out = tuple(validation_doc)
    unknown = [d for d in held_out if d not in docs]
    if unknown or not held_out:
        raise ValueError(f"validation_doc {unknown or held_out} not in corpus {name!r}: {docs}")
    if len(set(held_out)) == len(docs):
        raise ValueError(
            f"validation_doc {held_out} leaves no training document in {name!r} (documents: {docs})"
        )
    return held_out


def _chosen(docs: tuple[str, ...], held_out: tuple[str, ...], split: str) -> tuple[str, ...]:
    if split == "train":
        return tuple(d for d in docs if d not in held_out)
    if split == "validation":
        return tuple(d for d in docs if d in held_out)
    return docs


def load_corpus(
    name: str | os.PathLike[str] = "austen",
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    *,
    validation_doc: str | Sequence[str] | None = None,
    verify: bool = True,
) -> Corpus:
    """Load the ``split`` (``train``, ``validation`` or ``all``) of corpus ``name``: a
    built-in corpus or a folder of the user's UTF-8 ``*.txt`` files (see
    :func:`corpus_folder` for how the two are told apart).

    ``validation_doc`` names the held-out document(s) (for a folder: file stems, e.g.
    ``"chapter9"`` for ``chapter9.txt``); train is every other document in canonical order
    (:func:`corpus_documents`). Default: :data:`DEFAULT_VALIDATION` for a built-in corpus,
    the *last* file in sorted order for a folder. An unknown name raises ``ValueError``
    listing the documents, and so does holding out every document (a folder needs at
    least two files).

    Built-in corpora: ``data_dir`` overrides the data directory (default
    :func:`dipsjax.data.fetch.data_dir`: ``$DIPSJAX_DATA``, ``<repo>/data/corpus`` in a
    clone that has ``data/``, else the user cache), and with ``verify`` (the default)
    every file is checked against its sha256 first. Folders: ``data_dir`` and ``verify``
    are ignored, the corpus ``name`` is the folder path as given, and only the split's
    files are read; a missing, empty or non-UTF-8 one raises :class:`CorpusError` naming it.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    folder = corpus_folder(name)
    if folder is not None:
        label = os.fspath(name)
        files = {p.stem: p for p in _folder_files(folder)}
        docs = tuple(files)
        chosen = _chosen(docs, _held_out(label, docs, validation_doc), split)
        texts = tuple(_read_text_file(files[d]) for d in chosen)
        return Corpus(name=label, split=split, doc_names=chosen, texts=texts)
    name = str(name)
    docs = corpus_documents(name)
    chosen = _chosen(docs, _held_out(name, docs, validation_doc), split)
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
        files.extend(_folder_files(p) if p.is_dir() else [p])
    if not files:
        raise CorpusError("load_text_files: no files given")
    texts = tuple(_read_text_file(f) for f in files)
    return Corpus(name=name, split="all", doc_names=tuple(f.stem for f in files), texts=texts)
