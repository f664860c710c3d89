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
    settle,
    settled_batches,
    subtract,
)


def test_single_learner_follows_epoch_order():
    ledger = new_ledger(7, seed=3, max_epochs=2, batches_per_chunk=1)
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
    ledger = new_ledger(4, shuffle=False, batches_per_chunk=1)
    ledger, a0 = lease(ledger, "a")
    ledger, a1 = lease(ledger, "a")
    ledger, b2 = lease(ledger, "b")
    assert (a0, a1, b2) == (Lease(0, 0, 0, 1), Lease(1, 0, 0, 1), Lease(2, 0, 0, 1))
    assert leases_of(ledger, "a") == (Lease(0, 0, 0, 1), Lease(1, 0, 0, 1))
    assert holder(ledger, 2) == "b" and holder(ledger, 3) is None

    with pytest.raises(LedgerError, match=r"does not hold .*leased: \(0, 0, 1\) to 'a'"):
        complete(ledger, "b", 0)
    with pytest.raises(LedgerError, match="chunk 3: it does not hold them"):
        complete(ledger, "a", 3)
    with pytest.raises(LedgerError, match=r"cannot release batches 0\.\.0 of chunk 3"):
        release(ledger, "a", [(3, 0, 1)])
    with pytest.raises(LedgerError, match="non-empty string"):
        lease(ledger, "")

    ledger = complete(ledger, "a", 0)
    with pytest.raises(LedgerError, match="already settled"):
        complete(ledger, "a", 0)
    ledger = release(ledger, "a")  # a crashed holding chunk 1
    assert release(ledger, "a") == ledger  # duplicate failure report: no-op
    assert leases_of(ledger, "a") == ()
    ledger, c = lease(ledger, "c")
    assert c == Lease(1, 0, 0, 1)  # the released chunk goes first
    assert completed_chunks(ledger, 0) == {0}


def test_epoch_overlap_and_barrier():
    for overlap in (True, False):
        ledger = new_ledger(2, shuffle=False, overlap_epochs=overlap, batches_per_chunk=1)
        ledger, _ = lease(ledger, "a")
        ledger, _ = lease(ledger, "b")
        ledger = complete(ledger, "a", 0)
        ledger, got = lease(ledger, "a")  # epoch 0 has nothing left; chunk 1 busy
        if overlap:
            assert got == Lease(0, 1, 0, 1)
        else:
            assert got is None
        ledger = complete(ledger, "b", 1)
        assert ledger.epoch == 1 and completed_chunks(ledger, 0) == {0, 1}


def test_overlap_skips_chunk_busy_in_older_epoch():
    ledger = new_ledger(2, shuffle=False, batches_per_chunk=1)
    ledger, _ = lease(ledger, "a")  # chunk 0, epoch 0
    ledger, _ = lease(ledger, "b")  # chunk 1, epoch 0
    ledger = complete(ledger, "b", 1)
    ledger, got = lease(ledger, "b")  # epoch 1: chunk 0 is busy in epoch 0 -> chunk 1
    assert got == Lease(1, 1, 0, 1)
    ledger = complete(ledger, "a", 0)  # closes epoch 0
    ledger, got = lease(ledger, "a")
    assert got == Lease(0, 1, 0, 1)
    check_invariants(ledger)


def test_json_roundtrip_and_validation():
    ledger = new_ledger(5, seed=1, batches_per_chunk=1)
    for learner in ("a", "b", "a"):
        ledger, _ = lease(ledger, learner)
    assert ChunkLedger.from_json(ledger.to_json()) == ledger
    bad = ledger.to_dict()
    bad["epochs"][0]["leases"].append(bad["epochs"][0]["leases"][0])
    with pytest.raises(LedgerError, match="held twice"):
        ChunkLedger.from_dict(bad)
    with pytest.raises(LedgerError, match="num_chunks"):
        new_ledger(0, batches_per_chunk=1)
    with pytest.raises(LedgerError, match="batches_per_chunk"):
        new_ledger(3, batches_per_chunk=0)


def test_local_ledger_source():
    shared = LocalLedger(new_ledger(3, shuffle=False, max_epochs=1, batches_per_chunk=1))
    source = shared.source("a")
    assert [source(), source(), source(), source()] == [(0, 0, 1), (1, 0, 1), (2, 0, 1), None]
    shared.release("a", [(1, 0, 1)])
    assert shared.lease("b") == Lease(1, 0, 0, 1)


