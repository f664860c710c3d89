"""The papers' comparison at small scale, in simulated (virtual) time.

1. Throughput of Di-PS over synchronous DiLoCo with 4 learners whose speeds spread over
   0..eta% (Di-PS sec. 14 reports 1.27-4.67x end to end).
2. Weak scaling to 16 learners (the first 8 identical, then each next 25% slower; learner 0
   on a 1 Gbps link, the rest 10 Gbps): aggregate tokens/s over the ideal of every learner
   training alone with no outer communication (Di-PS reports 98.3-98.8% at 16 clusters).
   Timing follows the paper's setting: H = 64 inner steps of 3 s, a 1B-parameter model's
   BF16 payload on the wire.

Both runs train the tiny model for real on Austen; only the clock is simulated.
Run: ``.venv/bin/python benchmarks/sim_comparison.py [--quick]`` (``--tiny`` checks the
harness only: one round per learner, eta = 200 alone, H = 4, 4 learners in the weak
scaling, a compilation cache; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import time

from dipsjax.sim.simulator import SimConfig, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer tokens, 8 learners")
    parser.add_argument("--tiny", action="store_true", help="a harness check (see above)")
    parser.add_argument("--only", choices=("eta", "weak"), default=None)
    args = parser.parse_args()
    if args.tiny:  # every Engine compiles its programs again: load them from a cache
        import tempfile

        import jax

        jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="dipsjax-sim-"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    t0 = time.perf_counter()
    ratios = {}
    for eta in () if args.only == "weak" else (200,) if args.tiny else (50, 100, 200):
        # The tiny form: H = 4 (else the default, 16).
        steps = dict(inner_steps=4) if args.tiny else {}
        budget = 4 * 512 * (4 if args.tiny else 16 * (4 if args.quick else 8))
        sync = simulate(SimConfig(method="sync_diloco", eta=eta, token_budget=budget, **steps))
        dips = simulate(SimConfig(method="dips", eta=eta, token_budget=budget, **steps))
        ratios[eta] = dips.tokens_per_second / sync.tokens_per_second
        print(
            f"eta={eta:3d}: sync DiLoCo {sync.tokens_per_second:7.0f} tok/s "
            f"loss {sync.final_loss:.4f} | Di-PS {dips.tokens_per_second:7.0f} tok/s "
            f"loss {dips.final_loss:.4f} | ratio {ratios[eta]:.2f}",
            flush=True,
        )

    m = 4 if args.tiny else 8 if args.quick else 16
    h = 4 if args.tiny else 64
    speeds = tuple(1.0 if j < 8 else 1.0 + 0.25 * (j - 7) for j in range(m))
    common = dict(
        learners=m,
        speeds=speeds,
        bandwidth_gbps=(1.0,) + (10.0,) * (m - 1),
        inner_steps=h,
        step_time=3.0,
        token_budget=m * h * 512 * (1 if args.tiny else 4),
        eval_every=100,
    )
    eff = {}
    for method in () if args.only == "eta" else ("sync_diloco", "dips"):
        res = simulate(SimConfig(method=method, **common))
        eff[method] = res.tokens_per_second / res.ideal_tokens_per_second
        print(
            f"weak scaling, {m} learners, {method}: {res.tokens_per_second:.0f} tok/s of ideal "
            f"{res.ideal_tokens_per_second:.0f} = {eff[method]:.1%}",
            flush=True,
        )
    print(f"(wall {time.perf_counter() - t0:.0f} s)")
    for eta, r in ratios.items():
        print(f"dips_vs_sync_throughput_eta{eta}: {r:.2f} (goal: > 1; paper 1.27-4.67)")
    if eff:
        print(f"weak_scaling_efficiency_dips_{m}: {eff['dips']:.3f} (goal: paper 0.983-0.988)")
        print(
            f"weak_scaling_efficiency_sync_diloco_{m}: {eff['sync_diloco']:.3f} (goal: below Di-PS)"
        )


if __name__ == "__main__":
    main()
