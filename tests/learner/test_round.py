"""Rounds and contributions: exact pseudo-gradients (both references), exact token counts,
concurrent partitions on disjoint sub-meshes, validation loss and bits per byte."""

import functools
import math
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from dipsjax.learner import (
    Contribution,
    InnerOptimizerConfig,
    InnerStep,
    Learner,
    make_partition_mesh,
    params_to_dict,
)
from dipsjax.model import Llama, get_config

OPT = InnerOptimizerConfig(learning_rate=1e-3)
BATCH, SEQ = 8, 32  # as in test_step.py, so compiled steps are shared


def batches(n, *, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 260, (BATCH, SEQ + 1)).astype(np.int32) for _ in range(n)]


@functools.cache
def tiny_init(seed=0):
    model = Llama(get_config("tiny"), rngs=nnx.Rngs(seed))
    return jax.device_get(params_to_dict(nnx.state(model, nnx.Param)))


def copy_to_host(tree):
    return jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(tree))


def leaves(tree):
    return jax.tree.leaves(tree)


@pytest.fixture(scope="module")
def learner():
    mesh = make_partition_mesh(jax.devices()[:4], tensor=2)
    return Learner(get_config("tiny"), OPT, mesh=mesh, learner_id="a", params=tiny_init())


def test_start_reference_is_exactly_start_minus_end(learner):
    learner.pull(tiny_init(), version=7)
    start = copy_to_host(learner.params_dict())
    c = learner.run_round(iter(batches(3)), num_steps=3)
    end = copy_to_host(learner.params_dict())
    assert isinstance(c, Contribution)
    assert (c.learner_id, c.base_version, c.steps, c.reference) == ("a", 7, 3, "start")
    assert c.tokens == 3 * BATCH * SEQ
    delta = copy_to_host(c.delta)
    assert jax.tree.structure(delta) == jax.tree.structure(start)
    # A plain nested dict with string keys, as the outer library expects.
    assert set(delta) == {"embed", "layers", "final_norm", "lm_head"}
    assert set(delta["layers"]) == {"0", "1"} and isinstance(delta["layers"]["0"], dict)
    for d, s, e in zip(leaves(delta), leaves(start), leaves(end), strict=True):
        assert d.dtype == np.float32
        np.testing.assert_array_equal(d, s - e)
    assert any(np.any(d != 0) for d in leaves(delta))
    assert np.isfinite(c.train_loss)


def test_server_reference_is_exactly_server_minus_end(learner):
    learner.pull(tiny_init(), version=2)
    server = jax.tree.map(lambda x: x + np.float32(0.01), tiny_init())  # the server moved on
    for given in (server, lambda: server):
        c = learner.run_round(batches(2), num_steps=2, server_params=given, reference="server")
        end = copy_to_host(learner.params_dict())
        assert (c.reference, c.base_version, c.steps) == ("server", 2, 2)
        for d, s, e in zip(leaves(copy_to_host(c.delta)), leaves(server), leaves(end), strict=True):
            np.testing.assert_array_equal(d, s - e)
    with pytest.raises(ValueError, match="server_params"):
        learner.run_round(batches(1), num_steps=1, reference="server")


def test_round_ends_early_when_data_runs_out_and_counts_tokens_exactly(learner):
    learner.pull(tiny_init(), version=0)
    before = learner.tokens_done
    c = learner.run_round(batches(2), num_steps=5)
    assert (c.steps, c.tokens) == (2, 2 * BATCH * SEQ)
    assert learner.tokens_done - before == c.tokens
    empty = learner.run_round([], num_steps=4)
    assert (empty.steps, empty.tokens) == (0, 0) and math.isnan(empty.train_loss)
    assert all(np.all(d == 0) for d in leaves(copy_to_host(empty.delta)))


def test_pull_copies_the_callers_arrays(learner):
    mine = params_to_dict(learner.inner.put_params(tiny_init()))
    learner.pull(mine, version=1)
    learner.run_round(batches(1), num_steps=1)  # donates the learner's buffers
    assert not any(x.is_deleted() for x in leaves(mine))
    for a, b in zip(leaves(copy_to_host(mine)), leaves(tiny_init()), strict=True):
        np.testing.assert_array_equal(a, b)


def test_evaluate_reports_nats_and_bits_per_byte(learner):
    learner.pull(tiny_init(), version=0)
    data = batches(2, seed=5)
    result = learner.evaluate(data)
    model = Llama(get_config("tiny"), rngs=nnx.Rngs(0))
    nats = []
    for b in data:
        logits = np.asarray(model(b[:, :-1]), np.float64)
        logp = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
        nats.append(-np.take_along_axis(logp, b[:, 1:, None], -1))
    assert result.tokens == 2 * BATCH * SEQ
    assert result.loss == pytest.approx(np.mean(nats), rel=1e-5)
    assert result.bits_per_byte == pytest.approx(result.loss / math.log(2), rel=1e-12)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="reference"):
        Learner(get_config("tiny"), mesh=None, learner_id=0, reference="end", params=tiny_init())


