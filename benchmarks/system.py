"""System: aggregate learner tokens/s with the full syncer (leader, 2 followers, gRPC and
the data plane) against the same learners with no outer communication, in the same run.

Four learner processes train the ``small`` model (3.3M parameters; ``--model tiny`` for
the tiny one) with ``H = 64`` inner steps, pinned to the cores as ``dipsjax run`` pins
them. Each learner's throughput is the tokens it trained over the seconds from the start of
its first round to the end of its last; the aggregate is their sum. Baseline: the same
processes training the same number of rounds alone (``--solo``).
Two modes: learners that wait for their pull (Di-PS) and learners that keep training
(Decoupled DiLoCo, K=1, adding the global change). On 2 cores the leader's and followers'
work competes with the learners for the CPU, which a cluster does not have to.

Added time (Decoupled DiLoCo's figure; Di-PS seed 000 sec. 14): from the run's tape, each
learner's share of its time not spent training, push to pull, grace and transfers
included: ``1 - sum(train_seconds) / span``, where a push's ``train_seconds`` is the wall
time of the round it reports and the span runs from the start of the learner's first
reported round to its last push (:func:`added_time`). Sharing 2 cores slows training and
syncing alike, so the share is less distorted here than the tokens ratio. What a round
spends not training is mostly fixed costs (the leader's round, the transfers, adopting the
pull, leasing the data), printed in seconds a round: they grow more slowly than a round's
compute with the model, so they are a larger share of the tiny model's 1.6 s round than of
the ``small`` model's 27 s one (on these cores), itself far shorter than the papers' rounds
of hours.

Run: ``.venv/bin/python benchmarks/system.py`` (about 16 minutes on two cores; ``--rounds 3``
for a quicker run; ``--tiny`` checks the harness only: the tiny model, 1 learner, 1
follower, H = 4, 1 round, no checkpoints, one
compilation cache for every process, small programs included; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _aggregate(run_dir: Path, learners: int) -> float:
    total = 0.0
    for j in range(learners):
        stats = json.loads((run_dir / f"learner{j}" / "stats.json").read_text())
        if not stats["seconds"]:  # the others used the budget up before it trained a round
            print(f"  learner {j} of {run_dir.name} trained no round", flush=True)
            continue
        total += stats["tokens"] / stats["seconds"]
    return total


def _where(run_dir: Path, learners: int) -> dict[str, float]:
    """Seconds summed over learners (span, training compute) and CPU seconds by role."""
    stats = [
        json.loads((run_dir / f"learner{j}" / "stats.json").read_text()) for j in range(learners)
    ]
    out = {
        "span": sum(s["seconds"] for s in stats),
        "compute": sum(s["compute_seconds"] for s in stats),
        "learner_cpu": sum(s["cpu_seconds"] for s in stats),
        "tokens": sum(s["tokens"] for s in stats),
    }
    syncer = [run_dir / "leader" / "cpu.json", *sorted(run_dir.glob("follower*/cpu.json"))]
    out["syncer_cpu"] = sum(json.loads(p.read_text())["cpu_seconds"] for p in syncer if p.exists())
    return out


def _idle(tape_path: Path) -> dict[int, tuple[float, float, int]]:
    """Per learner, from every push the tape holds (applied, rejected or dropped): seconds
    not training, its span and its pushes (see the module docstring)."""
    from dipsjax.syncer.tape import EventTape

    pushes: dict[int, list[tuple[float, float]]] = {}
    for r in EventTape.read(tape_path).round_records():
        for p in r.participants + r.dropped:
            pushes.setdefault(p.learner, []).append((p.pushed_at, p.meta.train_seconds))
    out = {}
    for j, xs in sorted(pushes.items()):
        xs.sort()
        span = xs[-1][0] - (xs[0][0] - xs[0][1])
        out[j] = (span - sum(t for _, t in xs), span, len(xs))
    return out


def added_time(tape_path: Path) -> dict[int, float]:
    """Each learner's share of its span not spent training (see the module docstring), from
    every push the tape holds (applied, rejected or dropped), by learner."""
    return {j: idle / span if span > 0 else 0.0 for j, (idle, span, _) in _idle(tape_path).items()}


def idle_per_round(tape_path: Path) -> dict[int, float]:
    """Each learner's seconds not training between one round and the next
    (``added_time``'s numerator over the ``n - 1`` gaps between its ``n`` pushes: its span
    starts when its first round does): the fixed cost a round carries, whatever its length."""
    return {j: idle / (n - 1) if n > 1 else 0.0 for j, (idle, _, n) in _idle(tape_path).items()}


def _solo(spec, rounds: int) -> float:
    cores = sorted(os.sched_getaffinity(0))
    procs = []
    for j in range(spec.sim.learners):
        cmd = [
            sys.executable,
            "-m",
            "dipsjax.runtime.learner",
            str(Path(spec.run_dir) / "spec.json"),
            str(j),
            "--solo",
            str(rounds),
        ]
        p = subprocess.Popen(cmd, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        os.sched_setaffinity(p.pid, {cores[j % len(cores)]})
        procs.append(p)
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("a solo learner failed")
    return _aggregate(Path(spec.run_dir), spec.sim.learners)


def main() -> None:
    from dipsjax.launch.run import launch, make_spec
    from dipsjax.sim.config import SimConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per learner")
    parser.add_argument(
        "--checkpoints", choices=("on", "off"), default="on", help="roles checkpoint as they go"
    )
    parser.add_argument(
        "--model",
        default="small",
        help="the learners' model config (default small: 3.3M parameters, rounds about 15x as "
        "long as the tiny model's on these cores, so a round's fixed costs weigh less, as in "
        "the papers' long rounds)",
    )
    parser.add_argument("--tiny", action="store_true", help="a harness check (see above)")
    args = parser.parse_args()
    m, f, h = 4, 2, 64
    if args.tiny:
        m, f, h, args.rounds, args.checkpoints, args.model = 1, 1, 4, 1, "off", "tiny"
        # Every process of both modes (and the solo learners) shares one compilation cache,
        # which keeps every program (by default only those that took a second to compile).
        cache = tempfile.mkdtemp(prefix="dipsjax-sys-cache-")
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", cache)
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    budget = m * args.rounds * h * 8 * 64
    modes = {
        "waiting": dict(method="dips"),
        "overlap": dict(method="decoupled", quorum=1, overlap=True, adopt="delta"),
    }
    ratios, added = {}, {}
    for name, kw in modes.items():
        sim = SimConfig(
            learners=m, followers=f, inner_steps=h, token_budget=budget, model=args.model, **kw
        )
        synced = make_spec(sim, Path(tempfile.mkdtemp(prefix=f"dipsjax-sys-{name}-")))
        synced = dataclasses.replace(synced, checkpoints=args.checkpoints == "on")
        launch(synced, progress=False, evaluate=False)
        with_sync = _aggregate(Path(synced.run_dir), m)
        shares = added_time(Path(synced.run_dir) / "tape.jsonl")
        idle = idle_per_round(Path(synced.run_dir) / "tape.jsonl")
        added[name] = max(shares.values())
        print(
            f"{name}: added time (not training, push to pull) by learner: "
            + ", ".join(f"{j}: {s:.2%} ({idle[j]:.3f} s a round)" for j, s in shares.items()),
            flush=True,
        )
        alone = make_spec(sim, Path(tempfile.mkdtemp(prefix="dipsjax-solo-")))
        alone.write(Path(alone.run_dir) / "spec.json")
        without = _solo(alone, args.rounds)
        ratios[name] = with_sync / without
        print(
            f"{name}: {with_sync:.0f} tokens/s with the syncer, {without:.0f} alone "
            f"= {ratios[name]:.3f}",
            flush=True,
        )
        a, b = _where(Path(synced.run_dir), m), _where(Path(alone.run_dir), m)
        print(
            f"  where the time went (summed over learners): span {a['span']:.1f} s with the "
            f"syncer vs {b['span']:.1f} s alone; training compute {a['compute']:.1f} vs "
            f"{b['compute']:.1f} s ({a['compute'] / a['tokens'] * 1e6:.0f} vs "
            f"{b['compute'] / b['tokens'] * 1e6:.0f} us/token); learners' CPU "
            f"{a['learner_cpu']:.1f} vs {b['learner_cpu']:.1f} s; leader + followers' CPU "
            f"{a['syncer_cpu']:.1f} s",
            flush=True,
        )
    print(f"(model {args.model}, H = {h}, {m} learners, {args.rounds} rounds each)")
    print(f"system_tokens_ratio_waiting: {ratios['waiting']:.3f} (goal: >= 0.94)")
    print(f"system_tokens_ratio_overlap: {ratios['overlap']:.3f} (goal: >= 0.99)")
    print(f"system_added_time_waiting: {added['waiting']:.4f} (goal: <= 0.06, the worst learner)")
    print(f"system_added_time_overlap: {added['overlap']:.4f} (goal: <= 0.01, the worst learner)")


if __name__ == "__main__":
    main()
