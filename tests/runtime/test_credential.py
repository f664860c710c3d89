"""Only the job's credential holders get in: TLS with the job's certificates on the control
plane (a real leader process) plus the job token on every call."""

import dataclasses
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dipsjax.launch.run import make_spec
from dipsjax.runtime import credentials
from dipsjax.runtime.client import ControlClient, ControlError
from dipsjax.sim.config import SimConfig
from dipsjax.syncer import messages as m

pytestmark = [pytest.mark.integration]


def _leader_cmd(tmp_path):
    return [sys.executable, "-m", "dipsjax.runtime.leader", str(tmp_path / "run" / "spec.json")]


@pytest.fixture
def leader_proc(tmp_path):
    """A real leader process: ``(spec, process)``."""
    spec = make_spec(SimConfig(learners=2, followers=1), tmp_path / "run")
    spec.write(tmp_path / "run" / "spec.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(_leader_cmd(tmp_path), env=env)
    yield spec, proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


@pytest.fixture
def leader(leader_proc):
    return leader_proc[0]


def _refused(client: ControlClient, timeout: float) -> set[grpc.StatusCode]:
    """The status codes of a join, a heartbeat, a chunk request, a watch and a status read."""
    codes = set()
    for event in (m.Join(0.0, 0), m.Heartbeat(0.0, 0), m.ChunkRequested(0.0, 0)):
        with pytest.raises(grpc.RpcError) as e:
            client.call(event, timeout=timeout)
        codes.add(e.value.code())
    with pytest.raises(grpc.RpcError) as e:
        client.status(timeout=timeout)
    codes.add(e.value.code())
    return codes


def test_only_holders_of_the_certificates_and_token_can_join_watch_beat_or_read_status(
    leader_proc, tmp_path
):
    spec, proc = leader_proc
    # 1. Another job's certificates and token: the TLS handshake fails, nothing is called.
    other = credentials.create(tmp_path / "other")
    stranger = ControlClient(dataclasses.replace(spec, credentials=other.directory), learner=0)
    assert _refused(stranger, 1) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    # 2. No TLS at all: the server speaks only TLS.
    plain = ControlClient(dataclasses.replace(spec, tls=False), learner=0)
    assert _refused(plain, 1) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    # 3. The job's certificates (say a copied one) but not its token: refused on every call.
    stolen = tmp_path / "stolen"
    stolen.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        shutil.copy(Path(spec.credentials) / name, stolen / name)
    (stolen / "token").write_text("f" * 64)
    (stolen / "token").chmod(0o600)  # a looser token is refused before any call
    outsider = ControlClient(dataclasses.replace(spec, credentials=str(stolen)), learner=0)
    assert _refused(outsider, 20) == {grpc.StatusCode.UNAUTHENTICATED}
    with pytest.raises(grpc.RpcError) as e:
        next(iter(outsider.watch()))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert spec.token not in str(e.value)  # the secret is never echoed
    # The leader's state did not change: the real learner 0 joins as the first one.
    member = ControlClient(spec, learner=0)
    status = member.status()
    assert status["members"] == []
    assert status["refused"] == {"unauthenticated": 3 + 1 + 1}  # 3 calls, status, watch
    # A learner with another model is refused before any tensor moves, and counted.
    (refusal,) = member.call(m.Join(0.0, 0, fingerprint="0123456789abcdef"), timeout=20)
    assert isinstance(refusal, m.Refuse) and "fingerprint 0123456789abcdef" in refusal.reason
    # A malformed message gets a clear error, is counted, and changes nothing.
    from dipsjax.transport.proto import syncer_pb2

    reply = member.stub.Call(syncer_pb2.Envelope(), timeout=20, metadata=member.metadata)
    assert "malformed message" in reply.error and "no message" in reply.error
    raw = member.channel.unary_unary(  # bytes that are not a protobuf at all
        "/dipsjax.syncer.v1.Syncer/Call",
        request_serializer=lambda b: b,
        response_deserializer=syncer_pb2.Replies.FromString,
    )
    reply = raw(b"\xff\xff\xff\x0fnot a protobuf", timeout=20, metadata=member.metadata)
    assert "malformed message: not a protobuf Envelope (18 bytes)" in reply.error
    with pytest.raises(ControlError, match="not an event"):
        member.call(m.Evict(0, "forged"), timeout=20)  # an action sent as if an event
    # A push from a learner the job does not have: refused to its caller, counted.
    assert member.call(m.PushRequested(0.0, 9, m.PushMeta(1, 1, 0)), timeout=20) == []
    assert member.refused.startswith("unknown_learner: no learner 9")
    status = member.status()
    assert status["members"] == []
    assert status["refused"] == {
        "unauthenticated": 5,
        "fingerprint": 1,
        "malformed": 3,
        "unknown_learner": 1,
    }
    assert member.call(m.Join(0.0, 0, fingerprint=spec.fingerprint), timeout=20) == []
    actions = member.watch()
    assert isinstance(next(iter(actions)), m.SendModel)
    assert member.status()["members"] == [0]
    tape = Path(spec.run_dir) / "tape.jsonl"
    joins = [x for x in tape.read_text().splitlines() if '"join"' in x]
    assert len(joins) == 1
    # Killed and restarted from its snapshot, the leader still counts every refusal,
    # those of its transport (unauthenticated, malformed) too.
    refused = member.status()["refused"]
    proc.kill()
    proc.wait(30)
    again = subprocess.Popen([*_leader_cmd(tmp_path), "--resume"])
    try:
        assert member.status(timeout=60)["refused"] == refused
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(30)
    for c in (stranger, plain, outsider, member):
        c.close()


def test_the_credentials_command_writes_private_files_and_never_overwrites(tmp_path):
    from dipsjax.cli import main

    d = tmp_path / "creds"
    assert main(["credentials", str(d), "--hosts", "localhost,10.1.2.3,node7"]) == 0
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for name, mode in (("key.pem", 0o600), ("token", 0o600), ("ca.pem", 0o644)):
        assert stat.S_IMODE((d / name).stat().st_mode) == mode, name
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((d / "cert.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "node7"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    ca = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    cert.verify_directly_issued_by(ca)  # signed by the job's own CA
    token = (d / "token").read_text()
    assert len(token) == 64 and token not in repr(credentials.load(d))
    with pytest.raises(SystemExit) as e:  # a second call would replace a live job's keys
        main(["credentials", str(d)])
    assert e.value.code == 2
    assert (d / "token").read_text() == token
    (d / "token").unlink()
    with pytest.raises(FileNotFoundError, match="lacks token"):
        credentials.load.__wrapped__(d)


def test_a_learner_built_for_another_model_is_refused_at_join_and_not_restarted(leader, tmp_path):
    """A real learner process whose model differs from the job's (its config says
    ``small``, the job's ``tiny``) is refused before any tensor moves and exits with
    REFUSED_EXIT, which the launcher does not restart; the leader counts it."""
    from dipsjax.runtime.spec import REFUSED_EXIT

    spec = leader
    wrong = dataclasses.replace(spec, sim=dataclasses.replace(spec.sim, model="small"))
    wrong.write(tmp_path / "wrong.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "dipsjax.runtime.learner", str(tmp_path / "wrong.json"), "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == REFUSED_EXIT, out.stdout + out.stderr
    assert f"is not the job's {spec.fingerprint}" in out.stdout
    member = ControlClient(spec, learner=0)
    status = member.status()
    assert status["refused"] == {"fingerprint": 1} and status["members"] == []
    member.close()


def test_a_restarted_leader_cuts_its_tape_back_to_the_event_its_snapshot_follows(tmp_path):
    """The leader appends the tape, then writes the snapshot that counts it: a kill in
    between leaves extra records (the last maybe torn), which a restart cuts back so that
    the tape and the state agree."""
    import json

    from dipsjax.runtime.leader import restored
    from dipsjax.runtime.spec import RunSpec
    from dipsjax.syncer.leader import Leader, LeaderConfig

    leader = Leader(LeaderConfig())
    leader.handle(m.Join(0.0, 0))
    state = leader.snapshot()
    state["tape_records"] = len(leader.tape.records)
    run = tmp_path / "run"
    (run / "leader").mkdir(parents=True)
    (run / "leader" / "snapshot.json").write_text(json.dumps(state))
    kept = "".join(json.dumps(r) + "\n" for r in leader.tape.records)
    extra = json.dumps({"kind": "membership", "event": "join", "learner": 1}) + "\n"
    (run / "tape.jsonl").write_text(kept + extra + '{"kind": "mem')  # a torn last line
    spec = RunSpec(SimConfig(), "", (), "", str(run), (), 0)
    again = restored(spec)
    assert again.tape.records == leader.tape.records and list(again.members) == [0]
    assert (run / "tape.jsonl").read_text() == kept
