"""The leader process: an asyncio gRPC control server around the sans-IO :class:`Leader`.

It decides nothing itself: each ``Call`` carries one event, stamped here with the leader's
clock (``time.monotonic``), handed to :meth:`Leader.handle`; the actions that come back are
routed to the processes they address, on the ``Watch`` stream each process keeps open:

* learners: ``SendModel``, ``PushShards``, ``NotifyPull``, ``Evict``, ``Refuse``, ``Unused``;
* followers: ``RequestNorms``, ``Decide``, ``Apply``, ``Discard``;
* everyone: ``Stop``; the caller, in the reply: ``GrantChunk``;
* this process: ``WakeAt`` (a timer feeding ``Tick``), plus a ``Tick`` every second.

Every call must carry the job's credential, in its gRPC metadata (``x-dipsjax-token``):
:class:`TokenCheck` refuses one without it before its bytes are read. :class:`RpcCaps`
bounds the calls in flight from one host and in all (``peer_cap``, ``server_cap``). Bytes
that do not decode are answered with the problem and counted (``malformed``). Each event
is screened by the core (:meth:`Leader.screen`: unknown peers and rounds are refused and
counted) and checked against its sender's :class:`RequestLog` (a repeated request is
answered as the first time, never applied twice; an older incarnation's is refused). A
``Watch`` is screened alike (:meth:`LeaderNode.screen_watch`): one for a peer the job does
not have ends ``NOT_FOUND``, one of a learner incarnation older than the leader counts
``FAILED_PRECONDITION`` (``old_incarnation``), each counted, before it touches the peer's
stream or outbox. After every event the leader's state is written atomically to
``RUN_DIR/leader/snapshot.json`` and new tape records are appended to
``RUN_DIR/tape.jsonl``. It never carries tensors and never imports JAX.

``--resume`` restarts from that snapshot and tape (the clock continues from the last
status), then :meth:`Leader.resume`: a round the followers were applying is finished, what
else was in flight is dropped and counted, and every follower and learner must come back
(they restart from their own checkpoints, or rejoin). A leader restarted after it had
stopped the job tells whoever watches (``Stop``) for a few heartbeats and exits 0; with
``--reopen`` (``dipsjax run --resume`` of a run a fault stopped short of its budget) it goes
on instead. ``--alone`` (the launcher's restart of the leader by itself: its peers are up)
shortens the time before heartbeats count again to two heartbeat intervals.

Each leader process claims the next epoch (its fencing token, :mod:`dipsjax.runtime.lease`)
and stamps it on every action and answer. With a standby (``RunSpec.standby``) the active
leader renews its lease; ``--standby`` makes a process follow that lease (and the tape, as it
is written), take the run folder over once the lease lapses and serve on its own address
(``--listen-on standby``), resumed alone. A leader that finds a newer epoch claimed is
deposed: it routes nothing, refuses every call (``deposed``), and stands by in its turn.

Run: ``python -m dipsjax.runtime.leader RUN_DIR/spec.json [--resume [--reopen|--alone]]``
or ``... --standby [--listen-on standby]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import signal
import sys
import time
import urllib.parse
from collections import Counter, OrderedDict, defaultdict
from pathlib import Path
from typing import Any

import grpc

from dipsjax.data.ledger import new_ledger
from dipsjax.runtime import lease, logs, permissions
from dipsjax.runtime.client import TOKEN_KEY, keepalive_options
from dipsjax.runtime.credentials import push_ticket
from dipsjax.runtime.spec import RunSpec, write_cpu_seconds, write_json_at
from dipsjax.syncer import messages as m
from dipsjax.syncer import methods
from dipsjax.syncer.leader import Leader, Phase
from dipsjax.syncer.tape import EventTape, phase_seconds
from dipsjax.transport import control_codec as codec
from dipsjax.transport.proto import syncer_pb2, syncer_pb2_grpc
from dipsjax.transport.refusals import RefusalLog

log = logging.getLogger("dipsjax.runtime.leader")  # not __name__: "__main__" when run

MAX_REQUEST_BYTES = 1 << 20
#: Exit code of a leader deposed by a newer epoch (EX_TEMPFAIL: with a standby, the
#: launcher starts it again as the new standby).
DEPOSED = 75
#: A connection must finish its TLS and HTTP/2 handshakes within this (gRPC's default,
#: 120 s, let half-open handshakes hold descriptors for minutes).
HANDSHAKE_TIMEOUT_MS = 5000
REFUSAL_LOG_INTERVAL = 10.0  # seconds: at most one log line per refusal kind (the caps')

TO_FOLLOWERS = (m.RequestNorms, m.Decide, m.Apply, m.Discard)
TO_LEARNER = (m.SendModel, m.PushShards, m.Evict, m.Refuse, m.Unused, m.GrantChunk)


def sender(event: m.Event) -> tuple[str, int] | None:
    """Whose stream an event's acknowledgement is about: the learner or follower that sends
    it (a learner's events name it as ``learner``, a follower's as ``follower``)."""
    if hasattr(event, "follower"):
        return ("follower", event.follower)
    if hasattr(event, "learner"):
        return ("learner", event.learner)
    return None


def recipients(action: m.Action) -> list[tuple[str, int]]:
    """Who an action goes to: ``("learner", j)`` / ``("follower", k)`` / ``("all", -1)``."""
    if isinstance(action, m.NotifyPull):
        return [("learner", j) for j in action.learners]
    if isinstance(action, TO_LEARNER):
        return [("learner", action.learner)]
    if isinstance(action, m.Rejoin):
        return [("follower", action.follower)]
    if isinstance(action, TO_FOLLOWERS):
        return [("followers", -1)]
    if isinstance(action, m.Stop):
        return [("all", -1)]
    return []


class RequestLog:
    """What the leader has taken from each peer (replay protection, sans-IO): the newest
    incarnation it has seen, and for each of that incarnation's newest :attr:`SESSIONS`
    sessions (a session: one control client) the request numbers seen among the last
    :attr:`WINDOW` (requests of one session may arrive out of order: several threads share
    a client) and the replies to the last :attr:`REPLIES`. :meth:`check` says what to do
    with a request: ``new`` (handle it, then :meth:`answered`), ``repeat`` (answer the
    reply it got), ``replay`` (seen, too old to answer: refuse) or ``old_incarnation``.
    A restored log (:meth:`from_json`) refuses every number up to the newest it had."""

    WINDOW = 1024
    REPLIES = 16
    SESSIONS = 8

    @dataclasses.dataclass
    class Session:
        floor: int = 0  # numbers up to this one are refused (a restored log)
        high: int = 0
        seen: set[int] = dataclasses.field(default_factory=set)
        replies: OrderedDict[int, Any] = dataclasses.field(default_factory=OrderedDict)

    @dataclasses.dataclass
    class Peer:
        incarnation: int
        sessions: OrderedDict[int, RequestLog.Session] = dataclasses.field(
            default_factory=OrderedDict
        )

    def __init__(self) -> None:
        self.peers: dict[tuple[str, int], RequestLog.Peer] = {}

    def check(
        self, who: tuple[str, int], incarnation: int, session: int, request: int
    ) -> tuple[str, Any]:
        """``(verdict, reply)``: the verdict on request ``request`` of ``session`` (see
        the class), with the reply to repeat for ``repeat``. A ``new`` one is taken."""
        peer = self.peers.setdefault(who, RequestLog.Peer(incarnation))
        if incarnation < peer.incarnation:
            return "old_incarnation", None
        if incarnation > peer.incarnation:  # a restart: the older one's sessions are done
            peer.incarnation, peer.sessions = incarnation, OrderedDict()
        s = peer.sessions.get(session)
        if s is None:
            s = peer.sessions[session] = RequestLog.Session()
            while len(peer.sessions) > self.SESSIONS:
                peer.sessions.popitem(last=False)
        peer.sessions.move_to_end(session)
        if request in s.replies:
            return "repeat", s.replies[request]
        if request in s.seen or request <= max(s.floor, s.high - self.WINDOW):
            return "replay", None
        s.seen.add(request)
        if request > s.high:
            s.high = request
            s.seen = {r for r in s.seen if r > s.high - self.WINDOW}
        return "new", None

    def answered(self, who: tuple[str, int], session: int, request: int, reply: Any) -> None:
        """The reply a ``new`` request got (a repeat of it gets the same)."""
        s = self.peers[who].sessions.get(session)
        if s is not None:
            s.replies[request] = reply
            while len(s.replies) > self.REPLIES:
                s.replies.popitem(last=False)

    def to_json(self) -> list:
        return [
            [kind, j, p.incarnation, [[k, max(s.high, s.floor)] for k, s in p.sessions.items()]]
            for (kind, j), p in self.peers.items()
        ]

    @classmethod
    def from_json(cls, data: list) -> RequestLog:
        log = cls()
        for kind, j, incarnation, sessions in data:
            peer = log.peers[(kind, j)] = RequestLog.Peer(incarnation)
            for k, high in sessions:
                peer.sessions[k] = RequestLog.Session(floor=high, high=high)
        return log


class LeaderNode:
    """The leader's state, its routing and persistence (used by the gRPC service)."""

    def __init__(
        self,
        spec: RunSpec,
        leader: Leader | None = None,
        *,
        epoch: int | None = None,
        address: str | None = None,
        held: lease.Lease | None = None,
    ) -> None:
        self.spec = spec
        self.address = address or spec.leader
        resumed = leader is not None
        if leader is None:
            method = methods.build(
                spec.sim.method,
                spec.method_settings(),
            )
            sim = spec.sim
            config = dataclasses.replace(
                method.leader,
                fingerprint=spec.fingerprint,
                learners=sim.learners,  # learner ids 0 .. learners - 1
                # a round is at most inner_steps steps (adaptive steps: the most it is given)
                max_push_steps=method.leader.most_steps(),
                step_tokens=spec.batch_tokens,
            )
            leader = Leader(
                config,
                method.grace,
                data=new_ledger(
                    spec.num_chunks,
                    batches_per_chunk=spec.chunk_batches,
                    seed=spec.sim.seed,
                ),
            )
        self.leader = leader
        self.queues: dict[tuple[str, int], asyncio.Queue] = {}
        # Delivery (see ``_route``): this process's epoch, each peer's next number and what
        # it was sent and has not acknowledged, oldest first, each with the incarnation the
        # leader counted for that learner when it was routed (-1 for followers). The epoch
        # is also this leader's fencing token, claimed in RUN_DIR/lease (a standby that
        # took over claimed it before it restored: ``epoch``).
        role = "standby" if self.address != spec.leader else "leader"
        if held is None:
            holder = lease.holder_name(role)
            if epoch is None:
                epoch = lease.claim_next(spec.run_dir, holder)
            held = lease.Lease(spec.run_dir, epoch, holder, self.address)
        self.epoch = held.epoch
        self.lease = held
        self.deposed = False
        self.numbered: Counter[tuple[str, int]] = Counter()
        self.outbox: dict[tuple[str, int], list] = defaultdict(list)
        self.routed_to: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.t0 = time.monotonic()
        self.dir = Path(spec.run_dir)
        status = lease.snapshot_dir(self.dir) / "status.json"
        if resumed and status.exists():  # resumed: the clock goes on
            self.t0 -= float(json.loads(status.read_text())["t"])
        (self.dir / "leader").mkdir(parents=True, exist_ok=True)
        # Its folder and tape are written through descriptors opened now: after a takeover
        # (``lease.takeover`` moves the folder and copies the tape), what this process still
        # writes lands in its own, never in the new leader's files.
        self.dir_fd = os.open(self.dir / "leader", os.O_RDONLY | os.O_DIRECTORY)
        self.tape_path = self.dir / "tape.jsonl"
        self.tape_file = self.tape_path.open("a")
        self.taped = len(self.leader.tape.records)
        self.stopped = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tb = _writer(self.dir / "tb" / "leader")
        # Calls refused before the core saw them (unauthenticated, malformed); the core
        # counts what it refuses itself (``Leader.refused``). Both are in the status, and
        # both in the snapshot (these are saved with the next event's snapshot).
        self.refused: Counter[str] = Counter()
        self.requests = RequestLog()  # replay protection (saved with the snapshot)
        self.last_round: dict[str, Any] | None = None  # the newest round ended, for status
        # When training began: the first learner active (late joiners count from it).
        self.began = next(
            (
                r["t"]
                for r in leader.tape.records
                if r["kind"] == "membership" and r["event"] == "active"
            ),
            None,
        )
        snap = lease.snapshot_dir(self.dir) / "snapshot.json"
        if resumed and snap.exists():
            saved = json.loads(snap.read_text())
            self.refused.update(saved.get("transport_refused", {}))
            self.requests = RequestLog.from_json(saved.get("requests", []))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def close(self) -> None:
        """Its files and writer closed (a deposed leader that stands by again)."""
        self.tape_file.close()
        os.close(self.dir_fd)
        self.tb.close()

    def handle(self, event: m.Event) -> list[m.Action]:
        """One event through the core; routes and persists what it produced."""
        event = dataclasses.replace(event, t=self.now())  # the leader's clock, not the sender's
        actions = self.leader.handle(event)
        if isinstance(event, m.Join | m.PushRequested):
            # A refused join or push is answered to its caller alone (a forged one's refusal
            # never reaches the learner it names; the caller counts what it reported).
            refusals = [a for a in actions if isinstance(a, m.Refuse)]
            rest = [a for a in actions if not isinstance(a, m.Refuse)]
            return refusals + self.carry_out(rest)
        return self.carry_out(actions)

    def carry_out(self, actions: list[m.Action]) -> list[m.Action]:
        """Persists the core's state, then routes its actions; returns the caller's replies.

        In that order: no action leaves before the state that produced it is on disk, so a
        leader restarted from its snapshot never has to answer for an action it does not
        know it sent (an ``Apply`` above all: followers apply it). A leader that cannot
        persist ends at once, non-zero, with nothing of this event sent; the launcher
        restarts it from the last snapshot it wrote."""
        if self.deposed:
            return []
        try:
            self._persist()
        except Exception as e:
            log.error("cannot persist its state, ending: %r", e)
            os._exit(70)  # EX_SOFTWARE; from a gRPC handler thread, sys.exit would not do
        if self.lease.deposed():  # after the write: a standby that read it has it
            self.depose("a newer epoch was claimed")
            return []
        # A lease old by its own clock (it was paused, say) is renewed first, which finds
        # out whether a standby took over meanwhile.
        stale = self.spec.standby and not self.lease.fresh(self.spec.leader_lease)
        if stale and not self.lease.renew(stopped=self.leader.stopped):
            self.depose("a newer epoch was claimed while its lease was old")
            return []
        replies = []
        for a in actions:
            if isinstance(a, m.WakeAt):
                assert self.loop is not None
                delay = max(a.t - self.now(), 0.0)
                self.loop.call_later(delay, self._tick)
            if isinstance(a, m.GrantChunk):
                replies.append(a)
            for who in recipients(a):
                self._route(who, a)
            if isinstance(a, m.Stop):
                self.stopped.set()
        return replies

    def _tick(self) -> None:
        if not self.leader.stopped and not self.deposed:
            self.handle(m.Tick(0.0))

    def depose(self, why: str) -> None:
        """This leader has lost its lease to a newer epoch: it decides nothing more (no
        action leaves, no state is written), refuses every call, and ends."""
        if self.deposed:
            return
        self.deposed = True
        self.refused["deposed"] += 1
        log.error(
            "deposed (%s): epoch %d of %d; deciding nothing more",
            why,
            self.epoch,
            lease.newest_epoch(self.spec.run_dir),
        )
        self.stopped.set()

    def _route(self, who: tuple[str, int], action: m.Action) -> None:
        """Numbers ``action`` on each recipient's stream and keeps it in that recipient's
        outbox until acknowledged (:meth:`acknowledge`, or a watch that starts after it):
        an action sent into a stream that breaks goes again on the next one."""
        if who[0] == "followers":
            targets = [("follower", k) for k in range(len(self.spec.followers))]
        elif who[0] == "all":
            targets = list(self.queues) + [("follower", k) for k in range(len(self.spec.followers))]
        else:
            targets = [who]
        if isinstance(action, m.PushShards):  # signed: a follower takes only granted pushes
            inc = self._incarnation(who, action)
            grant = push_ticket(self.spec.token, action.round_id, action.learner, inc)
            action = dataclasses.replace(action, ticket=grant.hex())
        env = codec.to_proto(action)
        for target in dict.fromkeys(targets):
            self.numbered[target] += 1
            numbered = syncer_pb2.Envelope(epoch=self.epoch, seq=self.numbered[target])
            numbered.MergeFrom(env)
            self.outbox[target].append(numbered)
            self.routed_to[target].append(self._incarnation(target, action))
            q = self.queues.get(target)
            if q is not None:
                q.put_nowait(numbered)

    def _incarnation(self, who: tuple[str, int], action: m.Action) -> int:
        """The learner incarnation an action routed to ``who`` is for: the one it names
        (``Evict``, ``Refuse``, ``Unused``), else the one the leader counts now."""
        if who[0] != "learner":
            return -1
        return getattr(action, "incarnation", self.leader.incarnations.get(who[1], -1))

    def _forget(self, who: tuple[str, int], acked: int, epoch: int, incarnation: int = -1) -> None:
        """Drops what ``who`` acknowledged (numbers up to ``acked`` of this leader's epoch)
        and, for a learner's process of ``incarnation``, what was routed to an older one."""
        if who not in self.outbox:
            return
        if epoch != self.epoch:
            acked = 0
        kept = [
            (e, i)
            for e, i in zip(self.outbox[who], self.routed_to[who], strict=True)
            if e.seq > acked and i >= incarnation
        ]
        self.outbox[who] = [e for e, _ in kept]
        self.routed_to[who] = [i for _, i in kept]

    def acknowledge(self, event: m.Event, acked: int, epoch: int) -> None:
        """An event's sender has taken its stream's actions up to ``acked``."""
        who = sender(event)
        if who is not None:
            self._forget(who, acked, epoch)

    def screen_watch(
        self, who: tuple[str, int], incarnation: int = -1
    ) -> tuple[str, grpc.StatusCode, str] | None:
        """Why a watch by ``who`` (a learner's process of ``incarnation``) is refused, as
        ``(kind, status, reason)``, or None: a peer the job does not have (the kinds of the
        core's screening, :meth:`Leader.screen_peer`), or a learner incarnation older than
        the one the leader counts (a stale process, or a replayed request: it must not take
        the live process's stream, nor drop its outbox). A newer one is taken: a restarted
        learner may watch before its join."""
        bad = self.leader.screen_peer(*who)
        if bad is not None:
            return bad.kind, grpc.StatusCode.NOT_FOUND, bad.reason
        known = self.leader.incarnations.get(who[1]) if who[0] == "learner" else None
        if known is not None and incarnation < known:
            why = f"incarnation {incarnation} of learner {who[1]} is older than {known}"
            return "old_incarnation", grpc.StatusCode.FAILED_PRECONDITION, why
        return None

    def watch(
        self, who: tuple[str, int], acked: int = 0, epoch: int = 0, incarnation: int = -1
    ) -> asyncio.Queue:
        """A queue of ``who``'s actions: every one it has not acknowledged (``acked`` of
        ``epoch``; none of this leader's: all it kept), then each as it is routed. A learner
        process of ``incarnation`` gets nothing that was routed to an older incarnation (a
        new process must not take its predecessor's ``SendModel`` for its own)."""
        self._forget(who, acked, epoch, incarnation)
        q: asyncio.Queue = asyncio.Queue()
        backlog = self.outbox.get(who, [])
        for env in backlog:
            q.put_nowait(env)
        if self.leader.stopped and not any(e.WhichOneof("message") == "stop" for e in backlog):
            # The job has stopped (maybe before this process restarted): whoever watches
            # now hears it at once.
            q.put_nowait(codec.to_proto(self.final_stop()))
        self.queues[who] = q
        return q

    def final_stop(self) -> m.Stop:
        return m.Stop(self.leader.stop_reason or "the job has stopped")

    def unwatch(self, who: tuple[str, int], q: asyncio.Queue) -> None:
        """A watch stream ended: what it did not acknowledge stays in the outbox for the
        next one."""
        if self.queues.get(who) is q:
            del self.queues[who]

    def _persist(self) -> None:
        # The tape first, then the snapshot that says how long the tape it follows is: a
        # process killed in between leaves a tape longer than that, cut back on restore.
        records = self.leader.tape.records[self.taped :]
        if records:
            self.tape_file.writelines(json.dumps(r, allow_nan=False) + "\n" for r in records)
            self.tape_file.flush()
            if self.spec.standby:  # on the disk the standby reads (a network filesystem)
                os.fsync(self.tape_file.fileno())
            self.taped += len(records)
        state = self.leader.snapshot()
        state["tape_records"] = len(self.leader.tape.records)  # the tape this state follows
        state["transport_refused"] = dict(self.refused)
        state["requests"] = self.requests.to_json()
        write_json_at(self.dir_fd, "snapshot.json", state, allow_nan=False)
        for r in records:
            if self.began is None and r["kind"] == "membership" and r["event"] == "active":
                self.began = r["t"]
            self._log_record(r)
            if r["kind"] == "round":
                self._log_round(r)
                self.last_round = {
                    "id": r["round_id"],
                    "version": r["version"],
                    "applied": r["applied"],
                    "participants": len(r["participants"]),
                    "phases": phase_seconds(r["timings"], r["grace"]),
                }
        write_json_at(self.dir_fd, "status.json", self.status())

    def status(self) -> dict:
        """What ``dipsjax run`` shows while training and ``dipsjax status`` reads."""
        ld = self.leader
        rnd = ld.round
        in_round = {p.learner for p in rnd.pushes} if rnd is not None else set()
        waiting = {p.learner for p in ld.waiting}
        pulling = set(rnd.pulling) if rnd is not None else set()
        learners = {}
        for j, member in sorted(ld.members.items()):
            if not member.active:
                state = "joining"
            elif j in pulling:
                state = "pulling"
            elif j in in_round:
                state = f"in round {rnd.round_id}"
            elif j in waiting:
                state = "waiting"
            else:
                state = "training"
            learners[str(j)] = {
                "state": state,
                "tokens": ld.ledger.reported.get(j, 0),
                "accepted": ld.clock.get(j, 0),
                "incarnation": member.incarnation,
            }
        now = self.now()
        current = None
        if rnd is not None:
            closes = None
            if rnd.deadline is not None and rnd.phase is Phase.COLLECTING:
                closes = max(rnd.deadline - now, 0.0)
            current = {
                "id": rnd.round_id,
                "phase": rnd.phase.value,
                "pushes": sorted(p.learner for p in rnd.pushes),
                "opened": rnd.opened,
                "grace": rnd.grace if rnd.quorum_at is not None else None,
                "grace_closes_in": closes,
            }
        books = ld.ledger.totals()
        return {
            "t": now,
            "began": self.began,
            "version": ld.version,
            "rounds": ld.next_round_id,
            "phase": ld.phase.value,
            "members": sorted(ld.members),
            "followers_up": [k for k, up in sorted(ld.followers_up.items()) if up],
            "follower_addresses": {
                str(k): a for k, a in sorted(ld.follower_addresses.items()) if ld.followers_up[k]
            },
            "learners": learners,
            "tokens": books,
            "tokens_per_s": books["reported"] / max(now, 1e-9),  # since the leader started
            "round": current,
            "last_round": self.last_round,
            "budget": ld.config.token_budget,
            "stopped": ld.stopped,
            "stop_reason": ld.stop_reason,
            "budget_tokens": ld.budget_tokens(),
            "budget_reached": ld.budget_reached(),
            "refused": dict(sorted((ld.refused + self.refused).items())),
            "leader": {
                "epoch": self.epoch,
                "address": self.address,
                "holder": self.lease.holder,
                "standby": self.spec.standby or None,
            },
        }

    def _log_record(self, r: dict) -> None:
        """The log line of a tape record: each round (version, tokens, participants), each
        membership change, a follower lost, a resume."""
        kind = r["kind"]
        if kind == "round":
            parts = r["participants"]
            tokens = sum(
                p["meta"]["tokens"] for p, ok in zip(parts, r["accepted"], strict=False) if ok
            )
            learners = [p["learner"] for p in parts]
            if r["applied"]:
                log.info(
                    "round %d applied: version %d, %d tokens from learners %s (%d of %d "
                    "accepted), grace %.2f s",
                    r["round_id"],
                    r["version"],
                    tokens,
                    learners,
                    sum(r["accepted"]),
                    len(parts),
                    r["grace"],
                )
            else:
                log.info(
                    "round %d not applied (version stays %d): pushes from learners %s, %d dropped",
                    r["round_id"],
                    r["version"],
                    learners,
                    len(r.get("dropped", [])),
                )
        elif kind == "membership":
            extra = {k: v for k, v in r.items() if k not in ("kind", "t", "event", "learner")}
            log.info("learner %s: %s %s", r["learner"], r["event"], extra)
        elif kind == "follower" and r.get("event") == "lost":
            log.warning("follower %s: lost (%s)", r.get("follower"), r.get("reason"))
        elif kind == "follower":
            log.info(
                "follower %s: %s at version %s", r.get("follower"), r.get("event"), r.get("version")
            )
        elif kind == "resume":
            log.info("resumed at version %s (reopened: %s)", r.get("version"), r.get("reopened"))

    def _log_round(self, r: dict) -> None:
        """TensorBoard scalars of a round, against the tokens applied so far (the common
        x-axis of every role's scalars), with the wall time."""
        tm = r["timings"]
        step = self.leader.ledger.totals()["applied"]
        wall = time.time()

        def scalar(tag: str, value: float) -> None:
            self.tb.add_scalar(tag, value, step, walltime=wall)

        scalar("round/participants", len(r["participants"]))
        scalar("round/accepted", sum(r["accepted"]))
        scalar("round/grace_s", r["grace"])
        scalar("round/version", r["version"])
        for kind, n in (self.leader.refused + self.refused).items():
            scalar(f"refused/{kind}", n)
        if isinstance(r.get("clip_factor"), float):
            scalar("round/clip_factor", r["clip_factor"])
        for name, a, b in (
            ("push", "opened", "transfers_done"),
            ("update", "norms", "applied"),
            ("pull", "applied", "ended"),
        ):
            if isinstance(tm.get(a), float) and isinstance(tm.get(b), float):
                scalar(f"phase/{name}_s", tm[b] - tm[a])
        self.tb.flush()


