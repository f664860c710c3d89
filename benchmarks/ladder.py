"""The tuning ladder (issue 20): each method's outer learning rate x momentum (and clip) at
M learners and H inner steps, against data parallel with its own inner learning rate tuned,
at equal tokens, over several seeds, on the simulator's fixed validation set.

Every run is one :func:`dipsjax.sim.simulator.simulate` of the tiny language model for
``--rounds`` outer rounds' worth of tokens (``M * H * batch * seq_len`` a round; data
parallel gets the same token budget). Runs go to ``OUT/results.jsonl`` as they finish, one
line each, and a second invocation skips what is there: the ladder is resumable, and
several invocations with other ``--methods`` or ``--m`` fill the same table. Runs execute
in ``--workers`` processes, each pinned to its own core.

The summary, per method, M and H: the best (outer lr, momentum[, clip]) by mean final
bits per byte over the seeds, its spread, and its gap to the best data-parallel run of the
same M and tokens; the table goes to ``OUT/ladder.md`` and the plot to ``OUT/ladder.png``
(``--report-all``: of every result in ``OUT``, all invocations so far, one row per
method, M, H, rounds and eta).

Run: ``.venv/bin/python benchmarks/ladder.py --out runs/ladder`` (the whole grid: hours on
two cores); ``--tiny`` for the form the tests run (two rounds, one seed, M in {1, 2}).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METHODS = {
    # label: SimConfig fields (besides the ladder's axes)
    "sync_diloco": dict(method="sync_diloco", deal_chunks=True),
    "dips": dict(method="dips"),
    "decoupled_k1": dict(method="decoupled", quorum=1),
    "decoupled_km": dict(method="decoupled", quorum=0),  # quorum 0: K = M (set per run)
}
BASE = dict(model="tiny", batch_size=8, seq_len=64, inner_lr=3e-3, step_noise=0.05)


def grid(args: argparse.Namespace) -> list[dict]:
    """Every run of the ladder, as SimConfig keyword arguments plus its labels."""
    runs = []
    for m, h, seed in itertools.product(args.m, args.h, range(args.seeds)):
        tokens = args.rounds * m * h * BASE["batch_size"] * BASE["seq_len"]
        common = dict(BASE, learners=m, inner_steps=h, token_budget=tokens, seed=seed, eta=args.eta)
        for lr in args.dp_lr:
            runs.append(
                dict(label="dp", axes=dict(inner_lr=lr), cfg=dict(common, method="dp", inner_lr=lr))
            )
        for label in args.methods:
            fields = dict(METHODS[label])
            if fields.get("quorum") == 0:
                fields["quorum"] = m
            for lr, mom, clip in itertools.product(args.outer_lr, args.outer_momentum, args.clip):
                cfg = dict(common, **fields, outer_lr=lr, outer_momentum=mom, outer_clip=clip)
                axes = dict(outer_lr=lr, outer_momentum=mom, outer_clip=clip or "method")
                runs.append(dict(label=label, axes=axes, cfg=cfg))
    return runs


def key(run: dict) -> str:
    return json.dumps({"label": run["label"], "cfg": run["cfg"]}, sort_keys=True)


def _one(run: dict) -> dict:
    from dipsjax.sim.config import SimConfig
    from dipsjax.sim.simulator import simulate

    t0 = time.perf_counter()
    res = simulate(SimConfig(**run["cfg"]))
    return dict(
        key=key(run),
        label=run["label"],
        axes=run["axes"],
        m=run["cfg"]["learners"],
        h=run["cfg"]["inner_steps"],
        seed=run["cfg"]["seed"],
        tokens=int(res.tokens_applied if run["label"] != "dp" else run["cfg"]["token_budget"]),
        bpb=float(res.final_bpb),
        loss=float(res.final_loss),
        rounds=int(res.rounds),
        virtual_time=float(res.virtual_time),
        seconds=time.perf_counter() - t0,
    )


def _init_worker(cores: list[int]) -> None:
    import multiprocessing

    ident = multiprocessing.current_process()._identity
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cores[(ident[0] - 1) % len(cores)] if ident else cores[0]})


def run_all(runs: list[dict], out: Path, workers: int, every: bool = False) -> list[dict]:
    """Runs what ``out/results.jsonl`` does not hold yet; returns the results of ``runs``
    (``every``: every result the file holds)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["key"]] = r
    todo = [r for r in runs if key(r) not in done]
    print(
        f"ladder: {len(runs)} runs, {len(runs) - len(todo)} done before, {len(todo)} to run",
        flush=True,
    )
    if todo:
        import multiprocessing

        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        ctx = multiprocessing.get_context("spawn")
        with (
            ctx.Pool(max(1, workers), initializer=_init_worker, initargs=(cores,)) as pool,
            path.open("a") as f,
        ):
            for i, r in enumerate(pool.imap_unordered(_one, todo), 1):
                f.write(json.dumps(r) + "\n")
                f.flush()
                done[r["key"]] = r
                print(
                    f"ladder: [{i}/{len(todo)}] {r['label']} M={r['m']} H={r['h']} {r['axes']} "
                    f"seed {r['seed']}: {r['bpb']:.4f} bpb ({r['seconds']:.0f} s)",
                    flush=True,
                )
    wanted = {key(r) for r in runs}
    return [r for k, r in done.items() if every or k in wanted]


