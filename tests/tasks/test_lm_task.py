"""The built-in language-model task's arguments: the tokenizer (the model's vocabulary
follows it; exact bits per byte) and ArrayRecord chunks, the default unchanged."""

import math
import os

import numpy as np
import pytest

from dipsjax.data import ByteTokenizer, load_tokenizer, train_chunks, validation_data
from dipsjax.data.fetch import data_dir
from dipsjax.data.pipeline import TokenChunks
from dipsjax.data.records import RecordChunks
from dipsjax.learner.step import lm_model
from dipsjax.model.configs import get_config
from dipsjax.sim.simulator import SimConfig, replay, simulate, tree_equal
from dipsjax.task import load_task
from dipsjax.tasks import lm


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A data folder of its own holding the Austen corpus (the subword tokenizers trained
    here are cached in it, not in the shared one)."""
    root = tmp_path_factory.mktemp("data")
    os.symlink(data_dir() / "austen", root / "austen")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIPSJAX_DATA", str(root))
        yield root


def old_validation_batches(cfg, root):
    """The byte task's validation batches as they were before tokenizers (reference)."""
    val = validation_data(cfg.corpus, tokenizer=ByteTokenizer(), data_dir=root)
    b, s = cfg.batch_size, cfg.seq_len
    rows = val.tokens[: cfg.eval_batches * b * s + 1]
    return [
        np.stack([rows[(k * b + i) * s : (k * b + i + 1) * s + 1] for i in range(b)])
        for k in range(cfg.eval_batches)
    ]


def test_the_default_task_is_the_byte_task_as_before(data):
    cfg = SimConfig()
    task = load_task(cfg)
    assert task is lm.get_task(cfg) is lm.get_task(cfg, tokenizer="byte", records=None)
    assert load_task(SimConfig(task_args={"tokenizer": "byte"})) is task  # equal arguments
    assert task.name == "lm:tiny"
    assert task.model is lm_model(get_config("tiny"))  # vocab 260, as ever
    chunks = train_chunks(cfg.corpus, chunk_len=cfg.chunk_len, tokenizer=ByteTokenizer())
    want = TokenChunks(chunks, batch_size=cfg.batch_size, seq_len=cfg.seq_len)
    src = task.source
    assert isinstance(src, TokenChunks)
    assert (src.num_chunks, src.batches_per_chunk) == (want.num_chunks, want.batches_per_chunk)
    np.testing.assert_array_equal(src.chunks, want.chunks)
    for c, i in [(0, 0), (3, 7), (src.num_chunks - 1, src.batches_per_chunk - 1)]:
        np.testing.assert_array_equal(src.batch(c, i), want.batch(c, i))
    old = old_validation_batches(cfg, str(data))
    assert len(task.validation) == len(old)
    for got, ref in zip(task.validation, old, strict=True):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, ref)
    for loss in (0.0, 1.2345678, 2.718281828, 5.5):  # bit for bit: replay relies on it
        assert task.bits_per_byte(loss) == loss / math.log(2.0)


def test_a_subword_tokenizer_sizes_the_model_and_measures_bytes_per_token(data):
    cfg = SimConfig(task_args={"tokenizer": "bpe:512"})
    task = load_task(cfg)
    tok = load_tokenizer("bpe:512", data_dir=str(data))
    assert tok.vocab_size == 512
    assert task.model is lm_model(get_config("tiny", vocab_size=512))
    assert task.name == "lm:tiny:bpe:512"
    src = task.source
    assert src.batch(0, 0).shape == (cfg.batch_size, cfg.seq_len + 1)
    for c in range(0, src.num_chunks, 37):
        batch = src.batch(c, 0)
        assert batch.min() >= 0 and batch.max() < 512
    assert max(int(src.batch(c, 0).max()) for c in range(10)) > 259  # merges are used
    val = validation_data(cfg.corpus, tokenizer=tok)
    n = cfg.eval_batches * cfg.batch_size * cfg.seq_len
    assert sum(b.size - b.shape[0] for b in task.validation) == n
    targets = val.tokens[1 : n + 1]
    assert targets.max() < 512
    # The bytes those n target tokens spell (Austen is ASCII here: no character is cut).
    text = tok.decode(targets)
    assert "\ufffd" not in text
    num_bytes = len(text.encode("utf-8"))
    assert num_bytes > 1.5 * n  # about 2 bytes a token
    for loss in (1.0, 3.25):
        assert task.bits_per_byte(loss) == pytest.approx(loss * n / (math.log(2) * num_bytes))
        # ... near, not at, the whole held-out text's average (its opening, the title and
        # chapter headings, has fewer bytes a token): what the batches cover is measured
        whole = loss / (math.log(2) * tok.bytes_per_token(val_text(cfg)))
        assert task.bits_per_byte(loss) == pytest.approx(whole, rel=0.15)
        assert task.bits_per_byte(loss) != whole
    lengths = lm.token_byte_lengths(tok)
    assert lengths[list(tok.special_ids)].sum() == 0
    assert int(lengths[targets].sum()) == num_bytes