def _writer(path: Path):
    from tensorboardX import SummaryWriter

    return SummaryWriter(str(path))


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses a call whose metadata lacks the job's token (``UNAUTHENTICATED``, counted
    in ``refused``) before its request is read or parsed."""

    def __init__(self, token: str, refused: Counter) -> None:
        self.token = token.encode()
        self.refused = refused

    def authorized(self, metadata: Any) -> bool:
        got = next((v for k, v in metadata or () if k == TOKEN_KEY), "")
        got = got.encode() if isinstance(got, str) else bytes(got)
        return hmac.compare_digest(got, self.token)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or self.authorized(details.invocation_metadata):
            return handler
        self.refused["unauthenticated"] += 1
        why = "bad or missing job credential"

        async def deny(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        async def deny_stream(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
            yield  # (never reached: a generator, as a streaming handler is)

        if handler.response_streaming:  # the request stays bytes: nothing is parsed
            return grpc.unary_stream_rpc_method_handler(
                deny_stream, response_serializer=handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(
            deny, response_serializer=handler.response_serializer
        )


def rpc_caps(spec: RunSpec) -> tuple[int, int]:
    """``(per host, in all)``: the calls the leader serves at once (a ``Watch`` stream
    counts while open). A learner or follower holds a handful: its ``Watch``, a heartbeat
    or event, and a ``Status`` now and then; the launcher and ``dipsjax status`` one each.
    One host may hold every role (a local run is all ``127.0.0.1``, a node may run several
    learners), so the per-host cap is 8 calls per role of the whole job (twice a handful,
    for a restarted process whose predecessor's stream has not yet ended), never under 64;
    ``RunSpec.peer_rpc_cap`` sets it instead. The server takes 4 times that in all, so that
    one host at its cap leaves the job three times what it needs."""
    roles = spec.sim.learners + len(spec.followers) + 1  # the + 1: the launcher, the CLI
    per_peer = spec.peer_rpc_cap or max(64, 8 * roles)
    return per_peer, 4 * per_peer


def peer_host(peer: str) -> str:
    """The host of a gRPC peer (``context.peer()``), which the caps count by:
    ``ipv4:127.0.0.1:5555`` -> ``127.0.0.1``, ``ipv6:%5B::1%5D:5555`` (gRPC escapes the
    brackets) -> ``::1``. Unix-socket peers (``unix:...``) are all one host, ``unix``: they
    share this machine, as the data plane's peers of one address do."""
    kind, _, rest = urllib.parse.unquote(peer or "").partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return kind


class RpcCaps(grpc.aio.ServerInterceptor):
    """Bounds the calls in flight (a ``Watch`` stream counts while it is open): at most
    ``per_peer`` from one host (:func:`peer_host`) and ``total`` in all. One over is
    answered ``RESOURCE_EXHAUSTED``, naming the cap, before its request is parsed; counted
    in ``refused`` (``peer_cap``, ``server_cap``) and logged at most once per kind every
    :data:`REFUSAL_LOG_INTERVAL`. gRPC cannot cap TCP connections per address, as the data
    plane does (``DataPlaneServer.max_per_address``); the calls are what a host holds of
    the leader. Placed after :class:`TokenCheck`, it counts authenticated calls only: a
    stranger that shares a host with the job cannot use up the job's places.

    The service's methods are unary-unary or unary-stream; no other kind is wrapped. The
    server runs on one event loop, so the counts need no lock."""

    def __init__(self, per_peer: int, total: int, refused: Counter, log: RefusalLog) -> None:
        self.per_peer, self.total = per_peer, total
        self.refused, self.log = refused, log
        self.open: Counter[str] = Counter()  # host -> calls in flight

    def admit(self, host: str) -> str | None:
        """Takes a place for a call from ``host``; or the reason it gets none."""
        if self.open[host] >= self.per_peer:
            kind, why = "peer_cap", f"{self.per_peer} calls in flight from {host} at most"
        elif self.open.total() >= self.total:
            kind, why = "server_cap", f"{self.total} calls in flight at most"
        else:
            self.open[host] += 1
            return None
        why = f"the leader serves {why} (a Watch counts while open)"
        self.refused[kind] += 1
        self.log.record(kind, why)
        return f"{kind}: {why}"

    def release(self, host: str) -> None:
        self.open[host] -= 1
        if self.open[host] <= 0:
            del self.open[host]

    @contextlib.asynccontextmanager
    async def _place(self, context):
        """A place for one call of its peer's host while it runs (refused when none)."""
        host = peer_host(context.peer())
        why = self.admit(host)
        if why is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        try:
            yield
        finally:
            self.release(host)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        if handler.response_streaming:
            behavior = handler.unary_stream

            async def stream(request, context):
                # aclosing: the Watch's own cleanup runs even if it was left at a yield
                async with (
                    self._place(context),
                    contextlib.aclosing(behavior(request, context)) as replies,
                ):
                    async for reply in replies:
                        yield reply

            return handler._replace(unary_stream=stream)
        behavior = handler.unary_unary

        async def unary(request, context):
            async with self._place(context):
                return await behavior(request, context)

        return handler._replace(unary_unary=unary)


class SyncerService(syncer_pb2_grpc.SyncerServicer):
    """``Call``: one event in, the caller's replies out. ``Watch``: a process's actions.
    Every request arrives as bytes, from a caller :class:`TokenCheck` let through."""

    def __init__(self, node: LeaderNode, log: RefusalLog | None = None) -> None:
        self.node = node
        self.log = log  # refused watches: a line per kind per interval, not per request

    def _replies(self, **fields: Any) -> syncer_pb2.Replies:
        """An answer, stamped with this leader's epoch (callers refuse an older one's)."""
        return syncer_pb2.Replies(epoch=self.node.epoch, **fields)

    def _malformed(self, error: str) -> syncer_pb2.Replies:
        self.node.refused["malformed"] += 1
        return self._replies(error=error)

    async def _parse(self, cls: type, data: bytes, context) -> Any:
        """``data`` as a ``cls`` request, or the call ends ``INVALID_ARGUMENT`` (counted)."""
        request = cls()
        try:
            request.ParseFromString(data)
        except Exception as e:  # protobuf's DecodeError (and its kin)
            self.node.refused["malformed"] += 1
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"malformed request: not a {cls.__name__} ({len(data)} bytes): {e}",
            )
        return request

    def _refused(self, kind: str, reason: str) -> syncer_pb2.Replies:
        self.node.refused[kind] += 1
        return self._replies(refused=f"{kind}: {reason}")

    async def Call(self, request, context):
        try:  # raw bytes (see ``add_service``): what does not parse is answered and counted
            envelope = codec.parse_envelope(request)
            event = codec.from_proto(envelope)
        except ValueError as e:
            return self._malformed(f"malformed message: {e}")
        if not isinstance(event, m.Event):
            return self._malformed(f"{type(event).__name__} is not an event")
        node = self.node
        if envelope.epoch > node.epoch and not node.deposed:
            # The caller has heard a newer leader: if that epoch was claimed, this one is
            # deposed; if not, the number is made up (refused, counted).
            if node.lease.deposed():
                node.depose(f"a caller has heard epoch {envelope.epoch}")
            else:
                return self._refused(
                    "unknown_epoch",
                    f"epoch {envelope.epoch} was never claimed (this leader's: {node.epoch})",
                )
        if node.deposed:
            return self._refused(
                "deposed", f"epoch {node.epoch} has lost its lease to a newer leader"
            )
        bad = node.leader.screen(event)
        if bad is not None:
            node.leader.handle(event)  # the core counts it; nothing else changes
            return self._replies(refused=f"{bad.kind}: {bad.reason}")
        who = sender(event)
        if who is not None:
            if not envelope.session or not envelope.request:
                return self._malformed(
                    "malformed message: unnumbered request (set incarnation, session and "
                    "request: dipsjax.runtime.client.ControlClient does)"
                )
            if who[0] == "learner":
                # Only a Join raises a learner's incarnation: a request claiming one that
                # never joined would make the request log refuse the live process's own
                # requests as older (a lockout by one forged envelope).
                known = node.leader.incarnations.get(who[1], 0)
                joins = isinstance(event, m.Join) and event.incarnation == envelope.incarnation
                if envelope.incarnation > known and not joins:
                    return self._refused(
                        "unknown_incarnation",
                        f"incarnation {envelope.incarnation} of learner {who[1]} never joined "
                        f"(the newest that did: {known})",
                    )
            numbered = (envelope.incarnation, envelope.session, envelope.request)
            verdict, reply = node.requests.check(who, *numbered)
            if verdict == "repeat":
                node.refused["repeat"] += 1
                return reply
            if verdict != "new":
                what = {
                    "replay": f"request {envelope.request} of session {envelope.session} "
                    "was taken already",
                    "old_incarnation": f"incarnation {envelope.incarnation} of {who[0]} "
                    f"{who[1]} is older than one heard from",
                }[verdict]
                return self._refused(verdict, what)
        node.acknowledge(event, envelope.acked, envelope.epoch)
        try:
            replies = node.handle(event)
        except (ValueError, TypeError) as e:
            return self._malformed(str(e))
        if node.deposed:  # found deposed while it handled this: it decided nothing
            return self._refused(
                "deposed", f"epoch {node.epoch} has lost its lease to a newer leader"
            )
        reply = self._replies(actions=[codec.to_proto(a) for a in replies])
        if who is not None:
            node.requests.answered(who, envelope.session, envelope.request, reply)
        return reply

    async def Status(self, request, context):
        await self._parse(syncer_pb2.StatusRequest, request, context)
        return syncer_pb2.StatusReply(json=json.dumps(self.node.status()))

    async def Watch(self, request, context):
        request = await self._parse(syncer_pb2.WatchRequest, request, context)
        kind = request.WhichOneof("peer")
        if kind is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "watch: name a learner or follower"
            )
        who = (kind, getattr(request, kind))
        if request.epoch > self.node.epoch and self.node.lease.deposed():
            self.node.depose(f"a watcher has heard epoch {request.epoch}")
        if self.node.deposed:
            self.node.refused["deposed"] += 1
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"deposed: epoch {self.node.epoch} lost its lease"
            )
        incarnation = request.incarnation if kind == "learner" else -1
        refusal = self.node.screen_watch(who, incarnation)
        if refusal is not None:  # refused before it touches the peer's queue or outbox
            kind, status, why = refusal
            self.node.refused[kind] += 1
            if self.log is not None:
                self.log.record(kind, f"watch: {why}")
            await context.abort(status, f"{kind}: {why}")
        q = self.node.watch(who, request.acked, request.epoch, incarnation)
        try:
            while True:
                env = await q.get()
                yield env
                if env.WhichOneof("message") == "stop":
                    return
        finally:  # the peer went away: what is routed to it waits until it watches again
            self.node.unwatch(who, q)


