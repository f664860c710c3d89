"""The built-in task: a LLaMA decoder (``SimConfig.model``) learning next-token prediction on
a text corpus (``SimConfig.corpus``), the papers' setting.

Keyword arguments (``SimConfig.task_args``)::

    get_task(cfg, tokenizer="byte", records=None, remat="none", attention="auto", loss_chunk=0,
             scan_layers=False)

* ``tokenizer``: any spec :func:`~dipsjax.data.tokenizer.load_tokenizer` accepts: ``"byte"``
  (the default: UTF-8 bytes), ``"bpe:1024"`` (a byte-level BPE of 1024 ids trained on the
  corpus's train split and cached next to it), or the path of a ``tokenizer.json``. The
  model's ``vocab_size`` follows a subword tokenizer's (``get_config(cfg.model,
  vocab_size=tok.vocab_size)``); the byte tokenizer keeps the named configuration as is.
* ``records``: ArrayRecord files of the tokenized train split's chunks (a file, a path
  written in shards, a glob, or a list of those), read through grain one chunk at a time
  (:class:`~dipsjax.data.records.RecordChunks`): each learner reads only the chunks it
  leases, and memory does not grow with the corpus. Write them once with
  :func:`write_records` (``python -m dipsjax.tasks.lm --write-records PATH --tokenizer
  bpe:1024``) using the same corpus, tokenizer and ``chunk_len``. ``None``: the chunks are
  tokenized in memory (:class:`~dipsjax.data.pipeline.TokenChunks`). Both give the same
  batches, bit for bit.
* ``remat``, ``attention``, ``loss_chunk``, ``scan_layers``: the model's activation
  rematerialisation policy, attention implementation, the positions its loss takes at a
  time (0: the whole logits) and whether its blocks are stacked and run under ``nnx.scan``
  (:class:`~dipsjax.model.configs.ModelConfig`; the numbers are the same whichever, to
  float32 rounding for ``loss_chunk`` and ``scan_layers``), e.g. ``--set
  "sim.task_args={'remat': 'full', 'loss_chunk': 128, 'scan_layers': True}"``.

Data: the corpus's train split, tokenized and cut into chunks of ``chunk_len`` target
tokens, read in ``SimConfig.data_layout``: ``"contiguous"`` (the default: a batch is
consecutive sequences of one chunk, :class:`~dipsjax.data.pipeline.TokenChunks`) or
``"spread"``, an EXTENSION (a batch's rows drawn across the corpus by a permutation seeded by
``SimConfig.seed``, every sequence in one chunk: :class:`~dipsjax.data.layout.SpreadChunks`).

Validation: a fixed set of about ``SimConfig.eval_tokens`` target tokens, windows of
``seq_len`` spread evenly over the held-out document(s), in batches of a fixed number of
rows with a mask (:func:`~dipsjax.data.layout.validation_windows`): the same whatever the
batch size, the number of learners or the method. The loss is the mean next-token
cross-entropy (nats) over the scored targets, and ``bits_per_byte`` exactly ``loss *
targets / (ln 2 * bytes)``, ``targets`` the scored targets and ``bytes`` the UTF-8 bytes
those very tokens spell (for the byte tokenizer on one held-out document: ``loss / ln
2``).

The task is built once per process for equal arguments (and data folder), so equal
configs share one model factory and so one set of compiled steps.
"""

from __future__ import annotations

import argparse
import functools
import glob
import math
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from dipsjax.data.layout import LAYOUTS
from dipsjax.task import Task


def get_task(
    cfg: Any,
    tokenizer: str | os.PathLike[str] = "byte",
    records: str | os.PathLike[str] | Sequence[str] | None = None,
    remat: str = "none",
    attention: str = "auto",
    loss_chunk: int = 0,
    scan_layers: bool = False,
) -> Task:
    """The language-model task of experiment ``cfg`` (a :class:`~dipsjax.sim.config.SimConfig`)
    with ``tokenizer`` and, optionally, training chunks read from ``records`` (module doc)."""
    from dipsjax.data.fetch import data_dir

    if not isinstance(tokenizer, str | os.PathLike):
        raise TypeError(
            f"lm task: tokenizer must be a spec ('byte', 'bpe:1024' or a tokenizer.json path), "
            f"got {tokenizer!r}"
        )
    return _task(
        str(data_dir()),  # where the corpus is read from: a key of the cache too
        cfg.model,
        cfg.corpus,
        cfg.validation_doc,
        cfg.chunk_len,
        cfg.batch_size,
        cfg.seq_len,
        cfg.eval_tokens,
        os.fspath(tokenizer),
        _records_key(records),
        cfg.data_layout,
        cfg.seed if cfg.data_layout == "spread" else 0,  # the layout's permutation
        (
            ("remat", remat),
            ("attention", attention),
            ("loss_chunk", loss_chunk),
            ("scan_layers", scan_layers),
        ),
    )


