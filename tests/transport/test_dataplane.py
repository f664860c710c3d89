"""The data plane: exact codecs on the wire, whole pushes only, bad input refused."""

import socket
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dipsjax import outer
from dipsjax.transport import dataplane as dp

PARAMS = {
    i: np.random.default_rng(i).standard_normal((64, 33)).astype(np.float32) for i in range(4)
}


class Follower:
    """A stand-in follower: stages whole pushes, serves one version."""

    def __init__(self, **kw):
        self.pushes = {}
        self.server = dp.DataPlaneServer(self.on_push, self.on_pull, **kw)

    def on_push(self, round_id, learner, incarnation, base, tensors):
        if any(x.shape != PARAMS[i].shape for i, x in tensors.items()):
            raise ValueError("wrong shape for this follower's layers")
        self.pushes[round_id, learner] = (incarnation, base, tensors)

    def on_pull(self, version):
        if version not in (-1, 5):
            raise KeyError(f"version {version} is not kept")
        return 5, PARAMS


@pytest.fixture
def follower():
    f = Follower()
    yield f
    f.server.close()


# stat2 (EXTENSION) is pushed pre-encoded by learners: the pre-encoded test below covers it.
@pytest.mark.parametrize("codec", [c for c in dp.CODECS if c != "stat2"])
def test_push_and_pull_carry_exactly_what_the_codec_gives(follower, codec):
    client = dp.DataPlaneClient(follower.server.address)
    client.push(3, 1, 2, 4, PARAMS.items(), codec=codec)
    inc, base, got = follower.pushes[3, 1]
    assert (inc, base) == (2, 4)
    for i, x in PARAMS.items():  # the simulator applies the very same codec
        np.testing.assert_array_equal(got[i], np.asarray(outer.decode(outer.encode(x, codec))))
    version, pulled = client.pull(codec=codec)
    assert version == 5 and sorted(pulled) == sorted(PARAMS)
    for i, x in PARAMS.items():
        np.testing.assert_array_equal(pulled[i], np.asarray(outer.decode(outer.encode(x, codec))))
    client.close()


def test_a_pre_encoded_stat2_tree_arrives_as_the_learners_reconstruction():
    """Error feedback (EXTENSION) sends what :func:`outer.feedback_encode` encoded, each
    tensor in its own codec (norms and embeddings BF16, matrices stat2): the follower's
    decode equals the learner's ``Pending.decoded`` bit for bit."""
    rng = np.random.default_rng(7)
    delta = {
        "embed": rng.standard_normal((64, 33)).astype(np.float32),
        "w": rng.standard_normal((64, 33)).astype(np.float32),
        "w2": rng.standard_normal((64, 33)).astype(np.float32) * 1e-3,
        "norm": rng.standard_normal((64, 33)).astype(np.float32)[:1].reshape(-1)[:33],
    }
    state = outer.feedback_init(delta)
    state = outer.FeedbackState({k: v + 0.01 for k, v in state.residual.items()})
    _, encoded, pending = outer.feedback_encode(state, delta, codec="stat2", decay=0.5)
    codecs = {k: e.codec for k, e in encoded.items()}
    assert codecs == {"embed": "bf16", "w": "stat2", "w2": "stat2", "norm": "bf16"}
    names = sorted(delta)
    pushes = {}
    server = dp.DataPlaneServer(lambda *a: pushes.__setitem__(a[:2], a[4]), lambda v: (0, {}))
    client = dp.DataPlaneClient(server.address)
    try:
        client.push(2, 0, 0, 1, [(i, encoded[n]) for i, n in enumerate(names)], codec="bf16")
    finally:
        client.close()
        server.close()
    got = pushes[2, 0]
    for i, n in enumerate(names):
        want = np.asarray(pending.decoded[n])
        assert np.asarray(got[i], np.float32).tobytes() == want.tobytes(), n
    assert not np.array_equal(np.asarray(pending.decoded["w"]), delta["w"])  # it is lossy
    # stat2's frame: 2 bits a value, four BF16 levels a block of 256
    assert dp.expected_lengths("stat2", (64, 33), 256) == (9 * 64, 9 * 8)


def test_refusals_reach_the_sender_and_the_server_keeps_serving(follower):
    client = dp.DataPlaneClient(follower.server.address)
    with pytest.raises(dp.TransferError, match="not kept") as e:
        client.pull(9)
    assert e.value.refused  # asking again cannot help
    with pytest.raises(dp.TransferError, match="wrong shape") as e:
        client.push(0, 1, 0, 0, [(0, np.zeros((2, 2), np.float32))])
    assert e.value.refused
    assert follower.pushes == {} and follower.server.stats["errors"] == 2
    assert follower.server.refused == {"pull": 1, "push": 1}
    client.push(1, 1, 0, 0, PARAMS.items())
    assert (1, 1) in follower.pushes