def test_a_round_that_ends_inside_a_chunk_settles_only_its_batches():
    """Issue 17 item 6, in the ledger: a push settles the batches it trained, not the chunk;
    the rest of the chunk stays leased, and released goes back from where it stopped."""
    ledger = new_ledger(3, batches_per_chunk=4, shuffle=False)
    ledger, a = lease(ledger, "a")
    assert a == Lease(0, 0, 0, 4)
    ledger = settle(ledger, "a", [(0, 0, 3)])  # a round of 3 batches
    assert leases_of(ledger, "a") == (Lease(0, 0, 3, 4),)
    assert completed_chunks(ledger, 0) == set() and ledger.completions == 0
    assert settled_batches(ledger, 0) == {(0, 0), (0, 1), (0, 2)}
    ledger = release(ledger, "a")  # a crashes: its batch 3 goes back, not the chunk
    ledger, b = lease(ledger, "b")
    assert b == Lease(0, 0, 3, 4)
    ledger = settle(ledger, "b", [b.span])
    assert completed_chunks(ledger, 0) == {0} and ledger.completions == 1
    # A dropped push while its learner reads on gives back the middle of a chunk.
    ledger, c = lease(ledger, "c")
    assert c == Lease(1, 0, 0, 4)
    ledger = release(ledger, "c", [(1, 0, 2)])
    assert leases_of(ledger, "c") == (Lease(1, 0, 2, 4),)
    ledger, d = lease(ledger, "d")
    assert d == Lease(1, 0, 0, 2)  # given back first; chunk 1 is shared within its epoch
    check_invariants(ledger)
    ledger = release(ledger, "c", keep=[(1, 2, 3)])  # c goes, its push of batch 2 pending
    assert leases_of(ledger, "c") == (Lease(1, 0, 2, 3),)
    with pytest.raises(LedgerError, match=r"cannot settle batches 1\.\.2 of chunk 1"):
        settle(ledger, "d", [(1, 1, 3)])
    assert subtract([(1, 0, 4), (2, 0, 4)], [(1, 1, 2), (2, 0, 4)]) == ((1, 0, 1), (1, 2, 4))