def _records_key(records: Any) -> tuple[str, ...] | None:
    if records is None:
        return None
    given = [records] if isinstance(records, str | os.PathLike) else list(records)
    if not given or not all(isinstance(p, str | os.PathLike) for p in given):
        raise TypeError(
            f"lm task: records must be a path, a glob or a list of them, got {records!r}"
        )
    return tuple(os.fspath(p) for p in given)


def record_files(records: Sequence[str]) -> list[str]:
    """The ArrayRecord files ``records`` names: each a file, a path written in shards
    (:func:`~dipsjax.data.records.resolve_paths`) or a glob (its matches, sorted)."""
    from dipsjax.data.records import resolve_paths

    files: list[str] = []
    for p in records:
        if not os.path.exists(p) and glob.has_magic(p):
            matches = sorted(glob.glob(p))
            if not matches:
                raise FileNotFoundError(
                    f"no ArrayRecord file matches {p}; write them with "
                    "`python -m dipsjax.tasks.lm --write-records PATH --tokenizer SPEC`"
                )
            files.extend(matches)
        else:
            files.append(p)
    try:
        return resolve_paths(files)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e} (or `python -m dipsjax.tasks.lm --write-records PATH --tokenizer SPEC`)"
        ) from None


@functools.lru_cache(maxsize=8)
def _task(
    root: str,
    model: str,
    corpus: str,
    validation_doc: str | None,
    chunk_len: int,
    batch_size: int,
    seq_len: int,
    eval_tokens: int,
    tokenizer: str = "byte",
    records: tuple[str, ...] | None = None,
    layout: str = "contiguous",
    seed: int = 0,
    model_fields: tuple[tuple[str, Any], ...] = (),
) -> Task:
    from dipsjax.data import ByteTokenizer, load_tokenizer
    from dipsjax.learner.step import lm_model
    from dipsjax.model.configs import get_config

    if layout not in LAYOUTS:
        raise ValueError(f"lm task: data_layout must be one of {LAYOUTS}, got {layout!r}")

    beside = records_tokenizer(records) if records is not None else None
    if beside is not None and str(tokenizer).startswith("bpe:"):
        # The BPE the records were written with, saved beside them: a learner that reads
        # records never loads (or hashes) the train split's text to find its tokenizer.
        tok = load_tokenizer(beside)
        if tok.vocab_size != int(str(tokenizer)[4:]):
            raise ValueError(
                f"lm task: the records' tokenizer {beside} has {tok.vocab_size} ids, the "
                f"config names {tokenizer!r}"
            )
    else:
        tok = load_tokenizer(tokenizer, corpus=corpus, validation_doc=validation_doc, data_dir=root)
    if isinstance(tok, ByteTokenizer):
        config = get_config(model, **dict(model_fields))  # 260 ids hold the tokenizer's 259
        name = f"lm:{model}"
    else:
        config = get_config(model, vocab_size=tok.vocab_size, **dict(model_fields))
        name = f"lm:{model}:{tokenizer}"

    def data() -> Any:
        from dipsjax.data.layout import SpreadChunks

        if records is not None:
            source = _record_source(records, tok, chunk_len, batch_size, seq_len)
            if layout == "contiguous":
                return source
            return SpreadChunks(
                source.chunks,
                batch_size=batch_size,
                seq_len=seq_len,
                seed=seed,
                num_chunks=source.num_chunks,
                chunk_len=source.chunk_len,
            )
        from dipsjax.data import train_chunks
        from dipsjax.data.pipeline import TokenChunks

        chunks = train_chunks(
            corpus,
            chunk_len=chunk_len,
            tokenizer=tok,
            data_dir=root,
            validation_doc=validation_doc,
        )
        if layout == "contiguous":
            return TokenChunks(chunks, batch_size=batch_size, seq_len=seq_len)
        return SpreadChunks(chunks, batch_size=batch_size, seq_len=seq_len, seed=seed)

    @functools.cache
    def validation() -> tuple[list[Any], int, float]:
        """The eval batches, their scored targets and the UTF-8 bytes those tokens spell."""
        return validation_set(
            corpus, validation_doc, eval_tokens, seq_len, data_dir=root, tokenizer=tok
        )

    def metrics(loss: float) -> dict[str, float]:
        _, targets, num_bytes = validation()
        # bytes / targets is exactly 1.0 for byte tokens: then loss / ln 2, bit for bit.
        return {"bits_per_byte": loss / (math.log(2.0) * (num_bytes / targets))}

    return Task(
        name=name,
        model=lm_model(config),
        loss=task_loss,
        data=data,
        eval_batches=lambda: validation()[0],
        metrics=metrics,
        count=task_count,
    )


