"""What a run's console and ``dipsjax status`` show besides the leader's status: each
learner's phase and the validation of the versions the evaluator has seen.

* ``RUN_DIR/learner{j}/phase.json``: ``{"phase", "since", "incarnation", "rounds"}``,
  written whole by learner ``j`` as its phase changes: ``starting`` (the process is up,
  building its model), ``compiling`` (before it can join:
  its steps compile for tens of seconds), ``waiting to join`` (a late learner), then the
  protocol's state (``joining``, ``pulling``, ``training``, ``requesting``, ``pushing``,
  ``waiting``, ``holding``) and ``exited``.
* ``RUN_DIR/eval.jsonl``: one line per version the evaluator
  (:mod:`dipsjax.runtime.evaluator`) validated: ``{"version", "tokens", "val_loss",
  "val_bpb", "t", "time", "seconds"}`` and ``val_<name>`` for each of the task's other
  figures (its ``eval_metrics``, e.g. ``val_accuracy``).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dipsjax.runtime.spec import write_json

EVAL_FILE = "eval.jsonl"
#: The order the console lists phases in.
PHASES = (
    "starting",
    "compiling",
    "waiting to join",
    "idle",
    "joining",
    "pulling",
    "training",
    "requesting",
    "pushing",
    "waiting",
    "holding",
    "exited",
)


def phase_path(run_dir: str | Path, j: int) -> Path:
    return Path(run_dir) / f"learner{j}" / "phase.json"


def write_phase(run_dir: str | Path, j: int, phase: str, **extra: Any) -> None:
    """Learner ``j``'s phase, whole (readers never see half a file)."""
    path = phase_path(run_dir, j)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"phase": phase, "since": time.time(), **extra})


def read_phases(run_dir: str | Path, learners: int) -> dict[int, dict[str, Any]]:
    """Each learner's phase file (learners without one yet are left out)."""
    out = {}
    for j in range(learners):
        try:
            out[j] = json.loads(phase_path(run_dir, j).read_text())
        except (OSError, ValueError):
            continue
    return out


def phase_counts(phases: dict[int, dict[str, Any]], learners: int) -> str:
    """``learners: 2 compiling, 1 training, 1 waiting`` (``not started`` for learners
    without a phase file yet)."""
    counts = Counter(str(p.get("phase", "?")) for p in phases.values())
    missing = learners - len(phases)
    if missing > 0:
        counts["not started"] += missing
    order = {name: i for i, name in enumerate(("not started", *PHASES))}
    parts = sorted(counts.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    return "learners: " + ", ".join(f"{n} {name}" for name, n in parts)


def read_validation(run_dir: str | Path) -> list[dict[str, Any]]:
    """The evaluator's lines of ``RUN_DIR/eval.jsonl``, oldest first (a line being
    written is skipped)."""
    try:
        text = (Path(run_dir) / EVAL_FILE).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def other_figures(point: dict[str, Any]) -> dict[str, float]:
    """A point's ``val_<name>`` figures besides ``val_loss`` and ``val_bpb`` (a task's own
    ``eval_metrics``, e.g. ``val_accuracy``), in the order written."""
    return {
        k: v
        for k, v in point.items()
        if k.startswith("val_") and k not in ("val_loss", "val_bpb") and isinstance(v, int | float)
    }


def validation_text(points: list[dict[str, Any]]) -> str:
    """``val_loss 3.2101 (4.631 bpb) at version 8`` (``val_loss 0.4012, val_accuracy 0.9375
    at version 8`` for a task with its own figures) for the newest point, or ``""``."""
    if not points:
        return ""
    p = points[-1]
    bpb = p.get("val_bpb")  # NaN (or absent) for a task that is not a language model
    extra = f" ({bpb:.3f} bpb)" if isinstance(bpb, int | float) and math.isfinite(bpb) else ""
    extra += "".join(f", {k} {v:.4f}" for k, v in other_figures(p).items())
    return f"val_loss {p['val_loss']:.4f}{extra} at version {p['version']}"
