"""``SimConfig.outer_optimizer`` (an extension, off by default): a function named by import
path whose optax transform takes the place of the chain's Nesterov step, on every follower.
The toy world's engine runs the real followers' chains (``World.followers``)."""

import dataclasses
import textwrap

import jax
import numpy as np
import optax
import pytest

from dipsjax.sim.config import SimConfig
from dipsjax.sim.engine import Engine
from dipsjax.syncer import methods
from dipsjax.task import load_task

from .toy_world import ToyWorld, toy_config


def _final(**kw):
    cfg = toy_config(method="dips", **kw)
    engine = Engine(cfg, world=ToyWorld(cfg))
    res = engine.run()
    return res, jax.tree.leaves(res.params)


def test_naming_the_papers_nesterov_step_changes_nothing_and_another_step_trains_otherwise():
    default, base = _final()
    same, named = _final(outer_optimizer="dipsjax.outer:nesterov")
    other, sgd = _final(outer_optimizer="optax:sgd")  # plain momentum SGD: (lr, momentum)
    assert default.rounds == same.rounds == other.rounds and default.rounds >= 4
    for a, b in zip(base, named, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(base, sgd, strict=True))
    # The followers' chains end in the step named: the papers' 'nesterov', else 'outer'.
    s = toy_config(outer_optimizer="optax:sgd").method_settings()
    assert "outer" in methods.build("dips", s).make_tx().init({"w": np.zeros(2)})
    assert "nesterov" in methods.build("dips", toy_config().method_settings()).make_tx().init(
        {"w": np.zeros(2)}
    )


def _rounds(res):
    return [r for r in res.tape.rounds() if r["merged_sq_norm"] is not None]


def test_the_outer_clip_and_penalty_are_settings_with_the_papers_values_by_name():
    """Every method can clip at an absolute threshold, none, or (EXTENSION) relative to the
    running median; the Di-PS penalty turns off; ``dips-paper`` is today's default."""
    default, base = _final()
    _, named = _final(outer_preset="dips-paper")
    for a, b in zip(base, named, strict=True):
        np.testing.assert_array_equal(a, b)
    # A tiny absolute threshold binds in every round, with the factor min(1, c / ||u||).
    tight, _ = _final(outer_clip="absolute", outer_clip_norm=1e-4)
    for r in _rounds(tight):
        want = min(1.0, 1e-4 / np.sqrt(r["merged_sq_norm"]))
        np.testing.assert_allclose(r["clip_factor"], want, rtol=1e-5)
        assert r["clip_factor"] < 1.0
    free, _ = _final(outer_clip="none")
    assert all(r["clip_factor"] == 1.0 for r in _rounds(free))
    # Penalty off: no scores, every finite push accepted.
    off, _ = _final(anomaly_penalty=False)
    assert all(r["scores"] == [] and all(r["accepted"]) for r in _rounds(off))
    assert any(r["scores"] for r in _rounds(default))
    # Decoupled DiLoCo has no clip by default; asked, its followers' chain clips as told.
    cfg = toy_config(method="decoupled", outer_clip="relative", outer_clip_norm=0.5)
    res = Engine(cfg, world=ToyWorld(cfg)).run()
    rounds = _rounds(res)
    assert rounds[0]["clip_factor"] == 1.0 and any(r["clip_factor"] < 1.0 for r in rounds)
    tx = methods.build("decoupled", cfg.method_settings()).make_tx()
    assert "clip" in tx.init({"w": np.zeros(2)})
    plain = toy_config(method="decoupled").method_settings()
    assert "clip" not in methods.build("decoupled", plain).make_tx().init({"w": np.zeros(2)})


# ---- the task's outer optimizer (Task.outer_optimizer) -------------------------------------

OUTER_TASK = textwrap.dedent(
    """
    import numpy as np, optax
    from flax import nnx
    from dipsjax.task import Task

    class Source:
        num_chunks, batches_per_chunk, tokens_per_batch = 4, 2, 8
        def batch(self, chunk, index):
            rng = np.random.default_rng((chunk, index))
            return {"x": rng.standard_normal((8, 3)).astype(np.float32)}

    class Lin(nnx.Module):
        def __init__(self, rngs):
            self.w = nnx.Linear(3, 1, rngs=rngs)
        def __call__(self, x):
            return self.w(x)

    def loss(model, batch):
        return ((model(batch["x"]) - 1.0) ** 2).mean()

    class Unhashable(dict):  # a callable that cannot key the chains' cache
        __hash__ = None
        def __call__(self, lr, momentum):
            return optax.sgd(lr)

    def get_task(cfg, outer=False, validation=True):
        step = {True: optax.sgd, False: None, "unhashable": Unhashable()}[outer]
        return Task(name="lin", model=Lin, loss=loss, data=Source,
                    eval_batches=[Source().batch(9, 0)] if validation else [],
                    outer_optimizer=step)
    """
)