@pytest.mark.parametrize("kind", ["layout", "shape", "incarnation", "replayed", "nonfinite"])
def test_each_kind_a_follower_core_refuses_with_reaches_the_learner(follower, kind):
    """The learner's protocol acts on the kind (a replay waits for the pull; a push refused
    as not finite leaves), so every kind of ``PushRefused`` crosses the wire as itself."""
    from dipsjax.syncer.follower import PushRefused

    def refuse(*args):
        raise PushRefused(kind, f"refused as {kind}")

    follower.server.on_push = refuse
    with pytest.raises(dp.TransferError, match=f"refused as {kind}") as e:
        dp.DataPlaneClient(follower.server.address).push(3, 1, 0, 0, PARAMS.items())
    assert e.value.refused and e.value.kind == kind
    assert follower.server.refused == {kind: 1}


def test_refusals_are_counted_by_kind_and_only_broken_transfers_may_be_retried(follower):
    """A handler's refusal carries its ``kind``; a checksum mismatch is a broken transfer
    (sending again may help), a refusal is final: the learner does not retry it."""

    class Replayed(ValueError):
        kind = "replayed"

    def refuse(*args):
        raise Replayed("round 3 has ended")

    seen = []
    follower.server.on_refusal = lambda kind, message: seen.append((kind, message))
    follower.server.on_push = refuse
    with pytest.raises(dp.TransferError, match="round 3 has ended") as e:
        dp.DataPlaneClient(follower.server.address).push(3, 1, 0, 0, PARAMS.items())
    assert e.value.refused and e.value.kind == "replayed"  # the kind crosses the wire
    sock = _raw(follower.server.address)  # a body whose checksum does not match
    header, payload = _frame(0, PARAMS[0], round_id=2, learner=3)
    header = dp.dataclasses.replace(header, payload_len=len(payload), crc=1)
    sock.sendall(header.pack() + payload)
    dp.send_frame(sock, dp.Header(dp.END, "fp32"))
    reply, _, _ = dp.read_frame(sock)
    assert reply.kind == dp.ERROR and reply.tensor != dp.REFUSED
    sock.close()
    raw = _raw(follower.server.address)
    raw.sendall(b"\0" * 128)  # not a frame
    dp.read_frame(raw)
    raw.close()
    assert follower.server.refused == {"replayed": 1, "checksum": 1, "frame": 1}
    # the sender hears first, the callback runs after (metrics cannot delay an error frame);
    # each connection's thread calls it, so their order is not the order of the refusals
    deadline = time.monotonic() + 10
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(k for k, _ in seen) == ["checksum", "frame", "replayed"]
    assert dict(seen)["replayed"] == "round 3 has ended"


