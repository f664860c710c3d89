"""The follower: owns a shard of the global parameters and its FP32 outer state.

A follower receives learners' shards (data plane), reports per-learner partial squared
norms, merges with the leader's ONE decision, reports its merged partial norm, and applies
the outer chain (:mod:`dipsjax.outer`) with the leader's accepted set, weights and clip
factor passed in as given: the leader's decision is the one truth every follower applies,
under every method, and the union of all followers' results is exactly the single-process
outer step (DESIGN.md sec. 4).

Pseudo-gradient reference (DESIGN.md sec. 3). Learners always send ``Delta_start =
theta_start - theta_end`` against the version ``g`` they started from, so lossy wire codecs
quantize pseudo-gradients, never parameters:

* ``'start'`` (DiLoCo / Decoupled DiLoCo): the follower merges ``Delta_start``.
* ``'server'`` (Di-PS sec. 6, ``Delta = theta_now - theta_end``): the follower rebuilds it as
  ``(theta_now - theta_g) + Delta_start`` from its cache of recent versions. The cache keeps
  the newest ``version_cache`` versions of the shard; the leader drops a push whose base
  version fell out of it (stale) before asking for its norms, and a follower asked anyway
  raises ``KeyError`` naming the version.

The cache also serves pulls: :meth:`Follower.pull` returns a version's shard. The outer step
writes new parameter buffers (it donates only the outer state's), so a version's buffers
never change and the cache holds them without copying: the newest version costs no memory
beyond the live shard.

Contributions are stacked into a fixed ``[capacity, ...]`` batch with a mask, so rounds of
any size reuse one compiled step. Memory: shards are staged in the dtype they arrived in
(BF16 off the wire by default), stacked tensor by tensor (each staged tensor is released
as it is stacked) and promoted to FP32 op by op inside the compiled steps (exact: the
results equal FP32 staging bit for bit, tested), so a round holds its
contributions once, at wire precision: what lets a 1B-parameter round fit on one host.
Applying is idempotent: a version at or below the follower's own is ignored (retries and
a restarted leader cannot apply a round twice).

Durability (the commands the driver carries out, in order). A round's stacked batch is
fixed once its norms are taken: its write starts then (``Save("batch")``, not waited for);
a decided round's inputs, that batch and its ``Decide``, are on disk before its merge is
reported (``Save("inputs")``), and each step's ``Apply`` before the
step is reported (``Save("applied")``, a few bytes): the journal. The checkpoint of the new
version (shard and outer state) is only started after the report, every
``checkpoint_every`` versions, and nobody waits for it: it is off the round's critical
path. A restarted follower restores its newest checkpoint and redoes the steps its journal
holds since (:meth:`Follower.redo`: the same inputs through the same compiled step, so the
same parameters bit for bit), so it comes back at the version it reported, or holding the
inputs of the round it was applying.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dipsjax import outer
from dipsjax.syncer.messages import (
    Action,
    Apply,
    Command,
    Decide,
    Discard,
    Exit,
    ExitCode,
    FollowerApplied,
    FollowerHeartbeat,
    FollowerJoined,
    FollowerLost,
    FollowerMerged,
    FollowerNorms,
    Rejoin,
    RequestNorms,
    Save,
    Send,
    Stop,
)

REFERENCES = ("start", "server")


class PushRefused(ValueError):
    """A learner's shard the follower will not stage; ``kind`` names the problem for the
    metrics (``layout``, ``shape``, ``incarnation``, ``replayed``; the runtime's ``ticket``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class FollowerState(NamedTuple):
    """Everything a follower must keep across a restart (what orbax saves).

    Model shard, outer state and version change together, in one step.
    """

    version: int
    params: Any
    opt_state: Any


class Follower:
    """One follower's state and its four protocol steps (sans-IO: plain method calls)."""

    def __init__(
        self,
        follower_id: int,
        params: Mapping[str, Any],
        tx: optax.GradientTransformationExtraArgs,
        *,
        capacity: int,
        reference: str = "start",
        version: int = 0,
        opt_state: Any = None,
        version_cache: int = 8,
        ended: Iterable[Sequence[int]] = (),
        learners: int | None = None,
        refuse_nonfinite: bool = False,
        checkpoint_every: int = 1,
    ) -> None:
        """``ended``: rounds that ended before a restart, as ``[first, last]`` ranges (what
        :meth:`ended_rounds` gave, kept in the checkpoint): pushes for them are replays.
        ``learners``: the job's learner count (a push from an id outside ``[0, learners)``
        is refused; ``None``: any id >= 0). ``refuse_nonfinite`` (extension, off by default:
        the papers stage any value): a push holding NaN or Inf is refused.
        ``checkpoint_every``: the versions it asks to checkpoint (``Save("version")``) are
        the multiples of this; a restart redoes the steps since from its journal."""
        if learners is not None and learners < 1:
            raise ValueError(f"learners must be >= 1, got {learners}")
        self.learners = learners
        self.refuse_nonfinite = bool(refuse_nonfinite)
        # Pushes refused, by kind (learner, round, layout, shape, incarnation, replayed,
        # nonfinite): the driver puts them in the follower's metrics.
        self.refused: collections.Counter[str] = collections.Counter()
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if version_cache < 1:
            raise ValueError(f"version_cache must be >= 1, got {version_cache}")
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self.checkpoint_every = int(checkpoint_every)
        self.follower_id = follower_id
        self.tx = tx
        self.capacity = capacity
        self.reference = reference
        self.version_cache = version_cache
        # Own copies (the caller's arrays may change; the outer state's buffers are donated).
        params = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), dict(params))
        state = tx.init(params) if opt_state is None else opt_state
        self.state = FollowerState(version, params, state)
        self._versions: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._remember()
        self._staged: dict[tuple[int, int], Any] = {}
        self._batch: dict[int, tuple[tuple[int, ...], Any]] = {}
        self._incarnations: dict[tuple[int, int], int] = {}  # of each staged shard
        # Rounds applied or discarded: a push for one is a replay.
        self._done: set[int] = {r for a, b in ended for r in range(int(a), int(b) + 1)}
        # The Decide merged in each round not yet applied nor discarded (with the round's
        # batch, what a follower needs to apply it if told again after a lost link).
        self.decisions: dict[int, Decide] = {}
        self.address = ""  # its data plane's host:port, announced in FollowerJoined (driver)
        # Sent FollowerJoined and heard nothing from the leader since but Rejoins: a Rejoin
        # now is one the leader sent before it heard that join (harmless, see handle).
        self._rejoined = False
        self.last_applied: tuple[Decide, Apply] | None = None  # for the driver's bookkeeping
        self._dropped: set[int] = set()  # rounds it dropped when it said it was lost
        # The newest round the leader asked it about (norms or apply): one round is decided
        # at a time, in the order of their ids, so every older round is over.
        self._newest = -1

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def params(self) -> Any:
        """The live shard (never changed in place: the next outer step makes new buffers)."""
        return self.state.params

    def _remember(self) -> None:
        while len(self._versions) >= self.version_cache:  # make room first: one copy less
            self._versions.popitem(last=False)
        self._versions[self.state.version] = self.state.params  # immutable: no copy needed

    def ended_rounds(self) -> list[list[int]]:
        """The rounds that ended here, as sorted ``[first, last]`` ranges (JSON-ready, for
        the checkpoint: a restarted follower refuses their replays too)."""
        ranges: list[list[int]] = []
        for r in sorted(self._done):
            if ranges and r == ranges[-1][1] + 1:
                ranges[-1][1] = r
            else:
                ranges.append([r, r])
        return ranges

    def cached_versions(self) -> tuple[int, ...]:
        return tuple(self._versions)

    # -- data plane ----------------------------------------------------------------

    def receive(
        self, round_id: int, learner: int, payload: Mapping[str, Any], incarnation: int = 0
    ) -> str:
        """Stages a learner's shard of ``Delta_start = theta_start - theta_end``; returns
        ``"staged"``, ``"duplicate"`` for a resent push equal to the one staged (a retry
        whose acknowledgement was lost: nothing changes), or ``"replaced"`` for another
        push of the same incarnation for the same round before its norms were taken (a
        learner that rejoined the leader as itself trained the round again, and the leader
        admitted the new push to the same round).

        Raises :class:`PushRefused`, changing nothing, for a shard that does not match
        this follower's layers or shapes, from an older incarnation than the one staged
        for the same round and learner (a dead process's late push; a newer one replaces
        it), or for a round whose norms were already taken or that is over (a replay: one
        it saw end, or one older than a round the leader asked it about since)."""
        try:
            return self._receive(round_id, learner, payload, incarnation)
        except PushRefused as e:
            self.refused[e.kind] += 1
            raise

    def _receive(
        self, round_id: int, learner: int, payload: Mapping[str, Any], incarnation: int
    ) -> str:
        me = f"follower {self.follower_id}"
        if round_id < 0:
            raise PushRefused("round", f"{me}: round {round_id} is negative: push refused")
        if learner < 0 or (self.learners is not None and learner >= self.learners):
            known = "any id >= 0" if self.learners is None else f"0..{self.learners - 1}"
            raise PushRefused(
                "learner", f"{me}: learner {learner} is not in the job ({known}): push refused"
            )
        if round_id in self._batch or round_id in self._done or round_id < self._newest:
            state = "already taken its norms" if round_id in self._batch else "ended"
            raise PushRefused(
                "replayed", f"{me}: round {round_id} has {state}: learner {learner}'s push refused"
            )
        staged = self._incarnations.get((round_id, learner))
        if staged is not None and incarnation < staged:
            raise PushRefused(
                "incarnation",
                f"{me}: learner {learner}'s incarnation {incarnation} "
                f"is older than the one staged for round {round_id} ({staged})",
            )
        got = outer.flatten(payload)
        want = outer.flatten(self.state.params)
        if got.keys() != want.keys():
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            raise PushRefused(
                "layout",
                f"{me}: shard from learner {learner} does not match "
                f"its layers (missing {missing[:3]}, unexpected {extra[:3]})",
            )
        for path, x in got.items():
            if tuple(np.shape(x)) != tuple(want[path].shape):
                raise PushRefused(
                    "shape",
                    f"{me}: learner {learner} sent {path} with shape "
                    f"{tuple(np.shape(x))}, expected {tuple(want[path].shape)}",
                )
        if self.refuse_nonfinite:
            bad = [p for p, x in got.items() if not np.isfinite(np.asarray(x, np.float32)).all()]
            if bad:
                raise PushRefused(
                    "nonfinite",
                    f"{me}: learner {learner}'s push holds non-finite values in {bad[:3]}",
                )
        key = (round_id, learner)
        outcome = "staged"
        if staged == incarnation:  # the same push again (a retry), or a retrained one
            same = all(
                np.asarray(self._staged[key][p]).tobytes() == np.asarray(_staged_dtype(x)).tobytes()
                for p, x in got.items()
            )
            if same:
                return "duplicate"
            outcome = "replaced"
        self._staged[key] = {p: _staged_dtype(x) for p, x in got.items()}
        self._incarnations[key] = incarnation
        return outcome

    def pull(self, version: int | None = None) -> tuple[int, dict[str, Any]]:
        """A version (default: the newest) and its shard: a snapshot, safe to keep."""
        v = self.state.version if version is None else version
        if v not in self._versions:
            raise KeyError(
                f"follower {self.follower_id} keeps versions {list(self._versions)}, not {v}"
            )
        return v, self._versions[v]

    # -- control plane -------------------------------------------------------------

    def _stack(self, round_id: int, learners: tuple[int, ...], bases: tuple[int, ...]) -> Any:
        if len(learners) > self.capacity:
            raise ValueError(f"{len(learners)} learners exceed capacity {self.capacity}")
        missing = [j for j in learners if (round_id, j) not in self._staged]
        if missing:
            raise ValueError(
                f"follower {self.follower_id}: round {round_id} has no shard from {missing}"
            )
        # Shards of learners the leader did not ask about (dropped as stale) are forgotten.
        for key in [k for k in self._staged if k[0] == round_id and k[1] not in learners]:
            del self._staged[key]
        # Tensor by tensor, releasing each staged tensor once stacked (peak: one tensor more).
        rows = [self._staged.pop((round_id, j)) for j in learners]
        flat: dict = {}
        for path, live in outer.flatten(self.state.params).items():
            xs = [row.pop(path) for row in rows]
            pad = jnp.zeros(live.shape, xs[0].dtype if xs else jnp.float32)
            flat[path] = jnp.stack(xs + [pad] * (self.capacity - len(xs)))
            del xs
        stacked = outer.unflatten(flat)
        if self.reference == "server" and len(bases) != len(learners):
            raise ValueError("the server reference needs each learner's base version")
        if self.reference == "server" and any(b != self.state.version for b in bases):
            # Rows based on the current version need no correction ((theta_now - theta_now)
            # + Delta is Delta exactly): only a round with a stale row costs an FP32 stack.
            base_rows = [self.pull(b)[1] for b in bases]
            base_rows += [self.state.params] * (self.capacity - len(base_rows))
            base = jax.tree.map(lambda *xs: jnp.stack(xs), *base_rows)
            stacked = _server_delta(self.state.params, base, stacked)
        return stacked

    def partial_norms(
        self, round_id: int, learners: tuple[int, ...], base_versions: tuple[int, ...] = ()
    ) -> np.ndarray:
        """Step 1: per-learner squared norms of this shard's pseudo-gradients, ``[len]``
        (asked again for the same round and learners, it answers from the same batch)."""
        if round_id in self._batch and self._batch[round_id][0] == tuple(learners):
            return np.asarray(_sq_norms(self._batch[round_id][1]))[: len(learners)]
        stacked = self._stack(round_id, learners, base_versions)
        self._batch[round_id] = (learners, stacked)
        return np.asarray(_sq_norms(stacked))[: len(learners)]

    def _meta(self, decision: Decide) -> dict[str, jax.Array]:
        n, pad = len(decision.learners), self.capacity - len(decision.learners)
        return {
            "tokens": jnp.asarray(list(decision.tokens) + [0] * pad, jnp.float32),
            "steps": jnp.asarray(list(decision.steps) + [0] * pad, jnp.float32),
            "mask": jnp.asarray([True] * n + [False] * pad),
            "accepted": jnp.asarray(list(decision.accepted) + [False] * pad),
            "weights": jnp.asarray(list(decision.weights) + [0.0] * pad, jnp.float32),
            "learner_sq_norms": jnp.asarray(list(decision.sq_norms) + [0.0] * pad, jnp.float32),
        }

    def merged_partial(self, decision: Decide) -> float:
        """Step 2: squared norm of this shard's merged update under the leader's decision."""
        learners, stacked = self._batch[decision.round_id]
        if learners != decision.learners:
            raise ValueError(
                f"follower {self.follower_id}: round {decision.round_id} decided for "
                f"{decision.learners} but norms were computed for {learners}"
            )
        self.decisions[decision.round_id] = decision
        return float(_merged_norm(self.tx, stacked, self.state.opt_state, self._meta(decision)))

    def apply(self, decision: Decide, apply: Apply) -> int:
        """Step 3: the outer step with the leader's decision; returns the new version."""
        if apply.version <= self.state.version:
            self.discard(decision.round_id)  # already applied (a retry): idempotent
            return self.state.version
        if apply.version != self.state.version + 1:
            raise ValueError(
                f"follower {self.follower_id} is at version {self.state.version}, "
                f"cannot apply version {apply.version}"
            )
        _, stacked = self._batch.pop(decision.round_id)
        meta = self._meta(decision)
        meta["merged_sq_norm"] = jnp.asarray(apply.merged_sq_norm, jnp.float32)
        meta["clip_factor"] = jnp.asarray(apply.clip_factor, jnp.float32)
        params, opt_state = _apply(self.tx, self.state.params, self.state.opt_state, stacked, meta)
        self.state = FollowerState(apply.version, params, opt_state)
        self._remember()
        self._forget(decision.round_id)
        return self.state.version

    def round_batch(self, round_id: int) -> Any:
        """A round's stacked batch once its norms are taken (``[capacity, ...]`` per tensor,
        at staging precision): what a driver writes for ``Save("batch")``."""
        return self._batch[round_id][1]

    def round_inputs(self, round_id: int) -> tuple[Decide, Any]:
        """A decided round's inputs, its ``Decide`` and stacked batch (``[capacity, ...]``
        per tensor, at staging precision): what a driver writes for ``Save("inputs")``."""
        return self.decisions[round_id], self._batch[round_id][1]

    def restore_inputs(self, version: int, decision: Decide, stacked: Any) -> bool:
        """A restarted follower takes back the inputs of a round decided at ``version``
        (what :meth:`round_inputs` gave before it was killed) and lists the round in its
        join, so a leader applying it sends the ``Apply`` again and this follower redoes
        the step it lost. Inputs of another version (it checkpointed the step, or the
        round was decided before an older checkpoint) or of a round that ended here are
        ignored; returns whether they were taken."""
        r = decision.round_id
        if version != self.version or r in self._done:
            return False
        want = outer.flatten(self.state.params)
        got = outer.flatten(stacked)
        if got.keys() != want.keys() or any(
            tuple(np.shape(got[p])) != (self.capacity, *want[p].shape) for p in want
        ):
            raise ValueError(
                f"follower {self.follower_id}: saved inputs of round {r} do not fit its shard"
            )
        self._batch[r] = (tuple(decision.learners), jax.tree.map(jnp.asarray, stacked))
        self.decisions[r] = decision
        return True

    def redo(
        self,
        decided: Iterable[tuple[int, Decide, Any]],
        applied: Iterable[tuple[Apply, Iterable[Sequence[int]]]],
        upto: int | None = None,
    ) -> int:
        """A restarted follower, built from its newest checkpoint, redoes the outer steps
        its journal holds since. ``decided``: the inputs it saved (``Save("inputs")``: the
        version a round was decided at, its ``Decide`` and stacked batch); ``applied``: the
        ``Apply`` of each step it took (``Save("applied")``) with the rounds ended by then
        (:meth:`ended_rounds`). From its version on, the round decided at its version and
        applied is applied again (the same inputs through the same compiled step: the
        parameters it had, bit for bit), up to version ``upto`` (``None``: every step the
        journal holds); then it takes back the newest round decided at its version and not
        applied (:meth:`restore_inputs`: it was killed while applying it). Entries of other
        versions are ignored. Returns the number of steps redone."""
        at: dict[int, dict[int, tuple[Decide, Any]]] = collections.defaultdict(dict)
        for version, decision, stacked in decided:
            at[int(version)][decision.round_id] = (decision, stacked)
        steps = {a.round_id: (a, ended) for a, ended in applied}
        redone = 0
        while upto is None or self.version < upto:
            todo = [
                r
                for r in at.get(self.version, {})
                if r in steps and steps[r][0].version == self.version + 1
            ]
            if not todo or not self.restore_inputs(self.version, *at[self.version][todo[0]]):
                break
            decision, _ = at[self.version][todo[0]]
            a, ended = steps[todo[0]]
            self.apply(decision, a)
            self._done.update(r for lo, hi in ended for r in range(int(lo), int(hi) + 1))
            redone += 1
        open_rounds = sorted(r for r in at.get(self.version, {}) if r not in self._done)
        if open_rounds:
            self.restore_inputs(self.version, *at[self.version][open_rounds[-1]])
        return redone

    def holds(self, round_id: int, learners: tuple[int, ...] | None = None) -> bool:
        """Whether this follower can serve ``round_id``: its batch is stacked, or (given the
        round's ``learners``) every one of their shards is staged."""
        if round_id in self._batch:
            return True
        return learners is not None and all((round_id, j) in self._staged for j in learners)

    def discard_all(self) -> None:
        """Forgets every staged shard and batch (the leader restarted: rounds begin anew,
        under new ids; a late push for one of the rounds dropped is a replay)."""
        self._done.update(self._batch)
        self._done.update(r for r, _ in self._staged)
        self._batch.clear()
        self._staged.clear()
        self._incarnations.clear()
        self.decisions.clear()

    def discard(self, round_id: int) -> None:
        """Forgets everything staged for ``round_id`` (round abandoned)."""
        self._batch.pop(round_id, None)
        self._forget(round_id)

    def _forget(self, round_id: int) -> None:
        self._done.add(round_id)
        self.decisions.pop(round_id, None)
        for table in (self._staged, self._incarnations):
            for key in [k for k in table if k[0] == round_id]:
                del table[key]

    # -- the protocol (sans-IO: every decision of the follower's side) --------------

    def decided_rounds(self) -> tuple[int, ...]:
        """Rounds whose inputs it holds whole, batch and ``Decide``, not yet applied: what
        it can apply if told again (``FollowerJoined.rounds``)."""
        return tuple(sorted(r for r in self.decisions if r in self._batch))

    def start(self, now: float, restarted: bool = False) -> list[Command]:
        """Joining the leader: a restarted process first says it was lost (the round in
        flight needs shards it never received, and is discarded whole, never half
        applied); then a first heartbeat (the leader watches it from now on: a hang right
        after joining, before the heartbeat thread's first beat, was never found) and
        the join at its version."""
        lost = [Send(FollowerLost(now, self.follower_id, "restarted"))] if restarted else []
        return [*lost, Send(FollowerHeartbeat(now, self.follower_id)), self._join(now)]

    def leader_lost(self, now: float, reason: str = "control stream lost") -> list[Command]:
        """Its control stream broke: the leader died (a restarted one drops the rounds in
        flight), or only the stream did and the leader, up, may have sent actions into it
        that never arrived. Either way the follower says it was lost and joins again: it
        drops the staged shards of rounds not decided yet (the leader discards them) and
        keeps the batch and ``Decide`` of a decided round, which a leader in the middle of
        applying it tells it to apply again. The driver sends these once the leader is
        back, in order, each once (a failed send is retried, not the ones before)."""
        return self._lost(now, reason)

    def handle(self, action: Action, now: float) -> list[Command]:
        """Carries out one of the leader's actions; returns what the driver must do, in
        order (a ``Save`` of inputs or of an ``Apply`` is on disk before the next command
        is carried out; a ``Save`` of a version is started, not waited for)."""
        k = self.follower_id
        if isinstance(action, Rejoin):
            if action.follower != k:
                return []
            if self._rejoined:
                # Sent before the leader heard this follower's join (one per heartbeat of a
                # hang): it changes nothing, and must not wipe a newer round it staged since.
                return [self._join(now)]
            return self._lost(now, action.reason)
        self._rejoined = False
        if isinstance(action, RequestNorms | Decide) and action.round_id in self._dropped:
            # A round it dropped when it said it was lost, asked about before the leader
            # heard that: the leader discards it on hearing it (a second word would be
            # taken for a new loss, and cost a newer round).
            return []
        if isinstance(action, RequestNorms):
            r = action.round_id
            self._end_before(r)
            if not self.holds(r, action.learners):
                # Shards this process never received or dropped (it restarted, or its link
                # broke): saying so makes the leader discard the round, not wait forever.
                return self._lost(now, f"no shards of round {r}", r)
            new = r not in self._batch
            g = self.partial_norms(r, action.learners, action.base_versions)
            # The batch is fixed from here: its write to the journal can start now, while
            # the leader decides (``Save("inputs")`` at the merge waits for it).
            save = [Save("batch", r, self.version)] if new else []
            return [*save, Send(FollowerNorms(now, k, r, tuple(float(x) for x in g)))]
        if isinstance(action, Decide):
            r = action.round_id
            if r not in self._batch:
                return self._lost(now, f"no batch of round {r}", r)
            merged = self.merged_partial(action)  # keeps the Decide until apply or discard
            # Its inputs on disk before the leader can send any Apply (it waits for every
            # FollowerMerged): a follower killed while the others apply the round restarts
            # holding them and redoes V -> V+1 (see restore_inputs).
            return [Save("inputs", r, self.version), Send(FollowerMerged(now, k, r, merged))]
        if isinstance(action, Apply):
            return self._on_apply(action, now)
        if isinstance(action, Discard):
            self.discard(action.round_id)
            return []
        if isinstance(action, Stop):
            return [Exit(ExitCode.OK, action.reason)]
        return []

    def _on_apply(self, a: Apply, now: float) -> list[Command]:
        k, r = self.follower_id, a.round_id
        if a.version <= self.version:
            # Applied already (a repeat: a retry, or a leader that lost the report): the
            # same report again, no new checkpoint.
            self.discard(r)
            return [Send(FollowerApplied(now, k, r, self.version))]
        if a.version != self.version + 1:
            return self._lost(now, f"at version {self.version}, cannot apply version {a.version}")
        if r not in self._batch or r not in self.decisions:
            # Inputs it does not hold (it restarted mid-apply without them: no checkpoints
            # in this run): the leader hears it and decides.
            return self._lost(now, f"no inputs of round {r}")
        self._end_before(r)
        decision = self.decisions[r]
        v = self.apply(decision, a)
        self.last_applied = (decision, a)
        # The ordering rule: its Apply on disk before the leader hears of the step (with the
        # inputs saved at the merge, what a restart redoes it from), so a follower killed at
        # any moment restarts at a version the leader counted (or one more, mid-apply). The
        # checkpoint is started after the report: nobody waits for it.
        save = [Save("version", r, v)] if v % self.checkpoint_every == 0 else []
        return [Save("applied", r, v), Send(FollowerApplied(now, k, r, v)), *save]

    def _end_before(self, round_id: int) -> None:
        """Rounds older than ``round_id`` are over (the leader moved on: one round is
        decided at a time, in the order of their ids): what it holds of them (a decided
        round's inputs, or shards staged for a round it never heard end: it was restarted,
        or its ``Discard`` was lost) is freed, and a push for one of them is a replay."""
        self._newest = max(self._newest, round_id)
        held = {r for r, _ in self._staged} | set(self._batch) | set(self.decisions)
        for r in sorted(r for r in held if r < round_id):
            self.discard(r)

    def _lost(self, now: float, reason: str, round_id: int | None = None) -> list[Command]:
        """Says it was lost and joins again; drops every round not decided here (and
        ``round_id``, the one it was asked about)."""
        asked = set() if round_id is None else {round_id}
        for r in {r for r, _ in self._staged} | set(self._batch) | asked:
            if r not in self.decisions:
                self.discard(r)  # the leader discards it (a late push for it is a replay)
                self._dropped.add(r)
        return [Send(FollowerLost(now, self.follower_id, reason)), self._join(now)]

    def _join(self, now: float) -> Send:
        self._rejoined = True
        return Send(
            FollowerJoined(
                now,
                self.follower_id,
                self.version,
                min(self._versions),
                self.address,
                rounds=self.decided_rounds(),
            )
        )


