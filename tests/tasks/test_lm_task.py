"""The built-in language-model task's arguments: the tokenizer (the model's vocabulary
follows it; exact bits per byte) and ArrayRecord chunks, the default unchanged."""

import math
import os

import numpy as np
import pytest

from dipsjax.data import ByteTokenizer, load_tokenizer, train_chunks, validation_data
from dipsjax.data.fetch import data_dir
from dipsjax.data.layout import EVAL_ROWS, SpreadChunks, scored_targets, spread_windows
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


def test_the_default_task_is_the_byte_task_and_spread_rows_an_option(data):
    cfg = SimConfig()
    task = load_task(cfg)
    assert task is lm.get_task(cfg) is lm.get_task(cfg, tokenizer="byte", records=None)
    assert load_task(SimConfig(task_args={"tokenizer": "byte"})) is task  # equal arguments
    assert load_task(SimConfig(seed=3)) is task  # the contiguous layout has no seed
    assert task.name == "lm:tiny"
    assert task.model is lm_model(get_config("tiny"))  # vocab 260, as ever
    chunks = train_chunks(cfg.corpus, chunk_len=cfg.chunk_len, tokenizer=ByteTokenizer())
    want = TokenChunks(chunks, batch_size=cfg.batch_size, seq_len=cfg.seq_len)
    src = task.source
    assert cfg.data_layout == "contiguous" and isinstance(src, TokenChunks)
    assert (src.num_chunks, src.batches_per_chunk) == (want.num_chunks, want.batches_per_chunk)
    np.testing.assert_array_equal(src.chunks, want.chunks)
    for c, i in [(0, 0), (3, 7), (src.num_chunks - 1, src.batches_per_chunk - 1)]:
        np.testing.assert_array_equal(src.batch(c, i), want.batch(c, i))
    # "spread": rows across the corpus, in the order the seed gives.
    spread = load_task(SimConfig(data_layout="spread", seed=1)).source
    assert isinstance(spread, SpreadChunks)
    ref = SpreadChunks(chunks, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=1)
    assert (spread.num_chunks, spread.batches_per_chunk) == (src.num_chunks, 8)
    for c, i in [(0, 0), (3, 7)]:
        np.testing.assert_array_equal(spread.batch(c, i), ref.batch(c, i))
    other = load_task(SimConfig(data_layout="spread", seed=2)).source
    assert not np.array_equal(other.batch(0, 0), spread.batch(0, 0))
    with pytest.raises(ValueError, match="data_layout"):
        SimConfig(data_layout="random")
    for loss in (0.0, 1.2345678, 2.718281828, 5.5):  # bit for bit: replay relies on it
        assert task.bits_per_byte(loss) == loss / math.log(2.0)


