"""Hostile: a live ``dipsjax run`` trained while the same host attacks both planes.

One Di-PS job (3 learners of speeds 1, 1.3, 1.6, 2 followers, the tiny model, TLS and the
job token on) trains; its throughput is measured in windows that alternate between calm
and attack (the same job: the machine is shared and noisy), while a probe times the
leader's ``Status`` every 50 ms. The attack, bounded in size and rate:

* **idle sockets**: ``--idle`` TCP connections held open against the leader's port and
  each follower's data port (opened again when the server closes one);
* **half-open handshakes**: ``--half-open`` connections that send half a TLS ClientHello,
  then nothing;
* **forged requests**, with the job's own credentials (the worst case: a peer on the host
  holds the token): a push claiming 10**15 tokens from a learner the job does not have, a
  heartbeat of an unknown learner, a push for a live learner of an incarnation the job never
  had, and ``Status`` bytes that do not decode; and the same without the token (refused
  before parsing);
* **replayed requests**: one numbered request (a live learner's heartbeat) sent twice,
  byte for byte: the second must be answered from the leader's request log (counted
  ``repeat``), never applied again;
* **malformed frames** to each follower's data plane over TLS: a bad magic, a shape whose
  size overflows int64, a push of an unknown tensor id announcing 1 GiB of body (refused
  from its header, the body never read), a push from an unknown learner, a push for a round
  the leader never opened (no ticket), a truncated frame.

Then, with the attack still on, every learner is killed (``SIGKILL``): each must come back
(a new incarnation active and a push of it accepted). The job then runs to its budget
unattacked and its own records are audited (``runtime.audit``: tokens lost, batches twice
or lost, versions out of order).

Figures: tokens/s under attack over calm (goal >= 0.9), the probe's p99 under attack
(goal < 50 ms: the leader pinned to a core of its own, ``--pin``, the default with 2+
cores), refusals by kind (as counted by the leader and the followers), forged or replayed
requests the job accepted (goal 0), learners that came back (goal: all), tokens and
batches lost or twice (goal 0).

Run: ``.venv/bin/python benchmarks/hostile.py`` (``--window 20 --pairs 2``; ``--tiny``: one
short pair of windows, one learner killed: a harness check the tests run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import socket
import ssl
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _live import FOLLOWERS, LEARNERS, LiveJob
from _live import read_json as _json

STATUS = "/dipsjax.syncer.v1.Syncer/Status"


def _hostport(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def client_hello() -> bytes:
    """A real TLS ClientHello's bytes (made in memory: no connection)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


class Job(LiveJob):
    """The job under attack."""

    def __init__(self, base: Path, pushes: int, inner_steps: int) -> None:
        super().__init__(base, pushes, inner_steps, max_restarts=20)

    def decided_tokens(self) -> int:
        st = self.status() or {}
        books = st.get("tokens", {})
        return int(books.get("applied", 0) + books.get("rejected", 0))

    def pin(self) -> str:
        """The leader on the last core alone, every other process of the job (and this
        one) on the others; returns what was done."""
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            return "not pinned (one core)"
        pids = self.pids()
        others = set(cores[:-1])
        for role, pid in pids.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, {cores[-1]} if role == "leader" else others)
        os.sched_setaffinity(0, others)
        return f"leader on core {cores[-1]}, the rest on {sorted(others)}"

    def refused(self) -> Counter:
        """Refusals by kind: the leader's (``leader:KIND``) and the followers' data planes'
        (``follower:KIND``), from their own files."""
        out: Counter = Counter()
        for kind, n in ((self.status() or {}).get("refused") or {}).items():
            out[f"leader:{kind}"] += int(n)
        for k in range(FOLLOWERS):
            doc = _json(self.run / f"follower{k}" / "metrics.json") or {}
            for kind, n in (doc.get("refused") or {}).items():
                out[f"follower:{kind}"] += int(n)
        return out


class Probe:
    """Times the leader's ``Status`` (the job's credentials) every ``every`` seconds."""

    def __init__(self, spec: Any, every: float = 0.05) -> None:
        from dipsjax.runtime.client import ControlClient

        self.client = ControlClient(spec, learner=0)
        self.every = every
        self.samples: list[tuple[float, float]] = []  # (when, seconds)
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.client.status(timeout=5.0)
                self.samples.append((t0, time.monotonic() - t0))
            except Exception:
                self.failed += 1
            self.stop.wait(max(self.every - (time.monotonic() - t0), 0.0))

    def p99(self, spans: list[tuple[float, float]]) -> float:
        got = sorted(s for t, s in self.samples if any(a <= t < b for a, b in spans))
        if not got:
            return float("nan")
        return got[min(len(got) - 1, int(0.99 * len(got)))]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.client.close()


