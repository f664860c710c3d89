"""Tokenizers: a small protocol and the default byte-level tokenizer.

Every tokenizer maps a ``str`` to a 1-D ``int32`` array of ids in ``[0, vocab_size)`` and
declares three special ids: ``pad_id`` (filler in validation batches, never trained on),
``bos_id`` (marks the start of every document in a token stream) and ``eos_id`` (available
to generation code; the data layer itself does not insert it).

:class:`ByteTokenizer` is the default: ids 0-255 are the UTF-8 bytes of the text, then
PAD = 256, BOS = 257, EOS = 258, so ``vocab_size`` = 259 and the number of tokens of a text
equals its number of UTF-8 bytes. Other tokenizers plug in by implementing
:class:`Tokenizer` (register them in :data:`TOKENIZERS` to make them selectable by name).

:class:`SubwordTokenizer` wraps a Hugging Face ``tokenizers`` tokenizer. The built-in one is
a byte-level BPE (:func:`train_subword`): its alphabet is the 256 bytes, so every text
round-trips (``decode(encode(x)) == x``); it is trained offline on the train split of a
corpus only, then cached as a ``tokenizer.json`` next to the corpus. Its specials are
PAD = 0, BOS = 1, EOS = 2, SEP = 3 (``<pad>``, ``<bos>``, ``<eos>``, ``<sep>``), then the
bytes, then the merges, up to the ``vocab_size`` asked for. A user's
``tokenizer.json`` loads too (:meth:`SubwordTokenizer.from_file`).

Selecting one by name (:func:`load_tokenizer`, :func:`make_tokenizer`): ``"byte"``,
``"bpe:1024"`` (a BPE of 1024 ids trained on the train split of the corpus given, Austen by
default) or the path of a ``tokenizer.json`` (or of a folder holding one).

Bits per byte. A subword model's loss is in nats per *token*; with ``bytes_per_token(text)``
(the text's UTF-8 bytes over its token count, 1 for the byte tokenizer) the bits per byte of
a text are ``mean_loss_nats / (ln 2 * bytes_per_token)``, exactly (every byte of the text is
in exactly one token). The ``tokenizers`` package is imported on first use only.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import tokenizers


@runtime_checkable
class Tokenizer(Protocol):
    """What the data layer needs from a tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included; every id is in ``[0, vocab_size)``."""
        ...

    @property
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text`` as a 1-D int32 array, without special tokens."""
        ...

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of ``ids``; special ids are dropped."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (0-255) plus PAD = 256, BOS = 257, EOS = 258."""

    NUM_BYTES = 256

    @property
    def vocab_size(self) -> int:
        return self.NUM_BYTES + 3

    @property
    def pad_id(self) -> int:
        return self.NUM_BYTES

    @property
    def bos_id(self) -> int:
        return self.NUM_BYTES + 1

    @property
    def eos_id(self) -> int:
        return self.NUM_BYTES + 2

    def encode(self, text: str) -> np.ndarray:
        """The UTF-8 bytes of ``text`` as int32 ids (one id per byte)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Bytes of the ids below 256, decoded as UTF-8 (invalid sequences become U+FFFD)."""
        arr = np.asarray(ids if hasattr(ids, "__len__") else list(ids), dtype=np.int64)
        arr = arr[(arr >= 0) & (arr < self.NUM_BYTES)]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def bytes_per_token(self, text: str | Sequence[str]) -> float:
        """UTF-8 bytes per token of ``text`` (documents, each encoded alone): 1.0."""
        return _bytes_per_token(self, text)

    def __repr__(self) -> str:
        return "ByteTokenizer()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)


def _bytes_per_token(tok: Tokenizer, text: str | Sequence[str]) -> float:
    docs = [text] if isinstance(text, str) else list(text)
    num_bytes = sum(len(d.encode("utf-8")) for d in docs)
    num_tokens = sum(len(tok.encode(d)) for d in docs)
    if num_tokens == 0:
        raise ValueError("bytes_per_token: the text is empty")
    return num_bytes / num_tokens


SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<sep>")
"""The specials of a trained :class:`SubwordTokenizer`, ids 0-3 (PAD, BOS, EOS, SEP)."""

