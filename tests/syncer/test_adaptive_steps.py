"""Adaptive inner steps (EXTENSION, ``LeaderConfig.adaptive_steps``): the leader's count
for each learner from the train times its pushes report, and the learner's side of it."""

import math

import pytest

from dipsjax.syncer import Leader, LeaderConfig, NoGrace, QuorumGrace
from dipsjax.syncer import messages as m
from dipsjax.syncer.leader import SPEED_EMA
from dipsjax.syncer.learner import LearnerProtocol

H = 8


def config(**kw):
    kw = {"penalty": False, "adaptive_steps": True, "inner_steps": H, **kw}
    return LeaderConfig(**kw)


def push(t, j, steps, seconds, base=0):
    meta = m.PushMeta(tokens=10 * steps, steps=steps, base_version=base, train_seconds=seconds)
    return m.PushRequested(t, j, meta)


def join_all(leader, n):
    for j in range(n):
        leader.handle(m.Join(0.0, j))
        leader.handle(m.PullDone(0.0, j, leader.version))


def run_round(leader, t, pushes):
    """One round of ``pushes`` ``(learner, steps, seconds[, at])`` (``at``: when it is
    requested, else ``t``) through to its pull notice, at ``t``."""
    for j, steps, seconds, *at in pushes:
        leader.handle(push(at[0] if at else t, j, steps, seconds, leader.version))
    rnd = leader.round
    acts = []
    for p in list(rnd.pushes):
        acts += leader.handle(m.TransferDone(t, p.learner, rnd.round_id))
    (req,) = [a for a in acts if isinstance(a, m.RequestNorms)]
    leader.handle(m.FollowerNorms(t, 0, rnd.round_id, tuple(1.0 for _ in req.learners)))
    (apply,) = leader.handle(m.FollowerMerged(t, 0, rnd.round_id, 0.25))
    (notify,) = leader.handle(m.FollowerApplied(t, 0, rnd.round_id, apply.version))
    for j in notify.learners:
        leader.handle(m.PullDone(t, j, apply.version))
    return notify


def expected(rate, j, until, lead=None, cap=2 * H):
    """The count by the formula: learner ``j``'s steps in ``until`` seconds less its time
    before training."""
    lead = lead or {}
    return min(cap, max(1, round((until - lead.get(j, 0.0)) / rate[j])))


def test_a_round_together_each_learner_is_given_the_steps_the_slowest_trains_h_in():
    leader = Leader(config(), QuorumGrace(k=3, grace=False))
    join_all(leader, 3)
    # 1, 1.5 and 2 seconds a step: the fastest trains 16 steps, the middle one 8 x 2/1.5.
    notify = run_round(leader, 0.0, [(0, H, 8.0), (1, H, 12.0), (2, H, 16.0)])
    assert notify.learners == (0, 1, 2)
    assert notify.steps == (16, 11, 8)
    rate = {0: 1.0, 1: 1.5, 2: 2.0}
    assert notify.steps == tuple(expected(rate, j, H * 2.0) for j in (0, 1, 2))
    assert leader.beat == H * 2.0  # their pushes are aimed at 16 s from the notice
    # The next round's reports move each estimate by an EMA (learner 1 now 1 s a step),
    # and measure each one's time from its notice (at 0) to its training: 1, 1 and 3 s.
    pushes = [(0, 16, 16.0, 17.0), (1, 11, 11.0, 12.0), (2, H, 16.0, 19.0)]
    notify = run_round(leader, 19.0, pushes)
    a = SPEED_EMA  # learner 1: the EMAs of its seconds and of its steps, then their ratio
    rate[1] = (a * 11.0 + (1 - a) * 12.0) / (a * 11 + (1 - a) * H)
    lead = {0: 1.0, 1: 1.0, 2: 3.0}
    assert [leader.members[j].lead_seconds for j in (0, 1, 2)] == [1.0, 1.0, 3.0]
    period = max(lead[j] + H * rate[j] for j in (0, 1, 2))  # the slowest's: 3 + 16 s
    assert leader.beat == 19.0 + period == 38.0
    assert notify.steps == tuple(expected(rate, j, period, lead) for j in (0, 1, 2))
    assert notify.steps == (16, 15, 8)  # 18 capped at 2H; 18 / 1.21 = 14.9; 16 / 2


