"""Ablation of the ``refuse_nonfinite`` extension (off by default): a learner whose round
diverges pushes a NaN, on the toy world (real leader, followers, learner protocol).

Off (the papers): the followers stage the push, its squared norm is NaN and the leader
rejects it in the round (``nonfinite``, tokens booked as rejected); the learner is told
(``Unused``), pulls the round's result and goes on. On: the follower holding the NaN tensor
refuses the push when it arrives (counted as ``nonfinite``), the learner leaves, the
leader drops its push and the round goes on with the others, and a new incarnation of the
learner joins. The global model stays finite either way: the leader's rule already keeps a
NaN out of it; what the extension changes is where the NaN is stopped (before it is staged)
and what becomes of the learner (a fresh inner state instead of the diverged one).
"""

import dataclasses

import numpy as np
import pytest

from dipsjax.sim.engine import Engine
from tests.sim.toy_world import ToyLearner, ToyWorld, toy_config


class DivergesOnce(ToyLearner):
    """A toy learner whose first round ends with a NaN in tensor ``a`` (a diverged step)."""

    diverged = False

    def run_round(self, batches, *, num_steps, reference="start"):
        c = super().run_round(batches, num_steps=num_steps, reference=reference)
        if self.diverged:
            return c
        self.diverged = True
        self.params["a"][0] = np.nan
        delta = {k: v.copy() for k, v in c.delta.items()}
        delta["a"][0] = np.nan
        return dataclasses.replace(c, delta=delta)


class OneDivergence(ToyWorld):
    """Learner 0's first incarnation diverges in its first round; nobody else ever does."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.made = 0

    def learner(self, learner_id):
        if learner_id == 0 and self.made == 0:
            self.made += 1
            return DivergesOnce(learner_id, self.init_params)
        return super().learner(learner_id)


def _run(method, refuse):
    """The run, and the round of each push: ``{(learner, incarnation): [round ids]}``."""
    # Learner 0 the slowest: the others are in the round when its push arrives.
    cfg = toy_config(method=method, refuse_nonfinite=refuse, speeds=(1.5, 1.0, 1.25))
    engine = Engine(cfg, world=OneDivergence(cfg))
    plans: dict[tuple[int, int], list[int]] = {}
    push_shards = engine.cluster.push_shards

    def recorded(action, t, take_payload, incarnation=0, delivered=None):
        plans.setdefault((action.learner, incarnation), []).append(action.round_id)
        return push_shards(action, t, take_payload, incarnation, delivered)

    engine.cluster.push_shards = recorded
    res = engine.run()
    return engine, res, plans


@pytest.mark.parametrize("method", ["dips", "sync_diloco", "decoupled"])
@pytest.mark.parametrize("refuse", [False, True])
def test_a_nan_push_is_kept_out_of_the_model_and_the_run_goes_on(method, refuse):
    engine, res, plans = _run(method, refuse)
    leader, followers = engine.leader, engine.cluster.followers
    _, params = engine.cluster.model()
    assert all(np.isfinite(np.asarray(x)).all() for x in params.values()), params
    assert leader.budget_reached() and res.tokens.imbalance() == 0, res.tokens
    rounds = leader.tape.rounds()
    at_followers = sum(f.refused["nonfinite"] for f in followers)
    incarnations = [
        r.get("incarnation", 0)
        for r in leader.tape.membership()
        if r["learner"] == 0 and r["event"] == "join"
    ]
    by_id = {r["round_id"]: r for r in rounds}
    first = plans[(0, 0)][0]  # the round of the diverged push
    if not refuse:
        # Staged, then rejected in its round by its squared norm; the learner stays.
        assert at_followers == 0 and engine.cluster.refused == 0
        assert leader.refused["nonfinite"] == 1
        bad = by_id[first]
        i = [p["learner"] for p in bad["participants"]].index(0)
        assert bad["accepted"][i] is False and bad["sq_norms"][i] == "NaN"
        assert incarnations == [0] and len(plans[(0, 0)]) > 1
        return
    # Refused on arrival by the follower holding tensor ``a`` (the other one stages its
    # shard, then forgets it): the leader never sees the NaN.
    assert at_followers == 1 and engine.cluster.refused == 1
    assert leader.refused["nonfinite"] == 0
    assert all(x != "NaN" for r in rounds for x in r["sq_norms"])
    # The learner left: its push is dropped and its round goes on with the others (or,
    # had nobody else joined it, closes empty and the next one opens), never stalls.
    assert len(plans[(0, 0)]) == 1
    if method == "sync_diloco":  # every learner is in every round
        assert first in by_id
    if first in by_id:
        learners = [p["learner"] for p in by_id[first]["participants"]]
        assert by_id[first]["applied"] and learners and 0 not in learners, by_id[first]
    # A new incarnation joined, and its pushes are taken.
    assert incarnations == [0, 1]
    taken = [p for r in rounds for p in r["participants"] if p["learner"] == 0 and r["applied"]]
    assert taken and all(p["meta"]["incarnation"] == 1 for p in taken)
