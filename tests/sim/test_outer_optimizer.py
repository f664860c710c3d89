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