def test_a_learner_left_out_catches_up_at_the_beat_with_a_shorter_round():
    leader = Leader(config(), QuorumGrace(k=1, grace=False))
    join_all(leader, 2)
    run_round(leader, 0.0, [(0, H, 8.0), (1, H, 16.0)])  # both measured; beat at 16 s
    assert leader.beat == 16.0
    # Learner 1 was left out of a round: its own ends at 10 s, 6 s before the beat.
    notify = run_round(leader, 10.0, [(1, H, 16.0)])
    assert notify.steps == (3,)  # 6 s at 2 s a step, not H: it pushes with learner 0
    assert leader.beat == 16.0
    # At the beat (or past it) the next beat is set: H steps of the slowest from there.
    notify = run_round(leader, 16.0, [(1, 3, 6.0)])
    assert notify.steps == (8,) and leader.beat == 32.0
    assert leader.steps_for(0, 16.0) == 16


def test_the_count_is_capped_and_a_beat_too_close_means_the_one_after():
    leader = Leader(config(adaptive_max=1.5), QuorumGrace(k=2, grace=False))
    join_all(leader, 2)
    notify = run_round(leader, 0.0, [(0, H, 2.0), (1, H, 40.0)])  # 20 times faster
    assert notify.steps == (12, 8)  # 1.5 x H at most; the slowest trains H
    leader.beat = 40.0
    notify = run_round(leader, 39.5, [(1, H, 40.0)])  # 0.1 step before the beat
    assert notify.steps == (8 + 0,) and leader.beat == 40.0  # 0.5 / 5 + 8 steps: 8


def test_off_by_default_the_leader_says_nothing():
    leader = Leader(LeaderConfig(penalty=False), QuorumGrace(k=2, grace=False))
    join_all(leader, 2)
    notify = run_round(leader, 0.0, [(0, H, 2.0), (1, H, 40.0)])
    assert notify.steps == () and leader.steps_for(0, 1.0) == 0
    assert leader.members[0].step_seconds == 0.0


def test_unmeasured_learners_train_h_and_reports_without_a_time_are_not_measured():
    leader = Leader(config(), NoGrace())
    join_all(leader, 2)
    notify = run_round(leader, 0.0, [(0, H, 0.0)])  # no train time said
    assert notify.steps == (0,) and leader.members[0].step_seconds == 0.0
    notify = run_round(leader, 1.0, [(0, H, 4.0)])
    assert notify.steps == (H,)  # measured alone: it is the slowest it knows
    assert leader.steps_for(1, 2.0) == 0  # never pushed: the job's H


def test_a_rejoin_is_told_its_steps_and_a_new_incarnation_measures_afresh():
    leader = Leader(config(), QuorumGrace(k=2, grace=False))
    join_all(leader, 2)
    run_round(leader, 0.0, [(0, H, 8.0), (1, H, 16.0)])
    (send,) = leader.handle(m.Join(5.0, 0, 0, resume=True))
    assert isinstance(send, m.SendModel) and send.steps == 16 - 5  # until the beat, 16 s
    acts = leader.handle(m.Join(6.0, 0, 1))  # a new incarnation: another process
    (send,) = [a for a in acts if isinstance(a, m.SendModel)]
    assert send.steps == 0