def test_the_validation_set_is_fixed_spread_and_exact(data):
    """eval_tokens of windows over the whole of Persuasion, whatever the batch size, the
    learners, the method or the layout; bits per byte the direct sum over those windows."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dipsjax.learner.step import cross_entropy
    from dipsjax.sim.world import World

    eval_tokens = 40 * 64  # 40 windows: 3 batches of 16 rows, the last half padding
    cfg = SimConfig(eval_tokens=eval_tokens, learners=1, method="dp")
    val = validation_data(cfg.corpus, tokenizer=ByteTokenizer(), data_dir=str(data))
    task = load_task(cfg)
    got = task.validation
    assert [b.tokens.shape for b in got] == [(EVAL_ROWS, 65)] * 3
    assert sum(int(b.mask.sum()) for b in got) == eval_tokens
    rows = np.concatenate([b.tokens for b in got])[:40]
    starts = spread_windows(val.tokens.shape[0], 64, 40)
    for r, s in zip(rows, starts, strict=True):
        np.testing.assert_array_equal(r, val.tokens[s : s + 65])
    assert starts[0] == 0 and starts[-1] + 65 == val.tokens.shape[0]  # start to end
    assert np.all(np.diff(starts) >= 64)  # disjoint
    for other in (
        SimConfig(eval_tokens=eval_tokens, batch_size=32, learners=4),
        SimConfig(eval_tokens=eval_tokens, batch_size=2, chunk_len=2048, method="decoupled"),
        SimConfig(eval_tokens=eval_tokens, data_layout="spread", seed=7),
    ):
        theirs = load_task(other).validation
        assert len(theirs) == len(got)
        for a, b in zip(theirs, got, strict=True):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_array_equal(a.mask, b.mask)
    # The simulator's evaluation (the runtime's evaluator calls it) against a direct sum
    # of the model's next-token losses over the same 40 windows, of a model whose losses
    # vary from token to token (its initialization, scaled).
    world = World(cfg)
    params = jax.tree.map(lambda x: 3.0 * np.asarray(x), world.init_params)
    got = world.evaluate(params)
    loss, bpb = got.loss, got.bpb
    model = nnx.merge(world.evaluator.inner.graphdef, world.evaluator.params)
    windows = jnp.asarray(rows)
    nll = np.asarray(cross_entropy(model(windows[:, :-1]), windows[:, 1:]), np.float64)
    assert loss == pytest.approx(nll.sum() / eval_tokens, rel=2e-6)
    assert bpb == pytest.approx(nll.sum() / (math.log(2.0) * eval_tokens), rel=2e-6)
    # ... which the old validation, the text's first windows, misses by 50 times that.
    first = jnp.asarray(val.tokens[: 40 * 64 + 1][np.arange(40)[:, None] * 64 + np.arange(65)])
    head = np.asarray(cross_entropy(model(first[:, :-1]), first[:, 1:]), np.float64)
    assert abs(head.mean() - loss) > 1e-4 * loss


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
    n = cfg.eval_tokens
    assert sum(int(b.mask.sum()) for b in task.validation) == n
    targets = scored_targets(task.validation)
    assert targets.size == n and targets.max() < 512
    # The bytes those n target tokens spell (Austen is ASCII: no character is cut).
    text = "".join(tok.decode(b.tokens[r, 1:]) for b in task.validation for r in range(16))
    assert "\ufffd" not in text
    num_bytes = len(text.encode("utf-8"))
    assert num_bytes > 1.5 * n  # about 2 bytes a token
    for loss in (1.0, 3.25):
        assert task.bits_per_byte(loss) == pytest.approx(loss * n / (math.log(2) * num_bytes))
        # ... near, not at, the whole held-out text's average: what the windows cover
        whole = loss / (math.log(2) * tok.bytes_per_token(val_text(cfg)))
        assert task.bits_per_byte(loss) == pytest.approx(whole, rel=0.05)
        assert task.bits_per_byte(loss) != whole
    lengths = lm.token_byte_lengths(tok)
    assert lengths[list(tok.special_ids)].sum() == 0
    assert int(lengths[targets].sum()) == num_bytes


def val_text(cfg):
    from dipsjax.data import load_corpus

    return load_corpus(cfg.corpus, "validation").texts


def test_records_give_the_batches_of_memory(data, tmp_path):
    cfg = SimConfig(seq_len=32, data_layout="contiguous")
    path = tmp_path / "bpe" / "austen.array_record"
    files = lm.write_records(path, tokenizer="bpe:512", chunk_len=cfg.chunk_len, shards=3)
    assert len(files) == 3
    # Spread rows read from records are those read from memory.
    spread = SimConfig(seq_len=32, seed=5, data_layout="spread")
    from_records = lm.get_task(spread, tokenizer="bpe:512", records=str(path)).source
    assert isinstance(from_records, SpreadChunks)
    in_memory = lm.get_task(spread, tokenizer="bpe:512").source
    for c, i in [(0, 0), (17, 5), (from_records.num_chunks - 1, 15)]:
        np.testing.assert_array_equal(from_records.batch(c, i), in_memory.batch(c, i))
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
    # The BPE travels with its records: a learner that reads them never loads the train
    # split's text (here it cannot: reading it fails), by path, glob or shard files.
    assert (tmp_path / "bpe" / "austen.array_record.tokenizer.json").is_file()
    from dipsjax.data import corpus as corpus_lib
    from dipsjax.data import pipeline as pipeline_lib

    real_load = corpus_lib.load_corpus

    def no_train_text(name, split="train", *args, **kw):
        assert split != "train", "a learner reading records loaded the train split's text"
        return real_load(name, split, *args, **kw)

    for records in (str(path), str(tmp_path / "bpe" / "austen.array_record-*"), files):
        lm._task.cache_clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(corpus_lib, "load_corpus", no_train_text)
            mp.setattr(pipeline_lib, "load_corpus", no_train_text)
            task = lm.get_task(cfg, tokenizer="bpe:512", records=records)
            np.testing.assert_array_equal(task.source.batch(5, 3), memory.batch(5, 3))
            if records == str(path):  # the held-out text alone is read for validation
                assert len(task.validation) > 0
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
        eval_tokens=1024,
        data_layout="spread",  # and rows drawn across the corpus replay too
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
        assert len(task.validation) == cfg.eval_tokens // cfg.seq_len // EVAL_ROWS
    val = validation_data(cfg.corpus, tokenizer=tok)
    text_tokens = int((val.tokens != tok.bos_id).sum())
    n = cfg.eval_tokens
    want = 2.0 * n / (math.log(2.0) * (n * val.num_bytes / text_tokens))
    assert task.bits_per_byte(2.0) == pytest.approx(want, rel=1e-12)


def load_corpus_train():
    from dipsjax.data import load_corpus

    return load_corpus("austen", "train").texts


def test_remat_and_attention_reach_the_model_from_the_task_args(data):
    from flax import nnx

    cfg = SimConfig(task_args=(("remat", "full"), ("attention", "xla")))
    model = load_task(cfg).model(nnx.Rngs(0))
    assert (model.config.remat, model.config.attention) == ("full", "xla")
    assert load_task(SimConfig()).model(nnx.Rngs(0)).config.remat == "none"
    with pytest.raises(ValueError, match=r"ModelConfig\.remat must be one of"):
        load_task(SimConfig(task_args=(("remat", "everything"),)))
    scanned = load_task(SimConfig(task_args={"scan_layers": True})).model(nnx.Rngs(0))
    assert scanned.config.scan_layers and not model.config.scan_layers