def add_service(service: SyncerService, server: Any) -> None:
    """Registers the service as ``syncer_pb2_grpc`` would, except that every method gets
    the request's raw bytes, parsed only once :class:`TokenCheck` let the call through:
    bytes that are not a protobuf ``Envelope`` then get a reply naming the problem, and a
    ``Status`` or ``Watch`` request that does not decode ends ``INVALID_ARGUMENT``, each
    counted (``malformed``), where gRPC's own deserializer would end the call with a bare
    INTERNAL or UNKNOWN error."""
    handlers = {
        "Call": grpc.unary_unary_rpc_method_handler(
            service.Call,
            request_deserializer=bytes,
            response_serializer=syncer_pb2.Replies.SerializeToString,
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            service.Watch,
            request_deserializer=bytes,
            response_serializer=syncer_pb2.Envelope.SerializeToString,
        ),
        "Status": grpc.unary_unary_rpc_method_handler(
            service.Status,
            request_deserializer=bytes,
            response_serializer=syncer_pb2.StatusReply.SerializeToString,
        ),
    }
    name = syncer_pb2.DESCRIPTOR.services_by_name["Syncer"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


def server_options(heartbeat_interval: float) -> list[tuple[str, int]]:
    """The control server's gRPC keepalives, matching the clients'
    (:func:`dipsjax.runtime.client.keepalive_options`): it pings its peers as they ping it
    (a watcher gone silent is found within 1.5 heartbeats, and what is routed to it waits
    for its next watch), and takes their pings, even without calls or data, twice as often
    as they send them, never answering with GOAWAY ("too many pings")."""
    ms = max(int(heartbeat_interval * 1000), 4)
    return [
        *keepalive_options(heartbeat_interval),
        ("grpc.http2.min_ping_interval_without_data_ms", ms // 4),
        ("grpc.http2.max_ping_strikes", 0),  # 0: no limit
        # Events are < 1 KB typical and their strings are cut to 1 KiB: a bound on what a
        # request may make the leader read (gRPC's default is 4 MiB).
        ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    ]


def restored(
    spec: RunSpec, records: list[dict] | None = None, ends: list[int] | None = None
) -> Leader:
    """The leader of ``spec``'s run from its snapshot and tape (``--resume``); ``records``:
    the tape's records as a standby followed them (``lease.TapeFollower``) and each one's
    end in the file (``ends``), else the tape file is read whole."""
    run_dir = Path(spec.run_dir)
    snap = lease.snapshot_dir(run_dir) / "snapshot.json"
    if not snap.exists():
        raise FileNotFoundError(f"--resume: no leader snapshot at {snap}")
    tape_path = run_dir / "tape.jsonl"
    state = json.loads(snap.read_text())
    tape = None
    n = state.get("tape_records")
    if records is not None and ends is not None and n is not None and len(records) >= n:
        # Records past the snapshot's, or a line being written when the old leader died:
        # cut back to the snapshot's, as below (this process's own copy of the tape).
        keep = ends[n - 1] if n else 0
        if tape_path.stat().st_size > keep:
            os.truncate(tape_path, keep)
        return Leader.restore(state, tape=EventTape(records[:n]))
    if tape_path.exists():
        lines = tape_path.read_text().splitlines(keepends=True)
        if n is not None and len(lines) < n:
            raise ValueError(
                f"{tape_path} holds {len(lines)} records, fewer than the {n} its snapshot "
                f"{snap} follows: a tape cut short (not yet on this host's disk?); not resumed"
            )
        if n is not None and len(lines) > n:
            # Records of an event after the snapshot (killed in between; the last line may
            # be torn): cut back, so that the tape is the one the snapshot follows.
            tmp = tape_path.with_suffix(".tmp")
            tmp.write_text("".join(lines[:n]))
            os.replace(tmp, tape_path)
        tape = EventTape.read(tape_path)
    return Leader.restore(state, tape=tape)


async def stand_by(spec: RunSpec, address: str, tape: lease.TapeFollower) -> int | None:
    """A standby: follows the active leader's lease until it lapses, then claims the next
    epoch and returns it (None: the job stopped, or SIGTERM, first). Meanwhile it reads the
    tape as it is written (``tape``, each second), so that the takeover parses only its
    newest records; the snapshot is small, and read at the takeover."""
    run_dir = Path(spec.run_dir)
    follow = lease.Follow(run_dir, spec.leader_lease)
    tape.poll()
    last_read = time.monotonic()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    log.info(
        "standby for %s on %s: takes over once the lease is %.1f s without renewal",
        spec.run_dir,
        address,
        spec.leader_lease,
    )
    poll = min(0.1, spec.leader_lease / 10)
    try:
        while not done.is_set():
            state = follow.poll()
            if state == "stopped":
                log.info("the job has stopped: the standby ends")
                return None
            newest = follow.seen[0] if follow.seen else 0
            lapsed = state == "lapsed" and newest >= 1
            if lapsed and lease.claim(run_dir, newest + 1, lease.holder_name("standby")):
                log.warning(
                    "the lease of epoch %d lapsed (%.1f s without renewal): taking over "
                    "as epoch %d",
                    newest,
                    follow.age(),
                    newest + 1,
                )
                return newest + 1
            if time.monotonic() - last_read > 1.0:  # the tape, as it is written
                tape.poll()
                last_read = time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), poll)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return None


