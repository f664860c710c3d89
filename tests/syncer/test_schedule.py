"""Tests of the syncer's planning functions (Di-PS sec. 5 and 10)."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax.syncer.schedule import (
    Schedule,
    Transfer,
    assign_layers,
    follower_loads,
    greedy_schedule,
    optimal_schedule,
    place_ps,
    placement_scores,
    schedule_lower_bound,
    transfer_time,
)

# ----------------------------------------------------------------------------------------
# assign_layers / follower_loads
# ----------------------------------------------------------------------------------------


@st.composite
def layers_and_followers(draw):
    sizes = draw(st.lists(st.integers(0, 1000), min_size=1, max_size=40))
    return sizes, draw(st.integers(1, len(sizes)))


@given(layers_and_followers())
def test_assign_layers_balanced_and_nonempty(case):
    sizes, f = case
    owner = assign_layers(sizes, f)
    assert len(owner) == len(sizes)
    assert set(owner) == set(range(f))  # every follower owns at least one layer
    loads = follower_loads(owner, sizes, f)
    assert sum(loads) == sum(sizes)
    assert max(loads) <= min(loads) + max(sizes)  # list-scheduling bound
    assert assign_layers(sizes, f) == owner  # deterministic


def test_assign_layers_hand_examples():
    # Equal layers are dealt round-robin: consecutive layers (a pipeline stage) spread out.
    assert assign_layers([4, 4, 4, 4, 4], 2) == (0, 1, 0, 1, 0)
    assert assign_layers([4] * 6, 3) == (0, 1, 2, 0, 1, 2)
    # Largest first: the big layer alone on follower 0, the rest pile on follower 1.
    assert assign_layers([10, 1, 1, 1, 1], 2) == (0, 1, 1, 1, 1)
    # Embedding-like big first/last layers go to different followers; then the blocks
    # alternate (L1 -> f0 on the tie 8 = 8, L2 -> f1, L3 -> f0, L4 -> f1).
    assert assign_layers([8, 2, 2, 2, 2, 8], 2) == (0, 0, 1, 0, 1, 1)
    # Zero-byte layers still give every follower a layer (fewest-layers tie-break).
    assert assign_layers([5, 0, 0], 3) == (0, 1, 2)
    assert assign_layers([0, 0, 0, 0], 2) == (0, 1, 0, 1)


@pytest.mark.parametrize(
    ("sizes", "f", "match"),
    [
        ([1, 2], 0, "num_followers"),
        ([1, 2], 3, "num_followers=3"),
        ([], 1, "num_followers"),
        ([1, -2], 1, r"layer_bytes\[1\]"),
        ([1, 2.5], 1, r"layer_bytes\[1\]"),
        ([True, 1], 1, r"layer_bytes\[0\]"),
        ([1, 2], 1.0, "num_followers"),
    ],
)
def test_assign_layers_errors(sizes, f, match):
    with pytest.raises(ValueError, match=match):
        assign_layers(sizes, f)


def test_follower_loads():
    assert follower_loads((0, 1, 0), [3, 5, 7]) == (10, 5)
    assert follower_loads((0, 0), [3, 5], num_followers=3) == (8, 0, 0)
    with pytest.raises(ValueError, match="assignment has 2"):
        follower_loads((0, 1), [1, 2, 3])
    with pytest.raises(ValueError, match=r"assignment\[1\]"):
        follower_loads((0, -1), [1, 2])
    with pytest.raises(ValueError, match="num_followers"):
        follower_loads((0, 2), [1, 2], num_followers=2)


# ----------------------------------------------------------------------------------------
# schedules
# ----------------------------------------------------------------------------------------


@st.composite
def push_cases(draw):
    """Workers (learner, stage) pushing random layers; several learners may share layers."""
    f = draw(st.integers(1, 6))
    num_layers = draw(st.integers(1, 12))
    owner = draw(st.lists(st.integers(0, f - 1), min_size=num_layers, max_size=num_layers))
    num_workers = draw(st.integers(0, 6))
    worker_layers = {}
    for w in range(num_workers):
        layers = draw(st.lists(st.integers(0, num_layers - 1), unique=True, max_size=num_layers))
        worker_layers[(w % 3, w)] = layers
    lru = draw(st.one_of(st.none(), st.permutations(range(f)).map(lambda p: p[: len(p) // 2 + 1])))
    return worker_layers, owner, lru


def check_valid(schedule, worker_layers, owner):
    """Conflict-free steps; every (worker, layer) exactly once, to its owner."""
    assert isinstance(schedule, Schedule)
    assert schedule.num_steps == len(schedule.steps)
    for step in schedule.steps:
        assert step, "no empty steps"
        assert len({t.worker for t in step}) == len(step), "a worker sends twice in a step"
        assert len({t.follower for t in step}) == len(step), "a follower receives twice"
    sent = Counter((t.worker, t.layer) for t in schedule.transfers())
    wanted = Counter((w, layer) for w, layers in worker_layers.items() for layer in layers)
    assert sent == wanted
    assert all(t.follower == owner[t.layer] for t in schedule.transfers())


def degrees(worker_layers, owner):
    per_worker = {w: len(ls) for w, ls in worker_layers.items()}
    per_follower = Counter(owner[layer] for ls in worker_layers.values() for layer in ls)
    return per_worker, per_follower


@given(push_cases())
def test_greedy_valid_bounded_deterministic(case):
    worker_layers, owner, lru = case
    s = greedy_schedule(worker_layers, owner, lru)
    check_valid(s, worker_layers, owner)
    lb = schedule_lower_bound(worker_layers, owner)
    per_worker, per_follower = degrees(worker_layers, owner)
    assert lb == max([*per_worker.values(), *per_follower.values(), 0])
    assert s.num_steps >= lb
    # Each step is a maximal matching: transfer (w, l) is done by step deg(w)+deg(f)-1.
    step_of = s.step_of()
    for (w, layer), k in step_of.items():
        assert k + 1 <= per_worker[w] + per_follower[owner[layer]] - 1
    assert s.num_steps <= max(2 * lb - 1, 0)
    assert greedy_schedule(worker_layers, owner, lru) == s
    # Same answer for a Mapping owner.
    assert greedy_schedule(worker_layers, dict(enumerate(owner)), lru) == s
    # lru_after: every follower once, ordered by last use.
    assert sorted(s.lru_after) == sorted(set(per_follower) | set(lru or ()))


@given(push_cases())
def test_optimal_reaches_lower_bound(case):
    worker_layers, owner, _ = case
    s = optimal_schedule(worker_layers, owner)
    check_valid(s, worker_layers, owner)
    assert s.num_steps == schedule_lower_bound(worker_layers, owner)
    assert optimal_schedule(worker_layers, owner) == s


@given(st.integers(1, 8), st.data())
def test_greedy_latin_case_reaches_lower_bound(f, data):
    """F workers, one layer per follower each, worker i starting at follower perm[i]."""
    perm = data.draw(st.permutations(range(f)))
    owner, worker_layers = {}, {}
    for i in range(f):
        layers = []
        for j in range(f):
            layer = 100 * i + j
            owner[layer] = perm[(i + j) % f]
            layers.append(layer)
        worker_layers[("learner", i)] = layers
    s = greedy_schedule(worker_layers, owner)
    check_valid(s, worker_layers, owner)
    assert s.num_steps == schedule_lower_bound(worker_layers, owner) == f


@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4))
def test_greedy_no_contention_reaches_lower_bound(stages, layers_per_stage, fanout):
    """One learner, pipeline stages; each stage's layers on its own followers."""
    owner, worker_layers = {}, {}
    for s in range(stages):
        layers = list(range(s * layers_per_stage, (s + 1) * layers_per_stage))
        for k, layer in enumerate(layers):
            owner[layer] = s * fanout + k % fanout
        worker_layers[("L0", s)] = layers
    sched = greedy_schedule(worker_layers, owner)
    check_valid(sched, worker_layers, owner)
    assert sched.num_steps == schedule_lower_bound(worker_layers, owner) == layers_per_stage


