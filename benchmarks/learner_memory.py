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

Then XLA's own plan of one donating inner step (compiled, never run: nothing is
allocated), with every block rematerialised (``remat="full"``) and without: the bytes of
its arguments (weights and AdamW, aliased by its outputs) and of its scratch (gradients,
activations, the update's temporaries) beside the plan's 16 bytes a parameter. With
``--xla-only`` that plan alone, for models too large to train here (``--config
llama3.2-1b``: 1.24B parameters).

With ``--run-step`` it then runs ``--steps`` (at least 2) inner steps of the model with its
layers scanned and every block rematerialised, in a fresh process built as the runtime
builds a learner, and reports that process's peak resident memory (everything in it)
beside XLA's plan and this host's memory, and how many times the step compiled (once:
the second step's inputs are placed as the first's). ``--config llama3.2-1b --xla-only
--run-step``: about 8 minutes here.

Run: ``.venv/bin/python benchmarks/learner_memory.py`` (a 135M-parameter model, d = 1024,
8 layers: about 2 minutes and 5 GB here; ``--config small`` for a named model; ``--tiny``:
the harness on the tiny model, whose figure means nothing next to the allocator's own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


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
    from dipsjax.model.plan import learner_memory

    config = _config(config_name)
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


def _step_child(config_name: str, steps: int, batch: int, seq: int) -> dict:
    """``steps`` inner steps of the scanned model with every block rematerialised, on a
    learner built as the runtime builds one (its step donating); the process's peak
    resident memory, all of it (JAX, the compiled program and the data included).

    The steps run on the learner's step function directly: a round would also keep its
    starting parameters for the pseudo-gradient (4.9 GB more at 1B)."""
    import jax
    import numpy as np

    from dipsjax.learner import InnerOptimizerConfig, Learner

    config = _config(config_name).replace(remat="full", scan_layers=True)
    learner = Learner(config, InnerOptimizerConfig(), mesh=None, learner_id=0, donate=True)
    inner, rng = learner.inner, np.random.default_rng(0)
    params, opt_state = learner.params, learner.opt_state  # donated to the first step
    losses, seconds = [], []
    for _ in range(steps):
        tokens = rng.integers(0, config.vocab_size, (batch, seq + 1)).astype(np.int32)
        t = time.perf_counter()
        params, opt_state, metrics = inner.step(params, opt_state, inner.put_batch(tokens))
        losses.append(float(jax.device_get(metrics["loss"])))
        seconds.append(time.perf_counter() - t)
        print(f"step {len(losses)}: loss {losses[-1]:.3f} in {seconds[-1]:.1f} s", file=sys.stderr)
    return {
        "peak": _status("VmHWM"),
        "params": sum(x.size for x in jax.tree.leaves(params)),
        "losses": losses,
        "seconds": seconds,
        "compiles": inner.step._cache_size(),
    }


def _xla_plan(config_name: str, remat: str, batch: int, seq: int, scan: bool = False) -> dict:
    """XLA's memory plan of one donating inner step (``memory_analysis`` of the compiled
    program; abstract inputs, nothing allocated)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from dipsjax.inner import InnerOptimizerConfig
    from dipsjax.learner.step import lm_loss, make_inner_optimizer
    from dipsjax.model.llama import Llama

    config = _config(config_name).replace(remat=remat, scan_layers=scan)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Llama(config, rngs=nnx.Rngs(0))), nnx.Param)
    tx = make_inner_optimizer(InnerOptimizerConfig())

    def step(p, opt_state, tokens):
        loss, grads = jax.value_and_grad(lambda p: lm_loss(nnx.merge(graphdef, p), tokens))(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
    opt_state = jax.eval_shape(tx.init, params)
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, tokens).compile()
    m = compiled.memory_analysis()
    n = sum(x.size for x in jax.tree.leaves(params))
    held = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    return {"params": n, "held": held, "temp": m.temp_size_in_bytes}


def _config(name: str):
    from dipsjax.model import get_config

    if name == "135m":
        return get_config(
            "small", d_model=1024, num_layers=8, num_heads=8, num_kv_heads=8, d_ff=4096
        )
    return get_config(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="135m", help="'135m' (the default) or a name")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="the harness on the tiny model")
    parser.add_argument("--xla-only", action="store_true", help="XLA's plan of a step alone")
    parser.add_argument("--batch", type=int, default=4, help="XLA's plan: sequences a step")
    parser.add_argument("--seq", type=int, default=512, help="XLA's plan: tokens a sequence")
    parser.add_argument(
        "--run-step",
        action="store_true",
        help="also run --steps inner steps of the scanned model with remat (at least 2)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--step-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, steps, donate = args.child
        print(json.dumps(_child(name, int(steps), donate == "1")))
        return 0
    if args.step_child:
        name, steps, batch, seq = args.step_child
        print(json.dumps(_step_child(name, int(steps), int(batch), int(seq))))
        return 0
    if args.tiny:
        args.config, args.steps, args.batch, args.seq = "tiny", 1, 2, 64
    ratios = {}
    for donate in () if args.xla_only else (False, True):
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
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    steps = {}
    for remat, scan in (("none", False), ("full", False), ("full", True)):
        x = _xla_plan(args.config, remat, args.batch, args.seq, scan)
        name = remat + ("_scan" if scan else "")
        steps[name] = (x["held"] + x["temp"]) / 1e9
        print(
            f"XLA's plan of one donating step, remat={remat}, "
            f"{'layers scanned' if scan else 'layers unrolled'}, batch {args.batch} x {args.seq}: "
            f"weights and AdamW {x['held'] / 1e9:.2f} GB + scratch {x['temp'] / 1e9:.2f} GB "
            f"= {steps[name]:.2f} GB ({steps[name] * 1e9 / x['params']:.1f} bytes a "
            f"parameter; the plan's 16 without activations: {16 * x['params'] / 1e9:.2f} GB; "
            f"this host {total / 1e9:.1f} GB)",
            flush=True,
        )
    ran = None
    if args.run_step:
        steps_run = max(args.steps, 2)  # the second shows whether the step compiled again
        out = subprocess.run(
            [
                *(sys.executable, __file__, "--step-child", args.config),
                *(str(steps_run), str(args.batch), str(args.seq)),
            ],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
        ran = json.loads(out.strip().splitlines()[-1])
        from dipsjax.model.plan import learner_memory

        parts = learner_memory(ran["params"], donate=True)
        bare = (sum(parts.values()) - parts["reference"]) / 1e9  # a step outside a round
        print(
            f"{steps_run} steps ran, layers scanned, remat=full, batch {args.batch} x {args.seq}:"
            f" losses {', '.join(f'{x:.3f}' for x in ran['losses'])}, "
            f"{', '.join(f'{x:.1f}' for x in ran['seconds'])} s; peak resident memory "
            f"{ran['peak'] / 1e9:.2f} GB (XLA's plan {steps['full_scan']:.2f} GB, the memory "
            f"model's {bare:.2f} GB without activations, this host {total / 1e9:.1f} GB); "
            f"the step compiled {ran['compiles']} time(s)",
            flush=True,
        )
    if ratios:
        print(f"learner_memory_ratio_runtime: {ratios['runtime']:.3f} (goal: measured / plan ~ 1)")
        print(f"learner_memory_ratio_donate: {ratios['donate']:.3f} (goal: measured / plan ~ 1)")
    print(f"learner_memory_xla_step_gb_remat_none: {steps['none']:.4f} (goal: < {total / 1e9:.1f})")
    print(f"learner_memory_xla_step_gb_remat_full: {steps['full']:.4f} (goal: < {total / 1e9:.1f})")
    print(
        f"learner_memory_xla_step_gb_remat_full_scan: {steps['full_scan']:.4f} "
        f"(goal: < {total / 1e9:.1f})"
    )
    if ran is not None:
        print(
            f"learner_memory_step_peak_gb: {ran['peak'] / 1e9:.3f} "
            f"(goal: < {total / 1e9:.1f}, this host; XLA's plan {steps['full_scan']:.2f})"
        )
        print(f"learner_memory_step_compiles: {ran['compiles']} (goal: 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