def test_the_slowest_gone_the_others_train_h_again_at_once():
    """Also before the beat it set: the beat comes closer when the period shrinks."""
    leader = Leader(config(), QuorumGrace(k=2, grace=False))
    join_all(leader, 3)
    # Learner 2 is 100 times slower than learner 0: the beat is 800 s away.
    run_round(leader, 0.0, [(0, H, 8.0), (1, H, 16.0), (2, H, 800.0)])
    assert leader.beat == 800.0 and leader.steps_for(0, 1.0) == 16
    leader.handle(m.Leave(5.0, 2))
    assert leader.steps_for(1, 10.0) == H and leader.beat == 10.0 + 16.0
    assert leader.steps_for(0, 10.0) == 16  # 16 s at 1 s a step


def test_the_estimates_survive_a_leader_restart():
    leader = Leader(config(), QuorumGrace(k=2, grace=False))
    join_all(leader, 2)
    run_round(leader, 0.0, [(0, H, 8.0), (1, H, 16.0)])
    back = Leader.restore(leader.snapshot())
    assert back.config.adaptive_steps and back.members[0].step_seconds == 1.0
    assert back.beat == 16.0 and back.steps_for(0, 10.0) == 6
    back.resume(3.0)  # a new process: its clock starts again, the beat is forgotten
    assert back.beat is None and all(m.notified == -1.0 for m in back.members.values())


def test_a_snapshot_of_the_first_form_still_restores():
    """Its members held their seconds per step as ``step_seconds`` (c60d164)."""
    leader = Leader(config(), NoGrace())
    join_all(leader, 1)
    state = leader.snapshot()
    (j, member), *_ = state["members"]
    for key in ("train_ema", "steps_ema", "lead_seconds", "notified"):
        del member[key]
    member["step_seconds"] = 1.5
    back = Leader.restore(state)
    assert back.members[j].step_seconds == 1.5 and back.members[j].lead_seconds == 0.0


def test_a_round_of_the_given_steps_passes_the_bounds_and_more_is_refused():
    cfg = config(max_push_steps=2 * H, step_tokens=10)
    leader = Leader(cfg, NoGrace())
    join_all(leader, 2)
    assert isinstance(leader.handle(push(0.0, 0, 2 * H, 1.0))[0], m.PushShards)
    (refuse,) = leader.handle(push(0.1, 1, 2 * H + 1, 1.0))
    assert refuse.kind == m.RefuseKind.BOUNDS


def test_a_short_round_weighs_little_and_one_report_moves_an_estimate_at_most_twofold():
    """A round's train time holds a fixed cost besides its steps (in the runtime: the
    pseudo-gradient and its copy), which a short round (a catch-up) spreads over few
    steps; and a paused process reports a long time once. Neither may set the beat."""
    leader = Leader(config(), NoGrace())
    join_all(leader, 1)
    run_round(leader, 0.0, [(0, 16, 16.0)])  # 1 s a step
    run_round(leader, 1.0, [(0, 1, 3.0)])  # 1 step in 3 s: counted as 2 s, weighed as 1 step
    a = SPEED_EMA
    assert leader.members[0].step_seconds == pytest.approx(
        (a * 2.0 + (1 - a) * 16.0) / (a * 1 + (1 - a) * 16)
    )
    assert leader.members[0].step_seconds < 1.06  # an EMA per step would say 2 s
    run_round(leader, 2.0, [(0, 16, 1600.0)])  # paused for 26 minutes
    assert leader.members[0].step_seconds < 2.0


@pytest.mark.parametrize("seconds", [math.inf, -math.inf, math.nan, -1.0])
def test_a_push_with_a_train_time_that_is_not_a_time_is_refused_and_changes_nothing(seconds):
    leader = Leader(config(), NoGrace())
    join_all(leader, 2)
    run_round(leader, 0.0, [(0, H, 8.0)])
    before = leader.snapshot()
    (refuse,) = leader.handle(push(1.0, 1, H, seconds))
    assert refuse.kind == m.RefuseKind.INVALID and leader.refused["invalid"] == 1
    assert leader.members[1].step_seconds == 0.0 and leader.beat == before["beat"]


