"""Writes colabs/goodput.ipynb (kept as code so reviews see plain Python): run
``python colabs/_build_goodput.py`` from the repository root (colabs/_colab.py adds the
Colab badge and install cell, and formats the notebook)."""

from _colab import write

cells = [
    (
        "md",
        """# Goodput at chip scale: data parallelism against decoupled learners

At 10^5-10^6 chips, interruptions are no longer rare events: with a per-chip mean time
between interruptions (MTBI) of one year, a 1.2M-chip fleet sees one every 26 seconds.
*Goodput* is the share of the fleet's chip-time that turns into training progress, after
removing the time stalled in detection and recovery, the work lost and redone, and
checkpoint writes. `dipsjax.sim.goodput` models it for three ways of running one job:

| method | failure domain | on an interruption |
|---|---|---|
| `checkpoint_dp` | the whole job | every process restarts and reads the last checkpoint (written every Young/Daly interval) |
| `elastic_dp` | the whole job | the job drops the failed slice and switches to a pre-compiled smaller mesh; the in-flight step is lost |
| `decoupled_m<M>` | one of `M` learners of `chips / M` chips | only that learner stalls and reloads its weights; the others keep training and the syncer never waits for it |

Interruptions are a Poisson process over the fleet. A stalled domain absorbs further
interruptions while it plans its new mesh; one during the commit that follows restarts the
recovery. The module computes each goodput twice: a Monte-Carlo over a horizon of days, and
a steady-state closed form. The recovery times are derived from stated assumptions
(heartbeats, model bytes, reload and checkpoint bandwidth, relaunch time), listed below;
`dipsjax goodput --help` exposes each as a flag.

This notebook prints the chip-scale table (150k, 1.2M, 2.4M chips), then draws goodput
against the chip count, against the failure rate and against the number of partitions.
It runs in seconds; the test suite runs it with a shorter horizon
(`DIPSJAX_NOTEBOOK_TINY=1`).""",
    ),
    (
        "code",
        """import dataclasses
import json
import os
import pathlib

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, Markdown, display

from dipsjax.sim import goodput as gp

# Tiny settings (the test suite's): 2 simulated days instead of 30, fewer curve points.
TINY = os.environ.get("DIPSJAX_NOTEBOOK_TINY") == "1"
OUT = pathlib.Path(os.environ.get("DIPSJAX_NOTEBOOK_OUT", "runs/colabs")) / "goodput"
OUT.mkdir(parents=True, exist_ok=True)
DAYS = 2.0 if TINY else 30.0
SEED = 0
CHIPS = [gp.parse_count(c) for c in ("150k", "1.2M", "2.4M")]
METHODS = gp.DEFAULT_METHODS  # checkpoint_dp, elastic_dp, decoupled_m8, decoupled_m16
POINTS = 6 if TINY else 16  # Monte-Carlo points per curve (the closed form is drawn densely)
print("methods", METHODS, "| horizon", DAYS, "days | seed", SEED)""",
    ),
    (
        "md",
        """## 1. The assumptions and the recovery times they imply

Every time in the model comes from these (the defaults of `RecoveryAssumptions`; the
`source` column says which are the papers' and which are ours).""",
    ),
    (
        "code",
        """rows = ["| assumption | value | source |", "|---|---:|---|"]
for f in dataclasses.fields(gp.RecoveryAssumptions):
    rows.append(f"| `{f.name}` | {getattr(gp.DEFAULT_ASSUMPTIONS, f.name):g} | {f.metadata['doc']} |")
rows += ["", "| derived time | seconds |", "|---|---:|"]
rows += [f"| `{k}` | {v:.3g} |" for k, v in gp.DEFAULT_ASSUMPTIONS.times().items()]
display(Markdown("\\n".join(rows)))
for label in METHODS:
    method, learners = gp.parse_method(label)
    r = gp.GoodputParams(chips=1_200_000, method=method, learners=learners).recovery()
    print(f"{label:>14} at 1.2M chips: absorb {r.absorb_s:5.1f} s, commit {r.commit_s:5.1f} s, "
          f"work {r.work_s:5.1f} s between saved states, save {r.overhead_s:4.1f} s")""",
    ),
    (
        "md",
        """## 2. The chip-scale table

Monte-Carlo goodput over the horizon, with the closed form beside it, and the global
downtime: the time during which nothing trains (the DP job is down, or all `M` learners are
stalled at once). The same table comes from the command line:
`dipsjax goodput --chips 150k 1.2M 2.4M` (printed below too).""",
    ),
    (
        "code",
        """results = {}
for label in METHODS:
    method, learners = gp.parse_method(label)
    for n in CHIPS:
        params = gp.GoodputParams(chips=n, method=method, learners=learners, horizon_days=DAYS, seed=SEED)
        results[label, n] = gp.goodput(params)

rows = ["| chips | MTBF of the fleet | " + " | ".join(METHODS) + " |", "|---:|---:|" + "---:|" * len(METHODS)]
for n in CHIPS:
    mtbf = gp.GoodputParams(chips=n).mtbf_cluster_s
    cells = [f"{results[lab, n].percent:.1f}% [{results[lab, n].analytic_percent:.1f}]" for lab in METHODS]
    rows.append(f"| {gp.format_count(n)} | {mtbf:.1f} s | " + " | ".join(cells) + " |")
rows += ["", "Global downtime over the horizon (hours):", "",
         "| chips | " + " | ".join(METHODS) + " |", "|---:|" + "---:|" * len(METHODS)]
for n in CHIPS:
    rows.append(f"| {gp.format_count(n)} | "
                + " | ".join(f"{results[lab, n].global_downtime_s / 3600:.3g}" for lab in METHODS) + " |")
display(Markdown("Goodput, Monte-Carlo [closed form]:\\n\\n" + "\\n".join(rows)))

table = {
    "days": DAYS,
    "seed": SEED,
    "chips": CHIPS,
    "methods": list(METHODS),
    "percent": {lab: {str(n): results[lab, n].percent for n in CHIPS} for lab in METHODS},
    "analytic_percent": {lab: {str(n): results[lab, n].analytic_percent for n in CHIPS} for lab in METHODS},
    "global_downtime_s": {lab: {str(n): results[lab, n].global_downtime_s for n in CHIPS} for lab in METHODS},
}""",
    ),
    (
        "code",
        """gp.main(["--chips", *map(gp.format_count, CHIPS), "--days", f"{DAYS:g}", "--seed", str(SEED)])""",
    ),
    (
        "md",
        """## 3. Goodput against the number of chips

Lines: the closed form; markers: the Monte-Carlo; stars: the Decoupled DiLoCo paper's
anchors (elastic DP 58% and M = 8 / 16 at 88% / 93% at 1.2M chips, elastic DP about 40% at
2.4M; the paper has no checkpoint/restart figure). What to look for: both DP variants are
one failure domain, so their goodput falls as the fleet's MTBF shrinks below the recovery
time; checkpoint/restart falls fastest (a minute of relaunch and a checkpoint read per
interruption). `M` decoupled learners each see `M` times fewer interruptions, and nobody
waits for a stalled one.""",
    ),
    (
        "code",
        """PAPER = {("elastic_dp", 1_200_000): 58, ("decoupled_m8", 1_200_000): 88,
         ("decoupled_m16", 1_200_000): 93, ("elastic_dp", 2_400_000): 40}
COLORS = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
dense = np.unique(np.geomspace(10_000, 2_400_000, 60).astype(int))
coarse = np.unique(np.geomspace(10_000, 2_400_000, POINTS).astype(int))
curves = {"chips": {}, "failure_rate": {}, "partitions": {}}

fig, ax = plt.subplots(figsize=(7, 4.2))
for label in METHODS:
    method, learners = gp.parse_method(label)
    closed = [gp.analytic_goodput(gp.GoodputParams(chips=int(n), method=method, learners=learners)) for n in dense]
    mc = [gp.goodput(chips=int(n), method=method, learners=learners, horizon_days=DAYS, seed=SEED).percent
          for n in coarse]
    curves["chips"][label] = {"chips": coarse.tolist(), "percent": mc}
    ax.plot(dense, closed, color=COLORS[label], label=label)
    ax.plot(coarse, mc, "o", ms=4, color=COLORS[label])
for (label, n), pct in PAPER.items():
    ax.plot(n, pct, "*", ms=13, color=COLORS[label], markeredgecolor="k")
ax.set_xscale("log")
ax.set_xlabel("chips")
ax.set_ylabel("goodput (%)")
ax.set_ylim(0, 100)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "goodput_vs_chips.png", dpi=100)
plt.close(fig)
display(Image(filename=str(OUT / "goodput_vs_chips.png")))""",
    ),
    (
        "md",
        """## 4. Goodput against the failure rate

At 1.2M chips, the per-chip interruption rate (1 / MTBI) from one every 8 years to 4 a
year. The interruption rate of a failure domain is what matters, so doubling the per-chip
rate is, for each method, the same as doubling its chip count: look at how much more
slowly the decoupled curves fall, and at how little room checkpoint/restart has.""",
    ),
    (
        "code",
        """rates = np.geomspace(1 / 8, 4, POINTS)  # interruptions per chip per year
dense_rates = np.geomspace(1 / 8, 4, 60)
fig, ax = plt.subplots(figsize=(7, 4.2))
for label in METHODS:
    method, learners = gp.parse_method(label)
    common = dict(chips=1_200_000, method=method, learners=learners)
    closed = [gp.analytic_goodput(gp.GoodputParams(mtbi_years=1 / r, **common)) for r in dense_rates]
    mc = [gp.goodput(mtbi_years=1 / r, horizon_days=DAYS, seed=SEED, **common).percent for r in rates]
    curves["failure_rate"][label] = {"per_chip_per_year": rates.tolist(), "percent": mc}
    ax.plot(dense_rates, closed, color=COLORS[label], label=label)
    ax.plot(rates, mc, "o", ms=4, color=COLORS[label])
ax.axvline(1.0, color="gray", ls="--", lw=1)
ax.set_xscale("log", base=2)
ax.set_xlabel("interruptions per chip per year (1 / MTBI); dashed: the paper's 1")
ax.set_ylabel("goodput (%) at 1.2M chips")
ax.set_ylim(0, 100)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "goodput_vs_failure_rate.png", dpi=100)
plt.close(fig)
display(Image(filename=str(OUT / "goodput_vs_failure_rate.png")))""",
    ),
    (
        "md",
        """## 5. Goodput against the number of partitions

Decoupled DiLoCo with `M` = 1 to 64 learners at 150k, 1.2M and 2.4M chips (elastic DP as a
dashed line at the same chip count). Left: goodput; right: the global downtime over the
horizon (closed form, log scale), the time all `M` learners are stalled at once. One
learner (`M` = 1) is one failure domain again, and pays the learner's slower recovery
(weights reloaded from elsewhere) without elastic DP's quick rescale; each doubling of `M`
halves every learner's interruption rate, and the chance that all of them are down at once
falls like a power of `M`.""",
    ),
    (
        "code",
        """ms = [1, 2, 4, 8, 16, 32, 64]
FLOOR = 1e-9  # hours (3.6 microseconds): smaller global downtimes are drawn on this line
fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
for n, color in zip(CHIPS, ("C0", "C1", "C3"), strict=True):
    mc, down = [], []
    for m in ms:
        params = gp.GoodputParams(chips=n, method="decoupled", learners=m, horizon_days=DAYS, seed=SEED)
        mc.append(gp.goodput(params).percent)
        down.append(gp.analytic(dataclasses.replace(params, horizon_days=30.0))[1] / 3600)
    curves["partitions"][str(n)] = {"learners": ms, "percent": mc, "global_downtime_h_30d": down}
    ax.plot(ms, mc, "o-", color=color, label=f"decoupled, {gp.format_count(n)} chips")
    ax.axhline(results["elastic_dp", n].percent, color=color, ls="--", lw=1)
    ax2.plot(ms, np.maximum(down, FLOOR), "o-", color=color, label=f"{gp.format_count(n)} chips")
ax.set_xscale("log", base=2)
ax.set_xlabel("learners M (dashed: elastic DP)")
ax.set_ylabel("goodput (%)")
ax.set_ylim(0, 100)
ax.legend(fontsize=8)
ax2.set_xscale("log", base=2)
ax2.set_yscale("log")
ax2.axhline(1 / 3600, color="gray", ls=":", lw=1)
ax2.set_ylim(FLOOR / 3, None)
ax2.set_xlabel("learners M (dotted: one second; bottom: below 1e-9 h)")
ax2.set_ylabel("hours with nothing training, per 30 days")
ax2.legend(fontsize=8)
for a in (ax, ax2):
    a.grid(alpha=0.3, which="both")
fig.tight_layout()
fig.savefig(OUT / "goodput_vs_partitions.png", dpi=100)
plt.close(fig)
display(Image(filename=str(OUT / "goodput_vs_partitions.png")))
(OUT / "goodput.json").write_text(json.dumps({**table, "curves": curves}, indent=1))""",
    ),
    (
        "md",
        """## 6. What this run says

Read from the results above.""",
    ),
    (
        "code",
        """big, top = 1_200_000, CHIPS[-1]
pct = {k: r.percent for k, r in results.items()}
lines = [
    f"- At {gp.format_count(big)} chips (one interruption every "
    f"{gp.GoodputParams(chips=big).mtbf_cluster_s:.0f} s): "
    + ", ".join(f"`{lab}` {pct[lab, big]:.1f}%" for lab in METHODS)
    + " (paper: " + ", ".join(f"{lab} {v}%" for (lab, n), v in PAPER.items() if n == big) + ").",
    f"- At {gp.format_count(top)} chips: "
    + ", ".join(f"`{lab}` {pct[lab, top]:.1f}%" for lab in METHODS)
    + " (paper: " + ", ".join(f"{lab} about {v}%" for (lab, n), v in PAPER.items() if n == top) + ").",
    f"- Decoupled M = 16 keeps {pct['decoupled_m16', top] / pct['elastic_dp', top]:.1f}x elastic DP's "
    f"goodput at {gp.format_count(top)} chips, and {pct['decoupled_m16', CHIPS[0]] - pct['elastic_dp', CHIPS[0]]:+.1f} "
    f"points at {gp.format_count(CHIPS[0])}.",
    "- Monte-Carlo against closed form, largest gap in the table: "
    f"{max(abs(r.percent - r.analytic_percent) for r in results.values()):.2f} points "
    f"({DAYS:g} simulated days).",
]
for n in CHIPS:
    m8 = results["decoupled_m8", n]
    lines.append(f"- Global downtime at {gp.format_count(n)} chips over {DAYS:g} days: elastic DP "
                 f"{results['elastic_dp', n].global_downtime_s / 3600:.1f} h, M = 8 "
                 f"{m8.global_downtime_s:.1f} s (closed form {m8.analytic_global_downtime_s:.2g} s).")
part = curves["partitions"][str(big)]
best = max(zip(part["percent"], part["learners"], strict=True))
lines.append(f"- Against M at {gp.format_count(big)} chips: M = 1 gives {part['percent'][0]:.1f}% "
             f"(elastic DP {pct['elastic_dp', big]:.1f}%), the best M here is {best[1]} with {best[0]:.1f}%.")
display(Markdown("\\n".join(lines)))""",
    ),
    (
        "md",
        """What the model leaves out (module docstring): correlated outages (racks, power
domains), failures of the syncer or the checkpoint store, spare capacity, and any speed
difference between the methods other than interruptions. The checkpoint/restart row is
this library's own baseline, not the paper's; its level rests mostly on the assumed 60 s
relaunch and 1 TB/s checkpoint bandwidth (try `--job-relaunch-s` and
`--checkpoint-gb-per-s`).""",
    ),
]

write("goodput", cells)
