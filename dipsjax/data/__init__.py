"""Data layer: corpus -> tokens -> chunks -> (ledger-driven) batches; validation data.

Typical learner-side use::

    from dipsjax import data

    chunks = data.train_chunks("austen", chunk_len=4096)          # int32[868, 4097]
    ledger = data.LocalLedger(data.new_ledger(len(chunks), batches_per_chunk=2, seed=0))
    stream = data.BatchStream(chunks, batch_size=8, seq_len=256,
                              source=ledger.source("learner-0"))
    batch = stream.next_batch()                    # batch.inputs, batch.targets; None: wait
    if batch.finished:                             # the piece's last batch: once kept,
        ledger.settle("learner-0", [batch.piece])  # settle the batches of its piece
    checkpoint = stream.position.to_json()         # resume: BatchStream(..., position=...)

    val = data.validation_data("austen")           # held-out novel: Persuasion
    for eb in val.batches(batch_size=8, seq_len=256): ...   # eb.tokens, eb.mask

Beyond bytes and memory: ``data.load_tokenizer("bpe:1024")`` (a byte-level BPE trained on
the train split and cached, or a user's ``tokenizer.json``; :mod:`.tokenizer`), and
``data.write_chunks(path, chunks)`` / ``data.RecordChunks(path, batch_size, seq_len)``
(chunks as ArrayRecord files read through grain one chunk at a time; :mod:`.records`).

The corpora are installed by ``python -m dipsjax.data.fetch`` (run by ``scripts/setup.sh``)
into the data directory (:func:`dipsjax.data.fetch.data_dir`).
The package imports only numpy (``rdata`` is used by the fetch step alone; ``tokenizers``,
``grain`` and ``array_record`` on first use of what needs them).

The names below load their submodule on first use (PEP 562), so that
``python -m dipsjax.data.fetch`` runs without importing the rest of the package.
"""

import importlib
from typing import Any

_EXPORTS = {
    "Batch": "pipeline",
    "BatchStream": "pipeline",
    "ByteTokenizer": "tokenizer",
    "ChunkLedger": "ledger",
    "Corpus": "corpus",
    "CorpusError": "fetch",
    "DEFAULT_CHUNK_LEN": "pipeline",
    "DEFAULT_VALIDATION": "corpus",
    "EpochState": "ledger",
    "EvalBatch": "pipeline",
    "Lease": "ledger",
    "LedgerError": "ledger",
    "LocalLedger": "ledger",
    "MemoryChunks": "records",
    "RecordChunks": "records",
    "StreamPosition": "pipeline",
    "SubwordTokenizer": "tokenizer",
    "TOKENIZERS": "tokenizer",
    "TokenChunks": "pipeline",
    "Tokenizer": "tokenizer",
    "ValidationData": "pipeline",
    "bits_per_byte": "tokenizer",
    "check_invariants": "ledger",
    "chunk_tokens": "pipeline",
    "complete": "ledger",
    "completed_chunks": "ledger",
    "corpus_documents": "corpus",
    "data_dir": "fetch",
    "encode_documents": "tokenizer",
    "epoch_order": "ledger",
    "fixed_order": "ledger",
    "holder": "ledger",
    "lease": "ledger",
    "leases_of": "ledger",
    "load_corpus": "corpus",
    "load_text_files": "corpus",
    "load_tokenizer": "tokenizer",
    "make_tokenizer": "tokenizer",
    "new_ledger": "ledger",
    "num_chunks": "pipeline",
    "release": "ledger",
    "Span": "ledger",
    "settled_batches": "ledger",
    "subtract": "ledger",
    "holds": "ledger",
    "settle": "ledger",
    "train_chunks": "pipeline",
    "train_subword": "tokenizer",
    "unigram_entropy_bits": "tokenizer",
    "validation_batches": "pipeline",
    "validation_data": "pipeline",
    "write_chunks": "records",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"dipsjax.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'dipsjax.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "DEFAULT_CHUNK_LEN",
    "DEFAULT_VALIDATION",
    "TOKENIZERS",
    "Batch",
    "BatchStream",
    "ByteTokenizer",
    "ChunkLedger",
    "Corpus",
    "CorpusError",
    "EpochState",
    "EvalBatch",
    "Lease",
    "LedgerError",
    "LocalLedger",
    "MemoryChunks",
    "RecordChunks",
    "Span",
    "StreamPosition",
    "SubwordTokenizer",
    "TokenChunks",
    "Tokenizer",
    "ValidationData",
    "bits_per_byte",
    "check_invariants",
    "chunk_tokens",
    "complete",
    "completed_chunks",
    "corpus_documents",
    "data_dir",
    "encode_documents",
    "epoch_order",
    "fixed_order",
    "holder",
    "holds",
    "lease",
    "leases_of",
    "load_corpus",
    "load_text_files",
    "load_tokenizer",
    "make_tokenizer",
    "new_ledger",
    "num_chunks",
    "release",
    "settle",
    "settled_batches",
    "subtract",
    "train_chunks",
    "train_subword",
    "unigram_entropy_bits",
    "validation_batches",
    "validation_data",
    "write_chunks",
]
