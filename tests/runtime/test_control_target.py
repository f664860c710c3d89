"""The control channel's target when the leaders' addresses are several (a standby): every
address is named, in order, whatever its family, and a real gRPC channel reaches whichever
leader listens."""

import socket
from concurrent import futures

import grpc
import pytest

from dipsjax.runtime.client import control_target
from tests.runtime.test_hostile_control import _ipv6_loopback


def test_one_address_is_its_own_target():
    assert control_target(("leader-0:5555",)) == ("leader-0:5555", None)


def test_ipv4_addresses_make_an_ipv4_target_in_their_order():
    assert control_target(("10.0.0.2:5555", "10.0.0.1:6000")) == (
        "ipv4:10.0.0.2:5555,10.0.0.1:6000",
        "10.0.0.2",
    )


def test_mixed_families_keep_every_address_in_order():
    # An IPv4 address beside an IPv6 one becomes IPv4-mapped (::ffff:a.b.c.d): one ipv6
    # target names both. Before, the IPv4 leader was left out of the target.
    target, name = control_target(("[2001:db8::7]:443", "10.0.0.1:6000"))
    assert target == "ipv6:[2001:db8::7]:443,[::ffff:10.0.0.1]:6000"
    assert name == "2001:db8::7"
    target, name = control_target(("10.0.0.1:6000", "[2001:db8::7]:443"))
    assert target == "ipv6:[::ffff:10.0.0.1]:6000,[2001:db8::7]:443"
    assert name == "10.0.0.1"


def test_a_name_that_does_not_resolve_is_left_out():
    target, _ = control_target(("no-such-host.invalid:1", "127.0.0.1:7"))
    assert target == "ipv4:127.0.0.1:7"


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_a_channel_over_mixed_families_reaches_the_ipv4_leader():
    """The active leader's address is IPv6 and nothing listens there; the standby, which
    took over, listens on IPv4 only. A real channel to the target reaches it."""
    server = grpc.server(futures.ThreadPoolExecutor(1))
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t", {"Echo": echo}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with socket.socket(socket.AF_INET6) as s:  # a port nothing listens on
        s.bind(("::1", 0))
        dead = s.getsockname()[1]
    target, _ = control_target((f"[::1]:{dead}", f"127.0.0.1:{port}"))
    channel = grpc.insecure_channel(target)
    try:
        assert channel.unary_unary("/t/Echo")(b"ping", timeout=10) == b"ping"
    finally:
        channel.close()
        server.stop(0)
