"""The leader's caps on calls in flight (issue 18): per host and in all, sized from the
job, hosts read from gRPC's peer strings (the live test is in ``test_hostile_control``)."""

import dataclasses
from collections import Counter

import pytest

from dipsjax.runtime import leader as leader_mod
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig
from dipsjax.transport.refusals import RefusalLog


@pytest.mark.parametrize(
    "peer, host",
    [
        ("ipv4:127.0.0.1:5555", "127.0.0.1"),
        ("ipv6:%5B::1%5D:35662", "::1"),  # as gRPC writes it
        ("ipv6:[2001:db8::7]:443", "2001:db8::7"),
        ("unix:", "unix"),
        ("unix:/tmp/leader.sock", "unix"),
        ("", ""),
    ],
)
def test_peer_host(peer, host):
    assert leader_mod.peer_host(peer) == host


def _spec(learners, followers, **fields):
    spec = RunSpec(
        SimConfig(learners=learners),
        "127.0.0.1:1",
        tuple(f"127.0.0.1:{2 + k}" for k in range(followers)),
        "",
        "/nonexistent",
        (0,),
        1,
    )
    return dataclasses.replace(spec, **fields)


def test_the_caps_grow_with_the_job_and_the_spec_may_set_them():
    assert leader_mod.rpc_caps(_spec(2, 1)) == (64, 256)  # never under 64 per host
    assert leader_mod.rpc_caps(_spec(100, 8)) == (8 * 109, 4 * 8 * 109)
    assert leader_mod.rpc_caps(_spec(2, 1, peer_rpc_cap=5)) == (5, 20)
    with pytest.raises(ValueError, match="peer_rpc_cap"):
        _spec(2, 1, peer_rpc_cap=-1)


def test_a_host_at_its_cap_leaves_the_others_their_places_up_to_the_servers():
    lines, refused = [], Counter()
    caps = leader_mod.RpcCaps(2, 3, refused, RefusalLog(10.0, emit=lines.append))
    assert caps.admit("10.0.0.1") is None and caps.admit("10.0.0.1") is None
    assert caps.admit("10.0.0.1") == (
        "peer_cap: the leader serves 2 calls in flight from 10.0.0.1 at most "
        "(a Watch counts while open)"
    )
    assert caps.admit("10.0.0.2") is None  # another host: served
    assert caps.admit("10.0.0.3").startswith("server_cap: the leader serves 3 calls")
    caps.release("10.0.0.1")
    assert caps.admit("10.0.0.3") is None  # a place given back is taken again
    assert refused == {"peer_cap": 1, "server_cap": 1}
    assert len(lines) == 2  # one line per kind (then at most one per 10 s)
    for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        caps.release(host)
    assert caps.open == Counter()
