"""Chunk ledger: unit behaviour and invariants under random join / leave / crash sequences."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from dipsjax.data import (
    ChunkLedger,
    Lease,
    LedgerError,
    LocalLedger,
    check_invariants,
    complete,
    completed_chunks,
    epoch_order,
    fixed_order,
    holder,
    lease,
    leases_of,
    new_ledger,
    release,
)


def test_single_learner_follows_epoch_order():
    ledger = new_ledger(7, seed=3, max_epochs=2)
    seen = []
    while True:
        ledger, got = lease(ledger, "a")
        if got is None:
            break
        seen.append(got)
        ledger = complete(ledger, "a", got.chunk)
    assert [g.chunk for g in seen] == fixed_order(7, 2, seed=3).tolist()
    assert [g.epoch for g in seen] == [0] * 7 + [1] * 7
    assert ledger.finished and ledger.completions == 14
    assert sorted(epoch_order(7, 0, 3).tolist()) == list(range(7))
    assert epoch_order(7, 0, 3).tolist() != epoch_order(7, 1, 3).tolist()
    assert epoch_order(5, 4, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_release_re_leases_first_and_errors_are_clear():
    ledger = new_ledger(4, shuffle=False)
    ledger, a0 = lease(ledger, "a")
    ledger, a1 = lease(ledger, "a")
    ledger, b2 = lease(ledger, "b")
    assert (a0, a1, b2) == (Lease(0, 0), Lease(1, 0), Lease(2, 0))
    assert leases_of(ledger, "a") == (Lease(0, 0), Lease(1, 0))
    assert holder(ledger, 2) == "b" and holder(ledger, 3) is None

    with pytest.raises(LedgerError, match="leased to 'a'"):
        complete(ledger, "b", 0)
    with pytest.raises(LedgerError, match="not leased"):
        complete(ledger, "a", 3)
    with pytest.raises(LedgerError, match="leased to nobody"):
        release(ledger, "a", 3)
    with pytest.raises(LedgerError, match="non-empty string"):
        lease(ledger, "")

    ledger = complete(ledger, "a", 0)
    with pytest.raises(LedgerError, match="already completed"):
        complete(ledger, "a", 0)
    ledger = release(ledger, "a")  # a crashed holding chunk 1
    assert release(ledger, "a") == ledger  # duplicate failure report: no-op
    assert leases_of(ledger, "a") == ()
    ledger, c = lease(ledger, "c")
    assert c == Lease(1, 0)  # the released chunk goes first
    assert completed_chunks(ledger, 0) == {0}


def test_epoch_overlap_and_barrier():
    for overlap in (True, False):
        ledger = new_ledger(2, shuffle=False, overlap_epochs=overlap)
        ledger, _ = lease(ledger, "a")
        ledger, _ = lease(ledger, "b")
        ledger = complete(ledger, "a", 0)
        ledger, got = lease(ledger, "a")  # epoch 0 has nothing left; chunk 1 busy
        if overlap:
            assert got == Lease(0, 1)
        else:
            assert got is None
        ledger = complete(ledger, "b", 1)
        assert ledger.epoch == 1 and completed_chunks(ledger, 0) == {0, 1}


def test_overlap_skips_chunk_busy_in_older_epoch():
    ledger = new_ledger(2, shuffle=False)
    ledger, _ = lease(ledger, "a")  # chunk 0, epoch 0
    ledger, _ = lease(ledger, "b")  # chunk 1, epoch 0
    ledger = complete(ledger, "b", 1)
    ledger, got = lease(ledger, "b")  # epoch 1: chunk 0 is busy in epoch 0 -> chunk 1
    assert got == Lease(1, 1)
    ledger = complete(ledger, "a", 0)  # closes epoch 0
    ledger, got = lease(ledger, "a")
    assert got == Lease(0, 1)
    check_invariants(ledger)


def test_json_roundtrip_and_validation():
    ledger = new_ledger(5, seed=1)
    for learner in ("a", "b", "a"):
        ledger, _ = lease(ledger, learner)
    assert ChunkLedger.from_json(ledger.to_json()) == ledger
    bad = ledger.to_dict()
    bad["epochs"][0]["leases"].append(bad["epochs"][0]["leases"][0])
    with pytest.raises(LedgerError, match="inconsistent"):
        ChunkLedger.from_dict(bad)
    with pytest.raises(LedgerError, match="num_chunks"):
        new_ledger(0)


def test_local_ledger_source():
    shared = LocalLedger(new_ledger(3, shuffle=False, max_epochs=1))
    source = shared.source("a")
    assert [source(), source(), source(), source()] == [0, 1, 2, None]
    shared.release("a", 1)
    assert shared.lease("b") == Lease(1, 0)


class LedgerMachine(RuleBasedStateMachine):
    """Learners join, lease, complete, crash (release and come back), leave, misbehave.

    A model records who holds what and how often each (epoch, chunk) was completed; the
    ledger must agree with it after every step, and draining at the end must complete
    every chunk of every finished epoch exactly once.
    """

    @initialize(
        n=st.integers(1, 9),
        seed=st.integers(0, 3),
        shuffle=st.booleans(),
        overlap=st.booleans(),
        max_epochs=st.sampled_from([None, 1, 2, 3]),
    )
    def setup(self, n, seed, shuffle, overlap, max_epochs):
        self.ledger = new_ledger(
            n, seed=seed, shuffle=shuffle, max_epochs=max_epochs, overlap_epochs=overlap
        )
        self.n = n
        self.active: list[str] = []
        self.next_id = 0
        self.held: dict[str, list[Lease]] = {}
        self.done: Counter = Counter()

    def _busy(self):
        return {g.chunk for leases in self.held.values() for g in leases}

    def _available(self, epoch):
        """Chunks the model says may be leased in ``epoch`` now."""
        if self.ledger.max_epochs is not None and epoch >= self.ledger.max_epochs:
            return set()
        busy = self._busy()
        return {c for c in range(self.n) if self.done[epoch, c] == 0 and c not in busy}

    def _pick(self, data, learners):
        return data.draw(st.sampled_from(sorted(learners)))

    @rule()
    def join(self):
        learner = f"L{self.next_id}"
        self.next_id += 1
        self.active.append(learner)
        self.held[learner] = []

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def lease(self, data):
        learner = self._pick(data, self.active)
        cur = self.ledger.epoch
        avail_cur, avail_next = self._available(cur), self._available(cur + 1)
        self.ledger, got = lease(self.ledger, learner)
        if got is None:
            assert not avail_cur
            assert not self.ledger.overlap_epochs or not avail_next
            return
        assert got.chunk in (avail_cur if got.epoch == cur else avail_next)
        assert got.epoch == cur or (not avail_cur and self.ledger.overlap_epochs)
        assert got.epoch in (cur, cur + 1)
        self.held[learner].append(got)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def complete(self, data):
        learner = self._pick(data, [lr for lr, leases in self.held.items() if leases])
        got = data.draw(st.sampled_from(self.held[learner]))
        self.ledger = complete(self.ledger, learner, got.chunk)
        self.held[learner].remove(got)
        self.done[got.epoch, got.chunk] += 1

    @precondition(lambda self: self.active)
    @rule(data=st.data(), leave=st.booleans())
    def crash_or_leave(self, data, leave):
        """A crash releases everything (the learner restarts empty); leaving also departs."""
        learner = self._pick(data, self.active)
        self.ledger = release(self.ledger, learner)
        self.held[learner] = []
        if leave:
            self.active.remove(learner)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def give_back_one(self, data):
        learner = self._pick(data, [lr for lr, leases in self.held.items() if leases])
        got = data.draw(st.sampled_from(self.held[learner]))
        self.ledger = release(self.ledger, learner, got.chunk)
        self.held[learner].remove(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), chunk=st.integers(0, 8))
    def invalid_complete(self, data, chunk):
        """Completing a chunk one does not hold fails and changes nothing."""
        learner = self._pick(data, self.held)
        if chunk in {g.chunk for g in self.held[learner]}:
            return
        before = self.ledger
        with pytest.raises(LedgerError):
            complete(self.ledger, learner, chunk)
        assert self.ledger == before

    @rule()
    def checkpoint_roundtrip(self):
        text = self.ledger.to_json()
        self.ledger = ChunkLedger.from_json(text)
        assert self.ledger.to_json() == text

    @invariant()
    def agrees_with_model(self):
        check_invariants(self.ledger)
        for learner, leases in self.held.items():
            assert sorted(leases_of(self.ledger, learner)) == sorted(leases)
        assert max(self.done.values(), default=0) <= 1
        assert self.ledger.completions == sum(self.done.values())
        cur = self.ledger.epoch
        for e in range(cur):
            assert all(self.done[e, c] == 1 for c in range(self.n))
        if not self.ledger.finished:
            assert not all(self.done[cur, c] == 1 for c in range(self.n))
        for e in (cur, cur + 1):
            assert completed_chunks(self.ledger, e) == {c for c in range(self.n) if self.done[e, c]}

    def teardown(self):
        """Everyone crashes; one learner drains the open epochs: all complete exactly once."""
        if not hasattr(self, "ledger"):
            return
        for learner in list(self.held):
            self.ledger = release(self.ledger, learner)
        target = self.ledger.epoch + len(self.ledger.epochs)
        while self.ledger.epoch < target and not self.ledger.finished:
            self.ledger, got = lease(self.ledger, "drain")
            assert got is not None
            self.ledger = complete(self.ledger, "drain", got.chunk)
            self.done[got.epoch, got.chunk] += 1
        for e in range(self.ledger.epoch):
            assert [self.done[e, c] for c in range(self.n)] == [1] * self.n
        assert self.ledger.completions == sum(self.done.values())


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=60)


def test_large_ledger_is_cheap():
    ledger = new_ledger(100_000, seed=0)
    for i in range(200):
        ledger, got = lease(ledger, f"l{i % 8}")
        assert got is not None
    assert len(ledger.to_json()) < 10_000  # state is small: no per-chunk table
    assert len(np.unique([g.chunk for g in leases_of(ledger, "l0")])) == 25
