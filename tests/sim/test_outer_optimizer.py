"""``SimConfig.outer_optimizer`` (an extension, off by default): a function named by import
path whose optax transform takes the place of the chain's Nesterov step, on every follower.
The toy world's engine runs the real followers' chains (``World.followers``)."""

import jax
import numpy as np

from dipsjax.sim.engine import Engine
from dipsjax.syncer import methods

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
    paper, named = _final(outer_preset="dips-paper")
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
