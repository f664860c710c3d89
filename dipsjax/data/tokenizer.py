"""Tokenizers: a small protocol and the default byte-level tokenizer.

Every tokenizer maps a ``str`` to a 1-D ``int32`` array of ids in ``[0, vocab_size)`` and
declares three special ids: ``pad_id`` (filler in validation batches, never trained on),
``bos_id`` (marks the start of every document in a token stream) and ``eos_id`` (available
to generation code; the data layer itself does not insert it).

:class:`ByteTokenizer` is the default: ids 0-255 are the UTF-8 bytes of the text, then
PAD = 256, BOS = 257, EOS = 258, so ``vocab_size`` = 259 and the number of tokens of a text
equals its number of UTF-8 bytes. Other tokenizers plug in by implementing
:class:`Tokenizer` (register them in :data:`TOKENIZERS` to make them selectable by name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import numpy as np


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

    def __repr__(self) -> str:
        return "ByteTokenizer()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)


TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {"byte": ByteTokenizer}
"""Tokenizers selectable by name (configs use the name); add entries to plug in others."""


def make_tokenizer(name: str = "byte") -> Tokenizer:
    """The tokenizer registered as ``name`` in :data:`TOKENIZERS`."""
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; known: {sorted(TOKENIZERS)}")
    return TOKENIZERS[name]()


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
