"""The event tape as a timeline: spans that follow the tape's own times, and a picture."""

import itertools

import pytest

from dipsjax.runtime import timeline
from dipsjax.syncer import FixedGrace, Leader, LeaderConfig
from dipsjax.syncer import messages as L


def _round(leader, t, norms):
    rnd = leader.round
    for p in list(rnd.pushes):
        leader.handle(L.TransferDone(t, p.learner, rnd.round_id))
    leader.handle(L.Tick(t))  # the grace window closes
    acts = leader.handle(L.FollowerNorms(t + 0.1, 0, rnd.round_id, norms))
    if any(isinstance(a, L.Decide) for a in acts):
        (apply,) = leader.handle(L.FollowerMerged(t + 0.2, 0, rnd.round_id, 0.25))
        acts = leader.handle(L.FollowerApplied(t + 0.3, 0, rnd.round_id, apply.version))
    (notify,) = [a for a in acts if isinstance(a, L.NotifyPull)]
    for j in notify.learners:
        leader.handle(L.PullDone(t + 0.5, j, leader.version))


def _tape():
    leader = Leader(LeaderConfig(penalty=False), FixedGrace(1.0))
    for j in range(2):
        leader.handle(L.Join(0.0, j))
        leader.handle(L.PullDone(0.0, j, 0))
    meta = L.PushMeta(tokens=10, steps=1, base_version=0)
    leader.handle(L.PushRequested(2.0, 0, meta))
    leader.handle(L.PushRequested(2.5, 1, meta))
    _round(leader, 3.0, (1.0, float("nan")))  # learner 1's push: rejected (not finite)
    leader.handle(L.PushRequested(5.0, 0, L.PushMeta(tokens=10, steps=1, base_version=1)))
    _round(leader, 6.5, (1.0,))
    return leader.tape


def test_spans_follow_the_tapes_times_and_mark_what_was_not_applied():
    tape = _tape()
    got, marks = timeline.spans(tape)
    rounds = tape.round_records()
    assert len(rounds) == 2
    mine = [(s.kind, s.start, s.end) for s in got if s.row == "learner 0"]
    r0, r1 = (r.timings for r in rounds)
    # Learner 0: trained from its activation (0.0) to its push (2.0), waited for the
    # transfers, the update, the pull; then trained again until its next push (5.0).
    assert mine == [
        ("train", 0.0, 2.0),
        ("push", 2.0, r0["transfers_done"]),
        ("update", r0["transfers_done"], r0["applied"]),
        ("pull", r0["applied"], r0["ended"]),
        ("train", r0["ended"], 5.0),
        ("push", 5.0, r1["transfers_done"]),
        ("update", r1["transfers_done"], r1["applied"]),
        ("pull", r1["applied"], r1["ended"]),
    ]
    for row in ("learner 0", "learner 1", "rounds"):  # a row's spans never overlap
        xs = sorted((s.start, s.end) for s in got if s.row == row)
        assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(xs)), (row, xs)
        assert all(e >= s for s, e in xs)
    assert marks == [("learner 1", r0["transfers_done"], "rejected")]
    kinds = [s.kind for s in got if s.row == "rounds" and s.round_id == 0]
    assert kinds[-2:] == ["update", "pull"] and "grace" in kinds


def test_the_picture_is_drawn(tmp_path):
    import matplotlib.image

    _tape().write(tmp_path / "tape.jsonl")
    assert timeline.main([str(tmp_path)]) == 0  # the command, on a tape read back
    path = tmp_path / "timeline.png"
    img = matplotlib.image.imread(path)
    assert img.shape[0] >= 200 and img.shape[1] >= 1000
    # Blue (push), orange (update) and green (pull) are in it.
    pixels = (img[..., :3] * 255).round().reshape(-1, 3).astype(int)
    hexes = [timeline.COLORS[k] for k in ("push", "update", "pull")]
    colors = {tuple(int(h[i : i + 2], 16) for i in (1, 3, 5)) for h in hexes}
    assert colors <= {tuple(p) for p in pixels}


def test_the_command_needs_a_tape(tmp_path):
    with pytest.raises(SystemExit):
        timeline.main([str(tmp_path)])