def test_greedy_is_not_optimal_in_general():
    """Three learners, one worker each, all pushing layers 0, 1, 2 (one per follower)."""
    worker_layers = {w: [0, 1, 2] for w in "ABC"}
    owner = [0, 1, 2]
    s = greedy_schedule(worker_layers, owner)
    assert s.steps == (
        (Transfer("A", 0, 0), Transfer("B", 1, 1), Transfer("C", 2, 2)),
        (Transfer("A", 1, 1), Transfer("B", 0, 0)),  # C: owners 0 and 1 both busy
        (Transfer("A", 2, 2), Transfer("C", 0, 0)),
        (Transfer("B", 2, 2), Transfer("C", 1, 1)),
    )
    assert schedule_lower_bound(worker_layers, owner) == 3
    assert optimal_schedule(worker_layers, owner).num_steps == 3


def test_greedy_lru_hand_example():
    """Worker a: layers 0,1,2 on followers 0,1,2; worker b: layers 3,4 on followers 0,1.

    Step 0: all followers unused -> a takes its earliest layer 0 (f0); b's layer 3 needs the
    busy f0, so b sends layer 4 (f1). Step 1: f0, f1 used in step 0, f2 never -> a skips its
    earlier layer 1 (f1) for layer 2 (f2, least recently used); b sends layer 3 (f0).
    Step 2: a sends layer 1. (Plain earliest-first would send layer 1 in step 1.)
    """
    worker_layers = {"a": [0, 1, 2], "b": [3, 4]}
    owner = [0, 1, 2, 0, 1]
    s = greedy_schedule(worker_layers, owner)
    assert s.steps == (
        (Transfer("a", 0, 0), Transfer("b", 4, 1)),
        (Transfer("a", 2, 2), Transfer("b", 3, 0)),
        (Transfer("a", 1, 1),),
    )
    assert s.num_steps == 3
    assert s.transfers()[1] == Transfer("b", 4, 1)
    assert s.lru_after == (0, 2, 1)  # last used: f0 step 1, f2 step 1, f1 step 2