@pytest.mark.parametrize("seconds", [1e-310, 1e-300, 1e300, 1.7e308])
def test_extreme_train_times_keep_every_count_within_its_bounds(seconds):
    """A learner reporting an absurd but finite time (hostile, or a broken clock) moves
    the counts at most to their bounds: the leader never fails on it (it raised
    ``OverflowError`` in the pull notice, the round left half-ended), and once that
    learner is gone the others train ``H`` again."""
    leader = Leader(config(), QuorumGrace(k=2, grace=False))
    join_all(leader, 2)
    notify = run_round(leader, 0.0, [(0, H, 8.0), (1, 1, seconds)])
    assert all(1 <= n <= 2 * H for n in notify.steps), notify.steps
    (send,) = leader.handle(m.Join(1.0, 1, 0, resume=True))
    assert 1 <= send.steps <= 2 * H
    leader.handle(m.Leave(2.0, 1))
    # Learner 0 alone: its beat within its own H steps (1 s each), whatever came before.
    assert leader.steps_for(0, 3.0) <= H and 3.0 < leader.beat <= 3.0 + H


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"inner_steps": None}, "inner_steps"),
        ({"adaptive_max": 0.5}, "adaptive_max"),
        ({"max_push_steps": H}, "max_push_steps"),
        ({"adaptive_max": math.inf}, "adaptive_max"),
        ({"weighting": "uniform"}, "weighting"),
    ],
)
def test_bad_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"LeaderConfig.{field} must be"):
        config(**kw)


# -- the learner's side --------------------------------------------------------------


def trained(p, t, steps=H):
    meta = m.PushMeta(tokens=10, steps=steps, base_version=p.version)
    return p.on_trained(meta, t)


def test_the_learner_trains_the_steps_it_is_told():
    p = LearnerProtocol(3)
    p.start(0.0)
    assert p.on_action(m.SendModel(3, 0, steps=12), 1.0) == [m.Pull(0, first=True)]
    assert p.on_pulled(0, 1.0)[-1] == m.Train(steps=12)
    assert p.on_trained(None, 1.5) == [m.Train(wait=0.5, steps=12)]  # the retry too
    trained(p, 2.0, 12)
    p.on_action(m.PushShards(0, 3, ()), 2.0)
    p.on_pushed(0, 2.5)
    # Another learner's count is not this one's; its own comes with its pull notice.
    assert p.on_action(m.NotifyPull(0, (1, 3), 1, ("applied",) * 2, (20, 14)), 3.0) == [m.Pull(1)]
    assert p.on_pulled(1, 3.5)[-1] == m.Train(steps=14)
    trained(p, 4.0, 14)
    p.on_action(m.PushShards(1, 3, ()), 4.0)
    p.on_pushed(1, 4.5)
    p.on_action(m.NotifyPull(1, (3,), 2), 5.0)  # no count said: kept
    assert p.on_pulled(2, 5.5)[-1] == m.Train(steps=14)
    trained(p, 6.0, 14)
    p.on_action(m.PushShards(2, 3, ()), 6.0)
    p.on_pushed(2, 6.5)
    p.on_action(m.NotifyPull(2, (3,), 3, ("applied",), (-4,)), 7.0)  # nonsense: the job's H
    assert p.on_pulled(3, 7.5)[-1] == m.Train()


def test_an_overlapping_learner_takes_the_count_from_the_round_after():
    p = LearnerProtocol(3, overlap=True)
    p.start(0.0)
    p.on_action(m.SendModel(3, 0), 1.0)
    assert p.on_pulled(0, 1.0)[-1] == m.Train(adopt=True)
    out = trained(p, 2.0)  # the next round starts at once, before any word
    assert m.Train(adopt=True) in out
    p.on_action(m.PushShards(0, 3, ()), 2.0)
    p.on_pushed(0, 2.5)
    assert p.on_action(m.NotifyPull(0, (3,), 1, ("applied",), (13,)), 3.0) == [
        m.Pull(1, background=True)
    ]
    p.on_pulled(1, 3.5, background=True)
    out = trained(p, 4.0)
    assert m.Train(adopt=True, steps=13) in out