def test_two_partitions_step_concurrently_on_disjoint_meshes(learner):
    groups = (jax.devices()[:4], jax.devices()[4:])
    learner.pull(tiny_init(0), version=0, reset_optimizer=True)
    other = Learner(
        get_config("tiny"),
        OPT,
        mesh=make_partition_mesh(groups[1], tensor=1),
        learner_id="b",
        params=tiny_init(1),
    )
    learners = [learner, other]
    data = [batches(3, seed=10 + i) for i in range(2)]
    results = [None, None]
    barrier = threading.Barrier(2)

    def work(i):
        barrier.wait()
        results[i] = learners[i].run_round(data[i], num_steps=3).to_host()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Reference: the same rounds, unsharded, one after the other.
    ref = InnerStep(get_config("tiny"), OPT, mesh=None)
    for i, c in enumerate(results):
        assert c is not None and c.learner_id == "ab"[i] and c.tokens == 3 * BATCH * SEQ
        params = ref.put_params(tiny_init(i))
        start = copy_to_host(params_to_dict(params))
        opt_state = ref.init_opt_state(params)
        for b in data[i]:
            params, opt_state, _ = ref.step(params, opt_state, ref.put_batch(b))
        end = copy_to_host(params_to_dict(params))
        for d, s, e in zip(leaves(c.delta), leaves(start), leaves(end), strict=True):
            np.testing.assert_allclose(d, s - e, rtol=0, atol=2 * 3 * OPT.learning_rate)
            assert np.mean(np.abs(d - (s - e)) > 1e-2 * OPT.learning_rate) < 1e-3
        devices = {d.id for x in leaves(learners[i].params) for d in x.devices()}
        assert devices == {d.id for d in groups[i]}


def test_the_inner_schedule_counts_the_learner_s_steps_across_pulls():
    """DiLoCo keeps the inner AdamW state across rounds: a pull replaces the parameters
    only, so the schedule's step count (warmup, then cosine) goes on from where the last
    round left it; only a first pull (``reset_optimizer``) starts it again."""
    import optax

    from dipsjax.learner.step import learning_rate_schedule

    opt = InnerOptimizerConfig(
        learning_rate=1e-3, warmup_steps=2, schedule="cosine", decay_steps=10
    )
    learner = Learner(get_config("tiny"), opt, mesh=None, learner_id=0, params=tiny_init())

    def counts():
        leaves = jax.tree_util.tree_flatten_with_path(learner.opt_state)[0]
        return {int(v) for path, v in leaves if "count" in jax.tree_util.keystr(path)}

    learner.run_round(batches(3), num_steps=3)
    learner.pull(tiny_init(), version=1)
    assert counts() == {3}
    learner.run_round(batches(3, seed=1), num_steps=3)
    assert counts() == {6}
    # The step it applies next uses the schedule at step 6, not at 0 (warmup's 0 lr).
    schedule = learning_rate_schedule(opt)
    assert float(schedule(6)) == pytest.approx(
        float(optax.cosine_decay_schedule(1e-3, 10, alpha=0.1)(4))
    )
    learner.pull(tiny_init(), version=2, reset_optimizer=True)
    assert counts() == {0}


def test_round_reports_the_mean_gradient_norm_of_its_steps(learner):
    """``Contribution.grad_norm`` is the mean over the round's steps of the gradient norm
    the inner step reports, here recomputed by stepping the same start by hand."""
    data = batches(3, seed=5)
    inner = learner.inner
    params = inner.put_params(tiny_init())
    opt_state = inner.init_opt_state(params)
    norms = []
    for b in data:
        params, opt_state, metrics = inner.step(params, opt_state, inner.put_batch(b))
        norms.append(float(np.linalg.norm([float(metrics["grad_norm"])])))
    learner.pull(tiny_init(), version=0, reset_optimizer=True)
    c = learner.run_round(iter(data), num_steps=3)
    assert len(set(norms)) == 3 and all(n > 0 for n in norms)
    np.testing.assert_allclose(c.grad_norm, np.mean(norms), rtol=1e-6)
    assert math.isnan(learner.run_round(iter([]), num_steps=3).grad_norm)  # no step


def test_a_scanned_learner_contributes_the_unrolled_learner_s_pseudo_gradient():
    """Issue 21: a learner whose blocks are stacked and scanned (``scan_layers``) pulls the
    unrolled model's dict and pushes its pseudo-gradient in that same dict, layer by layer:
    the syncer cannot tell them apart (equal to float32 rounding of a two-step round)."""
    from dipsjax import outer

    deltas = []
    for scan in (False, True):
        learner = Learner(
            get_config("tiny", scan_layers=scan), OPT, mesh=None, learner_id=0, params=tiny_init()
        )
        got = learner.run_round(batches(2), num_steps=2).to_host()
        assert got.steps == 2 and got.tokens == 2 * BATCH * SEQ
        deltas.append(outer.flatten(got.delta))
        again = outer.flatten(learner.params_dict())
        assert list(again) == list(outer.flatten(tiny_init()))
    plain, scanned = deltas
    assert list(scanned) == list(plain)
    lr = OPT.learning_rate
    for path, want in plain.items():
        assert np.max(np.abs(want)) > 0.5 * lr, path  # the round moved every tensor
        np.testing.assert_allclose(scanned[path], want, rtol=0, atol=2 * 2 * lr, err_msg=str(path))
        assert np.mean(np.abs(scanned[path] - want) > 1e-2 * lr) < 1e-3, path


@pytest.mark.parametrize("mesh", [False, True], ids=["single-device", "mesh"])
def test_the_inner_step_compiles_once_from_a_fresh_learner(mesh):
    """The first step's inputs (fresh parameters and AdamW state) and every later step's
    (the step's own outputs) are placed alike, so the step compiles once: an initialiser
    whose outputs were uncommitted made the second step compile again (at 1B, a second
    executable and a minute of compiling)."""
    m = make_partition_mesh(jax.devices()[:1]) if mesh else None
    config = get_config("tiny", num_layers=1)
    learner = Learner(config, OPT, mesh=m, learner_id=0, donate=True)
    learner.run_round(batches(3), num_steps=3)
    learner.pull(learner.params_dict(), version=1)
    learner.run_round(batches(2, seed=1), num_steps=2)
    assert learner.inner.step._cache_size() == 1
