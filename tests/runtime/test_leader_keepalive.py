"""gRPC keepalives on the control plane, both sides, derived from the heartbeat interval: a
black-holed connection is seen well within the 3 heartbeats that make a peer lost (before,
none were set and it went unseen for minutes)."""

import dataclasses

import pytest

from dipsjax.runtime import client as client_mod
from dipsjax.runtime import credentials
from dipsjax.runtime import leader as leader_mod
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig


@pytest.mark.parametrize("interval", [1.0, 10.0])
def test_channel_and_server_keepalives_follow_the_heartbeat_interval(interval):
    ms = int(interval * 1000)
    chan = dict(client_mod.keepalive_options(interval))
    assert chan == {
        "grpc.keepalive_time_ms": ms // 2,
        "grpc.keepalive_timeout_ms": ms,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
    }
    # A dead link is found within ping + timeout: well under 3 heartbeats.
    found = chan["grpc.keepalive_time_ms"] + chan["grpc.keepalive_timeout_ms"]
    assert found <= 1.5 * ms < 3 * ms
    server = dict(leader_mod.server_options(interval))
    assert server == {
        "grpc.keepalive_time_ms": ms // 2,
        "grpc.keepalive_timeout_ms": ms,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        # The server takes the clients' pings (twice as often as they send them) and never
        # answers them with GOAWAY ("too many pings").
        "grpc.http2.min_ping_interval_without_data_ms": ms // 4,
        "grpc.http2.max_ping_strikes": 0,
        # A request may make the leader read at most 1 MiB (gRPC's default: 4 MiB).
        "grpc.max_receive_message_length": 1 << 20,
        # Half-open handshakes are dropped after 5 s (gRPC's default: 120 s).
        "grpc.server_handshake_timeout_ms": 5000,
    }
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < chan["grpc.keepalive_time_ms"]


OPTIONS = client_mod.keepalive_options(2.0) + client_mod.reconnect_options(2.0)


def test_a_channel_tries_a_lost_leader_again_at_least_once_a_heartbeat_interval():
    """gRPC's reconnect backoff grows to 120 s; a restarted leader's short grace (two
    intervals) needs its peers back within about one."""
    for interval in (0.5, 1.0, 10.0):
        opts = dict(client_mod.reconnect_options(interval))
        assert opts["grpc.max_reconnect_backoff_ms"] <= interval * 1000
        assert opts["grpc.initial_reconnect_backoff_ms"] <= opts["grpc.max_reconnect_backoff_ms"]


def test_the_control_client_opens_its_channel_with_the_keepalives(tmp_path, monkeypatch):
    creds = credentials.create(tmp_path / "credentials").directory
    spec = RunSpec(SimConfig(), "127.0.0.1:1", ("127.0.0.1:2",), creds, str(tmp_path), (0,), 1, 2.0)
    seen = []
    import grpc

    real = grpc.secure_channel
    monkeypatch.setattr(grpc, "secure_channel", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    c = client_mod.ControlClient(spec, learner=0)
    c.close()
    assert seen == [{"options": OPTIONS}]
    seen.clear()
    real_plain = grpc.insecure_channel
    monkeypatch.setattr(
        grpc, "insecure_channel", lambda *a, **kw: seen.append(kw) or real_plain(*a, **kw)
    )
    client_mod.ControlClient(dataclasses.replace(spec, tls=False), follower=0).close()
    assert seen == [{"options": OPTIONS}]