def test_greedy_lru_order_carries_over():
    """Same push, but before it f1 was least recently used, then f0, then f2.

    Step 0: a takes layer 1 (f1, oldest); b: layer 3 (f0; f1 busy). Step 1: f0 and f1 were
    just used, f2 is older -> a sends layer 2 (f2); b sends layer 4 (f1). Step 2: a: 0.
    """
    worker_layers = {"a": [0, 1, 2], "b": [3, 4]}
    owner = [0, 1, 2, 0, 1]
    s = greedy_schedule(worker_layers, owner, lru_order=[1, 0, 2])
    assert s.steps == (
        (Transfer("a", 1, 1), Transfer("b", 3, 0)),
        (Transfer("a", 2, 2), Transfer("b", 4, 1)),
        (Transfer("a", 0, 0),),
    )
    assert s.lru_after == (1, 2, 0)
    # A follower never used (here f3, not in lru_order) counts as the oldest.
    s2 = greedy_schedule({"c": [0, 5]}, [0, 1, 2, 0, 1, 3], lru_order=s.lru_after)
    assert s2.steps == ((Transfer("c", 5, 3),), (Transfer("c", 0, 0),))
    assert s2.lru_after == (1, 2, 3, 0)


def test_greedy_several_learners_pipeline():
    """Two learners x two stages, four layers dealt round-robin over two followers."""
    owner = assign_layers([7, 7, 7, 7], 2)  # (0, 1, 0, 1)
    worker_layers = {(r, s): [2 * s, 2 * s + 1] for r in range(2) for s in range(2)}
    s = greedy_schedule(worker_layers, owner)
    check_valid(s, worker_layers, owner)
    assert s.num_steps == schedule_lower_bound(worker_layers, owner) == 4
    assert s.steps[0] == (Transfer((0, 0), 0, 0), Transfer((0, 1), 3, 1))


def test_empty_push():
    s = greedy_schedule({}, [0, 1])
    assert s.steps == () and s.num_steps == 0 and s.transfers() == ()
    assert greedy_schedule({"a": []}, [0]).num_steps == 0
    assert optimal_schedule({"a": []}, [0]).num_steps == 0
    assert schedule_lower_bound({}, []) == 0


@pytest.mark.parametrize(
    ("worker_layers", "owner", "lru", "match"),
    [
        ({"a": [0, 2]}, [0, 1], None, "layer 2 has no owner"),
        ({"a": [0, 0]}, [0, 1], None, "lists a layer twice"),
        ({"a": [0]}, [-1], None, r"layer_owner\[0\]"),
        ({"a": [0]}, {-1: 0}, None, "layer ids"),
        ({"a": [0]}, [0], [0, 0], "lru_order lists a follower twice"),
        ({"a": [0]}, [0], [-3], r"lru_order\[0\]"),
        ([[0]], [0], None, "worker_layers must be a Mapping"),
    ],
)
def test_schedule_errors(worker_layers, owner, lru, match):
    with pytest.raises(ValueError, match=match):
        greedy_schedule(worker_layers, owner, lru)