def test_a_link_cut_mid_push_stages_nothing_and_the_push_goes_through_when_it_is_back(
    follower,
):
    """Fault injection ``LinkCut``: the connection is severed inside a push; the follower
    refuses the truncated stream (``frame``) and stages nothing; while the link is cut no
    connection goes through; once it is back, the same push goes through whole."""
    link = dp.LinkCut()
    client = dp.DataPlaneClient(follower.server.address, link=link)
    client.pull(5)  # the connection is up before the cut
    link.cut_after(1000, seconds=1.5)  # inside the first tensor's frame
    t0 = time.monotonic()
    with pytest.raises(ConnectionResetError, match="link cut"):
        client.push(2, 1, 0, 4, PARAMS.items())
    with pytest.raises(TimeoutError, match="link cut"):
        client.push(2, 1, 0, 4, PARAMS.items())
    deadline = time.monotonic() + 10
    while follower.server.refused.get("frame", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert follower.server.refused == {"frame": 1} and follower.pushes == {}
    while time.monotonic() - t0 < 1.5:
        time.sleep(0.1)
    client.push(2, 1, 0, 4, PARAMS.items())
    _, _, got = follower.pushes[2, 1]
    assert sorted(got) == sorted(PARAMS) and link.cuts == 1
    client.close()


def _raw(address):
    sock = socket.create_connection(address, timeout=10)
    return sock


def _frame(tensor, x, **kw):
    payload, _scales, shape = dp.encode_tensor(x, "bf16")
    return dp.Header(dp.PUSH, "bf16", shape=shape, tensor=tensor, **kw), bytes(payload)


def test_a_corrupted_tensor_refuses_the_whole_push(follower):
    sock = _raw(follower.server.address)
    header, payload = _frame(0, PARAMS[0], round_id=2, learner=3)
    crc = dp.checksum(payload)
    bad = bytearray(payload)
    bad[10] ^= 0xFF
    header = dp.dataclasses.replace(header, payload_len=len(bad), crc=crc)
    sock.sendall(header.pack() + bytes(bad))  # checksum of the good bytes
    dp.send_frame(sock, *_frame(1, PARAMS[1], round_id=2, learner=3))
    dp.send_frame(sock, dp.Header(dp.END, "fp32"))
    reply, body, _ = dp.read_frame(sock)
    assert reply.kind == dp.ERROR and b"checksum mismatch" in bytes(body)
    assert follower.pushes == {}  # no partial data staged
    sock.close()
    dp.DataPlaneClient(follower.server.address).push(2, 3, 0, 0, PARAMS.items())
    assert (2, 3) in follower.pushes


def test_a_truncated_push_stages_nothing(follower):
    sock = _raw(follower.server.address)
    header, payload = _frame(0, PARAMS[0], round_id=7, learner=1)
    head = dp.dataclasses.replace(header, payload_len=len(payload), crc=dp.checksum(payload)).pack()
    sock.sendall(head + payload[: len(payload) // 2])
    sock.close()  # the learner dies mid-transfer
    dp.DataPlaneClient(follower.server.address).push(8, 1, 0, 0, PARAMS.items())
    assert list(follower.pushes) == [(8, 1)]


def test_oversized_and_foreign_frames_are_refused():
    f = Follower(max_frame=1000)
    try:
        sock = _raw(f.server.address)
        header, payload = _frame(0, PARAMS[0])
        sock.sendall(
            dp.dataclasses.replace(header, payload_len=len(payload), crc=0).pack() + payload
        )
        reply, body, _ = dp.read_frame(sock)
        assert reply.kind == dp.ERROR and b"exceeds the limit of 1000" in bytes(body)
        sock = _raw(f.server.address)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 64)
        reply, body, _ = dp.read_frame(sock)
        assert reply.kind == dp.ERROR and b"bad magic" in bytes(body)
        assert f.server.stats["errors"] == 2
    finally:
        f.server.close()


def test_header_lengths_must_fit_the_shape():
    header = dp.Header(dp.PUSH, "bf16", shape=(3, 3), payload_len=17)
    fixed = header.pack()
    n = dp._HEAD.size + dp._HEAD_CRC.size
    parsed, _ndim = dp.parse_header(fixed[:n])
    with pytest.raises(dp.FrameError, match=r"do not fit shape \(3, 3\)"):
        dp._check_header(fixed[:n], fixed[n:], parsed)
    tampered = bytearray(fixed)
    tampered[n + 1] ^= 1  # a dimension changed on the way
    with pytest.raises(dp.FrameError, match="header checksum"):
        dp._check_header(bytes(tampered[:n]), bytes(tampered[n:]), parsed)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=dp._HEAD.size + dp._HEAD_CRC.size + 80))
def test_header_decoder_only_raises_frame_errors(data):
    n = dp._HEAD.size + dp._HEAD_CRC.size
    try:
        header, ndim = dp.parse_header(data[:n])
        dp._check_header(data[:n], data[n : n + 8 * ndim], header)
    except dp.FrameError:
        pass


@settings(max_examples=100, deadline=None)
@given(
    kind=st.sampled_from([dp.PUSH, dp.DATA]),
    codec=st.sampled_from(dp.CODECS),
    shape=st.lists(st.integers(1, 9), min_size=0, max_size=4).map(tuple),
    ids=st.tuples(st.integers(-(2**40), 2**40), st.integers(-(2**31), 2**31 - 1)),
    ticket=st.one_of(st.just(b""), st.binary(min_size=16, max_size=16).filter(any)),
)
def test_headers_round_trip(kind, codec, shape, ids, ticket):
    block = {"int8": 64, "int4": 64, "stat2": 256}.get(codec, 0)
    plen, slen = dp.expected_lengths(codec, shape, block)
    h = dp.Header(
        kind,
        codec,
        shape=shape,
        round_id=ids[0],
        learner=ids[1],
        block_size=block,
        payload_len=plen,
        scales_len=slen,
        crc=123,
        ticket=ticket,
    )
    raw = h.pack()
    n = dp._HEAD.size + dp._HEAD_CRC.size
    parsed, ndim = dp.parse_header(raw[:n])
    assert dp._check_header(raw[:n], raw[n:], parsed) == h and ndim == len(shape)


