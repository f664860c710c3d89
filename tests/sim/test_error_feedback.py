"""Error feedback in the simulator (EXTENSION): each push settled by the outcome the
leader's actions give it, on the toy world (real leader, followers, learner protocol)."""

import dataclasses

import jax
import numpy as np
import pytest

from dipsjax import outer
from dipsjax.launch import schema
from dipsjax.learner.contribution import encode_tree, wire
from dipsjax.sim.config import SimConfig
from dipsjax.sim.engine import Engine
from dipsjax.sim.replay import replay
from tests.sim.test_refuse_nonfinite import OneDivergence
from tests.sim.toy_world import ToyWorld, toy_config


def _run(world=ToyWorld, **kw):
    cfg = toy_config(method="dips", speeds=(1.5, 1.0, 1.25), **kw)
    engine = Engine(cfg, world=world(cfg))
    return engine, engine.run()


def _in_flight(engine):
    """Tokens of pushes not settled: sent with no word yet, or encoded and not pushed."""
    return sum(
        tokens for sl in engine.learners for _, tokens in [*sl.unsettled.values(), *sl.unassigned]
    )


def test_outcomes_match_the_leaders_books_and_the_residual_stays_finite():
    engine, _ = _run(wire="int4", error_feedback=True)
    books, seen = engine.leader.ledger.totals(), engine.feedback_tokens
    # the engine reads outcomes from Decide / Apply / Discard / Unused only
    assert seen["applied"] == books["applied"] == 600
    # a round with every push rejected reaches the followers as a Discard: the engine
    # counts those pushes discarded, the leader rejected (the residual is the same); the
    # push the leader dropped at the stop gets no word: it is still in flight, with one
    # round trained but never pushed
    assert seen["rejected"] + seen["discarded"] == books["rejected"] + books["dropped"] - 24
    assert _in_flight(engine) == 2 * 24
    residuals = [sl.feedback.residual for sl in engine.learners]
    assert all(np.all(np.isfinite(np.asarray(x))) for r in residuals for x in r.values())
    assert max(float(np.max(np.abs(np.asarray(x)))) for r in residuals for x in r.values()) > 0


def test_a_nonfinite_push_never_enters_the_residual():
    engine, _ = _run(world=OneDivergence, wire="int4", error_feedback=True)
    assert engine.feedback_tokens["nonfinite"] == 24  # the diverged round, settled so
    for sl in engine.learners:
        assert all(np.all(np.isfinite(np.asarray(x))) for x in sl.feedback.residual.values())


def test_lossless_wire_with_feedback_is_the_run_without():
    base, _ = _run(wire="fp32")
    fed, _ = _run(wire="fp32", error_feedback=True)
    a, b = base.cluster.model(), fed.cluster.model()
    assert a[0] == b[0]
    jax.tree.map(np.testing.assert_array_equal, a[1], b[1])
    assert all(not np.any(x) for sl in fed.learners for x in sl.feedback.residual.values())


def test_settings_named():
    with pytest.raises(ValueError, match="feedback_decay"):
        SimConfig(feedback_decay=1.5)
    for field, value in (("wire", "stat2"), ("error_feedback", True)):
        for command in ("run", "simulate"):  # the runtime carries both now
            assert getattr(schema.validate_sim({field: value}, command), field) == value


def test_replay_refuses_error_feedback():
    engine, _ = _run(wire="fp32", error_feedback=True)
    with pytest.raises(ValueError, match="replay does not carry error feedback"):
        replay(engine.cfg, engine.leader.tape, world=ToyWorld(engine.cfg))


@pytest.mark.parametrize("wire", ["bf16", "int4", "stat2"])
def test_the_simulator_prices_each_tensor_in_the_codec_it_is_sent_in(wire):
    # stat2 sends norms and embeddings as BF16 (outer.leaf_codecs): a round's bytes on the
    # wire are those of the tensors as sent, counted here from the names and shapes alone.
    from dipsjax import outer
    from dipsjax.sim.world import World

    world = World(SimConfig(model="tiny", wire=wire))
    flat = {"/".join(p): np.shape(x) for p, x in outer.flatten(world.init_params).items()}
    real = sum(int(np.prod(s)) for s in flat.values())
    scale = world.cfg.virtual_params / real
    per_value = {"bf16": 2.0, "int4": 0.5, "stat2": 0.28125}
    expected = 0.0
    for name, shape in flat.items():
        as_bf16 = wire == "stat2" and (len(shape) <= 1 or "embed" in name or "lm_head" in name)
        expected += int(np.prod(shape)) * (2.0 if as_bf16 else per_value[wire]) * scale
    assert world.wire_bytes == pytest.approx(expected, rel=1e-12)
    if wire == "stat2":  # the tiny model's embedding dominates: far above 2.25 bits a value
        assert world.wire_bytes > 2 * per_value["stat2"] * world.cfg.virtual_params


