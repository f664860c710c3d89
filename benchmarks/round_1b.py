"""One full outer round of the 1B-parameter model as processes, within this host's memory.

The ``llama3.2-1b`` config (1.24B parameters, 146 tensors) with the runtime's own leader
process, 2 follower processes (half the model each, FP32 shard and Nesterov state, Di-PS's
outer chain, a version cache of 1) and 2 learner stand-ins: processes that speak the real
protocol (join, pull version 0, push request, the leader's transfer plan, data-plane push
of real BF16 tensors, transfer done, pull notice, pull of the new version) without training
(a 1B model's inner steps do not fit beside the followers in 24 GB). The followers start
from zeros (initializing the model in every process would not fit either) and do not
checkpoint (``RunSpec.checkpoints=False``: the round alone is timed) unless
``--checkpoints``: then each follower journals the round's inputs (its half of both pushes,
BF16, synced to disk before it reports its merge) and the step's ``Apply``, and starts its
checkpoint (FP32 shard and Nesterov state) after it reports the step, written while the
round's pull goes on (checkpoints off the critical path, issue 21). Stand-ins pull in
BF16 and drop each tensor as it arrives.

Phases come from the leader's event tape: push (window closed to every transfer done),
update (transfers done to every follower applied: norms, decision, merge, clip, apply),
pull (applied to every stand-in pulled). Baseline in the same run: the paper's production
table (100B model over a 25 Gbps network, Di-PS sec. 16) is printed beside them. Memory:
the sum of every process's resident set, sampled every 0.2 s; the run is stopped if it
goes over ``--max-gb`` GiB (default 23.2, this host has 23.5). The two followers share this
host, so they take turns at their outer-step computations (``compute_in_turns``): the
update phase is both followers' norms, merge and apply one after the other.

Run: ``.venv/bin/python benchmarks/round_1b.py`` (a few minutes; ``--model small`` to try
the harness quickly, ``--tiny`` (the tiny model) to check it in seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PAPER = {  # Di-PS sec. 16: mean seconds of push / update / pull per production cluster
    "A": (195, 110, 135),
    "B": (193, 110, 134),
    "C": (60, 110, 67),
    "D": (86, 110, 80),
    "E": (116, 110, 121),
}


def stand_in(spec_path: str, j: int) -> None:
    """A learner stand-in: the protocol with real tensors, no training."""
    import ml_dtypes
    import numpy as np

    from dipsjax.runtime.client import ControlClient, in_parallel, model_shapes
    from dipsjax.runtime.spec import RunSpec, address
    from dipsjax.syncer import messages as m
    from dipsjax.transport.dataplane import DataPlaneClient

    spec = RunSpec.read(spec_path)
    shapes = list(model_shapes(spec).values())
    control = ControlClient(spec, learner=j)
    clients = [
        DataPlaneClient(address(a), timeout=600, ssl_context=spec.ssl_client())
        for a in spec.followers
    ]
    actions: queue.Queue = queue.Queue()

    def watch() -> None:
        for a in control.watch():
            actions.put(a)

    threading.Thread(target=watch, daemon=True).start()

    def wait_for(kind: type):
        while True:
            a = actions.get(timeout=900)
            if isinstance(a, m.Stop):
                raise SystemExit(0)
            if isinstance(a, kind):
                return a

    def parallel(fn) -> None:
        in_parallel(fn, range(len(clients)))

    received = [0] * len(clients)

    def pull(version: int) -> float:
        t0 = time.perf_counter()

        def one(k: int) -> None:
            def sink(tensor: int, x) -> None:
                received[k] += x.nbytes

            v, _ = clients[k].pull(version, codec="bf16", sink=sink)
            assert v == version, (v, version)

        parallel(one)
        control.call(m.PullDone(0.0, j, version))
        return time.perf_counter() - t0

    times: dict[str, float] = {}
    control.call(m.Join(0.0, j))
    times["pull_v0"] = pull(wait_for(m.SendModel).version)
    # Both stand-ins push into one round: wait until both have pulled (a file barrier).
    (Path(spec.run_dir) / f"ready{j}").touch()
    while not all((Path(spec.run_dir) / f"ready{k}").exists() for k in range(spec.sim.learners)):
        time.sleep(0.1)
    # Real BF16 pseudo-gradient-sized tensors: views of one random block (no per-tensor cost).
    rng = np.random.default_rng(j)
    largest = max(int(np.prod(s)) for s, _ in shapes)
    block = (rng.standard_normal(largest, np.float32) * 1e-3).astype(ml_dtypes.bfloat16)
    tokens = spec.sim.inner_steps * spec.sim.batch_size * spec.sim.seq_len
    meta = m.PushMeta(
        tokens=tokens, steps=spec.sim.inner_steps, base_version=0, train_seconds=1.0, pulled=True
    )
    control.call(m.PushRequested(0.0, j, meta))
    plan = wait_for(m.PushShards)
    t0 = time.perf_counter()

    def push(k: int) -> None:
        layers = [tr.layer for tr in plan.transfers if tr.follower == k]
        tensors = ((i, block[: int(np.prod(shapes[i][0]))].reshape(shapes[i][0])) for i in layers)
        ticket = bytes.fromhex(plan.ticket)  # the leader's grant, checked by the followers
        clients[k].push(plan.round_id, j, 0, 0, tensors, codec="bf16", ticket=ticket)

    parallel(push)
    times["push"] = time.perf_counter() - t0
    control.call(m.TransferDone(0.0, j, plan.round_id))
    t0 = time.perf_counter()
    notice = wait_for(m.NotifyPull)
    times["wait_for_update"] = time.perf_counter() - t0
    times["pull"] = pull(notice.version)
    times["pulled_bytes"] = sum(received)
    out = Path(spec.run_dir) / f"standin{j}.json"
    out.write_text(json.dumps(times))
    with contextlib.suppress(SystemExit, queue.Empty):
        wait_for(m.Stop)


def _rss_gb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama3.2-1b")
    parser.add_argument("--max-gb", type=float, default=23.2, help="GiB; stop above it")
    parser.add_argument("--stand-in", nargs=2, metavar=("SPEC", "J"), help=argparse.SUPPRESS)
    parser.add_argument("--tiny", action="store_true", help="the tiny model: a harness check")
    parser.add_argument(
        "--checkpoints",
        action="store_true",
        help="followers journal the round and checkpoint the new version after reporting it",
    )
    args = parser.parse_args()
    if args.tiny:
        args.model = "tiny"
    if args.stand_in:
        stand_in(args.stand_in[0], int(args.stand_in[1]))
        return

    import numpy as np

    from dipsjax.launch.core import role_job
    from dipsjax.launch.local import Local
    from dipsjax.launch.run import free_port
    from dipsjax.runtime.client import model_shapes
    from dipsjax.runtime.credentials import create as create_credentials
    from dipsjax.runtime.spec import RunSpec
    from dipsjax.sim.config import SimConfig
    from dipsjax.syncer.schedule import assign_layers
    from dipsjax.syncer.tape import EventTape

    sim = SimConfig(
        method="dips",
        model=args.model,
        learners=2,
        followers=2,
        version_cache=1,
        grace="fixed",  # a long window that closes as soon as both stand-ins are in
        grace_seconds=1200.0,
        token_budget=2 * 16 * 8 * 64,  # one round of both stand-ins
    )
    run_dir = Path(tempfile.mkdtemp(prefix="round_1b-"))
    probe = RunSpec(sim, "", (), "", str(run_dir), (), 0)
    shapes = model_shapes(probe)
    sizes = [4 * int(np.prod(s)) for s, _ in shapes.values()]
    params = sum(sizes) // 4
    spec = RunSpec(
        sim=sim,
        leader=f"127.0.0.1:{free_port()}",
        followers=tuple(f"127.0.0.1:{free_port()}" for _ in range(2)),
        credentials=str(create_credentials(run_dir / "credentials").directory),
        run_dir=str(run_dir),
        layer_owner=assign_layers(sizes, 2),
        num_chunks=1000,
        heartbeat_interval=30.0,
        checkpoints=args.checkpoints,
        compute_in_turns=True,  # one follower's update temporaries at a time in 24 GB
    )
    spec.write(run_dir / "spec.json")
    print(f"{args.model}: {params / 1e6:,.1f}M parameters in {len(sizes)} tensors; run {run_dir}")
    procs = Local(spec)
    peak = 0.0
    t0 = time.monotonic()
    try:
        procs.start(role_job("leader"))
        for k in range(2):
            procs.start(role_job("follower", k), "--init", "zeros")
        for j in range(2):
            procs.procs[f"standin{j}"] = subprocess.Popen(
                [sys.executable, __file__, "--stand-in", str(run_dir / "spec.json"), str(j)],
                stdout=(procs.logs / f"standin{j}.log").open("w"),
                stderr=subprocess.STDOUT,
                env=dict(os.environ, JAX_PLATFORMS="cpu"),
            )
        last = 0.0
        while procs.procs["leader"].poll() is None:
            time.sleep(0.2)
            rss = _rss_gb([p.pid for p in procs.procs.values()])
            peak = max(peak, rss)
            each = {n: _rss_gb([p.pid]) for n, p in procs.procs.items()}
            if rss > args.max_gb:
                raise MemoryError(
                    f"processes hold {rss:.1f} GiB > --max-gb {args.max_gb}: "
                    + ", ".join(f"{n} {g:.1f}" for n, g in each.items())
                )
            if procs.failed():
                raise RuntimeError(f"{procs.failed()} failed; see {procs.logs}")
            if time.monotonic() - last > 10:
                last = time.monotonic()
                per = " ".join(f"{n}={g:.1f}" for n, g in each.items())
                print(f"[{last - t0:5.0f}s] {rss:.1f} GiB (peak {peak:.1f}): {per}", flush=True)
            if time.monotonic() - t0 > 1500:
                raise TimeoutError("the round did not finish in 25 minutes")
    finally:
        procs.stop(timeout=30)
    (rnd,) = EventTape.read(run_dir / "tape.jsonl").round_records()
    tm = rnd.timings
    phases = {
        "push": tm["transfers_done"] - tm["closed"],
        "update": tm["applied"] - tm["transfers_done"],
        "pull": tm["ended"] - tm["applied"],
    }
    stand = [json.loads((run_dir / f"standin{j}.json").read_text()) for j in range(2)]
    wire_gb = params * 2 / 1e9
    print(f"round {rnd.round_id}: version {rnd.version}, applied {rnd.applied}")
    print("phase    this host (s)   paper's production clusters A-E (s, 100B, 25 Gbps)")
    for i, name in enumerate(("push", "update", "pull")):
        paper = " / ".join(str(v[i]) for v in PAPER.values())
        print(f"{name:7s}  {phases[name]:13.1f}   {paper}")
    for j, st in enumerate(stand):
        print(
            f"stand-in {j}: initial pull {st['pull_v0']:.1f} s, push {st['push']:.1f} s "
            f"({wire_gb / st['push']:.2f} GB/s), pull {st['pull']:.1f} s"
        )
    applies = []
    for k in range(2):
        path = run_dir / f"follower{k}" / "apply_seconds.jsonl"
        applies.append(json.loads(path.read_text().splitlines()[-1])["seconds"])
    print("followers' outer step (apply) alone: " + ", ".join(f"{a:.1f} s" for a in applies))
    if args.checkpoints:  # the new version's checkpoints, written after the round's report
        ckpts = [
            sorted(p.name for p in (run_dir / f"follower{k}" / "ckpt").iterdir()) for k in range(2)
        ]
        print(f"followers' checkpoints on disk after the run: {ckpts}")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"round_1b_peak_resident_gib: {peak:.1f} (goal: < {total:.1f}, this host's memory)")
    print(f"round_1b_push_s: {phases['push']:.1f} (goal: paper 60-195 at 100B)")
    print(f"round_1b_update_s: {phases['update']:.1f} (goal: paper 110 at 100B)")
    print(f"round_1b_pull_s: {phases['pull']:.1f} (goal: paper 67-135 at 100B)")


if __name__ == "__main__":
    main()
