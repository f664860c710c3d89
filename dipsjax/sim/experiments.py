"""``dipsjax simulate CONFIG``: run an experiment (a list of simulations) and write its results.

An experiment config is a Python file (or the name of a config shipped in
:mod:`dipsjax.configs`, e.g. ``sim_eta``) whose ``get_config(arg)``
returns an ``ml_collections.ConfigDict`` with ``name``, ``base`` (SimConfig fields shared by
every run) and ``runs`` (a list of dicts: each run's ``label`` and the fields it changes).
The command writes, under ``--out`` (default ``runs/NAME`` in the current folder):

* ``metrics.json`` -- one summary per run (aggregate tokens/s, effective tokens, rejected
  fraction, outer communication time, per-phase breakdown, validation curve);
* ``tape_LABEL.jsonl`` -- the event tape of each run with a syncer;
* ``loss_vs_time.png``, ``loss_vs_tokens.png`` -- validation loss of every run;

and prints a table of the headline numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from dipsjax.sim.simulator import SimConfig, SimResult, simulate


def load_experiment(name_or_path: str, arg: str | None = None) -> Any:
    """Loads a config, shipped (``NAME``: ``dipsjax/configs/NAME.py``) or your own (a path
    to a ``.py`` file), and returns its ``get_config(arg)``."""
    from dipsjax import configs

    path = configs.path(name_or_path)
    spec = importlib.util.spec_from_file_location(f"dipsjax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.path.insert(0, str(path.parent))  # a config of yours may import its neighbours
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    if not hasattr(module, "get_config"):
        raise ValueError(f"{path} has no get_config()")
    return module.get_config(arg) if arg is not None else module.get_config()


def expand(config: Any) -> list[tuple[str, SimConfig]]:
    """``[(label, SimConfig)]`` of an experiment config, validated (errors name the run)."""
    from dipsjax.launch.schema import TOP, ConfigError, validate_sim

    TOP["name"]("name", config.get("name"))  # the output folder's name: runs/NAME
    base = dict(config.get("base", {}))
    out = []
    for i, run in enumerate(config.runs):
        fields = dict(run)
        label = fields.pop("label", f"run{i}")
        merged = {**base, **fields}
        for key in ("bandwidth_gbps", "speeds", "failures", "joins", "leaves"):
            if key in merged:
                merged[key] = tuple(
                    tuple(x) if isinstance(x, list | tuple) else x for x in merged[key]
                )
        # Every field's rule and the cross-field rules (dipsjax.launch.schema), up front:
        # the error names the run and the field (runs[i].FIELD).
        try:
            out.append((label, validate_sim(merged, "simulate", where=f"runs[{i}]")))
        except ConfigError as e:
            context = f"experiment {config.name}, run {label!r}: "
            raise ConfigError(e.field, e.allowed, e.value, context) from None
    return out


def _plot(results: list[tuple[str, SimResult]], out: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, xlabel, fname in (
        ("t", "virtual time (s)", "loss_vs_time.png"),
        ("tokens_consumed", "tokens consumed", "loss_vs_tokens.png"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, res in results:
            xs = [p[key] for p in res.curve]
            ys = [p["val_loss"] for p in res.curve]
            ax.plot(xs, ys, marker="o", ms=3, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        paths.append(out / fname)
    return paths


def run_experiment(config: Any, out: pathlib.Path, *, quiet: bool = False) -> dict[str, Any]:
    """Runs every simulation of an experiment; writes metrics, tapes and plots."""
    runs = expand(config)
    out.mkdir(parents=True, exist_ok=True)
    results: list[tuple[str, SimResult]] = []
    summaries: dict[str, Any] = {}
    for label, cfg in runs:
        t0 = time.perf_counter()
        if not quiet:
            print(f"[{label}] {cfg.method}, {cfg.learners} learners, eta={cfg.eta}", flush=True)
        res = simulate(
            cfg,
            progress=None if quiet else (lambda s, lb=label: print(f"  [{lb}] {s}", flush=True)),
        )
        results.append((label, res))
        summary = res.summary()
        summary["curve"] = res.curve
        summary["wall_seconds"] = time.perf_counter() - t0
        summaries[label] = summary
        if res.tape is not None:
            res.tape.write(out / f"tape_{label}.jsonl")
    (out / "metrics.json").write_text(
        json.dumps({"name": config.name, "runs": summaries}, indent=1)
    )
    _plot(results, out)
    if not quiet:
        _table(config.name, summaries)
    return summaries


def _table(name: str, summaries: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"experiment {name}")
    for col in (
        "run",
        "method",
        "virtual s",
        "tokens/s",
        "effective",
        "rejected",
        "comm s",
        "val loss",
        "scaling",
    ):
        table.add_column(col, justify="right")
    # The task's own figures (its eval_metrics: final_val_accuracy, ...), one column each.
    own = list(
        dict.fromkeys(
            k
            for s in summaries.values()
            for k in s
            if k.startswith("final_val_") and k not in ("final_val_loss", "final_val_bpb")
        )
    )
    for key in own:
        table.add_column(key.removeprefix("final_").replace("_", " "), justify="right")
    for label, s in summaries.items():
        table.add_row(
            label,
            s["method"],
            f"{s['virtual_time']:.0f}",
            f"{s['tokens_per_second']:.0f}",
            str(s["effective_tokens"]),
            f"{s['rejected_fraction']:.1%}",
            f"{s['outer_comm_time']:.0f}",
            f"{s['final_val_loss']:.4f}",
            f"{s['scaling_efficiency']:.1%}",
            *(f"{s[k]:.4f}" if k in s else "-" for k in own),
        )
    Console().print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dipsjax simulate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="a shipped config's name (e.g. sim_eta) or a path")
    parser.add_argument("--arg", default=None, help="argument passed to get_config (e.g. 'small')")
    parser.add_argument("--out", default=None, help="output folder (default ./runs/NAME)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        config = load_experiment(args.config, args.arg)
        expand(config)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    out = pathlib.Path(args.out) if args.out else pathlib.Path("runs") / config.name
    run_experiment(config, out, quiet=args.quiet)
    print(f"wrote {out}/metrics.json, tapes and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