class LedgerMachine(RuleBasedStateMachine):
    """Learners join, lease pieces, settle some of their batches (a round ending anywhere
    in a chunk), give some back (a dropped push while they read on), crash (release all,
    or all but a push's batches), leave, misbehave.

    A model records who holds which batches and how often each (epoch, chunk, batch)
    settled; the ledger must agree with it after every step, and draining at the end must
    settle every batch of every finished epoch exactly once.
    """

    @initialize(
        n=st.integers(1, 7),
        b=st.integers(1, 4),
        seed=st.integers(0, 3),
        shuffle=st.booleans(),
        overlap=st.booleans(),
        max_epochs=st.sampled_from([None, 1, 2, 3]),
    )
    def setup(self, n, b, seed, shuffle, overlap, max_epochs):
        self.ledger = new_ledger(
            n,
            batches_per_chunk=b,
            seed=seed,
            shuffle=shuffle,
            max_epochs=max_epochs,
            overlap_epochs=overlap,
        )
        self.n, self.b = n, b
        self.active: list[str] = []
        self.next_id = 0
        self.held: dict[str, list[Lease]] = {}
        self.done: Counter = Counter()  # (epoch, chunk, batch) -> times settled

    def _held_batches(self):
        return {
            (g.epoch, g.chunk, i)
            for leases in self.held.values()
            for g in leases
            for i in range(g.start, g.end)
        }

    def _available(self, epoch):
        """(chunk, batch) the model says may be leased in ``epoch`` now."""
        if self.ledger.max_epochs is not None and epoch >= self.ledger.max_epochs:
            return set()
        held = self._held_batches()
        other = {c for e, c, _ in held if e != epoch}
        return {
            (c, i)
            for c in range(self.n)
            for i in range(self.b)
            if self.done[epoch, c, i] == 0 and (epoch, c, i) not in held and c not in other
        }

    def _pick(self, data, learners):
        return data.draw(st.sampled_from(sorted(learners)))

    def _sub(self, data, g):
        s = data.draw(st.integers(g.start, g.end - 1))
        return (g.chunk, s, data.draw(st.integers(s + 1, g.end)))

    def _cut(self, learner, g, span):
        self.held[learner].remove(g)
        _, s, e = span
        self.held[learner] += [
            Lease(g.chunk, g.epoch, a, z) for a, z in ((g.start, s), (e, g.end)) if a < z
        ]

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
        batches = {(got.chunk, i) for i in range(got.start, got.end)}
        assert batches <= (avail_cur if got.epoch == cur else avail_next)
        assert got.epoch == cur or (not avail_cur and self.ledger.overlap_epochs)
        assert got.epoch in (cur, cur + 1)
        self.held[learner].append(got)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def settle(self, data):
        learner = self._pick(data, [lr for lr, leases in self.held.items() if leases])
        g = data.draw(st.sampled_from(self.held[learner]))
        span = self._sub(data, g)
        self.ledger = settle(self.ledger, learner, [span])
        self._cut(learner, g, span)
        for i in range(span[1], span[2]):
            self.done[g.epoch, g.chunk, i] += 1

    @precondition(lambda self: self.active)
    @rule(data=st.data(), leave=st.booleans(), keep_one=st.booleans())
    def crash_or_leave(self, data, leave, keep_one):
        """A crash releases everything (the learner restarts empty) or all but the batches
        of a push still being decided; leaving also departs."""
        learner = self._pick(data, self.active)
        if keep_one and self.held[learner]:
            g = data.draw(st.sampled_from(self.held[learner]))
            keep = self._sub(data, g)
            self.ledger = release(self.ledger, learner, keep=[keep])
            self.held[learner] = [Lease(keep[0], g.epoch, keep[1], keep[2])]
        else:
            self.ledger = release(self.ledger, learner)
            self.held[learner] = []
        if leave and not self.held[learner]:
            self.active.remove(learner)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def give_back_some(self, data):
        learner = self._pick(data, [lr for lr, leases in self.held.items() if leases])
        g = data.draw(st.sampled_from(self.held[learner]))
        span = self._sub(data, g)
        self.ledger = release(self.ledger, learner, [span])
        self._cut(learner, g, span)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), chunk=st.integers(0, 6), batch=st.integers(0, 3))
    def invalid_settle(self, data, chunk, batch):
        """Settling batches one does not hold fails and changes nothing."""
        learner = self._pick(data, self.held)
        if any(g.chunk == chunk and g.start <= batch < g.end for g in self.held[learner]) or not (
            chunk < self.n and batch < self.b
        ):
            return
        before = self.ledger
        with pytest.raises(LedgerError):
            settle(self.ledger, learner, [(chunk, batch, batch + 1)])
        with pytest.raises(LedgerError):
            release(self.ledger, learner, [(chunk, batch, batch + 1)])
        assert self.ledger == before

    @rule()
    def checkpoint_roundtrip(self):
        text = self.ledger.to_json()
        self.ledger = ChunkLedger.from_json(text)
        assert self.ledger.to_json() == text

    def _whole(self, e):
        return {c for c in range(self.n) if all(self.done[e, c, i] for i in range(self.b))}

    @invariant()
    def agrees_with_model(self):
        check_invariants(self.ledger)
        for learner, leases in self.held.items():
            assert sorted(leases_of(self.ledger, learner)) == sorted(leases)
        assert max(self.done.values(), default=0) <= 1
        epochs = {e for e, _, _ in self.done}
        assert self.ledger.completions == sum(len(self._whole(e)) for e in epochs)
        cur = self.ledger.epoch
        for e in range(cur):
            assert self._whole(e) == set(range(self.n))
        if not self.ledger.finished:
            assert self._whole(cur) != set(range(self.n))
        for e in (cur, cur + 1):
            assert completed_chunks(self.ledger, e) == self._whole(e)
            assert settled_batches(self.ledger, e) == {
                (c, i) for (ep, c, i), k in self.done.items() if ep == e and k
            }

    def teardown(self):
        """Everyone crashes; one learner drains the open epochs: every batch settles once."""
        if not hasattr(self, "ledger"):
            return
        for learner in list(self.held):
            self.ledger = release(self.ledger, learner)
        target = self.ledger.epoch + len(self.ledger.epochs)
        while self.ledger.epoch < target and not self.ledger.finished:
            self.ledger, got = lease(self.ledger, "drain")
            assert got is not None
            self.ledger = settle(self.ledger, "drain", [got.span])
            for i in range(got.start, got.end):
                self.done[got.epoch, got.chunk, i] += 1
        for e in range(self.ledger.epoch):
            assert all(self.done[e, c, i] == 1 for c in range(self.n) for i in range(self.b))


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=60)


def test_large_ledger_is_cheap():
    ledger = new_ledger(100_000, batches_per_chunk=8, seed=0)
    for i in range(200):
        ledger, got = lease(ledger, f"l{i % 8}")
        assert got is not None
    assert len(ledger.to_json()) < 10_000  # state is small: no per-chunk table
    assert len(np.unique([g.chunk for g in leases_of(ledger, "l0")])) == 25
