"""LocalCluster: the leader and the followers' cores back to back on a virtual clock,
driven by scripted learners (no Engine), with faults injected as events."""

import types

import numpy as np
import pytest

from dipsjax import outer
from dipsjax.sim.cluster import Clock, LocalCluster
from dipsjax.syncer import Follower, Leader, LeaderConfig, NoGrace
from dipsjax.syncer import messages as m

LATENCY, UPDATE = 0.01, 0.5
MODEL = {"a": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
DELTAS = {
    0: {"a": np.full((2, 2), 0.1, np.float32), "b": np.full(3, -0.2, np.float32)},
    1: {"a": np.full((2, 2), 0.3, np.float32), "b": np.full(3, 0.1, np.float32)},
}


class Learners:
    """Two scripted learners: they push when the test says, pull when told."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.pulled = {0: [], 1: []}

    def on_action(self, a, t):
        c = self.cluster
        if isinstance(a, m.PushShards):
            c.push_shards(a, t, lambda: DELTAS[a.learner])
        elif isinstance(a, m.SendModel):
            c.clock.at(t + 0.1, self._pull, a.learner, a.version)
        elif isinstance(a, m.NotifyPull):
            for j in a.learners:
                c.clock.at(t + 0.1, self._pull, j, a.version)

    def _pull(self, j, version):
        self.pulled[j].append(version)
        self.cluster.feed(m.PullDone(self.cluster.clock.now, j, version))

    def push(self, t, j, base):
        meta = m.PushMeta(tokens=100 * (j + 1), steps=4, base_version=base)
        self.cluster.clock.at(t, self.cluster.feed, m.PushRequested(t, j, meta))

    def beat(self, t, followers=(0, 1)):
        """Heartbeats of both learners and of the followers named (a hung one is silent)."""
        for j in (0, 1):
            self.cluster.clock.at(t, self.cluster.feed, m.Heartbeat(t, j))
        for k in followers:
            self.cluster.clock.at(t, self.cluster.feed, m.FollowerHeartbeat(t, k))


def _cluster():
    world = types.SimpleNamespace(
        cfg=types.SimpleNamespace(latency=LATENCY, update_seconds=UPDATE),
        layer_bytes=[16, 12],
        rate=lambda j, k: 1e4,
        split=lambda tree: [{"a": tree["a"]}, {"b": tree["b"]}],
    )
    leader = Leader(
        LeaderConfig(penalty=False, max_norm=None, num_followers=2, layer_owner=(0, 1)),
        NoGrace(),
    )
    followers = [
        Follower(0, {"a": MODEL["a"]}, outer.diloco(), capacity=2),
        Follower(1, {"b": MODEL["b"]}, outer.diloco(), capacity=2),
    ]
    for k, f in enumerate(followers):
        f.address = f"follower{k}:1"
    cluster = LocalCluster(world, leader, followers, Clock())
    learners = Learners(cluster)
    cluster.port = learners
    for j in (0, 1):
        cluster.feed(m.Join(0.0, j))
    learners.beat(0.0)
    return cluster, learners


def _run(cluster, until):
    cluster.clock.at(until, lambda: None)
    cluster.clock.run(lambda: cluster.clock.now >= until)


def _outer_step():
    """The single-process outer step of learners 0 and 1 (the leader's token weights, no
    clip, the first Nesterov step: theta - lr * (1 + momentum) * delta)."""
    w = {0: 1 / 3, 1: 2 / 3}
    return {p: MODEL[p] - 0.7 * 1.8 * sum(w[j] * DELTAS[j][p] for j in w) for p in MODEL}


def _model(cluster):
    return {
        "a": np.asarray(cluster.followers[0].params["a"]),
        "b": cluster.followers[1].params["b"],
    }


def _outcomes(cluster):
    return [
        ("applied" if r["applied"] else "discarded", r["round_id"])
        for r in cluster.leader.tape.rounds()
    ]


def test_a_fault_free_round_applies_once_on_every_follower_with_one_save_each():
    cluster, learners = _cluster()
    learners.push(1.0, 0, 0)
    learners.push(1.0, 1, 0)
    _run(cluster, 10.0)
    assert cluster.leader.version == 1
    assert [f.version for f in cluster.followers] == [1, 1]
    assert (
        cluster.saves == {"batch": 2, "inputs": 2, "applied": 2, "version": 2}
        and cluster.refused == 0
    )
    assert learners.pulled == {0: [0, 1], 1: [0, 1]}
    want = _outer_step()
    for p in MODEL:
        np.testing.assert_allclose(np.asarray(_model(cluster)[p]), want[p], rtol=1e-6, atol=1e-7)
    assert [f.decided_rounds() for f in cluster.followers] == [(), ()]


def test_a_follower_whose_stream_breaks_mid_round_has_the_round_discarded_then_rejoins():
    """Follower 1's control stream breaks after it answered the norms (issue 17 item 4):
    it says it was lost and joins again; the leader discards the round whole (before, the
    follower dropped its batch silently and the round hung at the Decide). The learners
    pull version 0, push again, and the next round applies on both followers."""
    cluster, learners = _cluster()
    learners.push(1.0, 0, 0)
    learners.push(1.0, 1, 0)
    while cluster.leader.phase.value != "norms":  # norms requested, not yet answered
        _run(cluster, cluster.clock.now + 0.001)
    assert cluster.leader.phase.value == "norms"
    cluster.leader_lost(1, cluster.clock.now)
    _run(cluster, 5.0)
    assert _outcomes(cluster) == [("discarded", 0)]
    assert cluster.leader.followers_up == {0: True, 1: True}
    assert cluster.lost_actions == 1  # the Decide, sent into the broken stream
    follower_1 = [r["event"] for r in cluster.leader.tape.records if r.get("follower") == 1]
    assert follower_1 == ["lost", "joined"]  # one word each: nothing more came of the Decide
    assert [f.version for f in cluster.followers] == [0, 0] and cluster.saves["version"] == 0
    assert learners.pulled == {0: [0, 0], 1: [0, 0]}
    learners.push(6.0, 0, 0)
    learners.push(6.0, 1, 0)
    _run(cluster, 12.0)
    assert _outcomes(cluster) == [("discarded", 0), ("applied", 1)]
    assert [f.version for f in cluster.followers] == [1, 1] and cluster.saves["version"] == 2
    assert cluster.leader.version == 1


def test_a_stream_broken_while_the_round_is_applied_still_applies_it():
    """Follower 1 loses its stream after it merged, and the Apply goes into the broken
    stream: it keeps the decided round's inputs and lists it when it joins again at v; the
    leader sends the Apply again, and every follower ends at the same version."""
    cluster, learners = _cluster()
    learners.push(1.0, 0, 0)
    learners.push(1.0, 1, 0)
    while cluster.leader.phase.value != "merge":  # both merged, their word on the way
        _run(cluster, cluster.clock.now + 0.001)
    assert cluster.followers[1].decided_rounds() == (0,)
    cluster.leader_lost(1, cluster.clock.now)
    _run(cluster, 10.0)
    assert cluster.lost_actions == 1  # the Apply
    assert _outcomes(cluster) == [("applied", 0)]
    assert [f.version for f in cluster.followers] == [1, 1] and cluster.leader.version == 1
    assert cluster.saves["version"] == 2


@pytest.mark.parametrize("late", [False, True])
def test_a_hung_follower_found_lost_rejoins_once_and_the_next_round_applies(late):
    """Follower 1 hangs through round 0; the leader finds it silent and discards the round;
    woken, it beats twice before the leader hears its join: the leader asks it to rejoin
    once per lost episode (issue 17 item 5: before, a second Rejoin came, and, taken after
    the next round's shards were staged (``late``), wiped them and that round hung)."""
    cluster, learners = _cluster()
    cluster.hang(1, 40.0)
    learners.push(1.0, 0, 0)
    learners.push(1.0, 1, 0)
    learners.beat(20.0, followers=(0,))
    learners.beat(35.0, followers=(0,))  # follower 1 silent for 35 s > 3 * 10 s: lost
    _run(cluster, 36.0)
    assert _outcomes(cluster) == [("discarded", 0)]
    assert cluster.leader.followers_up[1] is False
    for t in (41.0, 41.005):  # both before its FollowerJoined reaches the leader (41.02)
        learners.beat(t)
    if late:
        cluster.clock.at(41.006, cluster.hang, 1, 50.0)  # the second Rejoin waits till 50
    learners.push(45.0, 0, 0)
    learners.push(45.0, 1, 0)
    learners.beat(46.0)
    _run(cluster, 60.0)
    assert _outcomes(cluster) == [("discarded", 0), ("applied", 1)]
    assert [f.version for f in cluster.followers] == [1, 1] and cluster.leader.version == 1
    tape = [
        (r["event"], r["follower"]) for r in cluster.leader.tape.records if r["kind"] == "follower"
    ]
    assert tape.count(("lost", 1)) == 2  # found silent, then its own word (nothing more)
    assert tape.count(("joined", 1)) == 1  # one Rejoin, one join


@pytest.mark.parametrize("refuse", [False, True])
def test_a_nan_push_is_kept_out_of_the_round_and_the_round_goes_on(refuse, monkeypatch):
    """Learner 0's push holds a NaN. Off (the papers' rule): staged, rejected by its norm.
    On (``refuse_nonfinite``): follower 0 refuses it on arrival, the learner leaves (what
    its protocol says), the leader drops its push and applies the round with learner 1."""
    nan = {"a": np.full((2, 2), np.nan, np.float32), "b": DELTAS[0]["b"]}
    monkeypatch.setitem(DELTAS, 0, nan)
    cluster, learners = _cluster()
    for f in cluster.followers:
        f.refuse_nonfinite = refuse
    learners.push(1.0, 0, 0)
    learners.push(1.0, 1, 0)
    _run(cluster, 10.0)
    assert _outcomes(cluster) == [("applied", 0)]
    (record,) = cluster.leader.tape.rounds()
    learners_in = [p["learner"] for p in record["participants"]]
    assert learners_in == ([1] if refuse else [0, 1])
    assert [f.refused["nonfinite"] for f in cluster.followers] == [int(refuse), 0]
    assert cluster.leader.refused["nonfinite"] == (0 if refuse else 1)
    assert (0 in cluster.leader.members) == (not refuse)
    model = _model(cluster)
    assert all(np.isfinite(np.asarray(x)).all() for x in model.values())
    # Only learner 1's pseudo-gradient moved the model (weight 1: the only one accepted).
    want = {p: MODEL[p] - 0.7 * 1.8 * DELTAS[1][p] for p in MODEL}
    for p in MODEL:
        np.testing.assert_allclose(np.asarray(model[p]), want[p], rtol=1e-6, atol=1e-7)
