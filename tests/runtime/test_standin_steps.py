"""Stand-ins (load tests) train the leader's count of inner steps (adaptive steps,
EXTENSION: ``Train.steps``), as a learner does; they once trained the job's H whatever the
leader said, so load tests with adaptive steps did not exercise the count."""

import time
import types

import pytest

from dipsjax.runtime.standin import StandIn
from dipsjax.syncer import messages as m
from dipsjax.syncer.learner import LearnerProtocol

H, BATCH_TOKENS = 8, 512


def _standin():
    s = object.__new__(StandIn)
    s.spec = types.SimpleNamespace(
        sim=types.SimpleNamespace(inner_steps=H), batch_tokens=BATCH_TOKENS
    )
    s.version = 3
    s.proto = LearnerProtocol(0)
    s.proto.start(0.0)
    s.proto.on_action(m.SendModel(0, 3, steps=5, session=1), 0.1)
    assert s.proto.on_pulled(3, 0.2)[-1] == m.Train(steps=5)
    return s


@pytest.mark.parametrize("steps", [0, 5, 16])
def test_a_stand_in_trains_and_reports_the_leaders_count(steps):
    s = _standin()
    t0 = time.monotonic()
    (send,) = StandIn._one(s, m.Train(steps=steps), 0.08)
    slept = time.monotonic() - t0
    want = steps or H  # 0: the job's H
    meta = send.event.meta
    assert (meta.steps, meta.tokens, meta.base_version) == (want, want * BATCH_TOKENS, 3)
    assert meta.train_seconds == pytest.approx(0.08 * want / H)
    assert slept >= 0.08 * want / H
    assert send.event.session == 1


def test_with_no_sleep_a_stand_in_reports_one_second_an_h():
    s = _standin()
    (send,) = StandIn._one(s, m.Train(steps=4), 0.0)
    assert send.event.meta.train_seconds == pytest.approx(4 / H)