def covered(kind: str, version: int, checkpoint: int) -> bool:
    """Whether the checkpoint of version ``checkpoint`` makes a journal entry useless:
    ``decided`` (a round's inputs, decided at ``version``) below it, ``applied`` (a step's
    ``Apply``, making ``version``) at or below it. A round decided at its version may still
    be applied after a restart from it: kept."""
    return version < checkpoint or (kind == "applied" and version == checkpoint)


def resume_step(steps: Sequence[int], resume: int) -> int | None:
    """The checkpoint step a follower started with ``--resume`` restores (its journal
    redoes the steps after it, :meth:`Follower.redo`), or ``None``: start from version 0,
    the initial shard. ``resume``: a version (the newest checkpoint at or below it), or
    ``-1`` for the newest (``latest``: the launcher's restart after a crash).

    With no checkpoint on disk (killed before its first one, during compilation) the
    newest is version 0: a follower's first checkpoint, of version 0, is on disk before
    it joins, so a run cannot have applied a version without it. Version 0 is the initial
    shard, so ``resume=0`` needs no checkpoint either (a step 1 beside it was taken in a
    round the leader never counted). Raises ``FileNotFoundError`` for a version with no
    checkpoint at or below it (checkpoints of another run's folder, or deleted)."""
    steps = sorted(steps)
    if resume < 0:
        return steps[-1] if steps else None
    below = [s for s in steps if s <= resume]
    if below:
        return below[-1]
    if resume == 0 and all(s <= 1 for s in steps):
        return None
    raise FileNotFoundError(f"no checkpoint at or below version {resume} (has {steps})")


