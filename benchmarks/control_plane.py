"""Control plane: heartbeat and decision latency, p50/p99, with the data plane idle and
saturated, in the same run.

A real leader process (gRPC, asyncio) serves a benchmark client that plays one learner and
one follower through whole rounds of control messages (push request, transfer plan,
transfers done, norms, decision, merged norm, apply, pull notice), measuring the time from
the follower's ``FollowerNorms`` to the ``Decide`` on its watch stream (a decision), and
``Heartbeat`` round trips. The same is measured again while two other processes saturate
the data plane (one pushing a 100M-parameter BF16 model to a follower's data-plane server
over and over).

Run: ``.venv/bin/python benchmarks/control_plane.py`` (``--tiny``: 3 rounds and 20
heartbeats each, a 2M-parameter model saturating; a harness check whose figures mean
nothing).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def _saturate(stop, started, tensors: int = 50) -> None:
    """Child: a data-plane server and a client pushing 100M parameters in a loop."""
    from dipsjax.transport import dataplane as dp

    model = {i: np.ones(2_000_000, np.float32) for i in range(tensors)}
    server = dp.DataPlaneServer(lambda *a: None, lambda v: (0, {}))
    client = dp.DataPlaneClient(server.address)
    started.set()
    n = 0
    while not stop.is_set():
        client.push(n, 0, 0, 0, model.items())
        n += 1
    server.close()


def _measure(
    spec, incarnation: int, rounds: int = 60, beats: int = 300
) -> tuple[list[float], list[float]]:
    from dipsjax.runtime.client import ControlClient
    from dipsjax.syncer import messages as m

    learner = ControlClient(spec, learner=0)
    follower = ControlClient(spec, follower=0)
    actions = {"learner": queue.Queue(), "follower": queue.Queue()}

    def watch(client, name):
        import grpc

        try:  # the learner's stream as this incarnation: the leader routes by it
            for a in client.watch(incarnation if name == "learner" else 0):
                actions[name].put((time.perf_counter(), a))
        except grpc.RpcError:  # closed at the end of the measurement
            return

    for client, name in ((learner, "learner"), (follower, "follower")):
        threading.Thread(target=watch, args=(client, name), daemon=True).start()

    def wait(name, kind):
        while True:
            t, a = actions[name].get(timeout=30)
            if isinstance(a, kind):
                return t, a

    learner.call(m.Join(0.0, 0, incarnation=incarnation, fingerprint=spec.fingerprint))
    _, send = wait("learner", m.SendModel)
    learner.call(m.PullDone(0.0, 0, send.version))
    decisions, heartbeats = [], []
    version = send.version
    for _ in range(rounds):
        meta = m.PushMeta(tokens=8192, steps=16, base_version=version, incarnation=incarnation)
        learner.call(m.PushRequested(0.0, 0, meta))
        _, plan = wait("learner", m.PushShards)
        learner.call(m.TransferDone(0.0, 0, plan.round_id, incarnation=incarnation))
        _, req = wait("follower", m.RequestNorms)
        t0 = time.perf_counter()
        follower.call(m.FollowerNorms(0.0, 0, req.round_id, (1.0,)))
        t1, decide = wait("follower", m.Decide)
        decisions.append(t1 - t0)
        follower.call(m.FollowerMerged(0.0, 0, decide.round_id, 0.5))
        _, apply = wait("follower", m.Apply)
        follower.call(m.FollowerApplied(0.0, 0, apply.round_id, apply.version))
        _, notify = wait("learner", m.NotifyPull)
        version = notify.version
        learner.call(m.PullDone(0.0, 0, version))
    for _ in range(beats):
        t0 = time.perf_counter()
        learner.call(m.Heartbeat(0.0, 0))
        heartbeats.append(time.perf_counter() - t0)
        time.sleep(0.005)
    learner.close()  # the next measurement's clients are the only ones watching
    follower.close()
    return decisions, heartbeats


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q))


def main() -> None:
    import argparse

    from dipsjax.launch.run import make_spec
    from dipsjax.sim.config import SimConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a harness check (see above)")
    args = parser.parse_args()
    size = dict(rounds=3, beats=20) if args.tiny else {}
    run_dir = Path(tempfile.mkdtemp(prefix="dipsjax-cp-"))
    # The clients beat only when they measure heartbeats: a long interval, so that the
    # leader does not evict them for their silence meanwhile.
    spec = make_spec(
        SimConfig(method="sync_diloco", learners=1, followers=1, token_budget=10**12),
        run_dir,
        heartbeat_interval=600.0,
    )
    spec.write(run_dir / "spec.json")
    leader = subprocess.Popen(
        [sys.executable, "-m", "dipsjax.runtime.leader", str(run_dir / "spec.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    results = {}
    try:
        results["idle"] = _measure(spec, incarnation=0, **size)
        ctx = mp.get_context("spawn")
        stop, started = ctx.Event(), ctx.Event()
        hog = ctx.Process(target=_saturate, args=(stop, started, 1 if args.tiny else 50))
        hog.daemon = True
        hog.start()
        started.wait(120)
        time.sleep(0.2 if args.tiny else 1.0)
        results["saturated"] = _measure(spec, incarnation=1, **size)
        stop.set()
        hog.join(30)
    finally:
        leader.terminate()
        leader.wait(10)
    for name, (decisions, beats) in results.items():
        print(
            f"{name:9s} decision p50 {_pct(decisions, 50):6.2f} ms  p99 "
            f"{_pct(decisions, 99):6.2f} ms | heartbeat p50 {_pct(beats, 50):6.2f} ms  p99 "
            f"{_pct(beats, 99):6.2f} ms  (median {statistics.median(beats) * 1000:.2f})"
        )
    dec, beats = results["saturated"]
    print(f"control_decision_p99_ms_saturated: {_pct(dec, 99):.1f} (goal: < 50)")
    print(f"control_heartbeat_p99_ms_saturated: {_pct(beats, 99):.1f} (goal: < 50)")


if __name__ == "__main__":
    main()