def task_loss(model: Any, batch: Any) -> Any:
    """The task's loss: :func:`~dipsjax.learner.step.lm_loss` of a token batch (training),
    or of an :class:`~dipsjax.data.pipeline.EvalBatch` the mean over the targets its mask
    scores (validation; 0 for a batch that scores none)."""
    import jax.numpy as jnp

    from dipsjax.data.pipeline import EvalBatch
    from dipsjax.learner.step import cross_entropy, lm_loss, split_batch
    from dipsjax.task import activation_sharding

    if not isinstance(batch, EvalBatch):
        return lm_loss(model, batch)
    inputs, targets = split_batch(batch.tokens)
    nll = cross_entropy(model(inputs, activation_sharding=activation_sharding()), targets)
    mask = batch.mask.astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def task_count(batch: Any) -> int:
    """What a batch counts: a token batch's ``batch * seq_len`` targets, an
    :class:`~dipsjax.data.pipeline.EvalBatch`'s scored targets."""
    from dipsjax.data.pipeline import EvalBatch
    from dipsjax.learner.step import tokens_in

    if isinstance(batch, EvalBatch):
        return int(np.count_nonzero(np.asarray(batch.mask)))
    return tokens_in(batch)


def records_tokenizer(records: Sequence[str]) -> str | None:
    """The ``tokenizer.json`` :func:`write_records` saved beside records ``records`` (the
    first path given, ``PATH.tokenizer.json``), if there is one."""
    first = str(records[0])
    stem = first.split("*", 1)[0].rstrip("-") if glob.has_magic(first) else first
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", stem)  # a shard's file: its records' path
    path = stem + ".tokenizer.json"
    return path if os.path.isfile(path) else None


def _record_source(
    records: Sequence[str], tok: Any, chunk_len: int, batch_size: int, seq_len: int
) -> Any:
    from dipsjax.data.records import RecordChunks

    files = record_files(records)
    source = RecordChunks(files, batch_size=batch_size, seq_len=seq_len)
    if source.chunk_len != chunk_len:
        raise ValueError(
            f"lm task: the records {', '.join(files)} hold chunks of {source.chunk_len} tokens, "
            f"the config's chunk_len is {chunk_len} (write them again with --chunk-len)"
        )
    first = source.batch(0, 0)
    if int(first.max()) >= tok.vocab_size or int(first.min()) < 0:
        raise ValueError(
            f"lm task: the records {', '.join(files)} hold ids outside [0, {tok.vocab_size}) "
            f"of tokenizer {tok!r}: were they written with another tokenizer?"
        )
    return source


def token_byte_lengths(tok: Any) -> np.ndarray:
    """``int64[vocab_size]``: the UTF-8 bytes each id stands for in text (0 for specials).

    Byte tokenizer: 1 for ids below 256. A byte-level BPE: the length of its token in the
    byte-level alphabet (one character a byte). Other tokenizers: the UTF-8 length of the
    id decoded alone."""
    from dipsjax.data import ByteTokenizer

    if isinstance(tok, ByteTokenizer):
        lengths = np.zeros(tok.vocab_size, dtype=np.int64)
        lengths[: ByteTokenizer.NUM_BYTES] = 1
        return lengths
    lengths = np.zeros(tok.vocab_size, dtype=np.int64)
    hf = getattr(tok, "hf", None)
    if hf is None:  # another Tokenizer: each id decoded alone
        for i in range(tok.vocab_size):
            lengths[i] = len(tok.decode([i]).encode("utf-8"))
        return lengths
    from tokenizers import pre_tokenizers

    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    special = set(getattr(tok, "special_ids", (tok.pad_id, tok.bos_id, tok.eos_id)))
    added = {int(i) for i, t in hf.get_added_tokens_decoder().items() if t.special}
    for i in range(tok.vocab_size):
        if i in special or i in added:
            continue
        piece = hf.id_to_token(i)
        if piece is None:
            continue
        if piece and all(c in alphabet for c in piece):
            lengths[i] = len(piece)
        else:
            lengths[i] = len(hf.decode([i], skip_special_tokens=True).encode("utf-8"))
    return lengths