_SPECIAL_NAMES = {
    # Looked for, in order, in a user tokenizer's vocabulary (the usual spellings).
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "bos": ("<bos>", "<s>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]", "<|endoftext|>"),
    "eos": ("<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "[SEP]"),
    "sep": ("<sep>", "[SEP]", "<|sep|>"),
}


class SubwordTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` behind the :class:`Tokenizer` protocol.

    ``encode`` adds no special tokens and reads a special token's spelling in the text
    (``"<bos>"``) as text, so a byte-level tokenizer round-trips *any* text;
    ``decode`` drops special ids (and ids outside ``[0, vocab_size)``).

    The four specials are found by name among the tokenizer's tokens (``pad``, ``bos``,
    ``eos``, ``sep`` override the names; defaults: the usual spellings, ``<pad>``,
    ``[PAD]``, ``<s>``, ``</s>``, ``<|endoftext|>``, ...); one it does not have is added as
    a special token at the end of the vocabulary (``<pad>``, ...), so every id stays in
    ``[0, vocab_size)``. Two tokenizers are equal when their ``tokenizer.json`` is.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        pad: str | None = None,
        bos: str | None = None,
        eos: str | None = None,
        sep: str | None = None,
        source: str = "",
    ) -> None:
        self._tok = tokenizer
        self.source = source
        given = {"pad": pad, "bos": bos, "eos": eos, "sep": sep}
        ids: dict[str, int] = {}
        for role, default in zip(("pad", "bos", "eos", "sep"), SPECIAL_TOKENS, strict=True):
            names = (given[role],) if given[role] is not None else _SPECIAL_NAMES[role]
            found = next((i for n in names if (i := tokenizer.token_to_id(n)) is not None), None)
            if found is None:
                token = given[role] or default
                tokenizer.add_special_tokens([token])
                found = tokenizer.token_to_id(token)
            ids[role] = int(found)
        self._pad, self._bos, self._eos, self._sep = (ids[r] for r in ("pad", "bos", "eos", "sep"))
        # Text that spells a special token is text (the specials only come from their ids).
        tokenizer.encode_special_tokens = True
        self._vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self._json = tokenizer.to_str()

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **specials: str) -> SubwordTokenizer:
        """Loads a ``tokenizer.json`` (a Hugging Face tokenizer file), or the one in folder
        ``path``; ``ValueError`` naming the file if it is missing or not a tokenizer."""
        from tokenizers import Tokenizer as HFTokenizer

        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"tokenizer file {file} does not exist")
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as e:  # the Rust side raises a bare Exception
            raise ValueError(f"{file} is not a Hugging Face tokenizer.json ({e})") from None
        return cls(tok, source=str(file), **specials)

    @property
    def hf(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def bos_id(self) -> int:
        return self._bos

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def sep_id(self) -> int:
        return self._sep

    @property
    def special_ids(self) -> tuple[int, ...]:
        """PAD, BOS, EOS and SEP ids."""
        return (self._pad, self._bos, self._eos, self._sep)

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text`` as a 1-D int32 array, without special tokens."""
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of ``ids``; special ids (and ids outside the vocabulary) are dropped."""
        arr = np.asarray(ids if hasattr(ids, "__len__") else list(ids), dtype=np.int64)
        arr = arr[(arr >= 0) & (arr < self._vocab_size)]
        return self._tok.decode(arr.tolist(), skip_special_tokens=True)

    def bytes_per_token(self, text: str | Sequence[str]) -> float:
        """UTF-8 bytes per token of ``text`` (one document, or several each encoded alone
        as :func:`encode_documents` does, without BOS): ``bits/byte = mean_nats / (ln 2 *
        bytes_per_token)`` for a loss averaged over the text's tokens."""
        return _bytes_per_token(self, text)

    def to_json(self) -> str:
        """The ``tokenizer.json`` text (specials included)."""
        return self._json

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes ``tokenizer.json`` to ``path`` (atomically: a reader never sees half)."""
        return _write_atomic(Path(path), self._json)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubwordTokenizer) and other._json == self._json

    def __hash__(self) -> int:
        return hash(self._json)

    def __repr__(self) -> str:
        where = f", source={self.source!r}" if self.source else ""
        return f"SubwordTokenizer(vocab_size={self._vocab_size}{where})"

    def __getstate__(self) -> dict[str, Any]:
        return {"json": self._json, "source": self.source, "specials": self.special_ids}

    def __setstate__(self, state: dict[str, Any]) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._tok = HFTokenizer.from_str(state["json"])
        self._tok.encode_special_tokens = True
        self._json, self.source = state["json"], state["source"]
        self._pad, self._bos, self._eos, self._sep = state["specials"]
        self._vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))


def _write_atomic(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


BPE_VERSION = 1
"""Changes when :func:`train_subword`'s recipe does (its cached files are keyed by it)."""


def _train_bpe(texts: Sequence[str], vocab_size: int) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def subword_cache_path(
    corpus: str | os.PathLike[str] = "austen",
    vocab_size: int = 1024,
    validation_doc: str | Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Where :func:`train_subword` keeps this tokenizer: ``<cache_dir>/<corpus>-bpe<vocab>-
    <key>/tokenizer.json``, ``cache_dir`` by default ``tokenizers/`` in the corpus data
    directory (:func:`~dipsjax.data.fetch.data_dir`), ``key`` a hash of the training texts,
    the vocabulary size, the recipe and the ``tokenizers`` version (another train split,
    another file)."""
    import tokenizers

    from dipsjax.data.corpus import corpus_folder, load_corpus
    from dipsjax.data.fetch import data_dir as default_data_dir

    train = load_corpus(corpus, "train", data_dir, validation_doc=validation_doc)
    h = hashlib.sha256(f"dipsjax-bpe-{BPE_VERSION}|{vocab_size}|{tokenizers.__version__}".encode())
    for name, text in zip(train.doc_names, train.texts, strict=True):
        h.update(f"|{name}|{len(text)}|".encode())
        h.update(text.encode("utf-8"))
    folder = corpus_folder(corpus)
    label = folder.resolve().name if folder is not None else str(corpus)
    label = "".join(c if c.isalnum() or c in "-_." else "_" for c in label) or "corpus"
    root = Path(cache_dir) if cache_dir is not None else default_data_dir(data_dir) / "tokenizers"
    return root / f"{label}-bpe{vocab_size}-{h.hexdigest()[:16]}" / "tokenizer.json"


def train_subword(
    corpus: str | os.PathLike[str] = "austen",
    vocab_size: int = 1024,
    validation_doc: str | Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> SubwordTokenizer:
    """A byte-level BPE of ``vocab_size`` ids trained on the *train* split of ``corpus``.

    ``corpus``, ``validation_doc`` and ``data_dir`` as in
    :func:`~dipsjax.data.corpus.load_corpus` (the held-out text is never seen). Trained
    once and cached (:func:`subword_cache_path`); later calls, in any process, load the
    cached ``tokenizer.json``. Training is deterministic (same texts, same tokenizer).
    ``vocab_size`` counts the 4 specials and the 256 bytes, so it must be at least 261; the
    result has exactly that many ids unless the split is too small to give that many merges
    (pairs seen at least twice), then fewer.
    """
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 261:
        raise ValueError(
            f"vocab_size must be an integer >= 261 (4 specials + 256 bytes + merges), "
            f"got {vocab_size!r}"
        )
    path = subword_cache_path(corpus, vocab_size, validation_doc, data_dir, cache_dir=cache_dir)
    if path.is_file():
        return SubwordTokenizer.from_file(path)
    from dipsjax.data.corpus import load_corpus

    train = load_corpus(corpus, "train", data_dir, validation_doc=validation_doc)
    tok = SubwordTokenizer(_train_bpe(train.texts, vocab_size), source=str(path))
    if tok.special_ids != (0, 1, 2, 3):  # the trainer puts its specials first
        raise AssertionError(f"unexpected special ids {tok.special_ids}")
    try:
        tok.save(path)
    except OSError as e:
        warnings.warn(
            f"cannot cache the tokenizer at {path} ({e}); it is retrained next time",
            stacklevel=2,
        )
    return tok


TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {"byte": ByteTokenizer}
"""Tokenizers selectable by name (configs use the name); add entries to plug in others."""

SPEC_FORMS = "'byte' (or another name in TOKENIZERS), 'bpe:<vocab_size>' or a tokenizer.json"


def load_tokenizer(
    spec: str | os.PathLike[str] | Tokenizer = "byte",
    *,
    corpus: str | os.PathLike[str] = "austen",
    validation_doc: str | Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> Tokenizer:
    """The tokenizer ``spec`` names.

    * a name in :data:`TOKENIZERS` (``"byte"``);
    * ``"bpe:<vocab_size>"``, e.g. ``"bpe:1024"``: :func:`train_subword` on the train split
      of ``corpus`` (with ``validation_doc``, ``data_dir``), trained once and cached;
    * the path of a ``tokenizer.json`` (or of a folder holding one): a user's tokenizer;
    * a :class:`Tokenizer`, returned as is.

    Anything else raises ``ValueError`` naming the forms.
    """
    if not isinstance(spec, str | os.PathLike):
        if isinstance(spec, Tokenizer):
            return spec
        raise TypeError(f"tokenizer spec must be a str or a path, got {type(spec).__name__}")
    if isinstance(spec, str):
        if spec in TOKENIZERS:
            return TOKENIZERS[spec]()
        kind, sep, size = spec.partition(":")
        if sep and kind == "bpe":
            if not size.isdigit():
                raise ValueError(
                    f"unknown tokenizer {spec!r}: 'bpe:' takes a vocabulary size, e.g. 'bpe:1024'"
                )
            return train_subword(corpus, int(size), validation_doc, data_dir)
    path = Path(spec)
    if path.suffix == ".json" or path.is_dir() or path.is_file():
        return SubwordTokenizer.from_file(path)
    raise ValueError(f"unknown tokenizer {os.fspath(spec)!r}; expected {SPEC_FORMS}")


def make_tokenizer(
    name: str | os.PathLike[str] = "byte",
    *,
    corpus: str | os.PathLike[str] = "austen",
    validation_doc: str | Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> Tokenizer:
    """The tokenizer named ``name``: see :func:`load_tokenizer` (``"byte"``, ``"bpe:1024"``
    or a ``tokenizer.json``)."""
    return load_tokenizer(name, corpus=corpus, validation_doc=validation_doc, data_dir=data_dir)


def encode_documents(
    texts: Iterable[str], tokenizer: Tokenizer | None = None, *, bos: bool = True
) -> np.ndarray:
    """One int32 token stream for a sequence of documents.

    Each document contributes ``[bos_id] + tokenizer.encode(text)`` (without the BOS when
    ``bos`` is false), in the given order. With :class:`ByteTokenizer` the length is exactly
    ``sum(len(text.encode('utf-8'))) + number of documents``.
    """
    tok = tokenizer if tokenizer is not None else ByteTokenizer()
    parts: list[np.ndarray] = []
    for text in texts:
        if bos:
            parts.append(np.array([tok.bos_id], dtype=np.int32))
        parts.append(np.asarray(tok.encode(text), dtype=np.int32))
    if not parts:
        return np.zeros((0,), dtype=np.int32)
    return np.concatenate(parts)


def unigram_entropy_bits(data: bytes | str | np.ndarray | Iterable[int]) -> float:
    """Entropy in bits per symbol of the empirical unigram distribution of ``data``.

    ``str`` is taken as its UTF-8 bytes and ``bytes`` as bytes, so the result is in bits per
    byte; an array of byte-tokenizer ids gives bits per byte too (pass only byte ids, i.e.
    without BOS/PAD, to match the text). This is the loss a model that only learned symbol
    frequencies would reach: a useful upper reference for validation bits per byte.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, bytes | bytearray):
        arr = np.frombuffer(bytes(data), dtype=np.uint8).astype(np.int64)
    else:
        arr = np.asarray(data if hasattr(data, "__len__") else list(data), dtype=np.int64)
    arr = arr.reshape(-1)
    if arr.size == 0:
        raise ValueError("unigram_entropy_bits: empty input")
    if arr.min() < 0:
        raise ValueError("unigram_entropy_bits: negative ids")
    counts = np.bincount(arr).astype(np.float64)
    p = counts[counts > 0] / arr.size
    return float(-(p * np.log2(p)).sum())


def bits_per_byte(total_nats: float, num_bytes: int) -> float:
    """Convert a summed cross-entropy (natural log) over a text to bits per byte of it."""
    if num_bytes <= 0:
        raise ValueError(f"num_bytes must be positive, got {num_bytes}")
    return float(total_nats) / (np.log(2.0) * num_bytes)