async def serve(
    spec: RunSpec,
    resume: bool = False,
    reopen: bool = False,
    alone: bool = False,
    *,
    address: str | None = None,
    held: lease.Lease | None = None,
    renewing: Any = None,
    records: list[dict] | None = None,
    ends: list[int] | None = None,
) -> int:
    address = address or spec.leader
    try:
        leader = restored(spec, records, ends) if resume else None
        node = LeaderNode(spec, leader, address=address, held=held)
    finally:
        if renewing is not None:
            renewing()  # its own renewals take over (below), once that thread has ended
    node.loop = asyncio.get_running_loop()
    if spec.standby and not node.lease.renew():  # before it listens: seen held at once
        node.depose("a newer epoch was claimed before it listened")
    if resume:
        node.carry_out(node.leader.resume(node.now(), reopen=reopen, alone=alone))
    refusals = RefusalLog(REFUSAL_LOG_INTERVAL, emit=log.warning, prefix="")
    caps = RpcCaps(*rpc_caps(spec), node.refused, refusals)
    server = grpc.aio.server(
        options=server_options(spec.heartbeat_interval),
        interceptors=[TokenCheck(spec.token, node.refused), caps],  # the token first
    )
    add_service(SyncerService(node, refusals), server)
    host, _, port = address.rpartition(":")
    host = spec.bind or host
    if spec.tls:
        server.add_secure_port(f"{host}:{port}", spec.secrets.grpc_server())
    else:
        server.add_insecure_port(f"{host}:{port}")
    await server.start()
    log.info(
        "listening on %s:%s (%s): %s, %d followers, %d learners, budget %d tokens%s",
        host,
        port,
        "TLS" if spec.tls else "no TLS",
        spec.sim.method,
        len(spec.followers),
        spec.sim.learners,
        spec.sim.token_budget,
        f"; resumed at version {node.leader.version}" if resume else "",
    )
    standby = f"; standby at {spec.standby}" if spec.standby else ""
    log.info("leader epoch %d%s", node.epoch, standby)
    for sig in (signal.SIGTERM, signal.SIGINT):
        node.loop.add_signal_handler(sig, node.stopped.set)

    async def ticks() -> None:
        while not node.stopped.is_set():
            await asyncio.sleep(1.0)
            node._tick()

    async def renewals() -> None:
        """With a standby: the lease renewed 4 times a lease period (or the leader finds
        itself deposed and ends)."""
        while not node.stopped.is_set():
            if not node.lease.renew(stopped=node.leader.stopped):
                node.depose("a newer epoch was claimed")
                return
            await asyncio.sleep(spec.leader_lease / 4)

    linger = 1.0  # let the watch streams deliver Stop
    if node.leader.stopped:
        # Restarted after it persisted the job's final Stop: nothing is left to do but tell
        # whoever watches (they reconnect within a few heartbeats), then exit 0.
        log.info("the job had stopped (%s)", node.final_stop().reason)
        linger = max(2.0, 3 * spec.heartbeat_interval)
        node.stopped.set()
    ticker = asyncio.create_task(ticks())
    renewer = asyncio.create_task(renewals()) if spec.standby else None
    await node.stopped.wait()
    if node.deposed:
        # It decides nothing now; for a moment it still answers, each call refused as
        # deposed with its epoch (a peer that still calls it learns so at once), then ends.
        linger = 2.0
    if node.leader.stopped and not node.deposed:
        log.info(
            "the job stopped (%s) at version %d; %d tokens applied",
            node.leader.stop_reason,
            node.leader.version,
            node.leader.ledger.totals()["applied"],
        )
    else:
        log.info("stopping (signal) at version %d", node.leader.version)
    await asyncio.sleep(linger)
    for task in (ticker, renewer):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if spec.standby and node.leader.stopped and not node.deposed:
        node.lease.renew(stopped=True)  # the standby ends, not takes over
    await server.stop(grace=2.0)
    if not node.deposed:
        write_cpu_seconds(Path(spec.run_dir) / "leader" / "cpu.json")
    node.close()
    log.info("stopped")
    return DEPOSED if node.deposed else 0