def test_concurrent_pushes_from_many_learners(follower):
    def push(j):
        dp.DataPlaneClient(follower.server.address).push(1, j, 0, 0, PARAMS.items())

    threads = [threading.Thread(target=push, args=(j,)) for j in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(follower.pushes) == [(1, j) for j in range(6)]
    assert follower.server.stats["pushes"] == 6


def test_bad_magic_struct_is_named():
    junk = struct.pack("<4s", b"XXXX") + b"\0" * (dp._HEAD.size + dp._HEAD_CRC.size - 4)
    with pytest.raises(dp.FrameError, match="bad magic"):
        dp.parse_header(junk)


@pytest.mark.parametrize("codec", ["fp32", "bf16"])
def test_host_fast_path_is_bit_identical_to_the_library_codec(codec):
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            rng.standard_normal(5000).astype(np.float32),
            np.array(
                [0.0, -0.0, np.inf, -np.inf, 1e-40, -1e-45, 3.4e38, 1 + 2**-8, 1 + 3 * 2**-8],
                np.float32,
            ),
            (rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32)).view(np.float32),
        ]
    )
    x = x[np.isfinite(x) | np.isinf(x)]  # NaN payload bits are not specified by either
    payload, _, shape = dp.encode_tensor(x, codec)
    enc = outer.encode(x, codec)
    assert bytes(payload) == np.asarray(enc.payload).tobytes()
    header = dp.Header(dp.DATA, codec, shape=shape)
    np.testing.assert_array_equal(
        dp.decode_tensor(header, payload, b""), np.asarray(outer.decode(enc))
    )


def test_bf16_pushes_stay_bf16_and_pulls_can_stream_into_a_sink(follower):
    import ml_dtypes

    client = dp.DataPlaneClient(follower.server.address)
    client.push(4, 2, 0, 0, PARAMS.items(), codec="bf16")
    _, _, got = follower.pushes[4, 2]
    for i, x in PARAMS.items():  # half the memory of float32, the same values once widened
        assert got[i].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(
            got[i].astype(np.float32), np.asarray(outer.decode(outer.encode(x, "bf16")))
        )
    seen = {}
    version, kept = client.pull(codec="bf16", sink=seen.setdefault)
    assert version == 5 and kept == {} and sorted(seen) == sorted(PARAMS)
    for i, x in PARAMS.items():
        np.testing.assert_array_equal(
            seen[i].astype(np.float32), np.asarray(outer.decode(outer.encode(x, "bf16")))
        )
    client.close()


_VALID = None


def _valid_push_bytes():
    """The bytes of one whole, valid push of one tensor (a framing a fuzzer mutates)."""
    global _VALID
    if _VALID is None:
        chunks = []

        class Sink:
            def sendall(self, b):
                chunks.append(bytes(b))

            def sendmsg(self, buffers):
                data = b"".join(bytes(b) for b in buffers)
                chunks.append(data)
                return len(data)

        x = PARAMS[0]
        head, payload = _frame(0, x, round_id=7, learner=2)
        dp.send_frame(Sink(), *dp.framed(head, payload))
        dp.send_frame(Sink(), dp.Header(dp.END, codec="fp32", round_id=7, learner=2))
        _VALID = b"".join(chunks)
    return _VALID


