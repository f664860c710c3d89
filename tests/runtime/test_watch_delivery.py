"""The leader's ``Watch`` delivery (issue 17 item 9): actions numbered per stream,
acknowledged by their receiver, redelivered after a reconnect, taken once.

Before, an action was taken off the peer's queue before it was sent: one sent into a
stream that was dying was lost (the two tests marked "seen failing" failed that way)."""

import asyncio
import threading

import grpc
import pytest

from dipsjax.launch.run import free_port
from dipsjax.runtime import credentials
from dipsjax.runtime.client import ControlClient, Delivery
from dipsjax.runtime.leader import LeaderNode, SyncerService, add_service, server_options
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim.config import SimConfig
from dipsjax.syncer import messages as m
from dipsjax.transport import control_codec as codec
from dipsjax.transport.proto import syncer_pb2


def _spec(tmp_path, port=None):
    sim = SimConfig(learners=2, followers=1, token_budget=10**9)
    creds = credentials.create(tmp_path / "credentials").directory
    return RunSpec(
        sim,
        f"127.0.0.1:{port or free_port()}",
        ("127.0.0.1:1",),
        creds,
        str(tmp_path / "run"),
        (0,),
        4,
        heartbeat_interval=1.0,
        tls=False,
    )


ACTIONS = [m.Discard(r, f"round {r}") for r in range(3)]


def test_an_action_taken_into_a_dying_stream_is_delivered_again(tmp_path):
    """Seen failing: the second action, taken off the queue for a stream that then ended,
    was gone from the next watch."""
    node = LeaderNode(_spec(tmp_path))
    who = ("follower", 0)
    q = node.watch(who)
    for a in ACTIONS:
        node._route(who, a)
    first, second = q.get_nowait(), q.get_nowait()  # the second one dies with the stream
    node.unwatch(who, q)
    again = node.watch(who)  # a new process: it has acknowledged nothing
    got = [again.get_nowait() for _ in range(again.qsize())]
    assert [codec.from_proto(e) for e in got] == ACTIONS
    assert [e.seq for e in got] == [first.seq, second.seq, second.seq + 1]
    assert first.seq >= 1 and second.seq == first.seq + 1


def test_a_watch_resumes_after_what_its_receiver_acknowledged(tmp_path):
    node = LeaderNode(_spec(tmp_path))
    who = ("learner", 1)
    q = node.watch(who)
    for a in ACTIONS:
        node._route(who, a)
    envs = [q.get_nowait() for _ in range(3)]
    node.unwatch(who, q)
    again = node.watch(who, acked=envs[0].seq, epoch=envs[0].epoch)
    assert [codec.from_proto(again.get_nowait()) for _ in range(again.qsize())] == ACTIONS[1:]
    # An acknowledgement on a call frees what it covers; another peer's stream is untouched.
    node._route(("learner", 0), ACTIONS[0])
    node.acknowledge(m.Heartbeat(0.0, 1), acked=envs[1].seq, epoch=envs[1].epoch)
    assert [e.seq for e in node.outbox[who]] == [envs[2].seq]
    assert len(node.outbox[("learner", 0)]) == 1
    # An acknowledgement of another leader's epoch (a restarted leader) frees nothing.
    node.acknowledge(m.Heartbeat(0.0, 1), acked=10**6, epoch=envs[1].epoch + 1)
    assert [e.seq for e in node.outbox[who]] == [envs[2].seq]
    node.unwatch(who, again)
    fresh = node.watch(who, acked=10**6, epoch=envs[0].epoch + 1)  # another epoch: all of it
    assert [e.seq for e in (fresh.get_nowait() for _ in range(fresh.qsize()))] == [envs[2].seq]


def test_a_new_learner_incarnation_gets_nothing_routed_to_its_predecessor(tmp_path):
    """A restarted learner process (incarnation 1) must not take incarnation 0's
    ``SendModel`` for the answer to its own join. Before, what no stream had taken went to
    whichever process watched next."""
    node = LeaderNode(_spec(tmp_path))
    ld = node.leader
    ld.handle(m.FollowerJoined(0.0, 0, 0))
    node.carry_out(ld.handle(m.Join(0.0, 1, incarnation=0)))  # its SendModel, not taken
    old = [codec.from_proto(e) for e in node.outbox[("learner", 1)]]
    assert [type(a) for a in old] == [m.SendModel]
    node.carry_out(ld.handle(m.Join(0.1, 1, incarnation=1)))  # the restart's join
    q = node.watch(("learner", 1), incarnation=1)
    got = [codec.from_proto(q.get_nowait()) for _ in range(q.qsize())]
    assert [type(a) for a in got] == [m.SendModel]  # its own, once
    assert len(node.outbox[("learner", 1)]) == 1
    # An older process watching still gets what was routed to the newer one (it is
    # evicted; the protocol ignores what is not its own).
    node.unwatch(("learner", 1), q)
    assert node.watch(("learner", 1), incarnation=0).qsize() == 1


class _Server:
    """A real gRPC control server around a :class:`LeaderNode`, on its own event loop."""

    def __init__(self, spec):
        self.node = LeaderNode(spec)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(spec), self.loop).result(10)

    async def _start(self, spec):
        self.node.loop = asyncio.get_running_loop()
        self.server = grpc.aio.server(options=server_options(spec.heartbeat_interval))
        add_service(SyncerService(self.node), self.server)
        self.server.add_insecure_port(spec.leader)
        await self.server.start()

    def route(self, who, actions):
        def go():
            for a in actions:
                self.node._route(who, a)

        self.loop.call_soon_threadsafe(go)

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.mark.integration
def test_a_stream_cut_mid_delivery_loses_nothing_and_repeats_nothing(tmp_path):
    """Seen failing: the receiver cut its stream after taking the first of three actions
    the leader had already sent; the next stream delivered neither of the other two."""
    spec = _spec(tmp_path, free_port())
    server = _Server(spec)
    client = ControlClient(spec, follower=0)
    try:
        stream = client.watch()
        server.route(("follower", 0), ACTIONS)
        assert next(stream) == ACTIONS[0]
        client.cut()  # the stream breaks with two actions sent and not yet taken
        with pytest.raises(grpc.RpcError):
            next(stream)
        later = m.Discard(3, "round 3")
        server.route(("follower", 0), [later])
        stream = client.watch()
        for expected in [*ACTIONS[1:], later]:
            assert next(stream) == expected
        # The leader's outbox is freed by the next call's acknowledgement.
        client.call(m.FollowerHeartbeat(0.0, 0))
        assert server.node.outbox[("follower", 0)] == []
    finally:
        client.close()
        server.stop()


def test_a_receiver_takes_each_action_once_per_leader_epoch():
    taken = Delivery()
    env = lambda epoch, seq: syncer_pb2.Envelope(epoch=epoch, seq=seq)  # noqa: E731
    assert [taken.take(env(7, s)) for s in (1, 2, 2, 1, 3)] == [True, True, False, False, True]
    assert (taken.epoch, taken.seen) == (7, 3)
    # A restarted leader numbers from 1 again under a new epoch: nothing is a duplicate.
    assert [taken.take(env(9, s)) for s in (1, 1, 2)] == [True, False, True]
    assert (taken.epoch, taken.seen) == (9, 2)
    assert taken.take(syncer_pb2.Envelope())  # unnumbered (a call's reply): always taken
