"""Writes colabs/outer_transforms.ipynb (kept as code so reviews see plain Python): run
``python colabs/_build_outer_transforms.py`` from the repository root (colabs/_colab.py adds the
Colab badge and install cell, and formats the notebook)."""

from _colab import write

cells = [
    (
        "md",
        """# Outer optimizers as optax transforms

`dipsjax.outer` turns a *batch of learner contributions* into one outer update. A contribution
batch is a pytree of pseudo-gradients stacked on a leading learner axis `[L, ...]`; the
per-learner metadata (`tokens`, `steps`, `mask`) rides along as keyword extra args of shape
`[L]`. Every transform is an ordinary `optax.GradientTransformationExtraArgs`, so they
compose with `optax.chain` / `optax.named_chain` and with anything else optax offers.

This notebook: (1) composes the Di-PS chain by hand and reproduces the paper's worked
example, (2) trains a toy problem with four learners of different speeds, (3) compares the
token-weighted mean with radial-directional averaging, (4) runs one round on two shards the
way the syncer's followers do, and (5) looks at the wire codecs.""",
    ),
    (
        "code",
        """import jax
import jax.numpy as jnp
import numpy as np
import optax

from dipsjax import outer""",
    ),
    (
        "md",
        """## 1. The Di-PS chain, by hand

Anomaly penalty -> token-weighted mean -> global clipping -> Nesterov (Di-PS sec. 6, 8).
Seed the detector with the history of the worked example (sec. 11): mean ~4.5, deviation ~1,
largest recent score 2, so the threshold is 3 x 2 = 6.""",
    ),
    (
        "code",
        """tx = optax.named_chain(
    ("reject", outer.reject_anomalies(alpha=0.02, beta=3.0, mu0=4.5, sigma0=1.0, recent_scores0=(2.0,))),
    ("merge", outer.token_weighted_mean()),
    ("clip", outer.clip_by_global_norm(1.0)),
    ("nesterov", optax.sgd(0.7, momentum=0.8, nesterov=True)),
)
params = {"w": jnp.zeros(2)}
state = tx.init(params)
deltas = {"w": jnp.array([[0.2, 0.4], [0.5, 0.1], [9.0, 0.0]])}   # learners A, B, C
tokens = jnp.array([32_000, 64_000, 10_000])
G = jnp.array([4.0, 5.0, 81.0])   # the leader's whole-model squared norms
updates, state = tx.update(deltas, state, params, tokens=tokens, learner_sq_norms=G)
merged = state["nesterov"][0].trace["w"]          # first step: momentum == merged update
print("merged delta:", merged, " norm:", float(jnp.sqrt(state["clip"].input_sq_norm)))
print("clip factor:", float(state["clip"].clip_factor))
np.testing.assert_allclose(merged, [0.4, 0.2], rtol=1e-6)   # C was rejected
assert float(state["clip"].clip_factor) == 1.0""",
    ),
    (
        "md",
        """## 2. A toy problem with heterogeneous learners

Four learners fit `y = X w` on their own shards. Learner `j` finishes a round of `H` AdamW
steps every `j + 1` outer rounds; absent learners are masked, so one jitted outer step
serves every round without recompiling. The preset `outer.dips()` builds the chain above.""",
    ),
    (
        "code",
        """rng = np.random.default_rng(0)
dim, L, H = 8, 4, 10
w_true = rng.standard_normal(dim).astype(np.float32)
xs = rng.standard_normal((L, 256, dim)).astype(np.float32)
ys = xs @ w_true
inner = optax.adamw(3e-2)

@jax.jit
def local_round(w, x, y):
    def step(carry, _):
        w, opt = carry
        g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        upd, opt = inner.update(g, opt, w)
        return (optax.apply_updates(w, upd), opt), None
    (w_end, _), _ = jax.lax.scan(step, (w, inner.init(w)), None, length=H)
    return w - w_end                      # pseudo-gradient: start minus end

tx = outer.dips(warmup=2)
params = {"w": jnp.zeros(dim)}
state = tx.init(params)

@jax.jit
def outer_step(params, state, deltas, tokens, mask):
    upd, state = tx.update(deltas, state, params, tokens=tokens, mask=mask)
    return optax.apply_updates(params, upd), state

losses = []
for r in range(20):
    mask = np.array([(r + 1) % (j + 1) == 0 for j in range(L)])
    deltas = {"w": jnp.stack([local_round(params["w"], xs[j], ys[j]) for j in range(L)])}
    tokens = jnp.asarray(mask * 256 * H, jnp.float32)
    params, state = outer_step(params, state, deltas, tokens, jnp.asarray(mask))
    losses.append(float(jnp.mean((xs[0] @ params["w"] - ys[0]) ** 2)))
print([round(v, 4) for v in losses[::4]])
assert losses[-1] < 1e-2 * losses[0]
assert outer_step._cache_size() == 1      # masks never recompiled the step""",
    ),
    (
        "md",
        """## 3. Mean versus radial-directional averaging (Decoupled DiLoCo)

When learners disagree, the plain mean shrinks the update: two orthogonal unit vectors
average to norm 0.71. RDA averages magnitude and direction separately, so the merged norm
stays the weighted mean of the learners' norms however many are merged.""",
    ),
    (
        "code",
        """x = {"w": jnp.eye(4)}          # four learners, orthogonal unit updates
mean_update, _ = outer.mean().update(x, None)
rda = outer.radial_directional_average(weighting="uniform")
rda_update, _ = rda.update(x, rda.init(None))
print("mean norm", float(jnp.linalg.norm(mean_update["w"])), " RDA norm", float(jnp.linalg.norm(rda_update["w"])))
assert abs(float(jnp.linalg.norm(rda_update["w"])) - 1.0) < 1e-6""",
    ),
    (
        "md",
        """## 4. One round on two shards, as the followers run it

Each follower holds some layers and their Nesterov state. The leader sums the followers'
partial statistics (per-learner squared norms, then the merged squared norm), so every
shard takes the same accept decision and the same clip factor, and the union of the shard
results is exactly the single-process result.""",
    ),
    (
        "code",
        """params = {"embed": jnp.ones((5, 3)), "layer_0": {"w": jnp.ones((3, 3))}, "head": jnp.ones((3,))}
deltas = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal((3, *p.shape)), jnp.float32), params)
tx = outer.dips(warmup=0)
state = tx.init(params)
meta = dict(tokens=jnp.array([1.0, 2.0, 3.0]))

single, _ = tx.update(deltas, state, params, **meta)

shard_of = lambda path: 0 if path[0] == "embed" else 1
shard_deltas = outer.split_tree(deltas, shard_of, 2)
shard_states = outer.split_state(tx, state, outer.split_tree(params, shard_of, 2))
shard_updates, shard_states, stats = outer.sharded_update(tx, shard_deltas, shard_states, **meta)
print("G per learner:", stats.learner_sq_norms, " merged |delta|^2:", float(stats.merged_sq_norm))
jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), outer.merge_trees(shard_updates), single)
print("sharded == single process")""",
    ),
    (
        "md",
        """## 5. Wire codecs

Pseudo-gradients travel as BF16 by default; int8 and int4 use one FP32 scale per block.
The documented bounds: bf16 `|x'-x| <= 2^-8 |x|`, int8 `<= max|block|/254`,
int4 `<= max|block|/14`.""",
    ),
    (
        "code",
        """v = jnp.asarray(rng.standard_normal(4096), jnp.float32)
for codec in outer.CODECS:
    enc = outer.encode(v, codec, block_size=64)
    err = float(jnp.max(jnp.abs(outer.decode(enc) - v)))
    assert bool(jnp.all(jnp.abs(outer.decode(enc) - v) <= outer.error_bound(v, codec, block_size=64) * (1 + 1e-6)))
    print(f"{codec}: {enc.nbytes:6d} bytes, max error {err:.2e}")""",
    ),
]

write("outer_transforms", cells)
