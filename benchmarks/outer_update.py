"""Outer-update throughput: one merge + clip + Nesterov step vs a numpy copy of the same bytes.

A 100M-parameter FP32 model (ten 10M tensors) receives K = 4 contributions. The jitted
update (token-weighted merge -> global clip -> Nesterov -> apply) donates parameters,
momentum and the contribution buffers. Its memory traffic is counted as the bytes it must
touch at minimum: read K deltas, params and momentum, write params and momentum, i.e.
``(K + 4) * N * 4`` bytes. The baseline copies the same input bytes with ``np.copyto``
(traffic = 2x the bytes copied). Both are measured interleaved in the same run; the
headline is the ratio of rates.

Run: ``.venv/bin/python benchmarks/outer_update.py [--params 100e6] [--learners 4]``
(``--tiny``: 1M parameters, 3 repeats, a harness check whose figures mean nothing).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dipsjax import outer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--learners", type=int, default=4)
    parser.add_argument("--tensors", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tiny", action="store_true", help="1M parameters, 3 repeats")
    args = parser.parse_args()
    if args.tiny:
        args.params, args.repeats = 1e6, 3
    n_total, k = int(args.params), args.learners
    per = n_total // args.tensors
    n_total = per * args.tensors

    tx = optax.named_chain(
        ("merge", outer.token_weighted_mean()),
        ("clip", outer.clip_by_global_norm(1.0)),
        ("nesterov", outer.nesterov(0.7, 0.8)),
    )

    def update(params, state, deltas, tokens):
        upd, state = tx.update(deltas, state, params, tokens=tokens)
        return optax.apply_updates(params, upd), state

    step = jax.jit(update, donate_argnums=(0, 1))
    key = jax.random.key(0)
    params = {
        f"w{i}": jax.random.normal(jax.random.fold_in(key, i), (per,)) for i in range(args.tensors)
    }
    state = tx.init(params)
    tokens = jnp.arange(1.0, k + 1.0)

    def fresh_deltas(seed):
        return {
            name: 1e-4 * jax.random.normal(jax.random.fold_in(key, 1000 + seed), (k, per))
            for name in params
        }

    # Warm up (compile) once.
    params, state = step(params, state, fresh_deltas(0), tokens)
    jax.block_until_ready(params)

    src = np.random.default_rng(0).standard_normal((k + 2) * per, dtype=np.float32)
    dst = np.empty_like(src)
    copy_bytes = src.nbytes * args.tensors  # the same bytes the update reads as input
    update_traffic = (k + 4) * n_total * 4

    t_update, t_copy = [], []
    for r in range(args.repeats):
        deltas = fresh_deltas(r + 1)
        jax.block_until_ready(deltas)
        t0 = time.perf_counter()
        params, state = step(params, state, deltas, tokens)
        jax.block_until_ready((params, state))
        t_update.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(args.tensors):
            np.copyto(dst, src)
        t_copy.append(time.perf_counter() - t0)

    tu, tc = statistics.median(t_update), statistics.median(t_copy)
    rate_update = update_traffic / tu
    rate_copy = 2 * copy_bytes / tc
    print(f"model: {n_total / 1e6:.0f}M FP32 params, K={k} contributions, {args.tensors} tensors")
    print(
        f"outer update: {tu * 1e3:.1f} ms median ({rate_update / 1e9:.2f} GB/s of minimal traffic)"
    )
    print(f"numpy copy:   {tc * 1e3:.1f} ms median ({rate_copy / 1e9:.2f} GB/s)")
    print(f"outer_update_ms: {tu * 1e3:.1f} (goal: lower is better)")
    print(f"outer_update_bandwidth_ratio: {rate_update / rate_copy:.2f} (goal: >= 0.5)")


if __name__ == "__main__":
    main()