def validation_set(
    corpus: str,
    validation_doc: str | None,
    eval_tokens: int,
    seq_len: int,
    data_dir: str | None = None,
    tokenizer: Any = None,
) -> tuple[list[Any], int, float]:
    """The fixed validation set (:func:`~dipsjax.data.layout.validation_windows` of the
    held-out text of :func:`~dipsjax.data.pipeline.validation_data`, BOS targets not
    scored), the number of its scored targets and the UTF-8 bytes those targets spell
    (exact: each byte of the held-out text is in one token).

    A tokenizer whose tokens do not add up to the held-out text's bytes (one that
    normalizes text) gets, with a warning, the text's average bytes per token instead."""
    from dipsjax.data import ByteTokenizer, validation_data
    from dipsjax.data.layout import scored_bytes, validation_windows

    tok = tokenizer if tokenizer is not None else ByteTokenizer()
    val = validation_data(corpus, tokenizer=tok, data_dir=data_dir, validation_doc=validation_doc)
    batches = validation_windows(
        val.tokens,
        eval_tokens=eval_tokens,
        seq_len=seq_len,
        pad_id=tok.pad_id,
        ignore_ids=(tok.bos_id,),
    )
    n = sum(int(np.count_nonzero(b.mask)) for b in batches)
    if n < 1:
        raise ValueError("the validation windows hold no text")
    lengths = token_byte_lengths(tok)
    if int(lengths[val.tokens].sum()) != val.num_bytes:
        # A tokenizer that normalizes text: its tokens do not spell the text's bytes. The
        # held-out text's average bytes per (text) token stands in for the windows'.
        text_tokens = int(np.count_nonzero(val.tokens != tok.bos_id))
        warnings.warn(
            f"the tokens of {tok!r} do not spell the held-out text's bytes: bits per byte "
            "use the text's average bytes per token, not the validation windows' own",
            stacklevel=2,
        )
        return batches, n, n * val.num_bytes / text_tokens
    num_bytes = scored_bytes(batches, lengths)
    if num_bytes < 1:
        raise ValueError("the validation windows hold no text")
    return batches, n, num_bytes


def write_records(
    path: str | os.PathLike[str],
    *,
    tokenizer: str | os.PathLike[str] = "byte",
    corpus: str = "austen",
    validation_doc: str | None = None,
    chunk_len: int = 4096,
    shards: int = 1,
    data_dir: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Writes the train split's chunks (``tokenizer``'s tokens, ``chunk_len`` targets each)
    as ArrayRecord files for ``task_args={"records": path, "tokenizer": ...}``; returns the
    files written. A subword tokenizer is saved beside them (``PATH.tokenizer.json``): a
    learner reading the records takes it from there, never reading the train text."""
    from dipsjax.data import load_tokenizer, train_chunks
    from dipsjax.data.fetch import data_dir as default_data_dir
    from dipsjax.data.records import write_chunks

    root = str(default_data_dir(data_dir))
    tok = load_tokenizer(tokenizer, corpus=corpus, validation_doc=validation_doc, data_dir=root)
    chunks = train_chunks(
        corpus, chunk_len=chunk_len, tokenizer=tok, data_dir=root, validation_doc=validation_doc
    )
    files = write_chunks(path, chunks, shards=shards)
    if hasattr(tok, "save"):  # a subword tokenizer travels with its records
        tok.save(str(path) + ".tokenizer.json")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dipsjax.tasks.lm",
        description="Write the language-model task's training chunks as ArrayRecord files "
        "(then task_args={'records': PATH, 'tokenizer': SPEC}).",
    )
    parser.add_argument("--write-records", metavar="PATH", required=True)
    parser.add_argument("--tokenizer", default="byte", help="'byte', 'bpe:1024' or a file")
    parser.add_argument("--corpus", default="austen")
    parser.add_argument("--validation-doc", default=None)
    parser.add_argument("--chunk-len", type=int, default=4096)
    parser.add_argument("--shards", type=int, default=1)
    args = parser.parse_args(argv)
    files = write_records(
        args.write_records,
        tokenizer=args.tokenizer,
        corpus=args.corpus,
        validation_doc=args.validation_doc,
        chunk_len=args.chunk_len,
        shards=args.shards,
    )
    print("\n".join(files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
