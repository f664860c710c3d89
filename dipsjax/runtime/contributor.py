"""A learner of a job driven by a user's own training loop (as torchft's users keep theirs).

:class:`Contributor` joins a running job as learner ``j``, hands the user the current global
parameters, and takes back what the user's loop made of them with the tokens and inner
steps it trained; it sends the pseudo-gradient to the followers as a built-in learner
does and returns the parameters to go on from::

    from dipsjax.runtime.contributor import Contributor

    with Contributor("runs/myjob", learner=1) as c:
        params = c.pull()  # the current global version, once joined
        while not c.done:  # the job stopped (its token budget reached): done
            for _ in range(c.inner_steps):
                params, opt_state = my_step(params, opt_state, next(my_batches))
            params = c.contribute(params, tokens=c.inner_steps * n, steps=c.inner_steps)

It *is* the built-in learner process's node (:class:`~dipsjax.runtime.learner.LearnerNode`,
every protocol decision :class:`~dipsjax.syncer.learner.LearnerProtocol`'s), run in a
thread of the user's process, with the partition's computations replaced by the user's
loop: where the built-in learner trains its ``H`` inner steps on leased chunks, this node
offers the round's starting parameters to the user's thread and waits for
:meth:`Contributor.contribute`. Everything else is the node's: the join (the job's model
fingerprint), heartbeats, the watch stream, the push in the order of the leader's
``PushShards`` plan, retries while a follower restarts, rejoining a restarted leader,
pulls, the books (``RUN_DIR/learner{j}/reported.json`` and ``stats.json``) and
TensorBoard scalars.

Its arithmetic is the built-in learner's (:mod:`dipsjax.learner.contribution`): the
pseudo-gradient is ``theta_start - theta_end`` in FP32 (start reference: the parameters
it handed out for the round minus the user's), or, for a server-reference method,
``theta_base - theta_end`` against the version it last pulled; a new version is taken as it
is (``adopt='replace'``) or as the user's parameters plus the global change
(``adopt='delta'``).

What the leader checks, it checks first, before anything is sent
(:class:`ContributionRefused`): ``1 <= steps <= inner_steps``, ``0 <= tokens <= steps *
batch_tokens``, and the parameters' paths and shapes (the job's model).

Data: the user's loop brings its own, so a contribution carries no chunk spans: the
leader books its tokens (the budget counts them) and settles no chunk of its ledger.

Faults, as the built-in learner's (the node is the same): a follower that restarts is
waited for; a leader that restarts is rejoined as the same incarnation (a round the
restart lost is not trained again: the user's loop goes on from the version it is sent);
the job's ``Stop`` ends it with :attr:`Contributor.done`; an eviction, a refusal or a
lost link ends it with :class:`ContributorEvicted`, :class:`ContributorRefused` or
:class:`ContributorUnreachable`, raised by the next :meth:`~Contributor.pull` or
:meth:`~Contributor.contribute` (start a new ``Contributor``: a new incarnation that
pulls a whole version). See ``docs/own-loop.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dipsjax import outer
from dipsjax.runtime import permissions
from dipsjax.runtime.learner import LearnerNode, log
from dipsjax.runtime.partition import Partition
from dipsjax.runtime.spec import RunSpec
from dipsjax.syncer import messages as m
from dipsjax.syncer import methods


class ContributionRefused(ValueError):
    """A contribution the leader would refuse (its counts) or the followers could not
    take (its parameters): raised before anything is sent."""


class ContributorEnded(RuntimeError):
    """The contributor's node ended before the job stopped: ``code`` (the built-in
    learner's exit code) and ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"learner ended (exit {code}): {reason}")
        self.code, self.reason = code, reason


class ContributorEvicted(ContributorEnded):
    """The leader evicted this incarnation (missed heartbeats, not a member, a push not
    finite, a lost leader without checkpoints): start a new :class:`Contributor`."""


class ContributorRefused(ContributorEnded):
    """The leader refused this process (another model fingerprint, another incarnation
    took over, an invalid push): the same process would be refused again."""