@pytest.mark.parametrize("codec", ["fp32", "stat2"])
def test_topk_without_feedback_sends_only_the_largest(codec):
    """``wire_topk`` without error feedback (the control of its ablation): each tensor
    keeps its ``ceil(topk * n)`` largest-magnitude values, counted here with numpy, and
    the rest of the pseudo-gradient is gone."""
    rng = np.random.default_rng(3)
    tree = {"w": rng.standard_normal((16, 32)).astype(np.float32), "b": rng.random(7)}
    out = wire(codec, tree, 0.25)
    for name, x in tree.items():
        flat = np.asarray(x, np.float32).reshape(-1)
        k = int(np.ceil(0.25 * flat.size))
        keep = np.argsort(-np.abs(flat))[:k]
        got = np.asarray(out[name]).reshape(-1)
        dropped = np.setdiff1d(np.arange(flat.size), keep)
        assert not np.any(got[dropped])
        if codec == "fp32":
            np.testing.assert_array_equal(got[keep], flat[keep])
        else:  # stat2 codes the kept values: most of them stay nonzero
            assert np.count_nonzero(got[keep]) >= k // 2

    # the runtime learner's encoding (encode_tree) is the codec's own encoding of the tree
    # sparsified here with numpy: it decodes to the same values bit for bit
    def np_topk(x):
        flat = np.asarray(x, np.float32).reshape(-1).copy()
        flat[np.argsort(-np.abs(flat))[int(np.ceil(0.25 * flat.size)) :]] = 0.0
        return flat.reshape(np.shape(x))

    want = outer.decode_tree(outer.encode_tree({k: np_topk(x) for k, x in tree.items()}, codec))
    dec = outer.decode_tree(encode_tree(tree, codec, 0.25))
    jax.tree.map(np.testing.assert_array_equal, dec, want)


def test_topk_in_the_simulator_and_the_runtime_config():
    with pytest.raises(ValueError, match="wire_topk"):
        SimConfig(wire_topk=0.0)
    for method in ("dp", "async_diloco"):  # they do not carry it: refused, not ignored
        with pytest.raises(ValueError, match="wire_topk"):
            SimConfig(method=method, wire_topk=0.5)
        with pytest.raises(ValueError, match="error_feedback"):  # nor error feedback
            SimConfig(method=method, wire="stat2", error_feedback=True)
    with pytest.raises(ValueError, match="wire_topk"):
        schema.validate_sim({"wire_topk": 1.5}, "run")
    for command in ("run", "simulate"):
        assert schema.validate_sim({"wire_topk": 0.1}, command).wire_topk == 0.1
    # every push the followers got, with and without feedback, holds at most
    # ceil(0.1 n) nonzero values a tensor; with feedback the rest waits in the residuals
    sent = {False: [], True: []}

    class Recording(Engine):  # what reaches the followers
        def _take_payload(self, j, incarnation):
            payload = super()._take_payload(j, incarnation)
            if payload is not None:
                sent[self.cfg.error_feedback].append(payload)
            return payload

    for feedback in (False, True):
        cfg = toy_config(method="dips", speeds=(1.5, 1.0, 1.25), wire="fp32", wire_topk=0.1)
        cfg = dataclasses.replace(cfg, error_feedback=feedback)
        engine = Recording(cfg, world=ToyWorld(cfg))
        engine.run()
    assert len(sent[False]) > 10 and len(sent[True]) > 10
    for tree in sent[False] + sent[True]:
        for x in tree.values():
            assert 0 < np.count_nonzero(np.asarray(x)) <= np.ceil(0.1 * np.size(x))
    residuals = [x for sl in engine.learners for x in sl.feedback.residual.values()]
    assert max(float(np.max(np.abs(np.asarray(x)))) for x in residuals) > 0
