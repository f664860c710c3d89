"""Throughput and model FLOPs utilization of the dipsjax learner step against a minimal
hand-written flax + optax loop of the same model, in the same run, on whatever devices
exist (CPU, GPU or TPU: the script is the same).

Run: ``python benchmarks/learner_mfu.py`` (a 2-layer d = 128 model, 25-45 s on 2 shared CPU
cores); ``--config small`` or ``--config llama3.2-1b`` for a named model (``--dtype
bfloat16`` for bf16 compute with FP32 master weights); ``--tiny``, a harness check whose
figures mean nothing: d = 32, 1 layer, 8 x 16 tokens, 2 steps, 1 trial.

Model FLOPs utilization: model FLOPs a token (training: 6 per matmul parameter, the
embedding lookup excluded and the output projection included, plus attention's
``12 x layers x seq x heads x head_dim``: PaLM, Chowdhery et al. 2022, appendix B) times
tokens/s over the devices' peak. The peak is the vendor's dense figure for the compute
dtype on known GPUs and TPUs (:data:`PEAK_FLOPS`); elsewhere (CPU) it is measured in the
same run, as the best rate of a large jitted matmul on each device, and the line says so.

Three loops train the same model (same configuration, initial parameters and batches) in
one process, interleaved trial by trial in a rotating order, after warm-up; each reports
the median tokens/s over the trials (the machine is shared and noisy):

* ``plain``  -- a minimal hand-written loop: ``nnx.split`` once, a ``jax.jit`` step with
  donated buffers, ``optax.chain(clip_by_global_norm, adamw)``, no shardings;
* ``step``   -- :class:`dipsjax.learner.InnerStep` on a partition mesh over the local
  devices: ``put_batch`` + the sharded, donated, jitted ``step``;
* ``round``  -- :meth:`dipsjax.learner.Learner.run_round` with ``H = steps``: the same steps
  plus the start copy, the FP32 pseudo-gradient and the host-side token accounting.

The ratios are medians over trials of the per-trial ratio to ``plain`` (loops of one trial
run back to back, so slow drifts of the load cancel). Ends with one line per headline
figure, e.g. ``learner_step_ratio: 0.99 (goal: >= 0.97)`` and ``step_mfu: 0.41``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dipsjax.learner import InnerOptimizerConfig, InnerStep, Learner, make_partition_mesh
from dipsjax.model import Llama, get_config

GOAL = 0.97

#: Dense peak FLOP/s a device, by a substring of ``device.device_kind`` (lower case) and
#: the compute dtype (vendors' datasheets: tensor-core / MXU dense figures; float32 on GPUs
#: counts TF32, which XLA uses for float32 matmuls by default).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h200": {"bfloat16": 989e12, "float32": 495e12},
    "h100": {"bfloat16": 989e12, "float32": 495e12},
    "a100": {"bfloat16": 312e12, "float32": 156e12},
    "l4": {"bfloat16": 121e12, "float32": 60e12},
    "tpu v4": {"bfloat16": 275e12, "float32": 275e12},
    "tpu v5 lite": {"bfloat16": 197e12, "float32": 197e12},
    "tpu v5p": {"bfloat16": 459e12, "float32": 459e12},
    "tpu v6 lite": {"bfloat16": 918e12, "float32": 918e12},
}


def flops_per_token(config, n_params: int, seq: int) -> float:
    """Training FLOPs a token (see the module docstring)."""
    table = config.vocab_size * config.d_model  # the lookup is no matmul (tied: lm_head is)
    matmul = n_params - (0 if config.tie_embeddings else table)
    heads_dim = config.num_heads * (config.head_dim or config.d_model // config.num_heads)
    return 6.0 * matmul + 12.0 * config.num_layers * seq * heads_dim


def device_peak(dtype: str) -> tuple[float, str]:
    """The summed peak FLOP/s of the local devices and where it comes from."""
    devices = jax.local_devices()
    kind = devices[0].device_kind.lower()
    for key, peaks in PEAK_FLOPS.items():
        if key in kind:
            return len(devices) * peaks[dtype], f"datasheet, {devices[0].device_kind} {dtype}"
    n = 2048 if devices[0].platform != "cpu" else 1024
    best = 0.0
    for d in devices:
        a = jax.device_put(jnp.ones((n, n), dtype), d)
        mm = jax.jit(lambda x: x @ x)
        mm(a).block_until_ready()
        for _ in range(5):
            t0 = time.perf_counter()
            mm(a).block_until_ready()
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return len(devices) * best, f"measured: the best {n}^3 {dtype} matmul rate a device"


def plain_loop(config, params_dict, optimizer: InnerOptimizerConfig):
    """The reference: what one writes by hand with flax NNX and optax."""
    model = Llama(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    nnx.replace_by_pure_dict(params, jax.tree.map(np.asarray, _int_keys(params, params_dict)))
    tx = optax.chain(
        optax.clip_by_global_norm(optimizer.clip_norm or 1.0),
        optax.adamw(
            optimizer.learning_rate,
            b1=optimizer.b1,
            b2=optimizer.b2,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        ),
    )
    opt_state = tx.init(params)

    def step(params, opt_state, batch):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1)), params, opt_state


def _int_keys(template, tree):
    pure = nnx.to_pure_dict(template)

    def match(t, g):
        if isinstance(t, dict):
            return {k: match(v, g[str(k)]) for k, v in t.items()}
        return g

    return match(pure, tree)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="a named model (default: --d-model...)")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="steps per trial (= H)")
    parser.add_argument("--trials", type=int, default=13)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tiny", action="store_true", help="a harness check (see above)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.d_model, args.layers, args.batch, args.seq = 32, 1, 8, 16
        args.steps, args.trials, args.warmup = 2, 1, 1

    if args.config:
        config = get_config(args.config, max_seq_len=args.seq, dtype=args.dtype)
    else:
        config = get_config(
            "small",
            d_model=args.d_model,
            num_layers=args.layers,
            num_heads=4,
            num_kv_heads=2,
            d_ff=3 * args.d_model,
            max_seq_len=args.seq,
            dtype=args.dtype,
        )
    optimizer = InnerOptimizerConfig()
    mesh = make_partition_mesh()
    rng = np.random.default_rng(0)
    batches = [
        rng.integers(0, config.vocab_size, (args.batch, args.seq + 1)).astype(np.int32)
        for _ in range(args.steps)
    ]
    tokens_per_trial = args.steps * args.batch * args.seq

    learner = Learner(config, optimizer, mesh=mesh, learner_id="bench", seed=0)
    init = jax.device_get(learner.params_dict())
    inner = InnerStep(config, optimizer, mesh=mesh)
    state = {"step": None}
    p = inner.put_params(init)
    state["step"] = (p, inner.init_opt_state(p))
    plain_step, pp, po = plain_loop(config, init, optimizer)
    device = jax.local_devices()[0]
    state["plain"] = (jax.device_put(pp, device), jax.device_put(po, device))

    def run_plain():
        params, opt_state = state["plain"]
        loss = None
        for b in batches:
            params, opt_state, loss = plain_step(params, opt_state, jax.device_put(b, device))
        float(loss)
        state["plain"] = (params, opt_state)

    def run_step():
        params, opt_state = state["step"]
        metrics = None
        for b in batches:
            params, opt_state, metrics = inner.step(params, opt_state, inner.put_batch(b))
        float(metrics["loss"])
        state["step"] = (params, opt_state)

    def run_round():
        learner.run_round(batches, num_steps=args.steps)

    loops = {"plain": run_plain, "step": run_step, "round": run_round}
    rates: dict[str, list[float]] = {name: [] for name in loops}
    order = list(loops)
    t_start = time.perf_counter()
    for trial in range(args.warmup + args.trials):
        rotated = order[trial % 3 :] + order[: trial % 3]
        for name in rotated:
            t0 = time.perf_counter()
            loops[name]()
            dt = time.perf_counter() - t0
            if trial >= args.warmup:
                rates[name].append(tokens_per_trial / dt)
    elapsed = time.perf_counter() - t_start

    med = {name: statistics.median(r) for name, r in rates.items()}
    n_params = sum(x.size for x in jax.tree.leaves(init))
    print(
        f"model: d={config.d_model} layers={config.num_layers} params={n_params:,} "
        f"dtype={config.dtype}; batch {args.batch} x seq {args.seq}; {args.steps} steps/trial; "
        f"{args.trials} trials (+{args.warmup} warm-up); devices {mesh.devices.size} "
        f"({jax.default_backend()}); {elapsed:.1f}s"
    )
    for name in loops:
        r = sorted(rates[name])
        print(
            f"  {name:6s} median {med[name]:>10,.0f} tok/s"
            f"   min {r[0]:>10,.0f}   max {r[-1]:>10,.0f}"
        )
    # Paired ratios: each trial runs the three loops back to back, so slow drifts of the
    # machine's load cancel within a trial; the median over trials discards bursts.
    plain = rates["plain"]
    step_ratio = statistics.median(s / p for s, p in zip(rates["step"], plain, strict=True))
    round_ratio = statistics.median(r / p for r, p in zip(rates["round"], plain, strict=True))
    print(f"plain_tokens_per_s: {med['plain']:.0f}")
    print(f"learner_tokens_per_s: {med['step']:.0f}")
    print(f"learner_round_tokens_per_s: {med['round']:.0f}")
    fpt = flops_per_token(config, n_params, args.seq)
    peak, source = device_peak(args.dtype)
    print(f"model FLOPs a token: {fpt:,.0f}; peak {peak / 1e12:.3f} TFLOP/s ({source})")
    print(f"learner_step_ratio: {step_ratio:.3f} (goal: >= {GOAL})")
    print(f"learner_round_ratio: {round_ratio:.3f} (goal: >= {GOAL})")
    for name, goal in (("plain", "the baseline"), ("step", "plain_mfu's"), ("round", "the step's")):
        print(f"{name}_mfu: {med[name] * fpt / peak:.4f} (goal: {goal})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
