"""The data plane: tensors framed over TCP, for learners' pushes and pulls.

Why raw TCP with our own framing: measured on this machine kind for 400 MB over loopback,
raw TCP moves 1.35-1.9 GB/s, pyzmq zero-copy multipart 0.85-1.1 GB/s, gRPC streaming raw
chunks 0.5-0.6 GB/s and gRPC one big message 0.2 GB/s (issue 8); the framing costs little
on top (``benchmarks/dataplane.py`` measures push + pull against raw TCP of the same bytes).
Large transfers never share a connection with the control plane (gRPC), so they cannot
delay heartbeats or decisions.

Frame (little-endian)::

    header  magic "DJX1" | kind u8 | codec u8 | dtype u8 | ndim u8 | round i64 | learner i32
            | incarnation i32 | version i64 | tensor u32 | block_size u32 | payload_len u64
            | scales_len u64 | checksum u64 | ticket 16 bytes | header_crc u32
    shape   ndim x u64
    body    payload (payload_len bytes) then scales (scales_len bytes: float32 block
            scales, or, under ``stat2``, BF16 levels, four a block)

``checksum`` (XXH3-64) covers payload and scales (one checksum per tensor transfer),
``header_crc`` (CRC-32) the header fields before it and the shape. ``ticket``: the
leader's grant of a push (zeros: none), checked by a follower before a push's body is read
(:func:`dipsjax.runtime.credentials.push_ticket`). Tensors are encoded with
:func:`dipsjax.outer.encode` (BF16 by default; fp32, int8 and int4 with block scales;
``stat2``, EXTENSION, the statistical 2-bit codec with four BF16 levels a block), the same
codec the simulator applies, so numerics agree bit for bit (BF16 and FP32 take a host fast
path through ``ml_dtypes``, tested bit-identical). The codec is a frame's, not a push's: a
sender may hand :func:`DataPlaneClient.push` tensors it encoded itself
(:class:`dipsjax.outer.Encoded`, e.g. a learner's error feedback,
:func:`dipsjax.outer.feedback_encode`, whose tree sends norms and embeddings as BF16 and
the other matrices as ``stat2``), and each goes in its own codec; the receiver decodes
with :func:`dipsjax.outer.decode`, so what it stages equals the sender's reconstruction
bit for bit.

A push is ``PUSH`` frames (one per tensor) then ``END``; the server answers ``ACK`` only
if every frame was whole and checked, and only then hands the tensors to its handler: no
partial data enters a round. A pull is one ``PULL`` frame (the version wanted, -1 for the
newest) answered by ``DATA`` frames and ``END``. Errors come back as an ``ERROR`` frame
whose body is a UTF-8 message and whose ``tensor`` field says whether sending again may
help (0: the transfer broke, e.g. a checksum) or not (``REFUSED``: the receiver will not
take this push, e.g. a replay or a wrong shape); a malformed header closes that connection
only. The server counts every refusal by kind (``DataPlaneServer.refused``). Both ends
overlap serialization with sending: an encoder thread fills a bounded queue while the
socket drains it, and a reader thread fills one while a decoder checks and decodes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import os
import queue
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import xxhash

from dipsjax import outer

MAGIC = b"DJX1"
PUSH, PULL, DATA, END, ACK, ERROR = 1, 2, 3, 4, 5, 6
KINDS = {PUSH: "PUSH", PULL: "PULL", DATA: "DATA", END: "END", ACK: "ACK", ERROR: "ERROR"}
CODECS = ("fp32", "bf16", "int8", "int4", "stat2")  # ids: the index (append only)
DTYPES = ("float32",)
MAX_NDIM = 8
DEFAULT_MAX_FRAME = 1 << 31  # 2 GiB: one tensor of 512M float32 values
# An ERROR frame's ``tensor`` field: 0 when sending again may help (a broken transfer),
# ``REFUSED + i`` when the transfer itself is refused, of kind ``REFUSAL_KINDS[i]``.
REFUSED = 1
REFUSAL_KINDS = (
    "push",
    "pull",
    "frame",
    "layout",
    "shape",
    "incarnation",
    "replayed",
    "nonfinite",
    "ticket",
)

_HEAD = struct.Struct("<4sBBBBqiiqIIQQQ16s")  # ... crc, ticket
_HEAD_CRC = struct.Struct("<I")
_DIM = struct.Struct("<Q")


class FrameError(ValueError):
    """A malformed, truncated, oversized or corrupted frame (the message names the problem)."""


class Refusal(ValueError):
    """A frame refused from its header (before its body is read); ``kind``: the refusal's
    kind (one of ``REFUSAL_KINDS`` reaches the sender as such)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Evicted(Exception):
    """A connection closed, before it authenticated, to make room for a newer one."""


class TransferError(RuntimeError):
    """The other end refused a transfer (its ``ERROR`` message is the text); ``refused``:
    it will refuse the same push again (sending it again cannot help)."""

    def __init__(self, message: str, refused: bool = False, kind: str | None = None) -> None:
        super().__init__(message)
        self.refused = refused
        self.kind = kind  # the refusal's kind (``REFUSAL_KINDS``), when refused


