"""The built-in task: a LLaMA decoder (``SimConfig.model``) learning next-token prediction on
a text corpus (``SimConfig.corpus``, byte tokens), the papers' setting.

Data: the corpus's train split, tokenized and cut into chunks of ``chunk_len`` target
tokens (:class:`~dipsjax.data.pipeline.TokenChunks`); validation: the first
``eval_batches`` batches of the held-out document, in nats per token and bits per byte.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from dipsjax.task import Task


def get_task(cfg: Any) -> Task:
    """The language-model task of experiment ``cfg`` (a :class:`~dipsjax.sim.config.SimConfig`)."""
    from dipsjax.data.fetch import data_dir

    return _task(
        str(data_dir()),  # where the corpus is read from: a key of the cache too
        cfg.model,
        cfg.corpus,
        cfg.validation_doc,
        cfg.chunk_len,
        cfg.batch_size,
        cfg.seq_len,
        cfg.eval_batches,
    )


@functools.lru_cache(maxsize=8)
def _task(
    root: str,
    model: str,
    corpus: str,
    validation_doc: str | None,
    chunk_len: int,
    batch_size: int,
    seq_len: int,
    eval_batches: int,
) -> Task:
    from dipsjax.learner.step import lm_loss, lm_model, tokens_in
    from dipsjax.model.configs import get_config

    def data() -> Any:
        from dipsjax.data import ByteTokenizer, train_chunks
        from dipsjax.data.pipeline import TokenChunks

        chunks = train_chunks(
            corpus,
            chunk_len=chunk_len,
            tokenizer=ByteTokenizer(),
            data_dir=root,
            validation_doc=validation_doc,
        )
        return TokenChunks(chunks, batch_size=batch_size, seq_len=seq_len)

    def validation() -> list[np.ndarray]:
        return validation_batches(
            corpus, validation_doc, eval_batches, batch_size, seq_len, data_dir=root
        )

    return Task(
        name=f"lm:{model}",
        model=lm_model(get_config(model)),
        loss=lm_loss,
        data=data,
        eval_batches=validation,
        metrics=lambda loss: {"bits_per_byte": loss / math.log(2.0)},
        count=tokens_in,
    )


def validation_batches(
    corpus: str,
    validation_doc: str | None,
    count: int,
    batch_size: int,
    seq_len: int,
    data_dir: str | None = None,
) -> list[np.ndarray]:
    """The first ``count`` batches ``int32[batch_size, seq_len + 1]`` of the held-out text,
    consecutive windows of it (one token of overlap, as training sequences)."""
    from dipsjax.data import ByteTokenizer, validation_data

    val = validation_data(
        corpus, tokenizer=ByteTokenizer(), data_dir=data_dir, validation_doc=validation_doc
    )
    n = count * batch_size * seq_len
    rows = val.tokens[: n + 1]
    if rows.shape[0] < n + 1:
        raise ValueError(
            f"the validation text has {val.tokens.shape[0]} tokens, fewer than the "
            f"{n + 1} that eval_batches * batch_size * seq_len needs"
        )
    return [
        np.stack(
            [
                rows[(b * batch_size + i) * seq_len : (b * batch_size + i + 1) * seq_len + 1]
                for i in range(batch_size)
            ]
        ).astype(np.int32)
        for b in range(count)
    ]