class ContributorUnreachable(ContributorEnded):
    """The link is down: the leader did not come back within the node's patience, or every
    follower of a push is up but the push failed."""


ENDINGS = {
    int(m.ExitCode.EVICTED): ContributorEvicted,
    int(m.ExitCode.REFUSED): ContributorRefused,
    int(m.ExitCode.UNREACHABLE): ContributorUnreachable,
}


def check_counts(spec: RunSpec, tokens: int, steps: int) -> None:
    """The leader's bounds on a push's counts (``bounds``), checked on the user's side:
    ``1 <= steps <= inner_steps`` and ``0 <= tokens <= steps * batch_tokens``."""
    if isinstance(tokens, bool) or not isinstance(tokens, int | np.integer):
        raise ContributionRefused(f"tokens must be an int, got {tokens!r}")
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer):
        raise ContributionRefused(f"steps must be an int, got {steps!r}")
    inner = spec.sim.inner_steps
    if not 1 <= steps <= inner:
        raise ContributionRefused(
            f"steps {steps}: a contribution is 1 to inner_steps={inner} inner steps "
            "(the leader refuses more)"
        )
    bound = steps * spec.batch_tokens
    if not 0 <= tokens <= bound:
        raise ContributionRefused(
            f"tokens {tokens}: {steps} steps train 0 to {bound} tokens (steps x the job's "
            f"batch_tokens={spec.batch_tokens}; the leader refuses more)"
        )


def as_flat(params: Any) -> dict[tuple[str, ...], np.ndarray]:
    """A nested dict (or ``nnx.State``) of arrays as ``{path: FP32 host array}``, copies
    (the caller may go on changing its own arrays in place)."""
    import jax
    from flax import nnx

    if isinstance(params, nnx.State):  # string keys, as pulled
        from dipsjax.learner.step import params_to_dict

        params = params_to_dict(params)
    if not isinstance(params, Mapping):
        raise ContributionRefused(
            f"params must be a nested dict of arrays, got {type(params).__name__}"
        )
    flat = outer.flatten(params)
    return {p: np.array(jax.device_get(x), np.float32) for p, x in flat.items()}


@dataclasses.dataclass
class _Offer:
    seq: int  # rounds offered so far
    version: int  # the global version the round starts from
    params: dict  # the round's starting parameters (the node's own copy)
    at: float  # when the user got them (perf_counter)


@dataclasses.dataclass
class _Given:
    seq: int  # the offer it answers
    flat: dict  # the user's parameters, {path: FP32}
    tokens: int
    steps: int
    loss: float | None
    seconds: float


class _UserSide:
    """What the node keeps of a partition when the user's loop trains: no devices, no
    inner state; the version it holds and what it trained, for the node's counters."""

    def __init__(self, reference: str) -> None:
        self.reference = reference
        self.learner = self  # the node reads ``compute.learner.version``
        self.partition = Partition()
        self.calls = 0
        self.version = -1
        self.tokens_done = self.steps_done = 0

    def call(self, name: str, *args: Any) -> Any:
        raise NotImplementedError(f"a contributor's loop is the user's: no {name!r} here")

    def stop(self) -> None:
        pass


