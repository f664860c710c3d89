"""issue 18 item 5 (core): a follower refuses pushes it cannot have been sent, counted by
kind, changing nothing."""

import numpy as np
import optax
import pytest

from dipsjax.syncer import Follower
from dipsjax.syncer.follower import PushRefused

SHARD = {"w": np.ones((2, 3), np.float32)}


def _follower(**kw):
    return Follower(0, SHARD, optax.sgd(1.0), capacity=4, **kw)


def _push(x=1.0):
    return {"w": np.full((2, 3), x, np.float32)}


@pytest.mark.parametrize(
    "round_id, learner, kind",
    [(-1, 0, "round"), (0, -1, "learner"), (0, 4, "learner"), (0, 1 << 40, "learner")],
)
def test_negative_rounds_and_unknown_learners_are_refused_and_counted(round_id, learner, kind):
    f = _follower(learners=4)
    with pytest.raises(PushRefused, match=f"{abs(learner)}|round") as e:
        f.receive(round_id, learner, _push())
    assert e.value.kind == kind and f.refused == {kind: 1} and f._staged == {}
    assert f.receive(0, 3, _push()) == "staged"  # a member's push still goes through


def test_a_duplicate_push_is_answered_but_not_staged_twice():
    f = _follower(learners=2)
    assert f.receive(0, 1, _push()) == "staged"
    assert f.receive(0, 1, _push()) == "duplicate"
    assert list(f._staged) == [(0, 1)]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_refuse_nonfinite_is_an_option_off_by_default(bad):
    assert _follower().receive(0, 0, _push(bad)) == "staged"  # the papers keep any value
    f = _follower(refuse_nonfinite=True)
    with pytest.raises(PushRefused, match="non-finite") as e:
        f.receive(0, 0, _push(bad))
    assert e.value.kind == "nonfinite" and f.refused == {"nonfinite": 1} and f._staged == {}
    assert f.receive(0, 0, _push(2.0)) == "staged"