def test_transfer_time():
    s = greedy_schedule({"a": [0, 1, 2], "b": [3, 4]}, [0, 1, 2, 0, 1])
    sizes = [100, 200, 300, 400, 500]
    bw = {"a": 100.0, "b": 50.0}
    # Steps: (a0: 1 s, b4: 10 s) -> 10; (a2: 3 s, b3: 8 s) -> 8; (a1: 2 s) -> 2.
    assert transfer_time(s, sizes, lambda w, f: bw[w]) == pytest.approx(20.0)
    assert transfer_time(s, dict(enumerate(sizes)), lambda w, f: bw[w]) == pytest.approx(20.0)
    # With 0.5 s latency per transfer, each of the three steps gets 0.5 s longer.
    assert transfer_time(s, sizes, lambda w, f: bw[w], lambda w, f: 0.5) == pytest.approx(21.5)
    assert transfer_time(Schedule(steps=()), sizes, lambda w, f: 1.0) == 0.0
    with pytest.raises(ValueError, match="bandwidth_fn"):
        transfer_time(s, sizes, lambda w, f: 0.0)
    with pytest.raises(ValueError, match="latency_fn"):
        transfer_time(s, sizes, lambda w, f: 1.0, lambda w, f: -1.0)
    with pytest.raises(ValueError, match="no entry for layer 4"):
        transfer_time(s, sizes[:4], lambda w, f: 1.0)


# ----------------------------------------------------------------------------------------
# PS placement
# ----------------------------------------------------------------------------------------


def test_place_ps_hand_example():
    bandwidth = np.array([[10.0, 1.0, 1.0], [2.0, 5.0, 5.0], [4.0, 4.0, 4.0]])
    throughput = np.array([1.0, 2.0, 3.0])
    # Site 0: 10*1 + 1*2 + 1*3 = 15; site 1: 2*1 + 5*2 + 5*3 = 27; site 2: 4*(1+2+3) = 24.
    np.testing.assert_allclose(placement_scores(bandwidth, throughput), [15.0, 27.0, 24.0])
    # Site 0 has the single fastest link but site 1 serves the busy learners best.
    assert place_ps(bandwidth, throughput) == 1
    # Ties go to the lowest index: both score 3.
    assert place_ps([[1, 2], [2, 1]], [1, 1]) == 0
    assert isinstance(place_ps([[1.0]], [0.0]), int)


@given(
    st.integers(1, 5).flatmap(
        lambda n: st.integers(1, 5).flatmap(
            lambda m: st.tuples(
                st.lists(
                    st.lists(st.integers(0, 10), min_size=m, max_size=m), min_size=n, max_size=n
                ),
                st.lists(st.integers(0, 10), min_size=m, max_size=m),
            )
        )
    )
)
def test_place_ps_is_argmax_lowest_index(case):
    bandwidth, throughput = case
    scores = [sum(b * p for b, p in zip(row, throughput, strict=True)) for row in bandwidth]
    assert place_ps(bandwidth, throughput) == scores.index(max(scores))


@pytest.mark.parametrize(
    ("bandwidth", "throughput", "match"),
    [
        ([1.0, 2.0], [1.0, 2.0], "bandwidth must be a 2-D"),
        (np.zeros((0, 2)), [1.0, 2.0], "bandwidth must be a 2-D"),
        ([[1.0, 2.0]], [1.0], r"throughput must have shape \(2,\)"),
        ([[1.0, 2.0]], [[1.0, 2.0]], "throughput must have shape"),
        ([[1.0, -2.0]], [1.0, 2.0], "bandwidth must be finite and non-negative"),
        ([[1.0, np.nan]], [1.0, 2.0], "bandwidth must be finite"),
        ([[1.0, 2.0]], [1.0, -2.0], "throughput must be finite and non-negative"),
        ([[1.0, 2.0]], [1.0, np.inf], "throughput must be finite"),
    ],
)
def test_place_ps_errors(bandwidth, throughput, match):
    with pytest.raises(ValueError, match=match):
        place_ps(bandwidth, throughput)