class ContributorNode(LearnerNode):
    """Learner ``j``'s node with the user's loop in place of its partition (see module
    docstring). Runs in the :class:`Contributor`'s thread."""

    def __init__(self, owner: Contributor, spec: RunSpec, j: int, incarnation: int) -> None:
        self.owner = owner
        self.current: dict | None = None  # {path: FP32}: where the next round starts
        self.base_flat: dict | None = None  # {path: FP32}: the version last taken
        super().__init__(spec, j, incarnation)

    def make_compute(self) -> tuple[Any, dict]:
        from dipsjax.runtime.client import model_shapes

        shapes = model_shapes(self.spec)  # abstract: nothing allocated
        import jax

        params = outer.unflatten({p: jax.ShapeDtypeStruct(s, d) for p, (s, d) in shapes.items()})
        self.shapes = {p: tuple(s) for p, (s, _) in shapes.items()}
        side = _UserSide(methods.build(self.spec.sim.method).reference)
        return side, params

    def warm_up(self) -> None:
        pass  # nothing to compile: the user's loop is the user's

    def make_data(self) -> tuple[Any, None]:
        return None, None  # the user's own data: the job's is never read or built here

    def save(self, c: m.Save) -> None:
        pass  # the inner state is the user's: the protocol's list of saves is all there is

    def restore(self, c: m.Restore) -> list[m.Command]:
        # Rejoined (a restarted leader): the user's loop goes on from the version it is
        # sent now; a round the restart lost is not trained again (no chunks to retrain).
        # Its error feedback's residual, if any, is the process's own (in memory).
        self.base_flat = None
        self.deltas.clear()  # rounds the rejoin dropped
        log.info("rejoined (last round %s: %s)", c.last_round, c.last_outcome)
        return []

    def take(self, version: int, params: dict, first: bool = False) -> None:
        new = {p: np.asarray(x, np.float32) for p, x in outer.flatten(params).items()}
        delta = self.spec.sim.adopt == "delta" and not first and self.base_flat is not None
        if delta and self.current is not None:
            assert self.base_flat is not None
            self.current = {p: self.current[p] + (new[p] - self.base_flat[p]) for p in new}
        else:
            self.current = new
        self.base_flat = new
        self.learner.version = version
        self.base = params

    def _train_round(self, seq: int, steps: int) -> tuple:
        del steps  # the user's loop takes its own steps (at most inner_steps)
        assert self.current is not None
        given = self.owner._offer(self.learner.version, self.current, self)
        if given is None:
            return ("nothing",)  # the job stopped, or the user closed it, while it trained
        ref = self.current if self.compute.reference != "server" else self.base_flat
        assert ref is not None
        delta = outer.unflatten({p: ref[p] - given.flat[p] for p in self.paths})
        self.current = given.flat  # where the next round goes on from, unless it pulls
        meta = m.PushMeta(
            tokens=int(given.tokens),
            steps=int(given.steps),
            base_version=self.learner.version,
            incarnation=self.incarnation,
            train_seconds=given.seconds,
            pulled=self.pulled,
        )  # no spans: the user's own data, not the job's chunks
        self.pulled = False
        self._count(meta.tokens, time.perf_counter() - given.seconds, given.seconds)
        side = self.compute
        side.tokens_done += meta.tokens
        side.steps_done += meta.steps
        wall = time.time()  # the wall-time axis every role's scalars share
        if given.loss is not None and math.isfinite(given.loss):
            self.tb.add_scalar("learner/train_loss", given.loss, side.tokens_done, walltime=wall)
        if given.seconds > 0:
            rate = meta.tokens / given.seconds
            self.tb.add_scalar("learner/tokens_per_s", rate, side.tokens_done, walltime=wall)
        self.tb.flush()
        return ("trained", meta, delta)

    def stopping(self) -> bool:
        """Whether the node should stop waiting for the user: the job stopped, the user
        closed it."""
        return self.job_stop is not None or self.terminating or self.stop.is_set()