class Attack:
    """The storm (see the module docstring), started and stopped as a whole; counts what
    was sent and what the job did with it."""

    def __init__(self, job: Job, idle: int, half_open: int, rate: float) -> None:
        self.job, self.idle, self.half_open, self.rate = job, idle, half_open, rate
        self.sent: Counter = Counter()
        self.accepted: Counter = Counter()  # what should have been refused and was not
        self.replays_taken = 0  # replayed requests whose first copy the leader took
        self.errors: Counter = Counter()
        self.on = threading.Event()
        self.done = threading.Event()
        self.hello = client_hello()
        self.threads: list[threading.Thread] = []

    # -- targets ---------------------------------------------------------------------

    def targets(self) -> list[tuple[str, int]]:
        st = self.job.status() or {}
        out = [_hostport(self.job.spec.leader)]
        out += [_hostport(a) for a in (st.get("follower_addresses") or {}).values()]
        return out

    def data_planes(self) -> list[tuple[str, int]]:
        st = self.job.status() or {}
        return [_hostport(a) for a in (st.get("follower_addresses") or {}).values()]

    def start(self) -> None:
        for fn in (self._sockets, self._forged, self._frames):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self.threads.append(t)

    def close(self) -> None:
        self.on.clear()
        self.done.set()
        for t in self.threads:
            t.join(30)

    # -- idle sockets and half-open handshakes ---------------------------------------

    def _sockets(self) -> None:
        held: list[socket.socket] = []
        while not self.done.is_set():
            if not self.on.is_set():
                for s in held:
                    with contextlib.suppress(OSError):
                        s.close()
                held = []
                self.on.wait(0.2)
                continue
            targets = self.targets()
            # Sockets the server closed (a deadline, a cap) are opened again.
            alive = []
            for s in held:
                try:
                    s.setblocking(False)
                    gone = s.recv(1, socket.MSG_PEEK) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self.sent["closed_by_server"] += 1
                    s.close()
                else:
                    alive.append(s)
            held = alive
            want = self.idle + self.half_open
            while len(held) < want and self.on.is_set():
                i = self.sent["idle"] + self.sent["half_open"]
                address = targets[i % len(targets)]
                try:
                    s = socket.create_connection(address, timeout=2.0)
                except OSError:
                    self.errors["connect"] += 1
                    break
                if self.sent["half_open"] < self.half_open or i % 2:
                    with contextlib.suppress(OSError):
                        s.sendall(self.hello[: len(self.hello) // 2])
                    self.sent["half_open"] += 1
                else:
                    self.sent["idle"] += 1
                held.append(s)
                if len(held) % 20 == 0:
                    time.sleep(0.01)  # a storm, not a busy loop
            self.done.wait(0.5)
        for s in held:
            with contextlib.suppress(OSError):
                s.close()

    # -- forged and replayed requests ------------------------------------------------

    def _forged(self) -> None:
        import grpc

        from dipsjax.runtime.client import ControlClient, ControlError
        from dipsjax.syncer import messages as m

        spec = self.job.spec
        insider = ControlClient(spec, learner=0)
        raw_status = insider.channel.unary_unary(STATUS)
        n = 0
        while not self.done.is_set():
            if not self.on.wait(0.2):
                continue
            n += 1
            st = self.job.status() or {}
            incs = {int(j): v["incarnation"] for j, v in (st.get("learners") or {}).items()}
            meta = m.PushMeta(tokens=10**15, steps=10**9, base_version=0)
            forged = [
                ("unknown_learner_push", m.PushRequested(0.0, 99, meta)),
                ("unknown_learner_heartbeat", m.Heartbeat(0.0, 1234)),
            ]
            if incs:
                j = sorted(incs)[n % len(incs)]
                ghost = dataclasses.replace(meta, incarnation=incs[j] + 10**6, tokens=4096)
                forged.append(("ghost_incarnation_push", m.PushRequested(0.0, j, ghost)))
            for kind, event in forged:
                self.sent[kind] += 1
                try:
                    replies = insider.call(event, timeout=5.0)
                except ControlError:
                    continue  # refused with a reason: as it should be
                except grpc.RpcError as e:
                    if e.code() in (
                        grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.PERMISSION_DENIED,
                        grpc.StatusCode.FAILED_PRECONDITION,
                    ):
                        continue
                    self.errors[f"{kind}:{e.code().name}"] += 1
                    continue
                refused = insider.refused or any(isinstance(a, m.Refuse) for a in replies)
                if not refused:
                    self.accepted[kind] += 1
            # A replay: the very same numbered request twice (a live learner's heartbeat,
            # as its current incarnation): the second must be answered from the leader's
            # request log, not applied again (judged by the leader's ``repeat`` count).
            if incs:
                j = sorted(incs)[n % len(incs)]
                insider.incarnation = incs[j]
                env = insider.envelope(m.Heartbeat(0.0, j))
                taken = False
                for copy in range(2):
                    self.sent["replayed"] += 1
                    with contextlib.suppress(grpc.RpcError, ControlError):
                        insider.send(env, timeout=5.0)
                        if copy == 0:
                            # A first copy taken (not refused, e.g. as an older
                            # incarnation): its second must come back a ``repeat``...
                            taken = not insider.refused
                        elif insider.refused.startswith("old_incarnation:"):
                            # ...unless learner j restarted between the two copies (it
                            # is killed under attack): then the second is refused as an
                            # older incarnation's (counted so), not applied, no repeat.
                            taken = False
                self.replays_taken += taken
                insider.incarnation = 0
            # Bytes that do not decode (with the token: they pass its check).
            self.sent["garbage_status"] += 1
            try:
                raw_status(b"\xff\xfe garbage \x00" * 8, timeout=5.0, metadata=insider.metadata)
                self.accepted["garbage_status"] += 1
            except grpc.RpcError as e:
                if e.code() is not grpc.StatusCode.INVALID_ARGUMENT:
                    self.errors[f"garbage_status:{e.code().name}"] += 1
            # No credentials at all: a plain channel against the TLS port.
            if spec.tls:
                self.sent["no_credentials"] += 1
                ch = grpc.insecure_channel(spec.leader)
                try:
                    ch.unary_unary(STATUS)(b"", timeout=2.0)
                    self.accepted["no_credentials"] += 1
                except grpc.RpcError:
                    pass
                finally:
                    ch.close()
            self.done.wait(1.0 / self.rate)
        insider.close()

    # -- malformed frames ------------------------------------------------------------

    def _frames(self) -> None:
        from dipsjax.transport import dataplane as dp

        ctx = self.job.spec.ssl_client() if self.job.spec.tls else None
        overflow = dp.Header(dp.PUSH, codec="fp32", shape=(2**40, 2**40), payload_len=16)
        huge = dp.Header(dp.PUSH, codec="fp32", shape=(2**28,), tensor=10**6, payload_len=2**30)
        whole = {  # whole frames, sent with their bodies
            "unknown_learner": dp.Header(dp.PUSH, codec="fp32", shape=(4,), learner=99),
            "never_opened": dp.Header(dp.PUSH, codec="fp32", shape=(4,), round_id=10**9),
        }
        cases = {
            "bad_magic": b"XXXX" + b"\x00" * 120,
            "overflow_shape": _packed(overflow),
            "unknown_tensor_1gib": _packed(huge),
            **dict.fromkeys(whole),
            "truncated": _packed(dp.Header(dp.PUSH, codec="fp32", shape=(4,)))[:20],
        }
        n = 0
        while not self.done.is_set():
            if not self.on.wait(0.2):
                continue
            for address in self.data_planes():
                for kind, data in cases.items():
                    n += 1
                    self.sent[f"frame_{kind}"] += 1
                    try:
                        sock = socket.create_connection(address, timeout=5.0)
                        if ctx is not None:
                            sock = ctx.wrap_socket(sock, server_hostname=address[0])
                        with sock:
                            if data is None:
                                head = whole[kind]
                                dp.send_frame(sock, head, b"\x00" * 16)
                                dp.send_frame(sock, dp.Header(dp.END, learner=head.learner))
                            else:
                                sock.sendall(data)
                            if kind == "truncated":
                                continue
                            sock.settimeout(5.0)
                            header, _, _ = dp.read_frame(sock)
                            if header.kind == dp.ACK:
                                self.accepted[f"frame_{kind}"] += 1
                    except (OSError, ValueError):
                        pass  # closed or refused: as it should be
            self.done.wait(1.0 / self.rate)


def _packed(header: Any) -> bytes:
    """A header's bytes exactly as a sender frames it (its CRC included)."""
    return header.pack()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=20.0, help="seconds a window")
    parser.add_argument("--pairs", type=int, default=2, help="calm + attack window pairs")
    parser.add_argument("--idle", type=int, default=150, help="idle sockets held")
    parser.add_argument("--half-open", type=int, default=60, help="half-open handshakes held")
    parser.add_argument("--rate", type=float, default=10.0, help="forged bursts a second")
    parser.add_argument("--pushes", type=int, default=100, help="the budget, in full rounds")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="a harness check")
    args = parser.parse_args()
    if args.tiny:
        # 32 full rounds (96 pushes): a run measured had 60 pushes in when the killed
        # learner's new incarnation had a push accepted (40 rounds trained on for 60 more).
        args.window, args.pairs, args.idle, args.half_open, args.pushes = 4.0, 1, 20, 10, 32

    base = Path(tempfile.mkdtemp(prefix="dipsjax-hostile-"))
    job = Job(base, pushes=args.pushes, inner_steps=8)
    print(f"run: {job.run}", flush=True)
    try:
        ok = job.wait(lambda: (st := job.status()) is not None and st["version"] >= 2, 900)
        if not ok:
            raise SystemExit("the job never trained (see its logs)")
        print("pinning: " + ("off" if args.no_pin else job.pin()), flush=True)
        probe = Probe(job.spec)
        attack = Attack(job, args.idle, args.half_open, args.rate)
        attack.start()
        calm, hostile, spans = [], [], []
        for i in range(2 * args.pairs):
            on = i % 2 == 1
            (attack.on.set if on else attack.on.clear)()
            time.sleep(1.0 if on else 0.5)  # the storm builds (or leaves) first
            t0, n0 = time.monotonic(), job.decided_tokens()
            time.sleep(args.window)
            rate = (job.decided_tokens() - n0) / (time.monotonic() - t0)
            (hostile if on else calm).append(rate)
            if on:
                spans.append((t0, time.monotonic()))
            print(f"window {i}: {'attack' if on else 'calm'}: {rate:.0f} tokens/s", flush=True)
            if job.launcher.poll() is not None:
                raise SystemExit("the job ended during the windows: raise --pushes")
        # Every learner killed under attack must come back.
        attack.on.set()
        st = job.status() or {}
        before = {j: (v["incarnation"], v["accepted"]) for j, v in st["learners"].items()}
        victims = sorted(before)[:1] if args.tiny else sorted(before)
        pids = job.pids()
        for j in victims:
            with contextlib.suppress(ProcessLookupError, KeyError):
                os.kill(pids[f"learner{j}"], signal.SIGKILL)

        def back(j: str) -> bool:
            now = ((job.status() or {}).get("learners") or {}).get(j)
            return (
                now is not None
                and now["incarnation"] > before[j][0]
                and (now["accepted"] > before[j][1])
            )

        came_back = job.wait(lambda: all(back(j) for j in victims), 300)
        returned = sum(back(j) for j in victims)
        attack.close()
        probe.close()
        print(f"learners killed under attack: {len(victims)}, back: {returned}", flush=True)
        rc = job.launcher.wait(1800)
        # Read once the job ended: a repeat is answered from the request log without an
        # event, so the leader's status.json counts it only at its next write (read just
        # after the attack, one repeat could be missing and a replay judged taken).
        refused = job.refused()
        # Each replayed pair whose first copy was taken: its second must be a repeat.
        attack.accepted["replayed"] = max(0, attack.replays_taken - refused["leader:repeat"])
    finally:
        if job.launcher.poll() is None:
            job.launcher.send_signal(signal.SIGINT)
            job.launcher.wait(60)
    from dipsjax.launch.run import outcome
    from dipsjax.runtime.audit import audit

    got = audit(job.run, LEARNERS, FOLLOWERS)
    finished = rc == 0 and outcome(job.run) == 0
    print(f"sent: {dict(sorted(attack.sent.items()))}", flush=True)
    print(f"accepted: {dict(sorted(attack.accepted.items())) or 'nothing'}", flush=True)
    print(f"errors: {dict(sorted(attack.errors.items())) or 'none'}", flush=True)
    print(f"refused: {dict(sorted(refused.items()))}", flush=True)
    print(f"audit problems: {got['problems'] or 'none'}; finished: {finished}", flush=True)
    ratio = statistics.mean(hostile) / statistics.mean(calm) if min(calm) > 0 else 0.0
    for kind, n in sorted(refused.items()):
        name = kind.replace(":", "_").replace("-", "_")
        print(f"hostile_refused_{name}: {n} (goal: counted)")
    print(f"hostile_probe_failures: {probe.failed} (goal: 0)")
    print(f"hostile_accepted: {sum(attack.accepted.values())} (goal: 0)")
    print(f"hostile_learners_back: {returned / len(victims):.2f} (goal: 1.00)")
    print(f"hostile_run_finished: {int(finished and came_back)} (goal: 1)")
    lost = got["tokens_unbooked"] + got["tokens_unsettled"]
    print(f"hostile_tokens_lost: {lost} (goal: 0)")
    print(f"hostile_batches_lost_or_twice: {got['batches_lost'] + got['batches_twice']} (goal: 0)")
    print(f"hostile_control_p99_ms: {1000 * probe.p99(spans):.1f} (goal: < 50)")
    print(f"hostile_throughput_ratio: {ratio:.3f} (goal: >= 0.9)")


if __name__ == "__main__":
    main()