def val_text(cfg):
    from dipsjax.data import load_corpus

    return load_corpus(cfg.corpus, "validation").texts


def test_records_give_the_batches_of_memory(data, tmp_path):
    cfg = SimConfig(seq_len=32)
    path = tmp_path / "bpe" / "austen.array_record"
    files = lm.write_records(path, tokenizer="bpe:512", chunk_len=cfg.chunk_len, shards=3)
    assert len(files) == 3
    memory = lm.get_task(cfg, tokenizer="bpe:512").source
    for records in (str(path), str(tmp_path / "bpe" / "austen.array_record-*"), files):
        task = lm.get_task(cfg, tokenizer="bpe:512", records=records)
        src = task.source
        assert isinstance(src, RecordChunks)
        assert task.model is lm.get_task(cfg, tokenizer="bpe:512").model
        assert (src.num_chunks, src.batches_per_chunk, src.tokens_per_batch) == (
            memory.num_chunks,
            memory.batches_per_chunk,
            memory.tokens_per_batch,
        )
        for c in range(0, src.num_chunks, 11):
            for i in (0, src.batches_per_chunk - 1):
                np.testing.assert_array_equal(src.batch(c, i), memory.batch(c, i))
    # The command line writes the same chunks.
    assert lm.main(["--write-records", str(tmp_path / "cli"), "--tokenizer", "bpe:512"]) == 0
    cli = RecordChunks(str(tmp_path / "cli"), batch_size=cfg.batch_size, seq_len=cfg.seq_len)
    np.testing.assert_array_equal(cli.batch(5, 3), memory.batch(5, 3))
    # Records of another chunk length or tokenizer are refused, a missing path named.
    with pytest.raises(ValueError, match="chunk_len"):
        _ = lm.get_task(SimConfig(chunk_len=2048), tokenizer="bpe:512", records=str(path)).source
    with pytest.raises(ValueError, match="outside"):
        _ = lm.get_task(cfg, tokenizer="byte", records=str(path)).source
    with pytest.raises(FileNotFoundError, match="write-records"):
        _ = lm.get_task(cfg, records=str(tmp_path / "nowhere")).source


def test_a_subword_run_trains_and_replays(data):
    cfg = SimConfig(
        method="dips",
        learners=2,
        inner_steps=4,
        eta=50,
        token_budget=3 * 2 * 4 * 8 * 64,
        eval_every=2,
        eval_batches=2,
        task_args={"tokenizer": "bpe:512"},
    )
    res = simulate(cfg)
    assert res.rounds >= 3
    assert res.params["embed"]["embedding"].shape[0] == 512
    assert math.isfinite(res.final_loss) and math.isfinite(res.final_bpb)
    assert res.final_bpb == load_task(cfg).bits_per_byte(res.final_loss)
    assert res.final_bpb < res.final_loss / math.log(2)  # more than a byte a token
    assert tree_equal(replay(cfg, res.tape), res.params)


def test_a_tokenizer_that_drops_bytes_gets_the_average_bytes_per_token(data, tmp_path):
    # Whitespace pre-tokenization drops the spaces: the tokens do not spell the text's bytes,
    # so the held-out text's average bytes per token stands in (with a warning).
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers, trainers

    hf = HF(models.BPE(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[UNK]", "<pad>", "<bos>", "<eos>"], show_progress=False
    )
    hf.train_from_iterator([t[:100_000] for t in load_corpus_train()], trainer)
    path = tmp_path / "words.json"
    hf.save(str(path))
    cfg = SimConfig()
    task = lm.get_task(cfg, tokenizer=str(path))
    tok = load_tokenizer(str(path))
    assert task.model is lm_model(get_config("tiny", vocab_size=tok.vocab_size))
    with pytest.warns(UserWarning, match="average bytes per token"):
        assert len(task.validation) == cfg.eval_batches
    val = validation_data(cfg.corpus, tokenizer=tok)
    text_tokens = int((val.tokens != tok.bos_id).sum())
    n = cfg.eval_batches * cfg.batch_size * cfg.seq_len
    want = 2.0 * n / (math.log(2.0) * (n * val.num_bytes / text_tokens))
    assert task.bits_per_byte(2.0) == pytest.approx(want, rel=1e-12)


def load_corpus_train():
    from dipsjax.data import load_corpus

    return load_corpus("austen", "train").texts
