"""What learners and followers share: the control-plane client and the model's layout."""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc

from dipsjax.runtime.spec import RunSpec
from dipsjax.syncer import messages as m
from dipsjax.transport import control_codec as codec
from dipsjax.transport.proto import syncer_pb2, syncer_pb2_grpc

log = logging.getLogger(__name__)


def keepalive_options(heartbeat_interval: float) -> list[tuple[str, int]]:
    """The control channel's gRPC keepalives (gRPC core's channel arguments), from the
    heartbeat interval ``h``: a ping every ``h / 2`` even without calls or data, and the
    connection closed when one is not answered within ``h``, so a black-holed link is found
    within ``1.5 h``, well before the 3 silent heartbeats that make a peer lost."""
    ms = max(int(heartbeat_interval * 1000), 2)
    return [
        ("grpc.keepalive_time_ms", ms // 2),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # 0: no limit
    ]


def reconnect_options(heartbeat_interval: float) -> list[tuple[str, int]]:
    """A channel to a leader that went away tries again at least once a heartbeat interval
    (gRPC's default backoff grows to 120 s), so a restarted leader hears from its peers
    within about one interval of listening: its short grace (``Leader.resume(alone=True)``)
    relies on that."""
    ms = max(int(heartbeat_interval * 1000), 100)
    return [
        ("grpc.initial_reconnect_backoff_ms", min(ms, 1000)),
        ("grpc.min_reconnect_backoff_ms", min(ms, 1000)),
        ("grpc.max_reconnect_backoff_ms", ms),
    ]


def control_target(addresses: tuple[str, ...]) -> tuple[str, str | None]:
    """``(target, TLS name)`` of a channel to the leader. One address: itself. Several (a
    standby): one target naming them all (``ipv4:a:p,b:q``; names resolved here, each time
    a channel is made: a pod restarted elsewhere has a new address), so that gRPC's
    ``pick_first`` connects to whichever leader listens, the first it can, and the TLS name
    to check is the first address's host (the job's certificate names both). Addresses of
    both families make one IPv6 target, the IPv4 ones mapped. A name that does not resolve
    yet (a pod not scheduled) is left out; none resolving, the first address alone (gRPC
    resolves it, again and again)."""
    import ipaddress
    import socket

    if len(addresses) == 1:
        return addresses[0], None
    first = addresses[0].rpartition(":")[0].strip("[]")
    parts = []
    for a in addresses:
        host, _, port = a.rpartition(":")
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            try:
                ip = ipaddress.ip_address(socket.getaddrinfo(host, int(port))[0][4][0])
            except OSError:
                continue
        parts.append((ip, port))
    if not parts:
        return addresses[0], None
    if any(ip.version == 6 for ip, _ in parts):
        # One target holds one family: IPv4 addresses join as IPv4-mapped IPv6 ones
        # (::ffff:a.b.c.d), which gRPC's dual-stack client sockets reach over IPv4.
        six = [(ip if ip.version == 6 else f"::ffff:{ip}", p) for ip, p in parts]
        return "ipv6:" + ",".join(f"[{ip}]:{p}" for ip, p in six), first
    return "ipv4:" + ",".join(f"{ip}:{p}" for ip, p in parts), first


def control_channel(spec: RunSpec) -> Any:
    """A channel to the leader (or, with a standby, to whichever of the two listens): TLS
    with the job's certificates (or plain), keepalives on."""
    import grpc

    options = keepalive_options(spec.heartbeat_interval) + reconnect_options(
        spec.heartbeat_interval
    )
    target, name = control_target(spec.leaders)
    if name is not None:
        options.append(("grpc.default_authority", name))
    if spec.tls:
        if name is not None:
            options.append(("grpc.ssl_target_name_override", name))
        return grpc.secure_channel(target, spec.secrets.grpc_channel(), options=options)
    return grpc.insecure_channel(target, options=options)


#: The gRPC metadata key that carries the job's token on every control call: the leader
#: checks it before it reads the request (:class:`dipsjax.runtime.leader.TokenCheck`).
TOKEN_KEY = "x-dipsjax-token"


class ControlError(RuntimeError):
    """The leader refused a call (its message says why)."""


class Delivery:
    """What a receiver has taken from its ``Watch`` streams: the leader's epoch and the
    newest number of it (one tuple, so that a heartbeat's thread reads a consistent pair).
    The leader numbers each action on a peer's stream and sends again, on the next stream,
    what was not acknowledged; :meth:`take` says whether an action is new.

    The epoch is also the leader's fencing token (:mod:`dipsjax.runtime.lease`): an action
    or answer from an epoch older than the newest heard (:meth:`heard`) comes from a
    deposed leader, and is refused and counted in :attr:`refused` (``old_epoch``)."""

    def __init__(self) -> None:
        self.state = (0, 0)  # (epoch, seen)
        self.newest = 0  # the newest epoch heard, on a stream or in an answer
        self.refused: Counter[str] = Counter()

    @property
    def epoch(self) -> int:
        return self.state[0]

    @property
    def seen(self) -> int:
        return self.state[1]

    def heard(self, epoch: int) -> bool:
        """Notes a leader's ``epoch`` (0: not said); False, counted, if it is older than
        one heard before (a deposed leader's)."""
        if epoch and epoch < self.newest:
            self.refused["old_epoch"] += 1
            log.warning(
                "refused a message of leader epoch %d (epoch %d has taken over; %d refused)",
                epoch,
                self.newest,
                self.refused["old_epoch"],
            )
            return False
        self.newest = max(self.newest, epoch)
        return True

    def acked(self) -> tuple[int, int]:
        """``(epoch, acked)`` for a request: the newest epoch heard (a leader deposed by a
        newer one learns so from it), and what was taken of that epoch's stream."""
        epoch, seen = self.state
        return (self.newest, seen) if epoch == self.newest else (self.newest, 0)

    def take(self, env: syncer_pb2.Envelope) -> bool:
        """Whether ``env`` is new (and now taken): unnumbered, of another epoch (a
        restarted leader numbers from 1 again), or numbered past what was taken. One of an
        older epoch than heard is not (:meth:`heard`): raises :class:`StaleLeader`."""
        if not self.heard(env.epoch):
            raise StaleLeader(env.epoch, self.newest)
        if not env.seq:
            return True
        epoch, seen = self.state
        if env.epoch != epoch:
            seen = 0
        if env.seq <= seen:
            return False
        self.state = (env.epoch, env.seq)
        return True


class StaleLeader(grpc.RpcError):
    """A message from a deposed leader (an epoch older than one heard): refused, and the
    connection to that leader dropped; to its caller, the leader is away (as an
    ``UNAVAILABLE`` call is)."""

    def __init__(self, epoch: int, newest: int) -> None:
        super().__init__(f"leader epoch {epoch} is older than {newest}: refused")
        self.epoch, self.newest = epoch, newest

    def code(self) -> Any:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return str(self)


class ControlClient:
    """A process's connection to the leader: ``call`` an event, ``watch`` its actions.

    Every call carries the job's token in its metadata (:data:`TOKEN_KEY`), and every event
    its sender's ``incarnation``, this client's random ``session`` and the next request
    number of it (the leader's replay protection: a repeat is answered as the first time,
    never applied twice)."""

    def __init__(
        self,
        spec: RunSpec,
        *,
        learner: int | None = None,
        follower: int | None = None,
        incarnation: int = 0,
    ):
        self.spec = spec
        self.peer = {"learner": learner} if learner is not None else {"follower": follower}
        self.channel = control_channel(spec)
        self.stub = syncer_pb2_grpc.SyncerStub(self.channel)
        self._swap = threading.Lock()
        self.metadata = ((TOKEN_KEY, spec.token),)
        self.incarnation = incarnation
        self.session = secrets.randbits(63) + 1
        self.requests = itertools.count(1)  # next() is atomic under the GIL
        self.lock = threading.Lock()
        self.delivery = Delivery()
        self.stream: Any = None  # the open Watch call
        self._last = threading.local()  # per thread: heartbeats call from their own

    @property
    def refused(self) -> str:
        """This thread's last call's ``Replies.refused`` ("": taken)."""
        return getattr(self._last, "refused", "")

    def envelope(self, event: m.Event) -> syncer_pb2.Envelope:
        """``event`` as the next numbered request of this session, with what the watch
        streams have taken (the leader then forgets it)."""
        env = codec.to_proto(event)
        env.epoch, env.acked = self.delivery.acked()
        env.incarnation, env.session = self.incarnation, self.session
        env.request = next(self.requests)
        return env

    def call(self, event: m.Event, timeout: float = 30.0) -> list[m.Action]:
        """Sends one event; returns the actions addressed to the caller in the reply (none
        when the leader refused to apply it: :attr:`refused` says why)."""
        return self.send(self.envelope(event), timeout)

    def send(self, env: syncer_pb2.Envelope, timeout: float = 30.0) -> list[m.Action]:
        """Sends one request made by :meth:`envelope`."""
        channel, stub = self.channel, self.stub
        try:
            reply = stub.Call(env, timeout=timeout, wait_for_ready=True, metadata=self.metadata)
        except grpc.RpcError as e:
            self._broken(channel, e.code())
            raise
        if not self.delivery.heard(reply.epoch):
            self._broken(channel, grpc.StatusCode.UNAVAILABLE)
            raise StaleLeader(reply.epoch, self.delivery.newest)
        if reply.refused.startswith("deposed:"):  # it has lost its lease: a lost leader
            self._last.refused = reply.refused
            self.delivery.refused["deposed"] += 1
            self._broken(channel, grpc.StatusCode.UNAVAILABLE)
            raise StaleLeader(reply.epoch, max(self.delivery.newest, reply.epoch + 1))
        if reply.error:
            raise ControlError(reply.error)
        self._last.refused = reply.refused
        return [codec.from_proto(a) for a in reply.actions]

    def watch(self, incarnation: int = 0) -> Iterator[m.Action]:
        """The actions the leader routes to this process, as they come, each once: a new
        stream starts after what the last one took, and what was sent into a stream that
        broke comes again (:class:`Delivery`)."""
        epoch, seen = self.delivery.acked()
        req = syncer_pb2.WatchRequest(incarnation=incarnation, acked=seen, epoch=epoch, **self.peer)
        channel, stub = self.channel, self.stub
        self.stream = stub.Watch(req, wait_for_ready=True, metadata=self.metadata)
        self.stream_channel = channel
        try:
            for env in self.stream:
                if self.delivery.take(env):
                    yield codec.from_proto(env)
        except grpc.RpcError as e:  # StaleLeader too
            self._broken(channel, e.code())
            raise

    def _broken(self, channel: Any, code: Any) -> None:
        """With a standby (several addresses), a call on ``channel`` that found the leader
        away (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``: dead, paused or deposed) makes this
        client start a new channel, which connects to whichever leader listens: an old
        channel may keep a connection to a paused leader for a minute. Its open calls end
        (``CANCELLED``); the caller's protocol rejoins as after any lost leader."""
        if len(self.spec.leaders) == 1 or code not in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ):
            return
        with self._swap:
            if self.channel is not channel:
                return  # another thread started a new one already
            new = control_channel(self.spec)
            self.stub = syncer_pb2_grpc.SyncerStub(new)
            self.channel = new
        # The watch stream ends (its reader rejoins, through the new channel); calls in
        # flight on the old channel finish or time out by themselves (a push the leader
        # took is answered, and counted), then the old channel is closed.
        if getattr(self, "stream_channel", None) is channel:
            self.cut()  # (a stream the watcher opened on the new channel stays)
        closer = threading.Timer(60.0, channel.close)
        closer.daemon = True
        closer.start()

    def cut(self) -> None:
        """Ends the open watch stream (its reader gets an ``RpcError``: CANCELLED)."""
        if self.stream is not None:
            self.stream.cancel()

    def status(self, timeout: float = 30.0) -> dict[str, Any]:
        """The leader's status: rounds, phase, tokens, learners' states.

        ``Status`` only reads, so a call that meets a connection broken a moment before
        (UNAVAILABLE: a leader restarted while this channel still held its old connection)
        is tried again, each 0.2 s, until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            channel = self.channel
            try:
                reply = self.stub.Status(
                    syncer_pb2.StatusRequest(),
                    timeout=max(left, 0.001),
                    wait_for_ready=True,
                    metadata=self.metadata,
                )
                return json.loads(reply.json)
            except grpc.RpcError as e:
                self._broken(channel, e.code())
                if e.code() != grpc.StatusCode.UNAVAILABLE or left <= 0.2:
                    raise
            time.sleep(0.2)

    def close(self) -> None:
        self.channel.close()


def booked(replies: list[m.Action], refused: str = "") -> bool:
    """Whether the leader booked a push its reply answered: not one it refused before its
    core saw it (``refused``: the call's ``Replies.refused``, e.g. an older incarnation's
    request or a replay), nor one its core refused unbooked (``messages.UNBOOKED``: no
    member sent it, its counts are out of bounds, or its member must pull first). The
    learner does not count those either, so that the two sides balance."""
    if refused:
        return False
    return not any(isinstance(a, m.Refuse) and a.kind in m.UNBOOKED for a in replies)


def in_parallel(fn: Callable[[int], Any], keys: Iterable[int]) -> list[Any]:
    """``[fn(k) for k in keys]``, each in its own thread (one per follower: transfers to
    and from every follower at once); raises the first error once all have finished."""
    keys = list(keys)
    results: list[Any] = [None] * len(keys)

    def one(i: int) -> None:
        try:
            results[i] = fn(keys[i])
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(keys))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, Exception):
            raise r
    return results


def model_fingerprint(shapes: dict[tuple[str, ...], tuple[tuple[int, ...], Any]]) -> str:
    """16 hex digits naming a model's layout: every parameter's path, shape and dtype in
    flattened order. A learner joins with its own; the leader refuses one that differs
    from the job's (another model, config or code version), before any tensor moves."""
    import hashlib

    layout = [["/".join(p), list(s), str(d)] for p, (s, d) in shapes.items()]
    return hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:16]


