"""Hostile requests against a real leader process (issue 18 items 3, 4 and 6): a forged
push does not move the job, a replayed request is not applied twice, the credential is
checked before anything is parsed, and bad input is answered and counted."""

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from dipsjax.launch.run import make_spec
from dipsjax.runtime.client import ControlClient, booked
from dipsjax.sim.config import SimConfig
from dipsjax.syncer import messages as m
from dipsjax.transport.proto import syncer_pb2, syncer_pb2_grpc

pytestmark = [pytest.mark.integration]

STEP = 8 * 64  # tokens of one inner step (batch_size x seq_len)


@pytest.fixture
def job(tmp_path):
    """A real leader of a 2-learner, 1-follower job; learner 0 active, follower 0 up."""
    yield from _job(tmp_path)


def _job(tmp_path, **spec_fields):
    run_dir = tmp_path / "run"
    spec = make_spec(SimConfig(learners=2, followers=1, token_budget=100_000), run_dir)
    spec = dataclasses.replace(spec, **spec_fields)
    spec.write(run_dir / "spec.json")
    cmd = [sys.executable, "-m", "dipsjax.runtime.leader", str(run_dir / "spec.json")]
    proc = subprocess.Popen(cmd, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    learner, follower = ControlClient(spec, learner=0), ControlClient(spec, follower=0)
    follower.call(m.FollowerJoined(0.0, 0, 0, address=spec.followers[0]), timeout=60)
    assert learner.call(m.Join(0.0, 0, fingerprint=spec.fingerprint), timeout=60) == []
    learner.call(m.PullDone(0.0, 0, 0))
    yield spec, learner, follower
    for c in (learner, follower):
        c.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def _round(learner, follower, round_id, version, tokens, steps):
    """Learner 0's push through a whole round: pushed, transferred, merged, applied, pulled."""
    meta = m.PushMeta(tokens, steps, version, learner.incarnation, train_seconds=1.0)
    learner.call(m.PushRequested(0.0, 0, meta))
    learner.call(m.TransferDone(0.0, 0, round_id, learner.incarnation))
    follower.call(m.FollowerNorms(0.0, 0, round_id, (1.0,)))
    follower.call(m.FollowerMerged(0.0, 0, round_id, 0.5))
    follower.call(m.FollowerApplied(0.0, 0, round_id, version + 1))
    learner.call(m.PullDone(0.0, 0, version + 1))


def test_a_forged_push_of_1e15_tokens_neither_ends_nor_moves_the_job(job):
    spec, learner, follower = job
    stranger = ControlClient(spec, learner=9)  # a learner id the job does not have
    stranger.call(m.PushRequested(0.0, 9, m.PushMeta(10**15, 16, 0)))
    forged = learner.call(m.PushRequested(0.0, 0, m.PushMeta(10**15, 16, 0)))
    st = learner.status()
    assert not st["stopped"] and st["round"] is None and st["version"] == 0
    assert st["tokens"] == {"reported": 0, "applied": 0, "rejected": 0, "dropped": 0}
    assert [a.kind for a in forged] == ["bounds"]  # answered to its sender
    assert "tokens 1000000000000000" in forged[0].reason
    assert st["budget_tokens"] == 0 and st["refused"] == {"bounds": 1, "unknown_learner": 1}
    # The job goes on: learner 0's own push is taken and applied.
    _round(learner, follower, 0, 0, 16 * STEP, 16)
    st = learner.status()
    assert st["version"] == 1 and st["tokens"]["applied"] == st["tokens"]["reported"] == 8192
    stranger.close()


class _Recorder(grpc.UnaryUnaryClientInterceptor):
    """Keeps every Call's request and metadata as sent (what a replay would resend)."""

    def __init__(self):
        self.sent = []

    def intercept_unary_unary(self, continuation, details, request):
        self.sent.append((request, details.metadata))
        return continuation(details, request)


def test_a_replayed_push_is_not_taken_and_the_learners_own_push_goes_through(job):
    _, learner, follower = job
    recorder = _Recorder()
    learner.stub = syncer_pb2_grpc.SyncerStub(grpc.intercept_channel(learner.channel, recorder))
    _round(learner, follower, 0, 0, 6 * STEP, 6)  # round 0, version 1
    (first, metadata) = recorder.sent[0]  # the push of round 0, as it went on the wire
    assert first.WhichOneof("message") == "push_requested"
    stub = syncer_pb2_grpc.SyncerStub(learner.channel)
    again = stub.Call(first, metadata=metadata, timeout=30)  # replayed
    assert again.error == "" and list(again.actions) == []  # answered as the first time
    st = learner.status()
    assert st["round"] is None and st["tokens"]["reported"] == 6 * STEP  # not taken
    # The learner's own next push goes through: no `pending` refusal, no eviction.
    assert learner.call(m.PushRequested(0.0, 0, m.PushMeta(5 * STEP, 5, 1))) == []
    st = learner.status()
    assert st["round"]["pushes"] == [0] and st["members"] == [0]
    assert st["refused"] == {"repeat": 1}
    books = st["tokens"]
    assert books["reported"] == 11 * STEP and books["applied"] == 6 * STEP
    assert books["dropped"] == books["rejected"] == 0  # the other 5 steps are in flight
    learner.call(m.TransferDone(0.0, 0, 1))
    follower.call(m.FollowerNorms(0.0, 0, 1, (1.0,)))
    follower.call(m.FollowerMerged(0.0, 0, 1, 0.5))
    follower.call(m.FollowerApplied(0.0, 0, 1, 2))
    assert learner.status()["tokens"]["applied"] == 11 * STEP


def test_an_envelope_claiming_an_incarnation_that_never_joined_locks_no_one_out(job):
    """Bug (review of issue 18): the request log took the envelope's incarnation on trust;
    one request claiming incarnation 2**62 for learner 0 made every later request of the
    live process (and of its restarts) ``old_incarnation``."""
    spec, learner, follower = job
    forger = ControlClient(spec, learner=0, incarnation=2**62)
    assert forger.call(m.Heartbeat(0.0, 0)) == []
    assert forger.refused.startswith("unknown_incarnation")
    learner.call(m.Heartbeat(0.0, 0))
    assert learner.refused == ""  # the live process is still heard
    _round(learner, follower, 0, 0, 4 * STEP, 4)
    st = learner.status()
    assert st["version"] == 1 and st["refused"] == {"unknown_incarnation": 1}
    # A real restart still raises the incarnation by joining.
    newer = ControlClient(spec, learner=0, incarnation=1)
    assert newer.call(m.Join(0.0, 0, incarnation=1, fingerprint=spec.fingerprint)) == []
    assert newer.refused == ""
    # The old process's push is refused before the core: neither side books its tokens.
    replies = learner.call(m.PushRequested(0.0, 0, m.PushMeta(4 * STEP, 4, 1)))
    assert learner.refused.startswith("old_incarnation")
    assert not booked(replies, learner.refused)
    assert learner.status()["tokens"]["reported"] == 4 * STEP  # round 0's alone
    for c in (forger, newer):
        c.close()


def test_a_watch_for_a_peer_the_job_does_not_have_is_refused_and_counted(job):
    """A Watch for learner 99, follower 99 or learner -1 (the job has 2 learners and 1
    follower) is refused, naming the id and the job's range, and counted as the Call
    path's screening counts it; before, the leader kept a queue for it and routed to it."""
    _, learner, _ = job
    stub = syncer_pb2_grpc.SyncerStub(learner.channel)
    for peer, n, job_has in (("learner", 99, 2), ("follower", 99, 1), ("learner", -1, 2)):
        request = syncer_pb2.WatchRequest(**{peer: n})
        with pytest.raises(grpc.RpcError) as e:
            next(stub.Watch(request, metadata=learner.metadata, timeout=10))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert f"no {peer} {n}: the job has {job_has} {peer}s" in e.value.details()
    st = learner.status()
    assert st["refused"] == {"unknown_learner": 2, "unknown_follower": 1}
    assert learner.call(m.Heartbeat(0.0, 0)) == []  # the job goes on


def test_a_watch_of_an_older_incarnation_is_refused_and_the_live_stream_keeps_its_actions(job):
    """Learner 0 restarts (incarnation 1); a Watch naming its incarnation 0 (a stale
    process, or a replayed request) that acknowledges everything is refused and counted: it
    neither takes the live stream's place nor drops what the outbox holds for learner 0."""
    spec, old, follower = job
    stub = syncer_pb2_grpc.SyncerStub(old.channel)
    new = ControlClient(spec, learner=0, incarnation=1)
    mine = syncer_pb2.WatchRequest(learner=0, incarnation=1)
    # A restarted learner may watch before its Join: an incarnation newer than the
    # leader counts is taken, as before.
    early = stub.Watch(mine, metadata=new.metadata, timeout=10)
    assert new.call(m.Join(0.0, 0, incarnation=1, fingerprint=spec.fingerprint)) == []
    first = next(early)  # the old incarnation's eviction went into the open stream
    while first.WhichOneof("message") != "send_model":
        first = next(early)
    early.cancel()
    live = stub.Watch(mine, metadata=new.metadata, timeout=60)
    assert next(live).seq == first.seq  # not acknowledged: sent again
    new.call(m.PullDone(0.0, 0, 0))
    stale = syncer_pb2.WatchRequest(learner=0, incarnation=0, acked=10**6, epoch=first.epoch)
    with pytest.raises(grpc.RpcError) as e:
        next(stub.Watch(stale, metadata=old.metadata, timeout=10))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "incarnation 0 of learner 0 is older than 1" in e.value.details()
    assert old.status()["refused"] == {"old_incarnation": 1}
    # The live stream still gets learner 0's next action ...
    _round(new, follower, 0, 0, 4 * STEP, 4)
    kinds = []
    while "notify_pull" not in kinds:
        kinds.append(next(live).WhichOneof("message"))
    live.cancel()
    # ... and the outbox still holds what learner 0 has not acknowledged.
    again = stub.Watch(mine, metadata=new.metadata, timeout=10)
    assert next(again).seq == first.seq
    again.cancel()
    new.close()


def test_the_credential_is_checked_before_the_request_is_parsed_and_bad_bytes_are_named(job):
    spec, learner, _ = job
    token = (("x-dipsjax-token", spec.token),)
    raw = {
        name: learner.channel.unary_unary(
            f"/dipsjax.syncer.v1.Syncer/{name}",
            request_serializer=lambda b: b,
            response_deserializer=reply.FromString,
        )
        for name, reply in (("Call", syncer_pb2.Replies), ("Status", syncer_pb2.StatusReply))
    }
    garbage = b"\xff\xff\xff\x0fnot a protobuf"
    # Without the credential nothing is parsed: refused as unauthenticated, not malformed.
    for name in ("Call", "Status"):
        with pytest.raises(grpc.RpcError) as e:
            raw[name](garbage, timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # With it: bytes that do not decode are named, and counted.
    reply = raw["Call"](garbage, metadata=token, timeout=30)
    assert "malformed message: not a protobuf Envelope (18 bytes)" in reply.error
    with pytest.raises(grpc.RpcError) as e:
        raw["Status"](garbage, metadata=token, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a StatusRequest" in e.value.details()
    watch = learner.channel.unary_stream(
        "/dipsjax.syncer.v1.Syncer/Watch",
        request_serializer=lambda b: b,
        response_deserializer=syncer_pb2.Envelope.FromString,
    )
    with pytest.raises(grpc.RpcError) as e:
        next(iter(watch(garbage, metadata=token, timeout=30)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert learner.status()["refused"] == {"unauthenticated": 2, "malformed": 3}
    # A 900 KiB reason reaches the tape cut to 1 KiB.
    learner.call(m.LearnerFailed(0.0, 0, "x" * (900 << 10)))
    tape = (Path(spec.run_dir) / "tape.jsonl").read_text()
    assert len(tape) < 10_000 and f"[{(900 << 10) - 1024} more bytes cut]" in tape


def test_refused_tls_handshakes_do_not_write_a_line_each_to_a_roles_log(tmp_path):
    """gRPC's core logged every refused handshake (one INFO line each, uncounted): 127
    lines in the leader's log from the hostile benchmark's tiny storm. A role process
    (which imports the runtime before grpc) logs only gRPC's errors."""
    import os
    import subprocess
    import sys

    script = f"""
import dipsjax.runtime.client
from concurrent import futures
from pathlib import Path
import grpc
from dipsjax.runtime import credentials
c = Path(credentials.create({str(tmp_path / "c")!r}).directory)
pair = [((c / "key.pem").read_bytes(), (c / "cert.pem").read_bytes())]
tls = grpc.ssl_server_credentials(pair, (c / "ca.pem").read_bytes(), True)
server = grpc.server(futures.ThreadPoolExecutor(2))
port = server.add_secure_port("127.0.0.1:0", tls)
server.start()
for _ in range(5):  # plaintext against the TLS port: each handshake refused
    channel = grpc.insecure_channel(f"127.0.0.1:{{port}}")
    try:
        channel.unary_unary("/x/y")(b"", timeout=1)
    except grpc.RpcError as e:
        print(e.code().name)
    channel.close()
"""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    got = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split() == ["UNAVAILABLE"] * 5  # refused, all five
    assert "Handshake failed" not in got.stderr, got.stderr[-2000:]


def test_a_connection_that_never_finishes_its_handshake_is_dropped_within_seconds(job):
    """Half a TLS ClientHello, then nothing: gRPC's default held such a connection (a
    descriptor and its buffers) for 120 s; the leader drops it after
    ``HANDSHAKE_TIMEOUT_MS``, while it goes on serving the job's own calls."""
    import socket
    import time

    from dipsjax.runtime.leader import HANDSHAKE_TIMEOUT_MS

    spec, learner, _ = job
    host, _, port = spec.leader.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # half a ClientHello
    t0 = time.monotonic()
    sock.settimeout(60)
    assert sock.recv(1024) == b""  # closed by the leader
    held = time.monotonic() - t0
    sock.close()
    assert HANDSHAKE_TIMEOUT_MS == 5000 and held < 30  # not gRPC's 120 s
    assert learner.status()["version"] == 0  # the job's own calls are served meanwhile


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def capped_job(tmp_path):
    """The job of ``job``, its leader serving 4 calls at once per host, on every interface
    (IPv4 and IPv6: ``::1`` is a second host on this machine)."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback: no second host to call from")
    yield from _job(tmp_path, peer_rpc_cap=4, bind="[::]")


def test_one_host_holding_its_cap_of_watch_streams_is_refused_and_no_other_host_is(capped_job):
    """Before the cap, one host could open Watch streams without end, each held by the
    leader for as long as it liked; now its fifth call in flight is refused
    (RESOURCE_EXHAUSTED, counted ``peer_cap``), another host is served meanwhile, and the
    host's places come back as its streams close."""
    spec, learner, _ = capped_job
    stub, token = syncer_pb2_grpc.SyncerStub(learner.channel), learner.metadata
    request = syncer_pb2.WatchRequest(learner=0, incarnation=0)
    streams = [stub.Watch(request, metadata=token) for _ in range(4)]
    for st in streams:  # each got the learner's backlog: it holds its place now
        assert next(st).WhichOneof("message") is not None
    with pytest.raises(grpc.RpcError) as e:
        next(stub.Watch(request, metadata=token, timeout=30))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "4 calls in flight from 127.0.0.1 at most" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        learner.status()
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    port = spec.leader.rpartition(":")[2]
    other = ControlClient(dataclasses.replace(spec, leader=f"[::1]:{port}"), learner=1)
    assert other.status()["refused"] == {"peer_cap": 2}  # the other host is served
    for st in streams:
        st.cancel()
    deadline = time.monotonic() + 30
    while True:  # the streams' places are given back once the leader sees them end
        try:
            st = learner.status()
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "the places of closed streams never came back"
            time.sleep(0.1)
    assert st["refused"]["peer_cap"] >= 2 and set(st["refused"]) == {"peer_cap"}
    assert learner.call(m.Heartbeat(0.0, 0)) == []  # the learner's own calls go through
    other.close()
