"""issue 18 item 1: a data-plane server degrades instead of dying (descriptor exhaustion,
idle and unauthenticated sockets, connection caps)."""

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from dipsjax.transport import dataplane as dp

PARAMS = {i: np.full((8, 4), i, np.float32) for i in range(2)}


class Follower:
    def __init__(self, **kw):
        self.pushes = {}
        self.server = dp.DataPlaneServer(self.on_push, self.on_pull, **kw)

    def on_push(self, round_id, learner, incarnation, base, tensors):
        self.pushes[round_id, learner] = tensors

    def on_pull(self, version):
        return 5, PARAMS


def _closed_by_peer(sock, within=10.0):
    """True once the server closed ``sock`` (EOF or reset), False if still open."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _until(predicate, within=10.0):
    deadline = time.monotonic() + within
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_an_unauthenticated_silent_connection_is_closed_after_the_first_frame_deadline():
    f = Follower(first_frame_timeout=0.3)
    try:
        idle = socket.create_connection(f.server.address, timeout=10)
        assert _closed_by_peer(idle)
        assert f.server.refused["first_frame"] == 1
        client = dp.DataPlaneClient(f.server.address, timeout=10)
        client.push(1, 0, 0, 0, PARAMS.items())
        assert sorted(f.pushes) == [(1, 0)]
        assert f.server.refused["first_frame"] == 1  # a legit client is not refused
        client.close()
    finally:
        f.server.close()


def test_idle_sockets_at_the_caps_make_room_for_a_client_oldest_first():
    """Bug (the full hostile benchmark): idle sockets from the learners' own host filled
    the per-address cap and a restarted learner was refused ``cap`` until they left. Now a
    new connection closes the oldest unauthenticated one of its address (``evicted``)."""
    f = Follower(max_connections=6, max_per_address=4, first_frame_timeout=30.0)
    try:
        held = [socket.create_connection(f.server.address, timeout=10) for _ in range(4)]
        assert _until(lambda: f.server.stats["open_connections"] == 4)
        client = dp.DataPlaneClient(f.server.address, timeout=10)
        client.push(2, 1, 0, 0, PARAMS.items())  # served: the oldest idle one made room
        assert sorted(f.pushes) == [(2, 1)]
        assert _closed_by_peer(held[0]) and not _closed_by_peer(held[1], within=0.2)
        extra = [socket.create_connection(f.server.address, timeout=10) for _ in range(3)]
        assert all(_closed_by_peer(s) for s in held[1:])  # oldest first
        assert not any(_closed_by_peer(s, within=0.2) for s in extra)
        assert f.server.refused["evicted"] == 4 and f.server.refused["cap"] == 0
        assert _until(lambda: f.server.stats["open_connections"] == 4)  # client + 3 extra
        client.push(3, 1, 0, 0, PARAMS.items())  # the established client was never evicted
        assert sorted(f.pushes) == [(2, 1), (3, 1)]
        client.close()
        for s in extra:
            s.close()
    finally:
        f.server.close()


def test_established_connections_are_never_evicted_and_fill_a_cap_alone():
    f = Follower(max_connections=6, max_per_address=3, first_frame_timeout=30.0)
    try:
        clients = [dp.DataPlaneClient(f.server.address, timeout=10) for _ in range(3)]
        for c in clients:
            assert c.pull()[0] == 5  # a first frame: established, kept open
        assert _until(lambda: f.server.stats["open_connections"] == 3)
        extra = socket.create_connection(f.server.address, timeout=10)
        assert _closed_by_peer(extra)
        assert f.server.refused["cap"] == 1 and f.server.refused["evicted"] == 0
        assert all(c.pull()[0] == 5 for c in clients)  # still served, on their connections
        for c in clients:
            c.close()
    finally:
        f.server.close()


def test_the_total_cap_holds_across_addresses():
    f = Follower(max_connections=3, max_per_address=64, first_frame_timeout=30.0)
    try:
        held = [socket.create_connection(f.server.address, timeout=10) for _ in range(3)]
        assert _until(lambda: f.server.stats["open_connections"] == 3)
        extra = socket.create_connection(f.server.address, timeout=10)
        assert _closed_by_peer(held[0]) and not _closed_by_peer(extra, within=0.2)
        assert f.server.refused["evicted"] == 1
        assert _until(lambda: f.server.stats["open_connections"] == 3)
        for s in [*held, extra]:
            s.close()
    finally:
        f.server.close()


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_connections=0),
        dict(max_per_address=-1),
        dict(first_frame_timeout=0),
        dict(idle_timeout=float("nan")),
    ],
)
def test_bad_limits_are_refused_with_their_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        dp.DataPlaneServer(lambda *a: None, lambda v: (0, {}), **bad)


SERVER = r"""
import resource, sys, time
import numpy as np
from dipsjax.transport import dataplane as dp
got = []
server = dp.DataPlaneServer(lambda r, l, i, b, t: got.append((r, l)), lambda v: (0, {}))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
import os
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir('/proc/self/fd')) + 6, hard))
print(server.address[1], flush=True)
sys.stdin.readline()
print(len(got), server.refused.get("accept", 0) > 0, flush=True)
"""


def test_descriptor_exhaustion_is_transient_and_a_client_still_connects_and_pushes():
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        port = int(proc.stdout.readline())
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
        fds = f"/proc/{proc.pid}/fd"
        with open(f"/proc/{proc.pid}/limits") as f:
            cap = next(int(x.split()[3]) for x in f if x.startswith("Max open files"))
        # the server holds as many as its limit allows; its next accept fails with EMFILE
        assert _until(lambda: len(os.listdir(fds)) >= cap)
        time.sleep(0.3)  # let the accept loop meet EMFILE (not a measured timing)
        for s in socks:
            s.close()
        client = dp.DataPlaneClient(("127.0.0.1", port), timeout=10, connect_timeout=10)
        client.push(4, 2, 0, 0, PARAMS.items())
        client.close()
        proc.stdin.write("\n")
        proc.stdin.flush()
        pushed, saw_emfile = proc.stdout.readline().split()
        assert int(pushed) == 1 and saw_emfile == "True"
    finally:
        proc.kill()
        proc.wait()


# issue 18 item 5: a push's header is checked before its body is read


def _reply(sock):
    sock.settimeout(10)
    return dp.read_frame(sock)


def test_a_shape_whose_size_overflows_int64_is_a_refused_frame_and_the_server_serves_on():
    f = Follower()
    try:
        sock = socket.create_connection(f.server.address, timeout=10)
        # 2**32 * 2**32 wraps to 0 in int64: zero body bytes would "fit"
        head = dp.Header(dp.PUSH, "fp32", shape=(1 << 32, 1 << 32), tensor=0, crc=1)
        sock.sendall(head.pack())
        header, payload, _ = _reply(sock)
        assert header.kind == dp.ERROR and b"overflow" in bytes(payload)
        assert f.server.refused["frame"] == 1 and f.pushes == {}
        client = dp.DataPlaneClient(f.server.address, timeout=10)
        client.push(1, 0, 0, 0, PARAMS.items())
        assert sorted(f.pushes) == [(1, 0)]
    finally:
        f.server.close()


def _expect(header):
    if header.tensor not in PARAMS:
        raise dp.Refusal("layout", f"tensor {header.tensor} is not on this follower")
    if tuple(header.shape) != PARAMS[header.tensor].shape:
        raise dp.Refusal("shape", f"tensor {header.tensor} has shape {PARAMS[0].shape}")


@pytest.mark.parametrize(
    "tensor, shape, kind", [(99, (1 << 28,), "layout"), (0, (1 << 28,), "shape")]
)
def test_a_push_announcing_a_gigabyte_is_refused_from_its_header_before_its_body(
    tensor, shape, kind
):
    f = Follower(expect=_expect)
    try:
        sock = socket.create_connection(f.server.address, timeout=10)
        nbytes = 4 * shape[0]  # 1 GiB of float32, never sent
        head = dp.Header(dp.PUSH, "fp32", shape=shape, tensor=tensor, payload_len=nbytes, crc=1)
        sock.sendall(head.pack())
        header, message, _ = _reply(sock)  # answered with only the header sent
        assert header.kind == dp.ERROR and header.tensor >= dp.REFUSED
        assert f"tensor {tensor}".encode() in bytes(message)
        assert f.server.refused[kind] == 1 and f.server.stats["bytes_in"] == 0
        assert _closed_by_peer(sock)
        client = dp.DataPlaneClient(f.server.address, timeout=10)
        client.push(1, 0, 0, 0, PARAMS.items())
        assert sorted(f.pushes) == [(1, 0)]
    finally:
        f.server.close()


def test_an_authenticated_connection_silent_past_idle_timeout_is_closed_and_counted():
    f = Follower(idle_timeout=0.3)
    try:
        client = dp.DataPlaneClient(f.server.address, timeout=10)
        client.push(1, 0, 0, 0, PARAMS.items())
        assert _until(lambda: f.server.refused["idle"] == 1)
        assert _until(lambda: f.server.stats["open_connections"] == 0)
        client.close()  # a learner's next transfer reconnects (it retries broken ones)
        client.push(2, 0, 0, 0, PARAMS.items())
        assert sorted(f.pushes) == [(1, 0), (2, 0)]
    finally:
        f.server.close()


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    from dipsjax.runtime import credentials

    return credentials.create(tmp_path_factory.mktemp("creds") / "job")


def test_over_tls_half_open_sockets_at_the_cap_are_shut_for_a_job_client(creds):
    """Bug (review of issue 18): eviction shut the raw socket object the TLS wrapper had
    detached, so over TLS nothing was closed and the caps were passed instead."""
    f = Follower(
        max_connections=6,
        max_per_address=4,
        first_frame_timeout=30.0,
        ssl_context=creds.ssl_server(),
    )
    try:
        held = [socket.create_connection(f.server.address, timeout=10) for _ in range(4)]
        held[0].sendall(b"\x16\x03\x01\x02\x00")  # half a ClientHello: mid-handshake
        assert _until(lambda: f.server.stats["open_connections"] == 4)
        client = dp.DataPlaneClient(f.server.address, timeout=10, ssl_context=creds.ssl_client())
        client.push(2, 1, 0, 0, PARAMS.items())
        assert sorted(f.pushes) == [(2, 1)] and _closed_by_peer(held[0])
        assert [_closed_by_peer(s, within=0.2) for s in held[1:]] == [False] * 3
        assert f.server.refused["evicted"] == 1
        assert f.server.stats["open_connections"] == 4  # the client and 3 held: exact
        client.close()
        for s in held[1:]:
            s.close()
    finally:
        f.server.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_the_first_frame_deadline_is_absolute_however_slowly_a_peer_trickles(creds, tls):
    """Bug (review of issue 18): the deadline was a per-receive timeout; a byte every
    deadline minus a little kept an unauthenticated connection open for good."""
    ctx = creds.ssl_server() if tls else None
    f = Follower(first_frame_timeout=1.0, ssl_context=ctx)
    try:
        slow = socket.create_connection(f.server.address, timeout=10)
        data = b"\x16\x03\x01\x02\x00" + b"\x00" * 40 if tls else dp.MAGIC + b"\x01" * 40
        t0, closed = time.monotonic(), False
        for byte in data:
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if _closed_by_peer(slow, within=0.6):
                closed = True
                break
        assert closed and time.monotonic() - t0 < 2.5
        assert _until(lambda: f.server.refused["first_frame"] == 1)
        # Counted by the reaper or, when a gap outlasted its receive timeout, by the
        # connection's own thread, which releases its place just after.
        assert _until(lambda: f.server.stats["open_connections"] == 0)
        client = dp.DataPlaneClient(
            f.server.address, timeout=10, ssl_context=creds.ssl_client() if tls else None
        )
        client.push(3, 1, 0, 0, PARAMS.items())  # a client is served at once
        assert sorted(f.pushes) == [(3, 1)]
        client.close()
    finally:
        f.server.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_push_refused_from_its_first_header_reaches_the_sender_as_a_refusal(creds, tls):
    """Bug (CI rehearsal): a push refused from its first header while the sender still
    sent its other tensors reached it as a broken link (``SSLEOFError``; a learner would
    retry in vain), not as the refusal: the server closed with frames unread."""

    def refuse(header):
        raise dp.Refusal("layout", f"no tensor {header.tensor} here")

    f = Follower(ssl_context=creds.ssl_server() if tls else None)
    f.server.expect = refuse
    try:
        client = dp.DataPlaneClient(
            f.server.address, timeout=10, ssl_context=creds.ssl_client() if tls else None
        )
        big = [(i, np.ones((1024, 1024), np.float32)) for i in range(8)]  # 32 MiB in all
        for _ in range(3):
            with pytest.raises(dp.TransferError, match="no tensor 0 here") as e:
                client.push(1, 0, 0, 0, big, codec="fp32")
            assert e.value.refused and e.value.kind == "layout"
        assert f.server.refused["layout"] == 3 and f.pushes == {}
        client.close()
    finally:
        f.server.close()
