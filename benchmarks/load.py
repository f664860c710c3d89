"""Load: 32 learner stand-ins push real tensors to 4 followers for many rounds; the
control plane's latency while the data plane is saturated, against the same calls idle.

A real leader, 4 real follower processes and 32 learner stand-ins
(:mod:`dipsjax.runtime.standin`: the learner's protocol with real BF16 tensors of the
model's shapes, no training), 8 to a process, over TLS. Stand-ins push again as soon as
they have pulled, so transfers run from the first push to the last pull. A probe in the
launcher's own, otherwise idle, process sends a heartbeat every 20 ms and times its round
trip (the leader's work included): for 3 s once the followers are up and before any
stand-in starts (the baseline, same run), then while the data plane is saturated (the
headline). The stand-ins time their own calls too; those include their wait for their
own process, busy with 8 stand-ins' encoding and TLS, so they are shown apart. It checks
that nothing was lost (the stand-ins' token count against the leader's books, every push
in one round) and ends with the figures.

Run: ``.venv/bin/python benchmarks/load.py`` (``--model small``, 3.3M parameters, by
default; ``--model tiny --pushes 64`` for a quick run; ``--tiny``: 2 stand-ins in 1
process, 2 followers, the tiny model, 4 pushes, a 1 s baseline, a harness check whose
figures mean nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--learners", type=int, default=32)
    parser.add_argument("--followers", type=int, default=4)
    parser.add_argument("--model", default="small")
    parser.add_argument("--pushes", type=int, default=320, help="token budget, in pushes")
    parser.add_argument("--groups", type=int, default=4, help="stand-in processes")
    parser.add_argument("--method", default="dips")
    parser.add_argument(
        "--leader-core",
        action="store_true",
        help="the leader (and the probe) on a core of their own, the rest on the others",
    )
    parser.add_argument("--nice", type=int, default=0, help="niceness of all but the leader")
    parser.add_argument("--tiny", action="store_true", help="a harness check (see above)")
    args = parser.parse_args()
    idle = {}  # seconds of the idle baseline: launch_load's default (3 s)
    if args.tiny:
        args.learners, args.followers, args.model, args.pushes, args.groups = 2, 2, "tiny", 4, 1
        idle = dict(idle_seconds=1.0)

    from dipsjax.launch.run import make_spec
    from dipsjax.runtime.standin import launch_load
    from dipsjax.sim.config import SimConfig
    from dipsjax.syncer.tape import EventTape

    base = SimConfig()
    per_push = base.inner_steps * base.batch_size * base.seq_len
    sim = dataclasses.replace(
        base,
        method=args.method,
        model=args.model,
        learners=args.learners,
        followers=args.followers,
        token_budget=args.pushes * per_push,
    )
    run_dir = Path(tempfile.mkdtemp(prefix="dipsjax-load-")) / "run"
    spec = make_spec(sim, run_dir)
    print(f"{args.learners} stand-ins, {len(spec.followers)} followers, {args.model}; {run_dir}")
    out = launch_load(
        spec, groups=args.groups, timeout=1800, leader_core=args.leader_core, nice=args.nice, **idle
    )
    stats = list(out["standins"].values())
    books = out["status"]["tokens"]
    tape = EventTape.read(run_dir / "tape.jsonl")
    rounds = tape.round_records()
    in_rounds = sum(len(r.participants) + len(r.dropped) for r in rounds)
    lost = abs(sum(s["reported"] for s in stats) - books["reported"]) + abs(
        books["reported"] - books["applied"] - books["rejected"] - books["dropped"]
    )
    pushed = sum(s["pushes"] for s in stats)
    shapes = json.loads((run_dir / "shapes.json").read_text())
    model_bytes = 2 * sum(int(np.prod(s)) for s in shapes)  # BF16 on the wire
    moved = model_bytes * (pushed + sum(s["pulls"] for s in stats))

    def pct(kind: str | None, busy: bool | None) -> tuple[int, float, float]:
        xs = [
            dt
            for k, dt, b in out["samples"]
            if (kind is None or k == kind) and (busy is None or b == busy)
        ]
        if not xs:
            return 0, float("nan"), float("nan")
        return len(xs), 1e3 * np.percentile(xs, 50), 1e3 * np.percentile(xs, 99)

    print(
        f"rounds {len(rounds)}, applied {sum(r.applied for r in rounds)}, pushes {pushed} "
        f"(in the tape: {in_rounds}), refused {sum(s['refused'] for s in stats)}"
    )
    start = min(s["span"][0] for s in stats)
    end = max(s["span"][1] for s in stats)
    print(
        f"data plane: {moved / 1e9:.2f} GB in the {end - start:.1f} s from the first push "
        f"to the last pull ({moved / (end - start) / 1e9:.2f} GB/s through the followers)"
    )
    print(f"tokens: stand-ins {sum(s['reported'] for s in stats)}, leader {books}")
    print("stand-ins' own control-plane round trips (ms): calls, p50, p99")
    for kind in (None, "Heartbeat", "PushRequested", "TransferDone", "PullDone"):
        for busy in (False, True):
            n, p50, p99 = pct(kind, busy)
            where = "transfer in flight" if busy else "no transfer in flight"
            print(f"  {kind or 'all calls':14s} {where:22s} {n:6d} {p50:7.2f} {p99:7.2f}")
    idle = [dt for ph, _, dt in out["probe"] if ph == "idle"]
    busy = [dt for ph, t, dt in out["probe"] if ph == "load" and start <= t <= end]
    print(f"probe heartbeats (ms): calls, p50, p99; saturated for {end - start:.0f} s")
    for name, xs in (("idle (baseline)", idle), ("data plane saturated", busy)):
        print(
            f"  {name:22s} {len(xs):6d} {1e3 * np.median(xs):7.2f} "
            f"{1e3 * np.percentile(xs, 99):7.2f}"
        )
    print(f"control_plane_p99_ms_idle: {1e3 * np.percentile(idle, 99):.1f} (goal: < 50)")
    print(f"control_plane_p99_ms_saturated: {1e3 * np.percentile(busy, 99):.1f} (goal: < 50)")
    print(f"load_tokens_lost: {lost} (goal: 0)")
    print(f"load_pushes_outside_a_round: {pushed - in_rounds} (goal: 0)")


if __name__ == "__main__":
    main()