def warm_up(shard: Any, tx: Any, capacity: int, reference: str, wire_dtype: Any) -> None:
    """Compiles every program of an outer step for this shard and capacity before a run
    needs them, by running rounds of zeros on a scratch follower: norms, merge and apply
    of rows in ``wire_dtype`` on the current version, and (server reference) of rows one
    version stale, which are rebuilt in FP32 and so run other programs. A runtime follower
    calls it before joining, so no compile lands in a round while learners train."""
    scratch = Follower(-1, shard, tx, capacity=capacity, reference=reference, version_cache=2)
    zeros = jax.tree.map(lambda x: np.zeros(x.shape, wire_dtype), shard)
    learners, ones = tuple(range(capacity)), (1,) * capacity
    for r in range(2 if reference == "server" else 1):
        for j in learners:
            scratch.receive(r, j, zeros)
        scratch.partial_norms(r, learners, (0,) * capacity)
        uniform = (1.0 / capacity,) * capacity
        decide = Decide(r, learners, (True,) * capacity, ones, ones, uniform, (0.0,) * capacity)
        scratch.merged_partial(decide)
        scratch.apply(decide, Apply(r, r + 1, 1.0, 0.0))


def _staged_dtype(x: Any) -> jax.Array:
    """A staged tensor: BF16 and FP32 as they came, anything else as FP32."""
    x = jnp.asarray(x)
    return x if x.dtype in (jnp.bfloat16, jnp.float32) else x.astype(jnp.float32)


@jax.jit
def _sq_norms(stacked: Any) -> jax.Array:
    """Per-row squared norms, compiled: widening and squaring fuse into the reduction, so
    no FP32 copy of a stacked tensor is made."""
    return outer.learner_sq_norms(stacked)


@jax.jit
def _server_delta(params: Any, stacked_base: Any, stacked_delta: Any) -> Any:
    """``(theta_now - theta_g) + (theta_g - theta_end) = theta_now - theta_end`` per row."""
    return jax.tree.map(
        lambda p, b, d: (p[None] - b) + d.astype(jnp.float32), params, stacked_base, stacked_delta
    )


@functools.partial(jax.jit, static_argnums=0)
def _merged_norm(tx: Any, stacked: Any, state: Any, meta: dict) -> jax.Array:
    return outer.shard_merged_sq_norm(tx, stacked, state, **meta)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(2,))
def _apply(tx: Any, params: Any, state: Any, stacked: Any, meta: dict) -> tuple[Any, Any]:
    updates, state = tx.update(stacked, state, params, **meta)
    return optax.apply_updates(params, updates), state
