"""Followers: the union of their shard updates equals the single-process outer step."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dipsjax import outer
from dipsjax.syncer import Follower
from dipsjax.syncer import messages as L

PARAMS = {
    "embed": {"table": np.arange(12.0).reshape(4, 3)},
    "layer_0": {"w": np.ones((3, 3)), "b": np.zeros(3)},
    "layer_1": {"w": 2 * np.ones((3, 3))},
    "head": np.ones(3),
}


def _shard_of(path):
    return {"embed": 0, "layer_0": 1, "layer_1": 2, "head": 0}[path[0]]


def _round(tx, reference, payloads, decide_kwargs):
    fs = [
        Follower(k, shard, tx, capacity=4, reference=reference)
        for k, shard in enumerate(outer.split_tree(PARAMS, _shard_of, 3))
    ]
    learners = tuple(sorted(payloads))
    for j in learners:
        for f, part in zip(fs, outer.split_tree(payloads[j], _shard_of, 3), strict=True):
            f.receive(0, j, part)
    g = sum(f.partial_norms(0, learners, (0,) * len(learners)) for f in fs)
    decide = L.Decide(0, learners, sq_norms=tuple(float(x) for x in g), **decide_kwargs)
    m = sum(f.merged_partial(decide) for f in fs)
    factor = float(outer.clip_factor(m, 1.0))
    apply = L.Apply(0, 1, factor, m)
    for f in fs:
        assert f.apply(decide, apply) == 1
    return fs, g, m


@pytest.mark.parametrize("reference", ["start", "server"])
def test_followers_equal_single_process(reference):
    rng = np.random.default_rng(0)
    tx = outer.dips(warmup=0)
    ends = {
        j: jax.tree.map(lambda p: p + 0.3 * rng.standard_normal(p.shape), PARAMS) for j in (0, 1, 2)
    }
    # Learners always send Delta_start; at version 0 the server reference rebuilds the same.
    payloads = {j: jax.tree.map(lambda p, e: p - e, PARAMS, ends[j]) for j in ends}
    kw = dict(
        accepted=(True, False, True),
        tokens=(10, 20, 30),
        steps=(1, 1, 1),
        weights=(0.25, 0.0, 0.75),
    )
    fs, g, m = _round(tx, reference, payloads, kw)
    # Single process: the same chain on the whole tree with the same decision.
    deltas = jax.tree.map(
        lambda *xs: jnp.stack(xs),
        *[jax.tree.map(lambda p, e: p - e, PARAMS, ends[j]) for j in (0, 1, 2)],
    )
    np.testing.assert_allclose(g, outer.learner_sq_norms(deltas), rtol=1e-5)
    state = tx.init(jax.tree.map(jnp.asarray, PARAMS))
    upd, _ = tx.update(
        deltas, state, tokens=jnp.array([10.0, 20, 30]), accepted=jnp.array([True, False, True])
    )
    want = jax.tree.map(lambda p, u: p + u, PARAMS, upd)
    got = outer.merge_trees([f.pull()[1] for f in fs])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
    # Every follower recorded the same global clip factor and merged norm.
    for f in fs:
        assert float(f.state.opt_state["clip"].input_sq_norm) == pytest.approx(m)


def test_apply_is_idempotent_and_ordered():
    tx = outer.diloco()
    payload = {j: jax.tree.map(lambda p: 0.1 * np.ones_like(p), PARAMS) for j in (0,)}
    kw = dict(accepted=(True,), tokens=(1,), steps=(1,), weights=(1.0,))
    fs, _, m = _round(tx, "start", payload, kw)
    before = jax.device_get(fs[0].pull()[1])
    decide = L.Decide(0, (0,), (True,), (1,), (1,), (1.0,), (1.0,))
    assert fs[0].apply(decide, L.Apply(0, 1, 1.0, m)) == 1  # a retried round: no-op
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(fs[0].pull()[1]), before)
    with pytest.raises(ValueError, match="cannot apply version 3"):
        fs[0].apply(decide, L.Apply(2, 3, 1.0, m))


def test_bad_shards_are_refused_with_a_clear_error():
    f = Follower(0, {"w": np.ones((2, 2))}, outer.diloco(), capacity=2)
    with pytest.raises(ValueError, match="shape"):
        f.receive(0, 1, {"w": np.ones((3, 2))})
    with pytest.raises(ValueError, match="missing"):
        f.receive(0, 1, {"v": np.ones((2, 2))})
    with pytest.raises(ValueError, match="no shard from"):
        f.partial_norms(0, (1,))
    f.receive(0, 1, {"w": np.ones((2, 2))})  # still serving after the bad ones
    assert f.partial_norms(0, (1,)).tolist() == [4.0]


FLAT = {"layer_0": {"w": np.arange(9.0).reshape(3, 3) / 10}, "head": np.linspace(-1, 1, 5)}


@pytest.mark.parametrize(
    "make_tx",
    [outer.decoupled_diloco, outer.diloco, lambda: outer.dips(warmup=0)],
    ids=["decoupled", "diloco", "dips"],
)
def test_followers_merge_only_the_leaders_accepted_set(make_tx):
    """Bug: chains without a reject stage merged every received learner, whatever the
    leader decided; a dropped or NaN contribution reached the parameters."""
    tx = make_tx()
    f = Follower(0, FLAT, tx, capacity=2)
    good = jax.tree.map(lambda p: 0.01 * np.ones_like(p), FLAT)
    bad = jax.tree.map(lambda p: np.full_like(p, np.nan), FLAT)
    f.receive(0, 0, good)
    f.receive(0, 1, bad)
    g = f.partial_norms(0, (0, 1))
    decide = L.Decide(0, (0, 1), (True, False), (10, 10), (1, 1), (1.0, 0.0), tuple(map(float, g)))
    merged = f.merged_partial(decide)
    f.apply(decide, L.Apply(0, 1, 1.0, merged))
    got = jax.device_get(f.pull()[1])
    # One accepted learner, first Nesterov step: theta - lr * (1 + momentum) * Delta_0.
    want = jax.tree.map(lambda p, d: p - 0.7 * 1.8 * d, FLAT, good)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, want)


def test_followers_apply_the_leaders_weights_and_clip_factor_as_given():
    tx = outer.dips(warmup=0)
    f = Follower(0, FLAT, tx, capacity=2)
    d0 = jax.tree.map(lambda p: 0.01 * np.ones_like(p), FLAT)
    d1 = jax.tree.map(lambda p: -0.03 * np.ones_like(p), FLAT)
    f.receive(0, 0, d0)
    f.receive(0, 1, d1)
    g = f.partial_norms(0, (0, 1))
    # Weights that token counts would not give, and a clip the norm would not need.
    decide = L.Decide(0, (0, 1), (True, True), (10, 10), (1, 1), (0.75, 0.25), tuple(map(float, g)))
    merged = f.merged_partial(decide)
    f.apply(decide, L.Apply(0, 1, 0.5, merged))
    got = jax.device_get(f.pull()[1])
    want = jax.tree.map(lambda p, a, b: p - 0.7 * 1.8 * 0.5 * (0.75 * a + 0.25 * b), FLAT, d0, d1)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, want)


@pytest.mark.parametrize("codec,bound", [("int8", 0.02), ("int4", 0.2)])
def test_server_reference_quantizes_pseudo_gradients_not_parameters(codec, bound):
    """Bug: under Di-PS's server reference the wire carried theta_end, so int4 quantized
    parameters (464% error relative to Delta). Now the learner sends Delta_start and the
    follower rebuilds theta_now - theta_end from its cached base version."""
    rng = np.random.default_rng(0)
    theta0 = {"w": rng.standard_normal((64, 64)).astype(np.float32)}
    tx = outer.dips(warmup=0)
    f = Follower(0, theta0, tx, capacity=2, reference="server")
    # Version 1 is applied while the learner trains from version 0.
    step = {"w": 1e-3 * rng.standard_normal((64, 64)).astype(np.float32)}
    f.receive(0, 9, step)
    f.partial_norms(0, (9,), (0,))
    d = L.Decide(0, (9,), (True,), (1,), (1,), (1.0,), (1.0,))
    f.apply(d, L.Apply(0, 1, 1.0, f.merged_partial(d)))
    theta_now = jax.device_get(f.pull()[1])
    theta_end = {"w": theta0["w"] - 1e-3 * rng.standard_normal((64, 64)).astype(np.float32)}
    delta_start = {"w": theta0["w"] - theta_end["w"]}
    sent = outer.decode_tree(outer.encode_tree(delta_start, codec))
    f.receive(1, 0, sent)
    f.partial_norms(1, (0,), (0,))
    _, rebuilt = f._batch[1]
    exact = theta_now["w"] - theta_end["w"]
    err = np.asarray(rebuilt["w"][0]) - exact
    # Elementwise within the codec's documented bound on Delta_start (plus FP32 rounding)...
    assert np.all(np.abs(err) <= np.asarray(outer.error_bound(delta_start["w"], codec)) + 1e-6)
    # ...so relative to the pseudo-gradient the error is small.
    assert np.linalg.norm(err) / np.linalg.norm(exact) < bound


def test_pulls_are_snapshots_and_old_versions_fall_out_of_the_cache():
    f = Follower(0, FLAT, outer.diloco(), capacity=1, version_cache=2)
    snaps = [f.pull()]
    for v in (1, 2):
        f.receive(v, 0, jax.tree.map(lambda p: 0.1 * np.ones_like(p), FLAT))
        f.partial_norms(v, (0,))
        d = L.Decide(v, (0,), (True,), (1,), (1,), (1.0,), (1.0,))
        f.apply(d, L.Apply(v, v, 1.0, f.merged_partial(d)))
        snaps.append(f.pull())
    # Later outer steps (which donate their buffers) did not touch what a pull returned.
    assert [v for v, _ in snaps] == [0, 1, 2]
    np.testing.assert_array_equal(np.asarray(snaps[0][1]["head"]), FLAT["head"])
    assert f.cached_versions() == (1, 2) and f.state.version == 2
    with pytest.raises(KeyError, match="not 0"):
        f.pull(0)


@pytest.mark.parametrize(
    "make_tx,reference",
    [
        (outer.decoupled_diloco, "start"),
        (outer.diloco, "start"),
        (lambda: outer.dips(warmup=0), "server"),
        (lambda: outer.dips(warmup=0), "start"),
    ],
    ids=["decoupled", "diloco", "dips-server", "dips-start"],
)
def test_bf16_staging_gives_the_float32_result_and_releases_staged_shards(make_tx, reference):
    import ml_dtypes

    rng = np.random.default_rng(3)
    payloads = {
        j: jax.tree.map(
            lambda p: (0.1 * rng.standard_normal(p.shape)).astype(ml_dtypes.bfloat16), PARAMS
        )
        for j in (0, 1)
    }
    widened = {j: jax.tree.map(lambda x: x.astype(np.float32), payloads[j]) for j in payloads}
    kw = dict(accepted=(True, True), tokens=(10, 30), steps=(1, 1), weights=(0.25, 0.75))
    fs16, g16, m16 = _round(make_tx(), reference, payloads, kw)
    fs32, g32, m32 = _round(make_tx(), reference, widened, kw)
    np.testing.assert_array_equal(g16, g32)
    assert m16 == m32
    for a, b in zip(fs16, fs32, strict=True):
        assert jax.tree.all(jax.tree.map(np.array_equal, a.params, b.params))
        assert a._staged == {} and a._batch == {}  # nothing of the round is held after it
    # Staged in the dtype they came in: BF16 shards take half the memory of FP32 ones.
    f = Follower(0, PARAMS, outer.dips(), capacity=2)
    f.receive(1, 0, payloads[0])
    assert {x.dtype for x in jax.tree.leaves(f._staged[(1, 0)])} == {jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize("reference", ["start", "server"])
def test_warm_up_compiles_every_program_a_round_runs(reference):
    """After ``warm_up``, a round on the current version and one whose rows are a version
    stale (server reference: rebuilt in FP32, other programs) compile nothing. Before the
    fix the stale round compiled the server correction and FP32 norms, merge and apply in
    the middle of a run (2.6 s of a system benchmark's first stale round)."""
    import ml_dtypes

    from dipsjax.syncer import follower as fmod

    tx = outer.dips() if reference == "server" else outer.decoupled_diloco()
    # Shapes of their own, so that no other test compiled these programs first.
    shard = {"w": np.ones((5, 7), np.float32), "b": np.zeros(7, np.float32)}
    fmod.warm_up(shard, tx, 3, reference, ml_dtypes.bfloat16)
    programs = (fmod._sq_norms, fmod._server_delta, fmod._merged_norm, fmod._apply)
    before = [p._cache_size() for p in programs]
    f = Follower(0, shard, tx, capacity=3, reference=reference)
    rng = np.random.default_rng(0)
    for r, bases in enumerate([(0, 0), (0, 1)]):  # the second round: learner 0 is stale
        for j in (0, 1):
            f.receive(
                r,
                j,
                jax.tree.map(
                    lambda x: rng.standard_normal(x.shape).astype(ml_dtypes.bfloat16), shard
                ),
            )
        g = f.partial_norms(r, (0, 1), bases)
        decide = L.Decide(r, (0, 1), (True, True), (5, 5), (1, 1), (0.5, 0.5), tuple(map(float, g)))
        merged = f.merged_partial(decide)
        assert f.apply(decide, L.Apply(r, r + 1, 1.0, merged)) == r + 1
    assert [p._cache_size() for p in programs] == before


def test_a_dead_incarnations_late_shard_never_replaces_the_new_ones():
    """Shards are staged per (round, learner) with their incarnation: a late push of a
    dead incarnation is refused (before, it silently replaced the new one's shard), a
    newer incarnation replaces an older one, and nothing is kept once the round ends."""
    shard = {"w": np.zeros((2, 2), np.float32)}
    f = Follower(0, shard, outer.dips(), capacity=2)
    f.receive(4, 1, {"w": np.full((2, 2), 2.0)}, incarnation=1)
    with pytest.raises(ValueError, match="incarnation 0 is older"):
        f.receive(4, 1, {"w": np.full((2, 2), 9.0)}, incarnation=0)
    np.testing.assert_array_equal(f._staged[(4, 1)][("w",)], np.full((2, 2), 2.0))
    f.receive(4, 1, {"w": np.full((2, 2), 3.0)}, incarnation=2)
    np.testing.assert_array_equal(f._staged[(4, 1)][("w",)], np.full((2, 2), 3.0))
    f.discard(4)
    assert f._staged == {} and f._incarnations == {}


def test_replayed_and_duplicate_pushes_are_refused_by_kind_and_change_nothing():
    """A push for a round whose norms were taken or that ended is a replay, refused (before,
    one arriving after the norms replaced the staged shard, so the merge would have used
    other values than the norms; one after the end was staged and never freed). The same
    incarnation's push again is a retry if equal (acknowledged, nothing changes); with
    other values before the norms it is a retrained push and replaces the staged one."""
    from dipsjax.syncer.follower import PushRefused

    f = Follower(0, {"w": np.zeros((2, 2), np.float32)}, outer.diloco(), capacity=2)
    one, two = {"w": np.ones((2, 2))}, {"w": np.full((2, 2), 2.0)}
    assert f.receive(0, 1, one) == "staged"
    assert f.receive(0, 1, {"w": np.ones((2, 2))}) == "duplicate"  # a retry: equal
    np.testing.assert_array_equal(f._staged[(0, 1)][("w",)], one["w"])
    assert f.receive(0, 1, two) == "replaced"  # retrained after a rejoin
    assert f.receive(0, 1, one) == "replaced"
    assert f.partial_norms(0, (1,)).tolist() == [4.0]
    with pytest.raises(PushRefused, match="round 0 has already taken its norms") as e:
        f.receive(0, 1, two)
    assert e.value.kind == "replayed" and (0, 1) not in f._staged
    assert f.partial_norms(0, (1,)).tolist() == [4.0]  # the round's batch is unchanged
    f.discard(0)
    with pytest.raises(PushRefused, match="round 0 has ended") as e:
        f.receive(0, 1, one)
    assert e.value.kind == "replayed" and f._staged == {}
    for bad, kind in (({"w": np.ones((3, 2))}, "shape"), ({"v": np.ones((2, 2))}, "layout")):
        with pytest.raises(PushRefused) as e:
            f.receive(1, 1, bad)
        assert e.value.kind == kind
    assert f.receive(1, 1, one) == "staged"  # still serving


def test_ended_rounds_survive_a_restart_from_the_checkpoint_meta():
    """A follower restarted from its checkpoint still refuses replays of rounds that ended
    before it (``ended_rounds()`` goes into the checkpoint's JSON meta as ranges and comes
    back through ``ended=``); rounds it never saw end are staged as before."""
    from dipsjax.syncer.follower import PushRefused

    f = Follower(0, {"w": np.zeros((2, 2), np.float32)}, outer.diloco(), capacity=2)
    for r in (0, 1, 2, 5, 7, 8):
        f.discard(r)
    assert f.ended_rounds() == [[0, 2], [5, 5], [7, 8]]
    g = Follower(
        0,
        {"w": np.zeros((2, 2), np.float32)},
        outer.diloco(),
        capacity=2,
        ended=json.loads(json.dumps(f.ended_rounds())),
    )
    for r in (0, 1, 2, 5, 7, 8):
        with pytest.raises(PushRefused, match=f"round {r} has ended") as e:
            g.receive(r, 1, {"w": np.ones((2, 2))})
        assert e.value.kind == "replayed"
    for r in (3, 4, 6, 9):
        assert g.receive(r, 1, {"w": np.ones((2, 2))}) == "staged"


def test_rounds_staged_when_the_leader_restarted_are_over():
    """A resumed leader drops the rounds in flight and opens new ones under new ids: a late
    push for a dropped round is a replay, refused, not staged and held forever."""
    from dipsjax.syncer.follower import PushRefused

    f = Follower(0, {"w": np.zeros((2, 2), np.float32)}, outer.diloco(), capacity=2)
    f.receive(3, 0, {"w": np.ones((2, 2))})
    f.receive(4, 1, {"w": np.ones((2, 2))})
    f.partial_norms(3, (0,))
    f.discard_all()
    for r, j in ((3, 1), (4, 0)):
        with pytest.raises(PushRefused, match=f"round {r} has ended") as e:
            f.receive(r, j, {"w": np.ones((2, 2))})
        assert e.value.kind == "replayed"
    assert f._staged == {} and [3, 4] in f.ended_rounds()
    assert f.receive(5, 0, {"w": np.ones((2, 2))}) == "staged"


# -- Follower.handle: the follower's protocol, exact commands -------------------------

ONE, TWO = {"w": np.ones((2, 2))}, {"w": np.full((2, 2), 2.0)}


def _protocol_follower():
    f = Follower(0, {"w": np.zeros((2, 2), np.float32)}, outer.diloco(), capacity=2)
    f.address = "host:7"
    return f


def _decide(r):
    return L.Decide(r, (0, 1), (True, True), (5, 5), (1, 1), (0.5, 0.5), (4.0, 16.0))


def _joined(t, version=0, oldest=0, rounds=()):
    return L.Send(L.FollowerJoined(t, 0, version, oldest, "host:7", rounds=rounds))


def _merged_round(f, r, t=1.0):
    """Round ``r`` staged from learners 0 and 1, its norms taken and its Decide merged."""
    f.receive(r, 0, ONE)
    f.receive(r, 1, TWO)
    # The batch is fixed once its norms are taken: its journal write starts before they
    # are reported (nobody waits for it there), asked again it is not saved twice.
    assert f.handle(L.RequestNorms(r, (0, 1), (0, 0)), t) == [
        L.Save("batch", r, f.version),
        L.Send(L.FollowerNorms(t, 0, r, (4.0, 16.0))),
    ]
    assert f.handle(L.RequestNorms(r, (0, 1), (0, 0)), t) == [
        L.Send(L.FollowerNorms(t, 0, r, (4.0, 16.0)))
    ]
    save, merged = f.handle(_decide(r), t)
    assert save == L.Save("inputs", r, f.version)  # on disk before the leader hears
    assert isinstance(merged.event, L.FollowerMerged) and merged.event.round_id == r
    return merged.event.merged_sq_norm


def test_handle_answers_norms_merge_and_apply_and_saves_before_it_reports():
    """The ordering rule: ``Save`` of the step's ``Apply`` (the journal), then
    ``FollowerApplied``, then the checkpoint of the new version, which nobody waits for
    (issue 21: checkpoints off the critical path); the round's Decide and batch are freed
    once applied."""
    f = _protocol_follower()
    m = _merged_round(f, 0)
    assert f.decided_rounds() == (0,)
    got = f.handle(L.Apply(0, 1, 1.0, m), 2.5)
    assert got == [
        L.Save("applied", 0, 1),
        L.Send(L.FollowerApplied(2.5, 0, 0, 1)),
        L.Save("version", 0, 1),
    ]
    assert f.version == 1 and f.decisions == {} and f._batch == {} and f.decided_rounds() == ()
    assert f.last_applied == (_decide(0), L.Apply(0, 1, 1.0, m))


def test_a_repeated_apply_reports_the_version_again_without_a_new_save():
    f = _protocol_follower()
    m = _merged_round(f, 0)
    f.handle(L.Apply(0, 1, 1.0, m), 2.0)
    before = np.asarray(f.params["w"]).copy()
    assert f.handle(L.Apply(0, 1, 1.0, m), 3.0) == [L.Send(L.FollowerApplied(3.0, 0, 0, 1))]
    np.testing.assert_array_equal(np.asarray(f.params["w"]), before)
    assert f.version == 1


def test_a_round_it_does_not_hold_is_answered_lost_and_joined_not_silence():
    """Bug (issue 17 item 4): asked for norms of shards it did not hold (restarted, or its
    link broke and it dropped them), the follower said nothing and the round hung forever;
    told to apply such a round it crashed with KeyError. Now it says it was lost (the
    leader discards the round) and joins again at its version."""
    f = _protocol_follower()
    f.receive(3, 0, ONE)  # learner 1's shard of round 3 never came
    assert f.handle(L.RequestNorms(3, (0, 1), (0, 0)), 4.0) == [
        L.Send(L.FollowerLost(4.0, 0, "no shards of round 3")),
        _joined(4.0),
    ]
    assert f._staged == {}  # the round is over here: its late pushes are replays
    with pytest.raises(ValueError, match="round 3 has ended"):
        f.receive(3, 1, TWO)
    assert f.handle(_decide(4), 5.0) == [
        L.Send(L.FollowerLost(5.0, 0, "no batch of round 4")),
        _joined(5.0),
    ]
    assert f.handle(L.Apply(4, 1, 1.0, 2.0), 6.0) == [
        L.Send(L.FollowerLost(6.0, 0, "no inputs of round 4")),
        _joined(6.0),
    ]
    assert f.handle(L.Apply(4, 3, 1.0, 2.0), 6.0) == [
        L.Send(L.FollowerLost(6.0, 0, "at version 0, cannot apply version 3")),
        _joined(6.0),
    ]
    assert f.version == 0


def test_rejoin_keeps_a_decided_round_and_drops_undecided_ones():
    """Found lost by silence (a hang), the follower says so and joins again, listing the
    decided round it can still apply; a leader applying it sends the Apply again."""
    f = _protocol_follower()
    m = _merged_round(f, 0)
    f.receive(1, 0, ONE)  # a round not decided yet
    assert f.handle(L.Rejoin(0, "found lost through missed heartbeats"), 7.0) == [
        L.Send(L.FollowerLost(7.0, 0, "found lost through missed heartbeats")),
        _joined(7.0, rounds=(0,)),
    ]
    assert (1, 0) not in f._staged
    with pytest.raises(ValueError, match="round 1 has ended"):
        f.receive(1, 0, ONE)
    assert f.handle(L.Apply(0, 1, 1.0, m), 8.0) == [
        L.Save("applied", 0, 1),
        L.Send(L.FollowerApplied(8.0, 0, 0, 1)),
        L.Save("version", 0, 1),
    ]
    assert f.handle(L.Rejoin(7, "not me"), 9.0) == []


def test_leader_lost_keeps_a_decided_round_and_drops_undecided_ones():
    """Bug (issue 17 item 4): when its control stream broke while the leader was up, the
    follower dropped what it had staged and joined again without saying it was lost; the
    leader then asked it for norms it no longer had."""
    f = _protocol_follower()
    m = _merged_round(f, 0)
    f.receive(1, 1, TWO)
    assert f.leader_lost(3.0) == [
        L.Send(L.FollowerLost(3.0, 0, "control stream lost")),
        _joined(3.0, rounds=(0,)),
    ]
    assert f._staged == {} and f.decided_rounds() == (0,)
    assert f.handle(L.Apply(0, 1, 1.0, m), 4.0)[0] == L.Save("applied", 0, 1)
    # Lost between the norms and the Decide: nothing decided is held.
    g = _protocol_follower()
    g.receive(2, 0, ONE)
    g.receive(2, 1, TWO)
    g.handle(L.RequestNorms(2, (0, 1), (0, 0)), 1.0)
    assert g.leader_lost(2.0, "watch ended") == [
        L.Send(L.FollowerLost(2.0, 0, "watch ended")),
        _joined(2.0),
    ]
    assert g._batch == {}


def test_a_late_rejoin_does_not_wipe_a_newer_round():
    """Bug (issue 17 item 5): a hung follower gets one Rejoin per heartbeat until the
    leader hears its join; a late second one wiped the next round's staged shards and that
    round hung. Now a Rejoin while it already rejoined only says it joined."""
    f = _protocol_follower()
    assert f.handle(L.Rejoin(0, "found lost"), 1.0) == [
        L.Send(L.FollowerLost(1.0, 0, "found lost")),
        _joined(1.0),
    ]
    f.receive(5, 0, ONE)  # the leader heard the join and opened round 5
    f.receive(5, 1, TWO)
    assert f.handle(L.Rejoin(0, "found lost"), 2.0) == [_joined(2.0)]
    assert f.handle(L.RequestNorms(5, (0, 1), (0, 0)), 3.0) == [
        L.Save("batch", 5, 0),
        L.Send(L.FollowerNorms(3.0, 0, 5, (4.0, 16.0))),
    ]
    # Once the leader spoke again, a Rejoin is a new loss.
    assert f.handle(L.Rejoin(0, "found lost"), 4.0) == [
        L.Send(L.FollowerLost(4.0, 0, "found lost")),
        _joined(4.0),
    ]


def test_start_discard_and_stop():
    f = _protocol_follower()
    assert f.start(0.5) == [L.Send(L.FollowerHeartbeat(0.5, 0)), _joined(0.5)]
    assert f.start(0.5, restarted=True) == [
        L.Send(L.FollowerLost(0.5, 0, "restarted")),
        L.Send(L.FollowerHeartbeat(0.5, 0)),
        _joined(0.5),
    ]
    _merged_round(f, 0)
    assert f.handle(L.Discard(0, "follower 1 lost"), 2.0) == []
    assert f.decisions == {} and f._batch == {}
    assert f.handle(L.Stop("budget reached"), 3.0) == [L.Exit(L.ExitCode.OK, "budget reached")]


def test_an_older_decided_round_is_freed_when_the_leader_moves_on():
    """A decided round kept over a lost link that the (restarted) leader never applies is
    freed once the leader asks about a newer round."""
    f = _protocol_follower()
    _merged_round(f, 0)
    f.leader_lost(1.0)
    f.receive(1, 0, ONE)
    f.receive(1, 1, TWO)
    f.handle(L.RequestNorms(1, (0, 1), (0, 0)), 2.0)
    assert f.decided_rounds() == () and 0 not in f._batch and 0 in f._done


def test_a_round_it_dropped_gets_no_second_word():
    """Asked about a round it dropped when it said it was lost (the question crossed its
    word on the way), the follower says nothing more: the leader discards the round on
    hearing the first word, and a second one would be taken for a new loss."""
    f = _protocol_follower()
    f.receive(0, 0, ONE)
    f.receive(0, 1, TWO)
    f.handle(L.RequestNorms(0, (0, 1), (0, 0)), 1.0)
    assert f.leader_lost(2.0)[0] == L.Send(L.FollowerLost(2.0, 0, "control stream lost"))
    assert f.handle(_decide(0), 3.0) == []
    assert f.handle(L.RequestNorms(1, (0,), (0,)), 4.0) == [
        L.Send(L.FollowerLost(4.0, 0, "no shards of round 1")),
        _joined(4.0),
    ]
    assert f.handle(L.RequestNorms(1, (0,), (0,)), 5.0) == []


def test_resume_latest_without_a_checkpoint_starts_at_version_zero():
    """Bug (issue 17 item 2): a follower killed before its first checkpoint (during the
    learners' compilation) restarted with ``--resume latest``, found none, crashed ("no
    checkpoint with any step") three times and the run failed; ``--resume`` of a run
    stopped during compilation (version 0) failed the same way."""
    from dipsjax.syncer.follower import resume_step

    assert resume_step([], -1) is None  # latest, none on disk: version 0
    assert resume_step([], 0) is None
    assert resume_step([3, 1, 2], -1) == 3
    assert resume_step([1, 2, 3], 2) == 2
    assert resume_step([1], 0) is None  # version 1 was saved mid-update, never counted
    assert resume_step([0, 1], 0) == 0
    # Issue 21: the newest checkpoint at or below the version; the journal redoes the rest.
    assert resume_step([0, 3, 6], 5) == 3
    with pytest.raises(FileNotFoundError, match="no checkpoint at or below version 4"):
        resume_step([5, 6], 4)
    with pytest.raises(FileNotFoundError, match="no checkpoint at or below version 0"):
        resume_step([2, 3], 0)  # checkpoints of a run past version 0: not this run's state


def test_a_follower_restarted_mid_apply_redoes_the_step_from_its_saved_inputs():
    """Bug (issue 17 item 10): a follower killed while the round was applied came back at
    v without the round's inputs; the others had applied it, so the job stopped
    ("followers ended at different versions"). Its inputs (batch and Decide) are saved
    before it reports its merge, hence before any Apply: a process restarted from the
    checkpoint of v takes them back, lists the round in its join, and the Apply sent
    again gives v + 1 bit for bit as the follower that was not killed."""
    alive, killed = _protocol_follower(), _protocol_follower()
    m = _merged_round(alive, 0)
    assert _merged_round(killed, 0) == m
    decision, stacked = killed.round_inputs(0)
    saved = (decision, jax.tree.map(np.asarray, stacked))  # what the driver wrote
    alive.handle(L.Apply(0, 1, 1.0, m), 2.0)
    restarted = _protocol_follower()  # from the checkpoint of version 0
    assert restarted.restore_inputs(0, *saved)
    assert restarted.start(3.0, restarted=True) == [
        L.Send(L.FollowerLost(3.0, 0, "restarted")),
        L.Send(L.FollowerHeartbeat(3.0, 0)),
        _joined(3.0, rounds=(0,)),
    ]
    assert restarted.handle(L.Apply(0, 1, 1.0, m), 4.0) == [
        L.Save("applied", 0, 1),
        L.Send(L.FollowerApplied(4.0, 0, 0, 1)),
        L.Save("version", 0, 1),
    ]
    np.testing.assert_array_equal(np.asarray(restarted.params["w"]), np.asarray(alive.params["w"]))
    # Inputs of another version are not taken: a checkpoint of v + 1 was written (the step
    # is done), or they are older than the checkpoint restored.
    assert not restarted.restore_inputs(0, *saved)  # now at version 1
    assert not _protocol_follower().restore_inputs(1, *saved)
    zeros = {"w": np.zeros((2, 2), np.float32)}
    ended = Follower(0, zeros, outer.diloco(), capacity=2, ended=[[0, 0]])
    assert not ended.restore_inputs(0, *saved)  # round 0 ended here before
    with pytest.raises(ValueError, match="do not fit its shard"):
        _protocol_follower().restore_inputs(0, decision, {"w": np.zeros((2, 3, 3))})


def test_rounds_older_than_one_the_leader_asks_about_are_over():
    """Bug (issue 17, found by the follower-kill fault schedules): a follower restarted from
    its checkpoint does not know the rounds that ended while it was down (its checkpoint
    lists older ones, and the ``Discard`` sent to the dead process was lost). A learner's
    push for such a round, sent again once it was back, was staged and held forever. One
    round is decided at a time, in the order of their ids: asked about a newer round, it
    frees what it holds of older ones, and refuses their pushes as replays."""
    from dipsjax.syncer.follower import PushRefused

    f = _protocol_follower()  # restarted: it knows of no round
    assert f.receive(3, 2, ONE) == "staged"  # round 3 ended while it was down
    f.receive(5, 0, ONE)
    f.receive(5, 1, TWO)
    assert f.handle(L.RequestNorms(5, (0, 1), (0, 0)), 1.0) == [
        L.Save("batch", 5, 0),
        L.Send(L.FollowerNorms(1.0, 0, 5, (4.0, 16.0))),
    ]
    assert (3, 2) not in f._staged and f.ended_rounds() == [[3, 3]]
    for r in (3, 4):  # seen, and never seen
        with pytest.raises(PushRefused, match=f"round {r} has ended") as e:
            f.receive(r, 1, ONE)
        assert e.value.kind == "replayed"
    assert f._staged == {} and f.receive(6, 0, ONE) == "staged"


# -- checkpoints off the critical path (issue 21): every k versions, and the journal ----


def _journaled_run(f, rounds, discard=()):
    """Rounds ``0..rounds-1`` through ``f``'s protocol (rounds in ``discard`` are decided,
    then discarded), with what its driver would write: the journal (inputs by round,
    ``Apply`` and ended rounds by round) and the checkpoints ``(params, opt_state,
    ended)`` by version, as copies."""
    disk = {"decided": {}, "applied": {}, "ckpt": {0: _snapshot(f)}}
    for r in range(rounds):
        scale = 1.0 + 0.25 * r  # a different pseudo-gradient each round
        f.receive(r, 0, {"w": np.full((2, 2), scale)})
        f.receive(r, 1, {"w": np.arange(4.0).reshape(2, 2) - scale})
        _, norms = f.handle(L.RequestNorms(r, (0, 1), (f.version,) * 2), 1.0)
        decide = L.Decide(r, (0, 1), (True, True), (5, 5), (1, 1), (0.5, 0.5), norms.event.sq_norms)
        save, merged = f.handle(decide, 1.0)
        assert save == L.Save("inputs", r, f.version)
        d, stacked = f.round_inputs(r)
        disk["decided"][r] = (f.version, d, jax.tree.map(np.array, stacked))
        if r in discard:
            f.handle(L.Discard(r), 2.0)
            continue
        m = merged.event.merged_sq_norm
        for c in f.handle(L.Apply(r, f.version + 1, 0.9, m), 3.0):
            if c.__class__ is L.Save and c.kind == "applied":
                disk["applied"][r] = (f.last_applied[1], f.ended_rounds())
            if c.__class__ is L.Save and c.kind == "version":
                disk["ckpt"][c.version] = _snapshot(f)
    return disk


def _live(every, **kw):
    """A follower that checkpoints every ``every`` versions, at version 0."""
    zeros = {"w": np.zeros((2, 2), np.float32)}
    return Follower(0, zeros, outer.diloco(0.7, 0.8), capacity=2, checkpoint_every=every, **kw)


def _snapshot(f):
    st = f.state
    return (
        jax.tree.map(np.array, st.params),
        jax.tree.map(np.array, st.opt_state),
        f.ended_rounds(),
    )


def _from_checkpoint(saved, version, every=1):
    params, opt_state, ended = saved
    return Follower(
        0,
        params,
        outer.diloco(0.7, 0.8),
        capacity=2,
        version=version,
        opt_state=jax.tree.map(jnp.asarray, opt_state),
        ended=ended,
        checkpoint_every=every,
    )


def test_the_checkpoint_is_asked_for_every_k_versions_after_the_report():
    f = _live(3)
    disk = _journaled_run(f, 7)
    assert sorted(disk["ckpt"]) == [0, 3, 6] and f.version == 7
    assert sorted(disk["applied"]) == list(range(7))
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1"):
        Follower(0, {"w": np.zeros(2)}, outer.diloco(), capacity=2, checkpoint_every=0)


@pytest.mark.parametrize("start", [0, 3, 6])
def test_a_restart_redoes_the_journal_to_the_same_parameters_bit_for_bit(start):
    """Killed at version 7 with checkpoints of 0, 3 and 6 (``checkpoint_every=3``): from
    any of them the journal's steps give version 7, its parameters, outer state, version
    cache and ended rounds as the follower that ran (a discarded round in between is
    skipped: its inputs are in the journal, it was never applied)."""
    live = _live(3, version_cache=4)
    disk = _journaled_run(live, 8, discard=(4,))
    assert live.version == 7
    f = _from_checkpoint(disk["ckpt"][start], start, every=3)
    f.version_cache = 4
    assert f.redo(disk["decided"].values(), disk["applied"].values()) == 7 - start
    assert f.version == 7
    for a, b in zip(
        jax.tree.leaves((live.params, live.state.opt_state)),
        jax.tree.leaves((f.params, f.state.opt_state)),
        strict=True,
    ):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert f.cached_versions() == tuple(range(max(start, 4), 8))
    assert f.ended_rounds() == live.ended_rounds() == [[0, 7]]
    assert f.decided_rounds() == ()
    # up to a version: the leader's snapshot was of version 5
    g = _from_checkpoint(disk["ckpt"][start], start)
    if start <= 5:
        assert g.redo(disk["decided"].values(), disk["applied"].values(), upto=5) == 5 - start
        assert g.version == 5


def test_a_restart_redoes_the_journal_then_takes_back_the_round_it_was_applying():
    """Killed after its merge of round 3 (inputs saved, no ``Apply`` saved): it redoes the
    steps to version 3 and holds round 3's inputs, which it lists in its join; the
    ``Apply`` sent again gives the live follower's version 4 bit for bit."""
    live = _live(2)
    disk = _journaled_run(live, 4)
    del disk["applied"][3]  # killed before the step of round 3 was journaled
    f = _from_checkpoint(disk["ckpt"][2], 2, every=2)
    f.address = "host:7"
    assert f.redo(disk["decided"].values(), disk["applied"].values()) == 1
    assert f.version == 3 and f.decided_rounds() == (3,)
    _, a = live.last_applied
    f.handle(a, 5.0)
    assert f.version == 4
    assert np.asarray(f.params["w"]).tobytes() == np.asarray(live.params["w"]).tobytes()
