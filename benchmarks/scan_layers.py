"""Layers under ``nnx.scan`` (``ModelConfig.scan_layers``) against the unrolled model, in the
same run: compile time and XLA's scratch plan of one donating inner step at several depths,
and the step's time.

One inner step (``dipsjax.learner.InnerStep``: value and gradient, the global clip, AdamW,
donated buffers) of the ``small`` config (d = 256) with every block rematerialised
(``remat="full"``), batch 4 x 128, is traced and compiled at each depth, unrolled and
scanned in turn (tracing and compiling are single-threaded and steady, so one timing each
is meaningful); then, at the middle depth, both steps run interleaved trial by trial and
the median step time of each is taken (the machine is shared and noisy).

Run: ``.venv/bin/python benchmarks/scan_layers.py`` (depths 8, 32 and 96: about 2 minutes
here); ``--tiny``: the harness on the ``tiny`` config at depths 2 and 4, whose figures mean
nothing. Ends with ``scan_compile_ratio`` (scanned over unrolled compile time at the
deepest depth), ``scan_scratch_ratio`` (XLA's scratch, the same) and ``scan_step_ratio``
(unrolled over scanned steps a second: 1 means no cost).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np


def _compile(config, batch: np.ndarray):
    from dipsjax.learner import InnerOptimizerConfig, InnerStep

    inner = InnerStep(config, InnerOptimizerConfig(), mesh=None)
    params = jax.eval_shape(inner.init_params, 0)
    opt = jax.eval_shape(inner.init_opt_state, params)
    t0 = time.perf_counter()
    lowered = inner.step.lower(params, opt, jax.ShapeDtypeStruct(batch.shape, np.int32))
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return inner, t1 - t0, t2 - t1, compiled.memory_analysis().temp_size_in_bytes


def main(argv: list[str] | None = None) -> int:
    from dipsjax.model import get_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--depths", default="8,32,96", help="layer counts, comma-separated")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the harness on the tiny model")
    args = parser.parse_args(argv)
    if args.tiny:
        args.config, args.depths, args.trials = "tiny", "2,4", 2
    depths = [int(d) for d in args.depths.split(",")]
    vocab = get_config(args.config).vocab_size
    batch = np.random.default_rng(0).integers(0, vocab, (4, 129)).astype(np.int32)
    compile_s: dict[tuple[int, bool], float] = {}
    scratch: dict[tuple[int, bool], int] = {}
    middle = depths[len(depths) // 2]
    kept = {}  # the middle depth's steps, timed below (their first call compiles them)
    for depth in depths:
        for scan in (False, True):
            config = get_config(args.config, num_layers=depth, remat="full", scan_layers=scan)
            inner, trace, comp, temp = _compile(config, batch)
            compile_s[depth, scan], scratch[depth, scan] = trace + comp, temp
            if depth == middle:
                kept[scan] = inner
            print(
                f"{args.config}, {depth} layers, {'scanned' if scan else 'unrolled'}: "
                f"trace {trace:.1f} s + compile {comp:.1f} s, XLA scratch {temp / 1e6:.1f} MB",
                flush=True,
            )
    steps = {}
    for scan in (False, True):
        inner = kept[scan]
        params = inner.init_params(0)
        state = [params, inner.init_opt_state(params)]
        steps[scan] = (inner, state)

    def one(scan: bool) -> float:
        inner, state = steps[scan]
        t = time.perf_counter()
        state[0], state[1], metrics = inner.step(state[0], state[1], inner.put_batch(batch))
        jax.block_until_ready(metrics["loss"])
        return time.perf_counter() - t

    for scan in (False, True):
        one(scan)  # compile and warm up
    times: dict[bool, list[float]] = {False: [], True: []}
    for trial in range(args.trials):
        for scan in (False, True) if trial % 2 == 0 else (True, False):
            times[scan].append(one(scan))
    unrolled, scanned = (statistics.median(times[s]) for s in (False, True))
    print(
        f"one step at {middle} layers: unrolled {unrolled * 1e3:.1f} ms, scanned "
        f"{scanned * 1e3:.1f} ms (medians of {args.trials})",
        flush=True,
    )
    deep = depths[-1]
    print(
        f"scan_compile_ratio: {compile_s[deep, True] / compile_s[deep, False]:.3f} "
        f"(at {deep} layers; goal: < 0.5)"
    )
    print(
        f"scan_scratch_ratio: {scratch[deep, True] / max(scratch[deep, False], 1):.3f} "
        f"(at {deep} layers; goal: <= 1)"
    )
    print(f"scan_step_ratio: {unrolled / scanned:.3f} (at {middle} layers; goal: >= 0.95)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