def _outer_update(tx, deltas):
    """One outer step of ``tx`` on two learners' pseudo-gradients (equal tokens)."""
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *deltas)
    params = jax.tree.map(np.zeros_like, deltas[0])
    ones = np.ones(len(deltas), np.float32)
    updates, _ = tx.update(stacked, tx.init(params), tokens=ones, steps=ones, mask=ones)
    return jax.tree.map(np.asarray, updates)


def test_a_task_s_outer_sgd_steps_as_the_config_s_and_both_set_is_an_error():
    # (their mean's norm under the Di-PS chain's clipping threshold, 1)
    deltas = [{"w": np.array([0.25, -0.5], np.float32)}, {"w": np.array([0.75, 0.5], np.float32)}]
    plain = methods.MethodSettings(learners=2, outer_lr=1.0, outer_momentum=0.0)
    by_config = dataclasses.replace(plain, outer_optimizer="optax:sgd")
    for name in ("sync_diloco", "dips"):
        from_task = methods.build(name, plain).make_tx(optax.sgd)
        from_config = methods.build(name, by_config).make_tx()
        assert "outer" in from_task.init(deltas[0])  # the step named as the config's is
        got = _outer_update(from_task, deltas)["w"]
        np.testing.assert_array_equal(got, _outer_update(from_config, deltas)["w"])
        # SGD at learning rate 1 without momentum: minus the learners' mean, exactly.
        np.testing.assert_array_equal(got, np.array([-0.5, 0.0], np.float32))
        papers = methods.build(name, methods.MethodSettings(learners=2)).make_tx()
        assert not np.array_equal(got, _outer_update(papers, deltas)["w"])  # -0.7*1.8*mean
        # One chain per method, settings and function: the followers' jit compiles once.
        assert methods.build(name, plain).make_tx(optax.sgd) is from_task
        assert methods.build(name, plain).make_tx() is not from_task
        # ...keyed on what the chain reads: another budget, learner count or shard layout
        # (e.g. the fault tests' replays, one world each) shares it; another lr does not.
        other = dataclasses.replace(
            plain,
            token_budget=123,
            learners=3,
            heartbeat_interval=1.0,
            num_followers=2,
            layer_owner=(0, 1),
        )
        assert methods.build(name, other).make_tx(optax.sgd) is from_task
        faster = dataclasses.replace(plain, outer_lr=0.5)
        assert methods.build(name, faster).make_tx(optax.sgd) is not from_task
        with pytest.raises(ValueError, match="set one of them"):
            methods.build(name, by_config).make_tx(optax.sgd)
        with pytest.raises(TypeError, match="must be a hashable function"):
            methods.build(name, plain).make_tx("optax:sgd")


@pytest.fixture
def outer_task(tmp_path, monkeypatch):
    (tmp_path / "outer_task.py").write_text(OUTER_TASK)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_simulator_and_a_follower_process_build_the_task_s_outer_step(outer_task):
    from dipsjax.launch.run import make_spec
    from dipsjax.runtime.follower import FollowerNode
    from dipsjax.sim.world import World

    cfg = SimConfig(task="outer_task:get_task", task_args={"outer": True}, learners=2)
    world = World(cfg)
    method = world.method()
    tx = method.make_tx(optax.sgd)
    assert load_task(cfg).outer_optimizer is optax.sgd
    assert all(f.tx is tx for f in world.followers(method)) and tx is not method.make_tx()
    # The follower process (a node built, not started: no leader) runs the same chain.
    spec = make_spec(cfg, outer_task / "run", tls=False, checkpoints=False)
    node = FollowerNode(spec, 0, port=0)
    node_method = methods.build(spec.sim.method, spec.method_settings())
    try:
        assert node.follower.tx is node_method.make_tx(optax.sgd)
        assert node.follower.tx is not node_method.make_tx()
    finally:
        node.data.close()
        node.tb.close()
    # The config naming one too: an error before anything starts, and in the world.
    both = dataclasses.replace(cfg, outer_optimizer="optax:sgd")
    with pytest.raises(ValueError, match="carries an outer_optimizer and the config names"):
        make_spec(both, outer_task / "run2")
    assert not (outer_task / "run2").exists()
    # What the followers or the evaluator would die of after the start is caught before it.
    for args, error, match in [
        ({"outer": "unhashable"}, TypeError, "hashable function"),
        ({"validation": False}, ValueError, "no validation batches"),
    ]:
        bad = SimConfig(task="outer_task:get_task", task_args=args, learners=2)
        with pytest.raises(error, match=match):
            make_spec(bad, outer_task / "run3")
        assert not (outer_task / "run3").exists()
    with pytest.raises(ValueError, match="set one of them"):
        World(both).followers(World(both).method())