def model_shapes(spec: RunSpec) -> dict[tuple[str, ...], tuple[tuple[int, ...], Any]]:
    """``{tensor path: (shape, dtype)}`` in flattened order (tensor ids), from the model's
    abstract parameters: nothing is allocated, so it is cheap for any model size."""
    from dipsjax import outer
    from dipsjax.learner.step import InnerStep, params_to_dict
    from dipsjax.task import load_task

    abstract = params_to_dict(InnerStep(load_task(spec.sim), mesh=None).abstract_params)
    return {p: (tuple(x.shape), x.dtype) for p, x in outer.flatten(abstract).items()}


def model_layout(spec: RunSpec) -> tuple[list[tuple[str, ...]], dict[str, Any]]:
    """Tensor paths in flattened order (tensor ids) and the initial parameters (host arrays),
    exactly as the simulator's world makes them (same config, same seed)."""
    import jax

    from dipsjax import outer
    from dipsjax.learner import Learner
    from dipsjax.task import load_task

    cfg = spec.sim
    task = load_task(cfg)
    learner = Learner(
        task,
        task.inner_optimizer or cfg.inner_optimizer(),
        mesh=None,
        learner_id="init",
        seed=cfg.seed,
        donate=False,
    )
    params = jax.device_get(learner.params_dict())
    return list(outer.flatten(params)), params
