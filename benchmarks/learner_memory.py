"""A learner's measured peak memory against the one memory model
(:func:`dipsjax.model.plan.learner_memory`, what ``dipsjax plan``, ``dipsjax run --dry-run``
and the learner's log say).

Each case runs in a fresh process: it builds the runtime's learner
(:class:`dipsjax.learner.Learner` on one device, its step not donating, as
``dipsjax.runtime.learner`` builds it), resets the kernel's high-water mark of resident
memory, then initializes the parameters and AdamW and trains one round of ``--steps``
steps. The figure is that high-water mark above the resident memory just before (JAX, the
compiled program and the data stay out of it) over the plan's bytes; ``donate`` is the same
with the step donating its inputs (the plan without the step's outputs). The plan leaves
out activations and XLA's scratch, so a ratio a little above 1 is the expected reading.

Run: ``.venv/bin/python benchmarks/learner_memory.py`` (a 135M-parameter model, d = 1024,
8 layers: about 2 minutes and 5 GB here; ``--config small`` for a named model; ``--tiny``:
the harness on the tiny model, whose figure means nothing next to the allocator's own).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _child(config_name: str, steps: int, donate: bool) -> dict:
    import jax
    import numpy as np

    from dipsjax.learner import InnerOptimizerConfig, Learner
    from dipsjax.model import get_config
    from dipsjax.model.plan import learner_memory

    if config_name == "135m":
        config = get_config(
            "small", d_model=1024, num_layers=8, num_heads=8, num_kv_heads=8, d_ff=4096
        )
    else:
        config = get_config(config_name)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (8, 65)).astype(np.int32) for _ in range(steps)]
    jax.block_until_ready(jax.numpy.ones(1))  # the runtime's own memory, before the model
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident memory
    before = _status("VmRSS")
    learner = Learner(config, InnerOptimizerConfig(), mesh=None, learner_id=0, donate=donate)
    learner.run_round(batches, num_steps=steps)
    peak = _status("VmHWM") - before
    n = sum(x.size for x in jax.tree.leaves(learner.params_dict()))
    return {"params": n, "peak": peak, "plan": sum(learner_memory(n, donate=donate).values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="135m", help="'135m' (the default) or a name")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="the harness on the tiny model")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, steps, donate = args.child
        print(json.dumps(_child(name, int(steps), donate == "1")))
        return 0
    if args.tiny:
        args.config, args.steps = "tiny", 1
    ratios = {}
    for donate in (False, True):
        out = subprocess.run(
            [sys.executable, __file__, "--child", args.config, str(args.steps), str(int(donate))],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        got = json.loads(out.strip().splitlines()[-1])
        name = "donate" if donate else "runtime"
        ratios[name] = got["peak"] / got["plan"]
        print(
            f"{args.config} ({got['params']:,} parameters), step {
                'donating' if donate else 'not donating (the runtime)'
            }: measured {got['peak'] / 1e9:.3f} GB above the process "
            f"before, plan {got['plan'] / 1e9:.3f} GB ({got['peak'] / got['params']:.1f} "
            f"against {got['plan'] / got['params']:.0f} bytes a parameter)",
            flush=True,
        )
    print(f"learner_memory_ratio_runtime: {ratios['runtime']:.3f} (goal: measured / plan ~ 1)")
    print(f"learner_memory_ratio_donate: {ratios['donate']:.3f} (goal: measured / plan ~ 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