async def run_standby(spec: RunSpec, address: str) -> int:
    """``--standby``: waits for the lease to lapse (:func:`stand_by`), takes the run folder
    over (:func:`lease.takeover`) and serves on ``address``, resumed from the snapshot and
    tape, its peers up (``alone``)."""
    tape = lease.TapeFollower(Path(spec.run_dir) / "tape.jsonl")
    epoch = await stand_by(spec, address, tape)
    if epoch is None:
        return 0
    t0 = time.monotonic()
    role = "standby" if address != spec.leader else "leader"
    held = lease.Lease(spec.run_dir, epoch, lease.holder_name(role), address)
    if not held.renew():  # the new epoch's lease at once, and renewed while it restores
        log.warning("epoch %d was deposed before it took over: standing by", epoch)
        return DEPOSED
    renewing = held.keep_renewing(spec.leader_lease / 4)
    try:
        _, ino = lease.takeover(spec.run_dir, epoch)
        resume = (lease.snapshot_dir(spec.run_dir) / "snapshot.json").exists()
        followed = len(tape.records)
        records = tape.caught_up(Path(spec.run_dir) / "tape.jsonl", ino) if resume else None
        how = "read whole" if records is None else f"{followed} records followed"
        log.info("took the run folder over in %.3f s (tape: %s)", time.monotonic() - t0, how)
    except BaseException:
        renewing()
        raise
    return await serve(
        spec,
        resume,
        alone=resume,
        address=address,
        held=held,
        renewing=renewing,
        records=records,
        ends=tape.ends if records is not None else None,
    )