@dataclasses.dataclass(frozen=True)
class Header:
    kind: int
    codec: str = "bf16"
    dtype: str = "float32"
    shape: tuple[int, ...] = ()
    round_id: int = 0
    learner: int = 0
    incarnation: int = 0
    version: int = 0
    tensor: int = 0
    block_size: int = 0
    payload_len: int = 0
    scales_len: int = 0
    crc: int = 0
    ticket: bytes = b""  # a PUSH's grant from the leader (16 bytes; empty: none)

    def pack(self) -> bytes:
        fixed = _HEAD.pack(
            MAGIC,
            self.kind,
            CODECS.index(self.codec),
            DTYPES.index(self.dtype),
            len(self.shape),
            self.round_id,
            self.learner,
            self.incarnation,
            self.version,
            self.tensor,
            self.block_size,
            self.payload_len,
            self.scales_len,
            self.crc,
            self.ticket,
        )
        dims = b"".join(_DIM.pack(d) for d in self.shape)
        return fixed + _HEAD_CRC.pack(zlib.crc32(fixed + dims)) + dims


def expected_lengths(codec: str, shape: tuple[int, ...], block_size: int) -> tuple[int, int]:
    """``(payload_len, scales_len)`` that a tensor of ``shape`` has under ``codec``."""
    n = math.prod(shape)  # Python ints: a shape cannot wrap around
    if n >= 1 << 61:
        raise FrameError(f"shape {tuple(shape)}: its size {n} overflows int64")
    if codec == "fp32":
        return 4 * n, 0
    if codec == "bf16":
        return 2 * n, 0
    if codec == "stat2":
        if block_size < 4 or block_size % 4:
            raise FrameError(f"codec stat2 needs a block_size a multiple of 4, got {block_size}")
        blocks = -(-n // block_size)
        return blocks * (block_size // 4), 8 * blocks  # four BF16 levels a block
    if block_size < 2 or block_size % 2:
        raise FrameError(f"codec {codec} needs an even block_size >= 2, got {block_size}")
    blocks = -(-n // block_size)
    per = block_size if codec == "int8" else block_size // 2
    return blocks * per, 4 * blocks


def parse_header(fixed: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> tuple[Header, int]:
    """Parses the fixed part of a header; returns it (shape empty) and ``ndim``.

    Raises :class:`FrameError` naming the field on anything malformed.
    """
    if len(fixed) != _HEAD.size + _HEAD_CRC.size:
        raise FrameError(f"header is {len(fixed)} bytes, expected {_HEAD.size + _HEAD_CRC.size}")
    fields = _HEAD.unpack(fixed[: _HEAD.size])
    (magic, kind, codec, dtype, ndim, rnd, learner, inc, version, tensor, block, plen, slen) = (
        fields[:13]
    )
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}: not a dipsjax data-plane frame")
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if codec >= len(CODECS):
        raise FrameError(f"unknown codec id {codec}")
    if dtype >= len(DTYPES):
        raise FrameError(f"unknown dtype id {dtype}")
    if ndim > MAX_NDIM:
        raise FrameError(f"ndim {ndim} > {MAX_NDIM}")
    if plen + slen > max_frame:
        raise FrameError(f"frame body of {plen + slen} bytes exceeds the limit of {max_frame}")
    header = Header(
        kind=kind,
        codec=CODECS[codec],
        dtype=DTYPES[dtype],
        round_id=rnd,
        learner=learner,
        incarnation=inc,
        version=version,
        tensor=tensor,
        block_size=block,
        payload_len=plen,
        scales_len=slen,
        crc=fields[13],
        ticket=b"" if fields[14] == bytes(16) else fields[14],
    )
    return header, ndim


def _check_header(fixed: bytes, dims: bytes, header: Header) -> Header:
    (want,) = _HEAD_CRC.unpack(fixed[_HEAD.size :])
    if zlib.crc32(fixed[: _HEAD.size] + dims) != want:
        raise FrameError("header checksum mismatch")
    shape = tuple(_DIM.unpack_from(dims, 8 * i)[0] for i in range(len(dims) // 8))
    header = dataclasses.replace(header, shape=shape)
    if header.kind in (PUSH, DATA):
        want_p, want_s = expected_lengths(header.codec, shape, header.block_size)
        if (header.payload_len, header.scales_len) != (want_p, want_s):
            raise FrameError(
                f"tensor {header.tensor}: {header.payload_len}+{header.scales_len} body bytes "
                f"do not fit shape {shape} under {header.codec} ({want_p}+{want_s})"
            )
    return header


# ------------------------------------------------------------------------- tensors


@functools.partial(jax.jit, static_argnames=("codec", "block_size"))
def _encode(x: jax.Array, codec: str, block_size: int) -> outer.Encoded:
    return outer.encode(x, codec, block_size=block_size)


@jax.jit
def _decode(enc: outer.Encoded) -> jax.Array:
    return outer.decode(enc)


def frame_codec(x: Any, codec: str, block_size: int | None = None) -> tuple[str, int]:
    """``(codec, block_size)`` a tensor's frame carries: a pre-encoded tensor's own
    (:class:`dipsjax.outer.Encoded`), else ``codec`` with ``block_size`` (``None``: the
    codec's default, :data:`dipsjax.outer.DEFAULT_BLOCK`; 0 for the unblocked codecs)."""
    if isinstance(x, outer.Encoded):
        return x.codec, x.block_size
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    if codec in ("fp32", "bf16"):
        return codec, 0
    return codec, outer.DEFAULT_BLOCK[codec] if block_size is None else block_size


def encode_tensor(
    x: Any, codec: str = "bf16", block_size: int | None = None
) -> tuple[memoryview, memoryview, tuple[int, ...]]:
    """``(payload, scales, shape)`` of a float32 tensor under ``codec`` (host bytes); an
    :class:`dipsjax.outer.Encoded` ``x`` is sent as it is (its own codec and block size,
    :func:`frame_codec`)."""
    if isinstance(x, outer.Encoded):
        if x.codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {x.codec!r}")
        if x.dtype not in DTYPES:
            raise ValueError(f"a pre-encoded tensor must be one of {DTYPES}, got {x.dtype}")
        payload = np.ascontiguousarray(np.asarray(x.payload, np.uint8))
        scales = np.ascontiguousarray(np.asarray(x.scales)).view(np.uint8)
        return memoryview(payload).cast("B"), memoryview(scales).cast("B"), tuple(x.shape)
    codec, block_size = frame_codec(x, codec, block_size)
    if codec in ("fp32", "bf16"):
        # Host fast path, bit-identical to outer.encode (both round to nearest even; tested).
        given = np.asarray(x)
        if codec == "bf16" and given.dtype == ml_dtypes.bfloat16:  # already wire precision
            wire = np.ascontiguousarray(given)
        else:
            host = np.ascontiguousarray(np.asarray(given, np.float32))
            wire = host if codec == "fp32" else host.astype(ml_dtypes.bfloat16)
        return memoryview(wire.reshape(-1).view(np.uint8)), memoryview(b""), wire.shape
    arr = jnp.asarray(x, jnp.float32)
    enc = _encode(arr, codec, block_size)
    payload = np.asarray(enc.payload)
    scales = np.ascontiguousarray(np.asarray(enc.scales)).view(np.uint8)
    return memoryview(payload).cast("B"), memoryview(scales).cast("B"), tuple(arr.shape)


def decode_tensor(header: Header, payload: Any, scales: Any, *, widen: bool = True) -> np.ndarray:
    """The float32 tensor a ``PUSH``/``DATA`` frame carries (``widen=False``: a BF16 one,
    or a ``stat2`` one, whose values are BF16 levels, comes as BF16, half the memory;
    widening later gives the same float32 values). An FP32 or unwidened BF16 frame's
    tensor is a view of ``payload`` (read-only if it is), not a copy: pass a buffer
    nothing else reuses, as :func:`read_frame` does."""
    if header.codec in ("fp32", "bf16"):  # host fast path, bit-identical to outer.decode
        dtype = np.float32 if header.codec == "fp32" else ml_dtypes.bfloat16
        # A view of the frame's own receive buffer (fresh for each frame), not a copy.
        x = np.frombuffer(payload, dtype).reshape(header.shape)
        return x.astype(np.float32) if widen and dtype is not np.float32 else x
    side = jnp.bfloat16 if header.codec == "stat2" else jnp.float32  # stat2: BF16 levels
    enc = outer.Encoded(
        jnp.frombuffer(payload, jnp.uint8) if len(payload) else jnp.zeros((0,), jnp.uint8),
        jnp.frombuffer(scales, side) if len(scales) else jnp.zeros((0,), side),
        codec=header.codec,
        shape=header.shape,
        dtype=header.dtype,
        block_size=header.block_size,
    )
    x = np.asarray(_decode(enc))
    # stat2 decodes to its blocks' BF16 levels: BF16 holds them exactly, in half the memory.
    return x if widen or header.codec != "stat2" else x.astype(ml_dtypes.bfloat16)


# -------------------------------------------------------------------------- frames


def _recv_exact(sock: socket.socket, n: int) -> Any:
    buf = np.empty(n, np.uint8)  # not zero-filled: every byte is received into
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise FrameError(f"connection closed after {got} of {n} bytes (truncated frame)")
        got += k
    return buf


def read_header(sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME) -> Header:
    """Reads and checks one frame's header (its body is still to be read)."""
    fixed = _recv_exact(sock, _HEAD.size + _HEAD_CRC.size).tobytes()
    header, ndim = parse_header(fixed, max_frame)
    dims = _recv_exact(sock, 8 * ndim).tobytes()
    return _check_header(fixed, dims, header)


def read_frame(
    sock: socket.socket,
    max_frame: int = DEFAULT_MAX_FRAME,
    expect: Callable[[Header], None] | None = None,
) -> tuple[Header, Any, Any]:
    """Reads one frame; checks header and body checksums. Raises :class:`FrameError`;
    ``expect(header)`` may refuse it (raising) before its body is read."""
    header = read_header(sock, max_frame)
    if expect is not None:
        expect(header)
    payload = _recv_exact(sock, header.payload_len)
    scales = _recv_exact(sock, header.scales_len)
    if checksum(payload, scales) != header.crc:
        raise ChecksumError(
            f"tensor {header.tensor}: checksum mismatch (corrupted transfer)",
            (header, payload, scales),
        )
    return header, payload, scales


class ChecksumError(FrameError):
    """The body arrived whole but its checksum does not match (the stream is still in sync);
    ``frame`` is what arrived."""

    def __init__(self, message: str, frame: tuple[Header, Any, Any]) -> None:
        super().__init__(message)
        self.frame = frame


def checksum(payload: Any, scales: Any = b"") -> int:
    """64-bit XXH3 of a frame's body (payload, then scales).

    XXH3 rather than CRC-32: measured here at 29.5 GB/s against zlib's 6.9 GB/s, it turns a
    checksum on each end of every transfer from a fifth of the data plane's time into noise.
    """
    h = xxhash.xxh3_64(payload)
    if len(scales):
        h.update(scales)
    return h.intdigest()


def framed(header: Header, payload: Any = b"", scales: Any = b"") -> tuple[Header, Any, Any]:
    """``header`` completed with the body's lengths and checksum (done off the send path)."""
    return (
        dataclasses.replace(
            header, payload_len=len(payload), scales_len=len(scales), crc=checksum(payload, scales)
        ),
        payload,
        scales,
    )


def send_frame(sock: socket.socket, header: Header, payload: Any = b"", scales: Any = b"") -> int:
    """Sends one frame; ``header`` must come from :func:`framed` unless the body is empty
    or small (then it is completed here)."""
    if header.payload_len != len(payload) or header.scales_len != len(scales) or not header.crc:
        header, payload, scales = framed(header, payload, scales)
    head = header.pack()
    sock.sendall(head)
    if len(payload):
        sock.sendall(payload)
    if len(scales):
        sock.sendall(scales)
    return len(head) + len(payload) + len(scales)


def _send_error(sock: socket.socket, message: str, refused: str | None = None) -> None:
    """An ERROR frame; ``refused``: the refusal's kind (``None``: sending again may help)."""
    code = 0
    if refused is not None:
        kinds = REFUSAL_KINDS
        code = REFUSED + (kinds.index(refused) if refused in kinds else 0)
    with contextlib.suppress(OSError):
        header = Header(ERROR, codec="fp32", tensor=code)
        send_frame(sock, header, message.encode())


def _pipelined(items: Iterable[Any], fn: Callable[[Any], Any], depth: int = 2) -> Iterator[Any]:
    """``map(fn, items)`` computed ``depth`` items ahead in a thread (overlap with I/O)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(("ok", fn(item)))
            q.put(("done", None))
        except BaseException as e:  # handed to the consumer
            q.put(("error", e))

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(0.01)


# -------------------------------------------------------------------------- server

_log = logging.getLogger(__name__)
ACCEPT_BACKOFF = (0.01, 1.0)  # seconds: first and longest wait after a failed accept

PushHandler = Callable[[int, int, int, int, dict[int, np.ndarray]], None]
PullHandler = Callable[[int], tuple[int, dict[int, Any]]]


class DataPlaneServer:
    """A follower's data-plane endpoint: receives pushes, serves pulls (one thread each).

    ``on_push(round_id, learner, incarnation, base_version, tensors)`` gets a whole push
    (``tensor id -> float32 array``) once every frame arrived intact; raising ``ValueError``
    refuses it (the sender gets the message). ``on_pull(version)`` returns ``(version,
    {tensor id: array})`` (``version=-1``: the newest); ``KeyError``/``ValueError`` refuse.
    """

    def __init__(
        self,
        on_push: PushHandler,
        on_pull: PullHandler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame: int = DEFAULT_MAX_FRAME,
        pull_codec: str = "bf16",
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 256,
        max_per_address: int = 64,
        first_frame_timeout: float = 5.0,
        idle_timeout: float = 60.0,
        expect: Callable[[Header], None] | None = None,
    ) -> None:
        for name, value in (
            ("max_connections", max_connections),
            ("max_per_address", max_per_address),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name, value in (
            ("first_frame_timeout", first_frame_timeout),
            ("idle_timeout", idle_timeout),
        ):
            if not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        self.max_connections, self.max_per_address = max_connections, max_per_address
        self.first_frame_timeout = float(first_frame_timeout)
        self.idle_timeout = float(idle_timeout)
        self._open: collections.Counter[str] = collections.Counter()  # peer address -> open
        # Connections not yet authenticated (TLS handshake, or without TLS the first frame,
        # not done), oldest first: id -> (peer address, descriptor, accepted at). At a
        # cap, the oldest of them (from the same address, when that cap is the one reached)
        # is shut to make room (``evicted``): idle or half-open sockets from a host cannot
        # shut out a job process of that host, whose handshake takes milliseconds.
        # Established connections are never evicted; when they alone fill a cap, a new one
        # is refused (``cap``). One still pending ``first_frame_timeout`` after its accept
        # is shut too (``first_frame``): an absolute deadline, however slowly it trickles.
        # A connection shut so no longer counts against the caps.
        self._pending: dict[int, tuple[str, int, float]] = {}
        self._shut: set[int] = set()  # shut while pending: its thread releases nothing
        self._ids = itertools.count()
        # expect(header) of each PUSH frame before its body is read: raising Refusal (or
        # ValueError, kind "push") refuses the push and closes the connection.
        self.expect = expect
        self.on_push = on_push
        self.ssl_context = ssl_context
        self.on_pull = on_pull
        self.max_frame = max_frame
        self.pull_codec = pull_codec
        self.stats = {
            "pushes": 0,
            "pulls": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "errors": 0,
            "open_connections": 0,
        }
        self.errors: list[str] = []
        # Refusals by kind: tls, frame (malformed, truncated, oversized), checksum, and the
        # push handler's (its ValueError's ``kind``, else "push"); pulls refused: "pull".
        self.refused: collections.Counter[str] = collections.Counter()
        self.on_refusal: Callable[[str, str], None] | None = None  # (kind, message)
        self._lock = threading.Lock()
        self._sock = socket.create_server((host, port))
        self.address = self._sock.getsockname()[:2]
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()
        threading.Thread(target=self._reap, daemon=True).start()

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def _error(
        self, sock: socket.socket | None, kind: str, message: str, refused: bool = False
    ) -> None:
        with self._lock:
            self._tally(kind, message)
        if sock is not None:
            # The sender first: metrics cannot delay it.
            _send_error(sock, message, kind if refused else None)
        self._notify(kind, message)

    def _tally(self, kind: str, message: str) -> None:
        """Under ``_lock``: counts a refusal (before its peer can see it)."""
        self.stats["errors"] += 1
        self.refused[kind] += 1
        self.errors.append(message)
        del self.errors[:-100]  # the newest hundred

    def _notify(self, kind: str, message: str) -> None:
        if self.on_refusal is not None:
            with contextlib.suppress(Exception):
                self.on_refusal(kind, message)

    def _serve(self) -> None:
        """Accepts until closed. Running out of descriptors, buffers or memory (or a peer
        that left before its accept) is transient: counted as refusal ``accept``, logged at
        most once a second, then accepting goes on after a back-off (10 ms doubling to 1 s)."""
        delay = ACCEPT_BACKOFF[0]
        last_log = -math.inf
        while not self._closed.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError as e:
                if self._closed.is_set():
                    return
                with self._lock:
                    self.refused["accept"] += 1
                now = time.monotonic()
                if now - last_log >= 1.0:
                    last_log = now
                    _log.warning("data plane: accept failed (%s), backing off %.2f s", e, delay)
                self._closed.wait(delay)
                delay = min(delay * 2, ACCEPT_BACKOFF[1])
                continue
            delay = ACCEPT_BACKOFF[0]
            ip = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            cid = next(self._ids)
            with self._lock:
                over, evicted = self._make_room(ip)
                if not over:
                    self._open[ip] += 1
                    self.stats["open_connections"] += 1
                    self._pending[cid] = (ip, conn.fileno(), time.monotonic())
            if evicted is not None:
                self._notify("evicted", evicted)
            if over:  # counted before it is closed: the peer sees the count
                self._error(None, "cap", f"connection from {ip} over the connection caps")
                with contextlib.suppress(OSError):
                    conn.close()
                continue
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                t = threading.Thread(target=self._connection, args=(conn, ip, cid), daemon=True)
                t.start()
            except (OSError, RuntimeError) as e:  # no thread to be had: transient as well
                self._settle(cid)
                if not self._was_shut(cid):
                    self._release(ip)
                with contextlib.suppress(OSError):
                    conn.close()
                self._error(None, "accept", f"connection from {ip} dropped: {e}")
                continue
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _make_room(self, ip: str) -> tuple[bool, str | None]:
        """Under ``_lock``, for a new connection from ``ip``: ``(over, evicted)``: still
        over a cap, and the refusal message of the unauthenticated connection shut to make
        room (counted already)."""
        per_address = self._open[ip] >= self.max_per_address
        if not per_address and self.stats["open_connections"] < self.max_connections:
            return False, None
        victim = next(
            (c for c, (a, _, _) in self._pending.items() if a == ip or not per_address), None
        )
        if victim is None:
            return True, None
        why = "unauthenticated connection from {} shut to make room"
        return False, self._shut_pending(victim, "evicted", why)

    def _shut_pending(self, cid: int, kind: str, message: str) -> str:
        """Under ``_lock``: counts refusal ``kind`` (``message`` formatted with the peer's
        address; returned, for the refusal log) before its peer can see it, then shuts
        pending connection ``cid`` (its thread then ends, closes it and counts nothing
        more) and takes it off the caps. Its descriptor is still open: a connection thread
        closes only once settled, under the same lock. Shut through a duplicate, beneath
        any TLS object wrapping it."""
        ip, fd, _ = self._pending.pop(cid)
        message = message.format(ip)
        self._tally(kind, message)
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as dup:
            dup.shutdown(socket.SHUT_RDWR)
        self._shut.add(cid)
        self._open[ip] -= 1
        if self._open[ip] <= 0:
            del self._open[ip]
        self.stats["open_connections"] -= 1
        return message

    def _reap(self) -> None:
        """Shuts connections still unauthenticated ``first_frame_timeout`` after their
        accept (``first_frame``), a few times a deadline."""
        tick = min(0.25, self.first_frame_timeout / 4)
        while not self._closed.wait(tick):
            now = time.monotonic()
            with self._lock:
                late = [
                    c
                    for c, (_, _, t0) in self._pending.items()
                    if now - t0 > self.first_frame_timeout
                ]
                deadline = f"{self.first_frame_timeout:g} s"
                why = "connection from {} not authenticated within " + deadline
                shut = [self._shut_pending(c, "first_frame", why) for c in late]
            for message in shut:
                self._notify("first_frame", message)

    def _was_shut(self, cid: int) -> bool:
        with self._lock:
            if cid in self._shut:
                self._shut.discard(cid)
                return True
            return False

    def _settle(self, cid: int) -> bool:
        """The connection ``cid`` is authenticated or ending: no longer evictable. False
        if it was evicted already (then counted as such, not again)."""
        with self._lock:
            return self._pending.pop(cid, None) is not None

    def _release(self, ip: str) -> None:
        with self._lock:
            self._open[ip] -= 1
            if self._open[ip] <= 0:
                del self._open[ip]
            self.stats["open_connections"] -= 1

    def _connection(self, sock: socket.socket, ip: str = "", cid: int = -1) -> None:
        try:
            self._converse(sock, cid)
        finally:
            self._settle(cid)  # before any close: a pending fd is never reused meanwhile
            with contextlib.suppress(OSError):
                sock.close()
            if not self._was_shut(cid):
                self._release(ip)

    def _converse(self, sock: socket.socket, cid: int = -1) -> None:
        """One connection: TLS (if any) and its first frame within ``first_frame_timeout``;
        then frames until the peer hangs up or is silent for ``idle_timeout``. Until its
        TLS handshake (without TLS: its first frame) it may be evicted (see ``_pending``)."""
        deadline = time.monotonic() + self.first_frame_timeout
        sock.settimeout(self.first_frame_timeout)
        if self.ssl_context is not None:
            # In this connection's thread: a slow or bad handshake holds no one else.
            sock = self.ssl_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
            try:
                sock.do_handshake()
            except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
                if self._settle(cid):  # else evicted (counted then)
                    if isinstance(e, TimeoutError):
                        message = "no TLS handshake within the first-frame deadline"
                        self._error(None, "first_frame", message)
                    else:
                        self._error(None, "tls", f"TLS handshake refused: {e}")
                sock.close()
                return
            if not self._settle(cid):  # evicted as its handshake ended
                sock.close()
                return
        first, pending = True, self.ssl_context is None  # pending: not yet settled
        with sock:
            try:
                while not self._closed.is_set():
                    problem = None
                    if first:
                        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                    try:
                        settles, pending = (cid if pending else None), False
                        header, payload, scales = self._read(sock, settles)
                    except ChecksumError as e:
                        (header, payload, scales), problem = e.frame, str(e)
                    except FrameError as e:
                        if "closed after 0 of" in str(e):
                            return  # the peer hung up between frames
                        self._error(sock, "frame", str(e))
                        return
                    except TimeoutError:
                        kind = "first_frame" if first else "idle"
                        self._error(None, kind, f"connection silent past its {kind} deadline")
                        return
                    if first:
                        first = False
                    sock.settimeout(self.idle_timeout)
                    self._count("bytes_in", len(payload) + len(scales))
                    if header.kind == PUSH:
                        self._push(sock, header, payload, scales, problem)
                    elif problem is not None:
                        self._error(sock, "checksum", problem)
                    elif header.kind == PULL:
                        self._pull(sock, header)
                    else:
                        self._error(sock, "frame", f"unexpected {KINDS[header.kind]} frame")
                        return
            except Refusal as e:  # refused from a header: its body was not read, so close
                self._error(sock, e.kind, str(e), refused=True)
                self._linger(sock)
            except FrameError as e:  # malformed mid-push: nothing was staged
                self._error(sock, "frame", str(e))
            except (OSError, _Evicted):
                return

    @staticmethod
    def _linger(sock: socket.socket, limit: int = 1 << 22, seconds: float = 1.0) -> None:
        """After refusing a push from a header: reads (and drops) what the sender still
        sends, at most ``limit`` bytes for ``seconds``, so that closing with its frames
        unread does not reset the connection before it read the ``ERROR`` (it would see a
        broken link, and retry, instead of the refusal)."""
        deadline, got = time.monotonic() + seconds, 0
        with contextlib.suppress(OSError, ValueError):
            while got < limit and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                data = sock.recv(1 << 16)
                if not data:
                    return
                got += len(data)

    def _read(self, sock: socket.socket, cid: int | None) -> tuple[Header, Any, Any]:
        """A frame; the connection's first (``cid`` given: no TLS) settles it once its
        header is in (a long first body is no longer under the first-frame deadline), and
        raises :class:`_Evicted` instead of what it got if the connection was shut first."""
        if cid is None:
            return read_frame(sock, self.max_frame, self._expect)
        settled: list[bool] = []

        def first(header: Header) -> None:
            settled.append(self._settle(cid))
            if not settled[0]:
                raise _Evicted
            self._expect(header)

        try:
            return read_frame(sock, self.max_frame, first)
        finally:
            if not settled and not self._settle(cid):
                raise _Evicted

    def _expect(self, header: Header) -> None:
        if header.kind != PUSH or self.expect is None:
            return
        try:
            self.expect(header)
        except Refusal:
            raise
        except ValueError as e:
            raise Refusal(getattr(e, "kind", "push"), str(e)) from e

    def _push(
        self, sock: socket.socket, first: Header, payload: Any, scales: Any, problem: str | None
    ) -> None:
        """Reads a whole push (frames until END), decoding each tensor while the next one is
        read, and hands it over only if every frame was whole and consistent."""
        key = (first.round_id, first.learner, first.incarnation, first.version)
        problems: list[str] = [] if problem is None else [problem]
        kinds: list[tuple[str, bool]] = [] if problem is None else [("checksum", False)]

        def frames() -> Iterator[tuple[Header, Any, Any]]:
            yield first, payload, scales
            while True:
                try:
                    frame = read_frame(sock, self.max_frame, self._expect)
                except ChecksumError as e:
                    problems.append(str(e))
                    kinds.append(("checksum", False))
                    continue  # the stream is still in sync: read on, refuse at END
                header = frame[0]
                self._count("bytes_in", header.payload_len + header.scales_len)
                if header.kind == END:
                    return
                if header.kind != PUSH:
                    raise FrameError(f"{KINDS[header.kind]} frame inside a push")
                if (header.round_id, header.learner, header.incarnation, header.version) != key:
                    problems.append("a push mixes frames of different rounds or learners")
                    kinds.append(("frame", True))
                yield frame

        tensors: dict[int, np.ndarray] = {}
        for header, body, sc in _pipelined(frames(), lambda f: f):  # read ahead in a thread
            if header.tensor in tensors:
                problems.append(f"a push sends tensor {header.tensor} twice")
                kinds.append(("frame", True))
            elif not problems:
                tensors[header.tensor] = decode_tensor(header, body, sc, widen=False)
        if not problems:
            try:
                self.on_push(*key, tensors)
            except ValueError as e:
                problems.append(str(e))
                kinds.append((getattr(e, "kind", "push"), True))
        if problems:
            kind, refused = kinds[0]
            self._error(sock, kind, problems[0], refused)
            return
        self._count("pushes")
        send_frame(sock, Header(ACK, codec="fp32", tensor=len(tensors)))

    def _pull(self, sock: socket.socket, request: Header) -> None:
        try:
            version, tensors = self.on_pull(request.version)
        except (KeyError, ValueError) as e:
            self._error(sock, "pull", f"pull of version {request.version}: {e}", refused=True)
            return
        codec = request.codec or self.pull_codec

        def encode(item: tuple[int, Any]) -> tuple[Header, Any, Any]:
            tid, x = item
            code, block = frame_codec(x, codec)
            payload, scales, shape = encode_tensor(x, code, block)
            head = Header(DATA, code, shape=shape, version=version, tensor=tid, block_size=block)
            return framed(head, payload, scales)  # checksummed in the encoder thread

        sent = 0
        for header, payload, scales in _pipelined(sorted(tensors.items()), encode):
            sent += send_frame(sock, header, payload, scales)
        send_frame(sock, Header(END, codec="fp32", version=version, tensor=len(tensors)))
        self._count("pulls")
        self._count("bytes_out", sent)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.close()


# -------------------------------------------------------------------------- client


class Throttled:
    """A socket whose transfers are held to ``rate`` bytes a second each way (fault
    injection: a slow link), in 64 KiB steps."""

    STEP = 1 << 16

    def __init__(self, sock: Any, rate: float) -> None:
        if rate <= 0:
            raise ValueError(f"link rate must be > 0 bytes/s, got {rate}")
        self.sock, self.rate = sock, rate
        self._due = {"send": 0.0, "recv": 0.0}

    def _spend(self, way: str, n: int) -> None:
        now = time.monotonic()
        self._due[way] = max(self._due[way], now) + n / self.rate
        if self._due[way] > now:
            time.sleep(self._due[way] - now)

    def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        for i in range(0, len(view), self.STEP):
            chunk = view[i : i + self.STEP]
            self._spend("send", len(chunk))
            self.sock.sendall(chunk)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        k = self.sock.recv_into(buffer, min(nbytes or len(buffer), self.STEP))
        self._spend("recv", k)
        return k

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class LinkCut:
    """Fault injection: a link that can be cut. :meth:`cut_after` arms it: once ``nbytes``
    more bytes went out on its connections, every connection is severed mid-transfer (the
    peer sees a stream end inside a frame) and for ``seconds`` no connection goes through
    (each attempt times out after a second, as a link that drops packets)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: list[Any] = []
        self._left: int | None = None  # bytes until the armed cut
        self._seconds = 0.0
        self.until = 0.0  # monotonic time the link comes back
        self.cuts = 0

    def cut_after(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._left, self._seconds = nbytes, seconds

    def disarm(self) -> None:
        """An armed cut that has not fired will not (it was meant for one transfer)."""
        with self._lock:
            self._left = None

    def check(self) -> None:
        """Raises while the link is cut."""
        left = self.until - time.monotonic()
        if left > 0:
            time.sleep(min(left, 1.0))
            raise TimeoutError(f"link cut (fault injection), back in {max(left - 1, 0):.1f} s")

    def wrap(self, sock: Any) -> Any:
        with self._lock:
            self._socks = [x for x in self._socks if x.fileno() != -1] + [sock]
        return _OnLink(sock, self)

    def _may_send(self, n: int) -> int:
        """How many of ``n`` bytes go out before the cut (``n``: all of them)."""
        with self._lock:
            if self._left is None or n <= self._left:
                if self._left is not None:
                    self._left -= n
                return n
            k, self._left = self._left, None
            return k

    def _sever(self) -> None:
        with self._lock:
            self.until, self.cuts = time.monotonic() + self._seconds, self.cuts + 1
            for x in self._socks:  # every connection of the link
                with contextlib.suppress(OSError):
                    x.shutdown(socket.SHUT_RDWR)


class _OnLink:
    """A socket on a :class:`LinkCut` (it fails once the link is cut)."""

    def __init__(self, sock: Any, link: LinkCut) -> None:
        self.sock, self.link = sock, link

    def sendall(self, data: Any) -> None:
        self.link.check()
        view = memoryview(data).cast("B")
        k = self.link._may_send(len(view))
        self.sock.sendall(view[:k])
        if k < len(view):
            self.link._sever()
            raise ConnectionResetError("link cut (fault injection) mid-transfer")

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        self.link.check()
        return self.sock.recv_into(buffer, nbytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class DataPlaneClient:
    """A learner's connection to one follower's data plane."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        timeout: float = 60.0,
        connect_timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
        rate: float | None = None,
        link: LinkCut | None = None,
    ) -> None:
        self.address = tuple(address)
        self.ssl_context = ssl_context
        self.rate = rate  # bytes/s each way (fault injection: a slow link); None: no limit
        self.link = link  # fault injection: a link that can be cut
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self._sock is None:
            if self.link is not None:
                self.link.check()
            deadline = time.monotonic() + self.connect_timeout
            while True:  # the follower may still be starting
                try:
                    sock = socket.create_connection(self.address, timeout=self.timeout)
                    break
                except ConnectionRefusedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                try:
                    sock = self.ssl_context.wrap_socket(sock, server_hostname=self.address[0])
                except OSError:
                    sock.close()
                    raise
            if self.link is not None:
                sock = self.link.wrap(sock)
            self._sock = sock if self.rate is None else Throttled(sock, self.rate)
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _reply(self, sock: socket.socket) -> tuple[Header, Any, Any]:
        header, payload, scales = read_frame(sock)
        if header.kind == ERROR:
            message = bytes(payload).decode(errors="replace")
            i = header.tensor - REFUSED
            kind = REFUSAL_KINDS[i] if 0 <= i < len(REFUSAL_KINDS) else None
            raise TransferError(message, refused=header.tensor >= REFUSED, kind=kind)
        return header, payload, scales

    def _refusal_after(self, sock: Any) -> TransferError | None:
        """The server's ``ERROR`` reply if one is waiting on a connection whose sending
        failed, else None (the connection broke: a retry may help)."""
        try:
            sock.settimeout(1.0)
            self._reply(sock)
        except TransferError as refusal:
            return refusal
        except (OSError, FrameError, ValueError):
            pass
        return None

    def push(
        self,
        round_id: int,
        learner: int,
        incarnation: int,
        base_version: int,
        tensors: Iterable[tuple[int, Any]],
        *,
        codec: str = "bf16",
        block_size: int | None = None,
        ticket: bytes = b"",
    ) -> int:
        """Streams ``(tensor id, array)`` pairs in order, each frame with the leader's
        ``ticket`` for the push; returns the bytes sent. An array goes in ``codec``
        (``block_size``: its blocks, ``None``: the codec's default), an
        :class:`dipsjax.outer.Encoded` one as it was encoded."""
        sock = self._connect()

        def encode(item: tuple[int, Any]) -> tuple[Header, Any, Any]:
            tid, x = item
            code, block = frame_codec(x, codec, block_size)
            payload, scales, shape = encode_tensor(x, code, block)
            head = Header(
                PUSH,
                code,
                shape=shape,
                round_id=round_id,
                learner=learner,
                incarnation=incarnation,
                version=base_version,
                tensor=tid,
                block_size=block,
                ticket=ticket,
            )
            return framed(head, payload, scales)  # checksummed in the encoder thread

        sent = 0
        try:
            for header, payload, scales in _pipelined(tensors, encode):
                sent += send_frame(sock, header, payload, scales)
            send_frame(sock, Header(END, codec="fp32", round_id=round_id, learner=learner))
            self._reply(sock)
        except (OSError, FrameError) as e:
            # A push refused from a header: the server sent its ERROR and hung up while we
            # were still sending. Its reply, if it came, says why (and whether to retry).
            refusal = self._refusal_after(sock) if isinstance(e, OSError) else None
            self.close()
            if refusal is not None:
                raise refusal from e
            raise
        except TransferError:
            self.close()  # the server may have dropped the stream: start clean
            raise
        return sent

    def pull(
        self,
        version: int = -1,
        *,
        codec: str = "bf16",
        sink: Callable[[int, np.ndarray], None] | None = None,
    ) -> tuple[int, dict[int, np.ndarray]]:
        """``(version, {tensor id: float32 array})`` of a version (-1: the newest). With a
        ``sink``, each tensor goes to ``sink(tensor id, array)`` as it arrives and is not
        kept (the dict comes back empty): a pull that never holds the whole shard."""
        sock = self._connect()
        try:
            send_frame(sock, Header(PULL, codec, version=version))
            frames: list[tuple[Header, Any, Any]] = []

            def reader() -> Iterator[tuple[Header, Any, Any]]:
                while True:
                    frame = self._reply(sock)
                    if frame[0].kind == END:
                        frames.append(frame)
                        return
                    yield frame

            out = {}
            ids: set[int] = set()
            for f in _pipelined(reader(), lambda f: f):
                ids.add(f[0].tensor)
                if sink is None:
                    out[f[0].tensor] = decode_tensor(*f)
                else:
                    sink(f[0].tensor, decode_tensor(*f, widen=False))
        except (OSError, FrameError, TransferError):
            self.close()
            raise
        end = frames[0][0]
        if end.tensor != len(ids):
            raise FrameError(f"pull ended after {len(ids)} distinct of {end.tensor} tensors")
        return end.version, out