class Contributor:
    """Learner ``learner`` of the job ``job`` (a :class:`RunSpec`, its ``spec.json`` or its
    run folder), driven by the caller's own training loop (see module docstring and
    ``docs/own-loop.md``).

    ``incarnation``: ``None`` (default) takes the run folder's rule for a learner's start
    (:func:`dipsjax.launch.entry.start_args`: the first start is the recorded incarnation,
    every later one a new incarnation, which the leader lets take over from the old one).
    Use it as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self, job: RunSpec | str | Path, learner: int, *, incarnation: int | None = None
    ) -> None:
        if not isinstance(job, RunSpec):
            path = Path(job)
            path = path / "spec.json" if path.is_dir() else path
            if not path.exists():
                raise FileNotFoundError(
                    f"{path}: no job spec (the launcher writes RUN_DIR/spec.json when it starts)"
                )
            job = RunSpec.read(path)
        self.spec: RunSpec = job
        if not 0 <= learner < job.sim.learners:
            raise ValueError(
                f"learner {learner}: the job's learners are 0 .. {job.sim.learners - 1}"
            )
        if job.sim.deal_chunks:
            raise ValueError(
                "sim.deal_chunks: the leader deals chunks to every learner in turn, and a "
                "contributor never trains or settles them (the epoch would never end); "
                "run a job with a contributor with deal_chunks=False"
            )
        self.j = learner
        self.incarnation = incarnation
        self.node: ContributorNode | None = None
        self._thread: threading.Thread | None = None
        self._cv = threading.Condition()
        self._offered: _Offer | None = None
        self._given: _Given | None = None
        self._ended: ContributorEnded | None = None
        self._done = False
        self._closed = False
        self._shapes: dict | None = None
        self._umask: int | None = None

    # -- the job's facts ---------------------------------------------------------------

    @property
    def inner_steps(self) -> int:
        """``H``: the most inner steps one contribution may report."""
        return self.spec.sim.inner_steps

    @property
    def batch_tokens(self) -> int:
        """The most tokens one inner step may report (the job's batch, in the books' unit)."""
        return self.spec.batch_tokens

    @property
    def done(self) -> bool:
        """The job stopped (its budget reached): nothing more is taken."""
        return self._done

    @property
    def version(self) -> int:
        """The global version the current round started from (-1 before the first pull)."""
        offer = self._offered
        return -1 if offer is None else offer.version

    @property
    def reported(self) -> int:
        """Tokens of this process's pushes the leader took (its side of the books)."""
        return 0 if self.node is None else self.node.reported

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Contributor:
        """Builds the node and starts it in a thread: it joins the job and pulls. Until
        :meth:`close`, this process's umask is a run's (what the node writes in the run
        folder is its owner's alone, or its group's: ``permissions.private``)."""
        if self._thread is not None:
            raise RuntimeError("this Contributor was started already")
        self._umask = permissions.private()
        try:
            incarnation = self.incarnation
            if incarnation is None:
                from dipsjax.launch.entry import start_args

                incarnation = int(start_args("learner", self.j, Path(self.spec.run_dir))[1])
            self.incarnation = incarnation
            self.node = ContributorNode(self, self.spec, self.j, incarnation)
        except BaseException:
            os.umask(self._umask)
            self._umask = None
            raise
        self._shapes = self.node.shapes
        self._thread = threading.Thread(
            target=self._run, name=f"dipsjax-contributor-{self.j}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        node = self.node
        assert node is not None
        ended: ContributorEnded | None = None
        try:
            node.run()
        except BaseException as e:  # a bug or an unexpected failure: the user hears of it
            ended = ContributorEnded(1, f"{type(e).__name__}: {e}")
            ended.__cause__ = e
        with self._cv:
            exit_ = node.proto.exit
            if ended is None and not self._closed:
                code = node.exit_code
                reason = exit_.reason if exit_ is not None else "ended"
                if code == 0:  # the job's Stop (the only way the node ends with 0 here)
                    self._done = True
                else:
                    ended = ENDINGS.get(code, ContributorEnded)(code, reason)
            self._ended = ended
            self._cv.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Leaves the job (unless it stopped) and ends the node."""
        node, thread = self.node, self._thread
        if node is None or thread is None or self._closed:
            return
        with self._cv:
            self._closed = True
            running = thread.is_alive() and not self._done and self._ended is None
            self._cv.notify_all()
        if running:
            with contextlib.suppress(Exception):  # the leader drops its pending push
                node.control.call(m.Leave(0.0, self.j), timeout=5.0)
        node.terminating = True
        threading.Thread(target=node.control.close, daemon=True).start()
        thread.join(timeout)
        if self._umask is not None:
            os.umask(self._umask)  # the caller's again
            self._umask = None

    def __enter__(self) -> Contributor:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the user's side ---------------------------------------------------------------

    def pull(self, timeout: float | None = None) -> dict:
        """The parameters the current round starts from (a nested dict of FP32 NumPy
        arrays, the task's model parameters as ``params_to_dict`` gives them): the global
        version, once joined. Blocks until there is one; raises what ended the node."""
        if self._thread is None:
            raise RuntimeError("start the Contributor first (a with-block, or start())")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._offered is None and not self._over():
                self._wait(deadline)
            self._raise_if_ended()
            if self._offered is None:
                raise RuntimeError("the job stopped before this learner joined")
            self._offered.at = time.perf_counter()
            return _copy(self._offered.params)

    def contribute(
        self,
        params: Any,
        *,
        tokens: int,
        steps: int,
        loss: float | None = None,
        timeout: float | None = None,
    ) -> dict:
        """Sends what the user's loop made of the round's parameters: ``params`` (a nested
        dict of arrays, as :meth:`pull` gave), trained ``steps`` inner steps on ``tokens``
        tokens (``loss``: its mean training loss, for TensorBoard). Blocks until the round
        is over for this learner and returns the parameters to go on from: the new global
        version when it pulled one, else ``params`` as given. Once the job stopped
        (:attr:`done`) nothing is sent and ``params`` comes back as it is.

        Raises :class:`ContributionRefused` (bad counts or parameters: nothing sent),
        or what ended the node (:class:`ContributorEvicted`, ...)."""
        check_counts(self.spec, tokens, steps)
        if self._thread is None:
            raise RuntimeError("start the Contributor first (a with-block, or start())")
        flat = self._check_params(params)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            self._raise_if_ended()
            if self._done:
                return params
            offer = self._offered
            if offer is None:
                raise RuntimeError("pull() first: no round was handed out yet")
            if self._given is not None:
                raise RuntimeError("a contribution of this round is pending already")
            seconds = time.perf_counter() - offer.at
            self._given = _Given(offer.seq, flat, int(tokens), int(steps), loss, seconds)
            self._cv.notify_all()
            while not self._over() and (self._offered is offer or self._given is not None):
                self._wait(deadline)
            self._raise_if_ended()
            if self._done or self._offered is None:
                return params
            self._offered.at = time.perf_counter()
            return _copy(self._offered.params)

    # -- between the threads -----------------------------------------------------------

    def _over(self) -> bool:
        return self._done or self._ended is not None or self._closed

    def _wait(self, deadline: float | None) -> None:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("the contributor's round did not end in time")
        self._cv.wait(0.5 if left is None else min(left, 0.5))

    def _raise_if_ended(self) -> None:
        if self._ended is not None:
            raise self._ended
        if self._closed:
            raise RuntimeError("this Contributor was closed")

    def _check_params(self, params: Any) -> dict:
        flat = as_flat(params)
        shapes = self._shapes
        assert shapes is not None
        if set(flat) != set(shapes):
            missing = sorted("/".join(p) for p in set(shapes) - set(flat))[:5]
            extra = sorted("/".join(p) for p in set(flat) - set(shapes))[:5]
            raise ContributionRefused(
                f"params are not the job's model: missing {missing}, unexpected {extra}"
            )
        for p, shape in shapes.items():
            if flat[p].shape != shape:
                raise ContributionRefused(
                    f"params {'/'.join(p)}: shape {flat[p].shape}, the job's model has {shape}"
                )
        return flat

    def _offer(self, version: int, current: dict, node: ContributorNode) -> _Given | None:
        """The node's side of a round: hands ``current`` to the user and waits for the
        contribution (``None``: the job stopped, or the user closed it, meanwhile)."""
        with self._cv:
            seq = 1 if self._offered is None else self._offered.seq + 1
            params = outer.unflatten(current)
            self._offered = _Offer(seq, version, params, time.perf_counter())
            self._given = None
            self._cv.notify_all()
            while self._given is None or self._given.seq != seq:
                if node.stopping() or self._closed:
                    return None
                self._cv.wait(0.2)
            given, self._given = self._given, None
            self._cv.notify_all()
            return given


def _copy(tree: dict) -> dict:
    return {k: _copy(v) if isinstance(v, Mapping) else np.array(v) for k, v in tree.items()}