def main(argv: list[str] | None = None) -> int:
    permissions.private()  # what this process writes is its owner's alone
    parser = argparse.ArgumentParser(prog="dipsjax-leader", description=__doc__)
    parser.add_argument("spec", help="RUN_DIR/spec.json written by the launcher")
    parser.add_argument("--resume", action="store_true", help="restart from its snapshot")
    parser.add_argument(
        "--reopen",
        action="store_true",
        help="with --resume: go on with a run a fault stopped short of its budget (a "
        "whole-run resume); without it a stopped leader only tells whoever watches, and exits",
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="with --resume: only the leader restarted (its learners and followers are up), "
        "so heartbeats count again after two intervals, not the whole-run rejoin grace",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="a standby leader (the run's spec names one): follow the active leader's lease "
        "and take over, resumed from its snapshot and tape, once it lapses",
    )
    parser.add_argument(
        "--listen-on",
        choices=("leader", "standby"),
        default="leader",
        help="which of the spec's two addresses this process serves on (default: leader)",
    )
    args = parser.parse_args(argv)
    logs.setup("standby" if args.listen_on == "standby" else "leader")
    if (args.reopen or args.alone) and not args.resume:
        parser.error("--reopen and --alone need --resume")
    spec = RunSpec.read(args.spec)
    if (args.standby or args.listen_on == "standby") and not spec.standby:
        parser.error("--standby, --listen-on standby: the run's spec names no standby leader")
    address = spec.standby if args.listen_on == "standby" else spec.leader
    if args.standby and args.resume:
        parser.error("--standby resumes by itself when it takes over: no --resume")
    if args.standby:
        rc = asyncio.run(run_standby(spec, address))
    else:
        rc = asyncio.run(serve(spec, args.resume, args.reopen, args.alone, address=address))
    while rc == DEPOSED and spec.standby:
        # Deposed by the standby: this process stands by in its turn (no restart, which a
        # cluster would count as a failure).
        log.info("standing by again")
        rc = asyncio.run(run_standby(spec, address))
    return rc


if __name__ == "__main__":
    sys.exit(main())