@pytest.fixture(scope="module")
def fuzzed():
    f = Follower()
    yield f
    f.server.close()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fuzz_the_server_with_mutated_pushes_it_stages_nothing_bad_and_keeps_serving(fuzzed, data):
    """Random bytes, or a valid push with bytes flipped, cut or inserted, sent on a raw
    connection: the server never stages a push that differs from what was sent (corrupt
    or partial pushes are refused whole), and a well-formed push from another learner
    goes through right after."""
    valid = _valid_push_bytes()
    kind = data.draw(st.sampled_from(["none", "random", "flip", "cut", "insert"]))
    if kind == "none":
        blob = valid
    elif kind == "random":
        blob = data.draw(st.binary(max_size=512))
    else:
        at = data.draw(st.integers(0, len(valid) - 1))
        if kind == "flip":
            bit = data.draw(st.integers(0, 7))
            blob = valid[:at] + bytes([valid[at] ^ (1 << bit)]) + valid[at + 1 :]
        elif kind == "cut":
            blob = valid[:at]
        else:
            blob = valid[:at] + data.draw(st.binary(min_size=1, max_size=64)) + valid[at:]
    fuzzed.pushes.clear()
    sock = _raw(fuzzed.server.address)
    try:
        sock.sendall(blob)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(5)
        while sock.recv(65536):  # until the server answers and closes, or just closes
            pass
    except OSError:
        pass
    finally:
        sock.close()
    if kind == "none":  # the unmutated bytes are a whole push: the fuzzer's base is valid
        assert list(fuzzed.pushes) == [(7, 2)]
    for _inc, _base, tensors in fuzzed.pushes.values():
        # Whatever was staged is exactly the valid push (a flip in a field the checksums
        # do not cover, e.g. the END frame's ids, cannot corrupt the tensors).
        expect = np.asarray(outer.decode(outer.encode(PARAMS[0], "bf16")))
        assert sorted(tensors) == [0]
        np.testing.assert_array_equal(tensors[0], expect)
    client = dp.DataPlaneClient(fuzzed.server.address)
    client.push(99, 5, 0, 0, [(1, PARAMS[1])])
    client.close()
    assert (99, 5) in fuzzed.pushes


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from dipsjax.runtime import credentials

    root = tmp_path_factory.mktemp("creds")
    return credentials.create(root / "job"), credentials.create(root / "other")


def test_over_tls_a_job_client_pushes_and_pulls_exactly_and_outsiders_are_refused(job):
    mine, other = job
    f = Follower(ssl_context=mine.ssl_server())
    try:
        client = dp.DataPlaneClient(f.server.address, ssl_context=mine.ssl_client())
        client.push(3, 1, 0, 0, PARAMS.items())
        assert sorted(f.pushes[3, 1][2]) == sorted(PARAMS)
        version, pulled = client.pull(codec="fp32")
        assert version == 5
        for i, x in PARAMS.items():
            np.testing.assert_array_equal(pulled[i], x)
        client.close()
        refused = 0
        # 1. Plain TCP: the server takes our frames for a TLS handshake and refuses it.
        with pytest.raises((dp.FrameError, OSError)):
            dp.DataPlaneClient(f.server.address, timeout=10).push(4, 2, 0, 0, PARAMS.items())
        refused += 1
        # 2. TLS with another job's certificates: neither side trusts the other.
        with pytest.raises(OSError):
            dp.DataPlaneClient(f.server.address, ssl_context=other.ssl_client()).pull()
        refused += 1
        # 3. TLS that trusts the job's CA but shows no client certificate.
        import ssl

        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anonymous.load_verify_locations(cadata=mine.ca.decode())
        with pytest.raises((dp.FrameError, OSError)):
            dp.DataPlaneClient(f.server.address, ssl_context=anonymous, timeout=10).push(
                5, 3, 0, 0, PARAMS.items()
            )
        refused += 1
        for _ in range(50):  # the server counts each refusal in its own thread
            if f.server.stats["errors"] >= refused:
                break
            threading.Event().wait(0.05)
        assert f.server.stats["errors"] == refused
        assert all(e.startswith("TLS handshake refused") for e in f.server.errors)
        assert list(f.pushes) == [(3, 1)]  # nothing from an outsider was staged
        # ...and the server still serves the job's clients.
        again = dp.DataPlaneClient(f.server.address, ssl_context=mine.ssl_client())
        again.push(6, 1, 0, 0, PARAMS.items())
        again.close()
        assert (6, 1) in f.pushes
    finally:
        f.server.close()


def test_an_fp32_frame_decodes_in_place_and_a_bf16_one_widens_to_its_own_array():
    # FP32 (the runtime's pulls) is a view of the frame's fresh receive buffer, not a copy
    # of it (a 100M-parameter pull copied 400 MB for nothing); BF16 widens into new memory.
    import ml_dtypes

    x = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
    for codec, widened in (("fp32", False), ("bf16", True)):
        payload, _, shape = dp.encode_tensor(x, codec)
        body = np.frombuffer(bytes(payload), np.uint8).copy()  # as _recv_exact hands it
        y = dp.decode_tensor(dp.Header(dp.DATA, codec, shape=shape), body, b"")
        assert y.dtype == np.float32 and y.shape == x.shape and y.flags.writeable
        assert np.shares_memory(y, body) is not widened
        np.testing.assert_array_equal(y, x if codec == "fp32" else x.astype(ml_dtypes.bfloat16))