def _stats(xs: list[float]) -> tuple[float, float]:
    mean = sum(xs) / len(xs)
    spread = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return mean, spread


def _cell(r: dict) -> tuple:
    """A result's cell: ``(label, M, H, rounds, eta)``, its rounds the outer rounds' worth
    of tokens its run had."""
    cfg = json.loads(r["key"])["cfg"]
    per_round = cfg["learners"] * cfg["inner_steps"] * cfg["batch_size"] * cfg["seq_len"]
    return (r["label"], r["m"], r["h"], round(cfg["token_budget"] / per_round), cfg["eta"])


def summarize(results: list[dict]) -> dict[tuple, dict]:
    """Per (label, M, H, rounds, eta): the best setting by mean bpb over seeds, and the gap
    to DP of the same cell (the same tokens)."""
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        cells[_cell(r)][json.dumps(r["axes"], sort_keys=True)].append(r["bpb"])
    best = {}
    for cell, settings in cells.items():
        ranked = sorted(((*_stats(v), k, len(v)) for k, v in settings.items()), key=lambda x: x[0])
        mean, spread, axes, n = ranked[0]
        best[cell] = dict(mean=mean, spread=spread, axes=json.loads(axes), seeds=n)
    for (label, m, h, rounds, eta), b in best.items():
        dp = best.get(("dp", m, h, rounds, eta))
        b["gap"] = (b["mean"] / dp["mean"] - 1.0) if dp and label != "dp" else 0.0
    return best


def write_report(best: dict[tuple, dict], out: Path) -> None:
    lines = [
        "| method | M | H | rounds | eta | best setting | bpb (mean +- sd, seeds) | gap to DP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (label, m, h, rounds, eta), b in sorted(best.items()):
        setting = ", ".join(f"{k} {v}" for k, v in b["axes"].items())
        lines.append(
            f"| {label} | {m} | {h} | {rounds} | {eta:g} | {setting} | {b['mean']:.4f} +- "
            f"{b['spread']:.4f} ({b['seeds']}) | {100 * b['gap']:+.1f}% |"
        )
    (out / "ladder.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    lowest = min(c[4] for c in best)  # the plot shows the least heterogeneous cells
    for label in sorted({c[0] for c in best} - {"dp"}):
        for h, rounds, eta in sorted({c[2:] for c in best if c[0] == label and c[4] == lowest}):
            ms = sorted(c[1] for c in best if c[0] == label and c[2:] == (h, rounds, eta))
            ax.plot(
                ms,
                [100 * best[(label, m, h, rounds, eta)]["gap"] for m in ms],
                marker="o",
                label=f"{label} H={h}, {rounds} rounds, eta {eta:g}",
            )
    ax.set_xlabel("learners M")
    ax.set_ylabel("gap to tuned DP at equal tokens (%)")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "ladder.png", dpi=120)


def runner_args(p: argparse.ArgumentParser, out: str, tiny: str) -> None:
    """The arguments every script on this runner takes (``quality.py`` too)."""
    p.add_argument("--out", type=Path, default=Path(out))
    p.add_argument("--tiny", action="store_true", help=tiny)
    p.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2,
    )
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runner_args(p, "runs/ladder", "the tests' form: 2 rounds, 1 seed, M 1 and 2")
    p.add_argument("--eta", type=float, default=0.0, help="step-time heterogeneity (percent)")
    p.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--h", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--outer-lr", type=float, nargs="+", default=[0.4, 0.7, 1.0])
    p.add_argument("--outer-momentum", type=float, nargs="+", default=[0.0, 0.8, 0.9])
    p.add_argument("--clip", nargs="+", default=[""], help="outer_clip values ('' the method's)")
    p.add_argument("--dp-lr", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    p.add_argument(
        "--report-all",
        action="store_true",
        help="write ladder.md and ladder.png from every result in OUT, not only this grid's",
    )
    args = p.parse_args(argv)
    if args.tiny:
        args.rounds, args.seeds, args.m, args.h = 2, 1, [1, 2], [2]
        args.methods, args.outer_lr, args.outer_momentum, args.dp_lr = (
            ["sync_diloco"],
            [1.0],
            [0.0],
            [3e-3],
        )
    runs = grid(args)
    results = run_all(runs, args.out, args.workers)
    best = summarize(results)
    if args.report_all:  # every invocation's results so far: the whole table and plot
        write_report(summarize(run_all([], args.out, args.workers, every=True)), args.out)
    else:
        write_report(best, args.out)
    gaps: dict[tuple[str, int], float] = {}  # the best H of each method and M
    for (label, m, *_), b in best.items():
        if label != "dp":
            gaps[(label, m)] = min(b["gap"], gaps.get((label, m), math.inf))
    print(f"ladder_runs: {len(results)} (goal: {len(runs)})")
    for m in (1, 4):
        if ("sync_diloco", m) in gaps:
            goal = "<= 0.01" if m == 1 else "<= 0.04"
            print(f"ladder_sync_diloco_gap_m{m}: {gaps[('sync_diloco', m)]:.4f} (goal: {goal})")
    return 0 if len(results) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
