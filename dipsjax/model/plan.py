"""Memory plans for the named configurations (``dipsjax plan``), computed without memory.

Each row builds the model abstractly (``nnx.eval_shape``), counts its parameters ``N`` and
sizes, in decimal GB (1e9 bytes, the unit of Di-PS seed 000 sec. 1 "FP32 100B = 400 GB"):

* ``params_fp32`` = 4N: one FP32 copy of the model (the master weights; also one full
  model on the wire in FP32, the paper's 400 GB for 100B);
* ``adamw`` = 8N: the inner AdamW moments ``m`` and ``v`` in FP32;
* ``learner`` = 16N: what one learner partition holds between steps, FP32 master weights +
  FP32 gradients + AdamW moments (spread over its devices by the ``data``/``model`` mesh);
* ``learner_peak``: what a learner process holds at the peak of an inner step, the one
  memory model of ``plan``, ``dipsjax run --dry-run`` and the learner's own log
  (:func:`learner_memory`: 32N in the runtime, whose step does not donate its inputs);
* ``outer`` = 8N: the FP32 outer state a syncer keeps, global parameters ``theta`` + Nesterov
  momentum (spread over the followers, seed 000 sec. 5);
* ``wire_bf16`` = 2N: one pseudo-gradient or model pull in BF16 on the wire (sec. 12).

The paper's estimate for the 100B model (sec. 5) is ~1600 GB for the outer model and
optimizer state plus >= 400 GB of receive buffers (>= 2000 GB in all), i.e. ~16 bytes per
parameter; our minimal FP32 ``theta`` + momentum is 8 bytes per parameter (829 GB for
``dips-100b``), the same order of magnitude, and the paper's 16 B/param equals our
``learner`` column (an Adam-style state). ``plan --paper`` prints that comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from flax import nnx

from dipsjax.model.configs import CONFIG_NAMES, ModelConfig, get_config
from dipsjax.model.llama import abstract_model, count_params

GB = 1e9


def learner_memory(num_params: int, *, donate: bool = False) -> dict[str, int]:
    """Bytes a learner holds at the peak of an inner step, by part (FP32 master weights):

    * ``weights`` 4N, ``adamw`` 8N (``m`` and ``v``), ``reference`` 4N (the round's start,
      which the pseudo-gradient is taken from), held between steps;
    * ``gradients`` 4N, made by the step;
    * ``step_outputs`` 12N: the step's new weights and AdamW state, beside its inputs,
      unless it donates them (``donate``; the runtime's learner does not).

    Activations, XLA's scratch and the process's own memory (JAX, the data) come on top.
    Measured on this CPU for a 135M-parameter model (``benchmarks/learner_memory.py``):
    see docs/benchmarks.md.
    """
    n = int(num_params)
    parts = {"weights": 4 * n, "adamw": 8 * n, "reference": 4 * n, "gradients": 4 * n}
    if not donate:
        parts["step_outputs"] = 12 * n
    return parts


def follower_memory(
    shard_params: int, *, learners: int, wire_bytes: float, version_cache: int
) -> dict[str, int]:
    """Bytes a follower holds for its shard of ``shard_params`` values, by part: the FP32
    shard and the outer state (``theta`` + Nesterov momentum, 8 bytes a value), the older
    versions it keeps to serve pulls (4 bytes each), and one round's pushes staged at wire
    precision from every learner."""
    n = int(shard_params)
    return {
        "outer_state": 8 * n,
        "version_cache": 4 * n * (version_cache - 1),
        "staged_pushes": learners * int(wire_bytes * n),
    }


#: Di-PS seed 000 sec. 5: outer model + optimizer state for the 100B model, bytes.
PAPER_100B_OUTER_BYTES = 1600 * GB
#: Di-PS seed 000 sec. 5: receive buffers for the 100B model, bytes (lower bound).
PAPER_100B_RECEIVE_BYTES = 400 * GB


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Parameter count and byte sizes of one configuration (see the module docstring)."""

    name: str
    num_params: int
    params_fp32_bytes: int
    adamw_bytes: int
    learner_bytes: int
    learner_peak_bytes: int
    outer_bytes: int
    wire_bf16_bytes: int


def memory_plan(config: ModelConfig) -> MemoryPlan:
    """Plans one configuration; the count comes from the abstract model, not a formula."""
    _, params = nnx.split(abstract_model(config), nnx.Param)
    n = count_params(params)
    return MemoryPlan(
        name=config.name,
        num_params=n,
        params_fp32_bytes=4 * n,
        adamw_bytes=8 * n,
        learner_bytes=16 * n,
        learner_peak_bytes=sum(learner_memory(n).values()),
        outer_bytes=8 * n,
        wire_bf16_bytes=2 * n,
    )


def plan_rows(names: Sequence[str] | None = None) -> list[MemoryPlan]:
    """One :class:`MemoryPlan` per named configuration (all of them by default)."""
    return [memory_plan(get_config(name)) for name in (names or CONFIG_NAMES)]


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _gb(b: int) -> str:
    x = b / GB
    if x < 1:
        return f"{x:.4f}"
    return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def format_plan(names: Sequence[str] | None = None, *, paper: bool = True) -> str:
    """The ``dipsjax plan`` table: one row per configuration, sizes in GB (1e9 bytes)."""
    header = (
        "config",
        "params",
        "params_fp32",
        "adamw",
        "learner",
        "learner_peak",
        "outer_fp32",
        "wire_bf16",
    )
    rows = [header]
    plans = plan_rows(names)
    for p in plans:
        rows.append(
            (
                p.name,
                _count(p.num_params),
                _gb(p.params_fp32_bytes),
                _gb(p.adamw_bytes),
                _gb(p.learner_bytes),
                _gb(p.learner_peak_bytes),
                _gb(p.outer_bytes),
                _gb(p.wire_bf16_bytes),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        "GB = 1e9 bytes. params_fp32 = 4N; adamw = m+v FP32 = 8N; learner = FP32 weights + "
        "grads + m + v = 16N; learner_peak = the runtime learner's step (learner_memory: + "
        "the round's reference + the step's outputs beside its inputs = 32N); outer_fp32 = "
        "theta + Nesterov momentum = 8N; wire_bf16 = 2N."
    )
    if paper:
        big = [p for p in plans if p.name == "dips-100b"]
        if big:
            p = big[0]
            lines.append(
                "Di-PS sec. 5 (100B): outer model + optimizer"
                f" ~{PAPER_100B_OUTER_BYTES / GB:.0f} GB"
                f" + receive buffers >= {PAPER_100B_RECEIVE_BYTES / GB:.0f} GB; dips-100b here:"
                f" outer_fp32 {p.outer_bytes / GB:.0f} GB"
                f" ({p.outer_bytes / PAPER_100B_OUTER_BYTES:.2f}x), learner-style 16 B/param"
                f" {p.learner_bytes / GB:.0f} GB ({p.learner_bytes / PAPER_100B_OUTER_BYTES:.2f}x),"
                f" one FP32 model {p.params_fp32_bytes / GB:.0f} GB."
            )
    return "\n".join(lines)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Adds the ``plan`` arguments to ``parser`` (a sub-command parser) or a new one."""
    parser = parser or argparse.ArgumentParser(prog="dipsjax plan", description=__doc__)
    parser.add_argument(
        "--config",
        action="append",
        choices=CONFIG_NAMES,
        help="a named configuration (repeatable); default: all",
    )
    parser.add_argument(
        "--no-paper", action="store_true", help="omit the comparison with the paper's estimate"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Prints the plan for parsed ``args`` (see :func:`build_parser`)."""
    print(format_plan(args.config, paper=not args.no_paper))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``dipsjax plan [--config NAME ...] [--no-paper]``."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
