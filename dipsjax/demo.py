"""``dipsjax demo``: the outer library on a toy problem, in a few seconds.

``M`` learners fit one linear model ``y = X w`` on their own data shards. Each round, the
learners that are "done" (learner ``j`` finishes every ``j + 1`` rounds: heterogeneous
speeds) run ``H`` AdamW steps from the current global weights and contribute a
pseudo-gradient ``Delta = theta_start - theta_end`` with their token and step counts. The
last learner is faulty: every few rounds it sends a pseudo-gradient 50x too large. The Di-PS
outer chain (:func:`dipsjax.outer.dips`) rejects it, token-weights the rest, clips and
applies Nesterov. One jitted outer step serves every round: absent learners are masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from rich.console import Console
from rich.table import Table

from dipsjax import outer

DIM = 16
INNER_STEPS = 16
BATCH = 32


def _loss(w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((x @ w - y) ** 2)


def run(rounds: int = 30, learners: int = 4, seed: int = 0, console: Console | None = None) -> dict:
    """Runs the demonstration and returns the final loss and rejection counts."""
    if learners < 2:
        raise ValueError(f"learners must be >= 2 (one of them is faulty), got {learners}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    console = console or Console()
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(DIM).astype(np.float32)
    xs = rng.standard_normal((learners, 512, DIM)).astype(np.float32)
    ys = (xs @ w_true + 0.1 * rng.standard_normal((learners, 512))).astype(np.float32)
    x_val = rng.standard_normal((1024, DIM)).astype(np.float32)
    y_val = x_val @ w_true

    inner = optax.adamw(3e-2)

    @jax.jit
    def local_round(w, x, y, key):
        def step(carry, k):
            w, opt = carry
            idx = jax.random.randint(k, (BATCH,), 0, x.shape[0])
            loss, g = jax.value_and_grad(_loss)(w, x[idx], y[idx])
            upd, opt = inner.update(g, opt, w)
            return (optax.apply_updates(w, upd), opt), loss

        (w_end, _), _ = jax.lax.scan(step, (w, inner.init(w)), jax.random.split(key, INNER_STEPS))
        return w - w_end

    tx = outer.dips(warmup=3)
    params = {"w": jnp.zeros(DIM)}
    state = tx.init(params)

    @jax.jit
    def outer_step(params, state, deltas, tokens, steps, mask):
        upd, state = tx.update(deltas, state, params, tokens=tokens, steps=steps, mask=mask)
        return optax.apply_updates(params, upd), state

    table = Table(title=f"dipsjax demo: Di-PS outer rounds, {learners} learners (last is faulty)")
    for col in ("round", "present", "accepted", "clip factor", "val loss"):
        table.add_column(col, justify="right")
    key = jax.random.key(seed)
    rejected_faulty = sent_faulty = rejected_healthy = 0
    for r in range(rounds):
        mask = np.array([(r + 1) % (j + 1) == 0 for j in range(learners)])
        if not mask.any():
            continue
        deltas = []
        for j in range(learners):
            key, sub = jax.random.split(key)
            d = local_round(params["w"], xs[j], ys[j], sub)
            faulty = j == learners - 1 and mask[j] and r % 3 == 2
            deltas.append(d * 50.0 if faulty else d)
            sent_faulty += int(faulty)
        stacked = {"w": jnp.stack(deltas)}
        tokens = jnp.asarray(mask * BATCH * INNER_STEPS, jnp.float32)
        steps = jnp.asarray(mask * INNER_STEPS, jnp.float32)
        before = state["reject"]
        dec = outer.score_learners(
            before, outer.learner_sq_norms(stacked), jnp.asarray(mask), beta=3.0, warmup=3
        )
        params, state = outer_step(params, state, stacked, tokens, steps, jnp.asarray(mask))
        acc = np.asarray(dec.accepted)
        for j in np.flatnonzero(mask & ~acc):
            if j == learners - 1 and r % 3 == 2:
                rejected_faulty += 1
            else:
                rejected_healthy += 1
        val = float(_loss(params["w"], x_val, y_val))
        table.add_row(
            str(r),
            ",".join(str(j) for j in np.flatnonzero(mask)),
            ",".join(str(j) for j in np.flatnonzero(acc)) or "-",
            f"{float(state['clip'].clip_factor):.3f}",
            f"{val:.4f}",
        )
    console.print(table)
    final = float(_loss(params["w"], x_val, y_val))
    start = float(_loss(jnp.zeros(DIM), x_val, y_val))
    console.print(
        f"final validation loss {final:.4f} (start {start:.2f}); "
        f"faulty contributions rejected {rejected_faulty}/{sent_faulty}; "
        f"healthy ones rejected {rejected_healthy}"
    )
    return {
        "final_loss": final,
        "rejected_faulty": rejected_faulty,
        "sent_faulty": sent_faulty,
        "rejected_healthy": rejected_healthy,
    }
