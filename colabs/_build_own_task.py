"""Writes colabs/own_task.ipynb (kept as code so reviews see plain Python): run
``python colabs/_build_own_task.py`` from the repository root (colabs/_colab.py adds the
Colab badge and install cell, and formats the notebook)."""

from _colab import write

cells = [
    (
        "md",
        """# Your own model on your own data, across a local job

dipsjax trains any model through its task API (`dipsjax.task`): a `Task` names the model
(any Flax NNX module), its loss, the training data (a `DataSource`: batches by
`(chunk, index)`) and the validation batches. Everything else (the learners' protocol,
the syncer, the books, checkpoints, replay, export) works the same for every task.

This notebook writes a task of its own, a small NNX regression network fitted to a
noisy 1-D signal kept in a NumPy file (stand-ins for your model and your data), then

1. trains it with `dipsjax run`: a leader, a follower and two learners of different speeds
   as processes on this machine, Di-PS;
2. shows the validation curve from the run's `summary.json`;
3. exports the final parameters with `dipsjax export`, loads them into the model with
   `dipsjax.export.load_model` and evaluates it.

Every process of a job imports the task by its import path (`my_task:get_task`), from the
installed packages or from the folder the job runs in: the task module is a file in a
work folder, and the job runs there. About a minute on a laptop CPU; the test suite runs
it on tiny settings (`DIPSJAX_NOTEBOOK_TINY=1`: 6 rounds' examples instead of 40).""",
    ),
    (
        "code",
        """import json
import os
import pathlib
import subprocess
import sys
import tempfile

import matplotlib.pyplot as plt
import numpy as np

TINY = os.environ.get("DIPSJAX_NOTEBOOK_TINY") == "1"
# The work folder: the task module, its data and config, the run and the export.
WORK = pathlib.Path(os.environ.get("DIPSJAX_NOTEBOOK_OUT") or tempfile.mkdtemp()) / "own_task"
WORK.mkdir(parents=True, exist_ok=True)

# Your data: here a noisy signal y(x), 4096 training and 512 validation points.
rng = np.random.default_rng(0)


def signal(x):
    return np.sin(2.0 * x) + 0.3 * x


x = rng.uniform(-3.0, 3.0, (4096 + 512, 1)).astype(np.float32)
y = (signal(x) + 0.05 * rng.standard_normal(x.shape)).astype(np.float32)
np.savez(WORK / "data.npz", x_train=x[:4096], y_train=y[:4096], x_val=x[4096:], y_val=y[4096:])
print("work folder:", WORK, "| data:", {k: v.shape for k, v in np.load(WORK / "data.npz").items()})""",
    ),
    (
        "md",
        """## 1. The task module

`my_task.py` holds the model, the data source and `get_task(cfg, **task_args)`, which every
process of the job calls with the run's config (`cfg.batch_size`, `cfg.seed`...) and the
config's `task_args`:

* the model: an `nnx.Module` whose `nnx.Param` leaves are what the job trains, shards over
  followers and exports (here sine features of `x`, two GELU layers with a LayerNorm);
* the data: `ArrayChunks` serves the training arrays as chunks of `batches_per_chunk`
  batches; `batch(chunk, index)` must give the same batch in every process, every time
  (the leader leases pieces of chunks to learners, and replay reads them again);
  `tokens_per_batch` is what a batch counts in the job's books (examples here); the
  leader hands the chunks out again, epoch after epoch, until the budget is trained;
* the validation batches, on which the job reports the mean loss.""",
    ),
    (
        "code",
        """%%writefile {WORK}/my_task.py
\"\"\"A task of my own: an NNX regression network on the arrays of data.npz.\"\"\"

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dipsjax.task import Task

DATA = pathlib.Path(__file__).with_name("data.npz")


class Regressor(nnx.Module):
    \"\"\"x [batch, 1] -> y [batch, 1]: sine features, two GELU layers, a LayerNorm.\"\"\"

    def __init__(self, width: int, *, rngs: nnx.Rngs):
        self.features = nnx.Linear(1, width, rngs=rngs)  # frequencies and phases
        self.hidden = nnx.Linear(width, width, rngs=rngs)
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.out = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jnp.sin(self.features(x))
        h = h + jax.nn.gelu(self.hidden(self.norm(h)))
        return self.out(h)


class ArrayChunks:
    \"\"\"In-memory arrays as a dipsjax DataSource: the examples, shuffled once (seeded),
    cut into num_chunks chunks of batches_per_chunk batches of batch_size.\"\"\"

    def __init__(self, x, y, batch_size: int, batches_per_chunk: int = 4, seed: int = 0):
        order = np.random.default_rng(seed).permutation(len(x))
        self.x, self.y = x[order], y[order]
        self.batch_size, self.batches_per_chunk = batch_size, batches_per_chunk
        self.num_chunks = len(x) // (batch_size * batches_per_chunk)
        self.tokens_per_batch = batch_size  # the books count examples

    def batch(self, chunk: int, index: int) -> dict[str, np.ndarray]:
        start = (chunk * self.batches_per_chunk + index) * self.batch_size
        return {"x": self.x[start : start + self.batch_size], "y": self.y[start : start + self.batch_size]}


def loss(model: Regressor, batch) -> jax.Array:
    \"\"\"Mean squared error.\"\"\"
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


def get_task(cfg, width: int = 64) -> Task:
    data = np.load(DATA)
    n = cfg.batch_size
    val = [
        {"x": data["x_val"][i : i + n], "y": data["y_val"][i : i + n]}
        for i in range(0, len(data["x_val"]) - n + 1, n)
    ]
    return Task(
        name="regressor",
        model=lambda rngs: Regressor(width, rngs=rngs),
        loss=loss,
        data=lambda: ArrayChunks(data["x_train"], data["y_train"], n, seed=cfg.seed),
        eval_batches=val,
    )""",
    ),
    (
        "md",
        """A config names the task by import path (`task="my_task:get_task"`, with `task_args`)
and says how the job trains it: the method, the learners and their speeds, the batch, the
inner steps per round, the budget (in the task's unit, examples here) and how often to
evaluate. `dipsjax run CONFIG` takes a config file like this one; `--arg` is what
`get_config` receives.""",
    ),
    (
        "code",
        """%%writefile {WORK}/my_config.py
import ml_collections


def get_config(arg=None):
    cfg = ml_collections.ConfigDict()
    cfg.name = "my_task"
    cfg.sim = dict(
        method="dips",
        task="my_task:get_task",
        task_args={"width": 64},
        learners=2,
        followers=1,
        batch_size=32,
        inner_steps=8,
        inner_lr=1e-2,
        token_budget=2 * 8 * 32 * (6 if arg == "ci" else 40),  # examples: 6 or 40 rounds
        speeds=(1.0, 1.5),  # learner 1 is 1.5 times slower
        eval_every=2,
        seed=0,
    )
    cfg.heartbeat_interval = 1.0
    cfg.launch = dict(learner=dict(cpus=1))
    return cfg""",
    ),
    (
        "md",
        """## 2. Training it across a local job

`dipsjax run my_config.py`, run in the work folder (so that every process imports
`my_task` from there): the processes start, train to the budget and stop; the launcher
prints its progress and a summary. The run folder is `--out`.""",
    ),
    (
        "code",
        """RUN = WORK / "run"
cmd = [sys.executable, "-m", "dipsjax.cli", "run", "my_config.py", "--out", str(RUN), "--timeout", "600"]
if TINY:
    cmd += ["--arg", "ci"]
result = subprocess.run(cmd, cwd=WORK, capture_output=True, text=True, check=False)
print("\\n".join(result.stdout.splitlines()[-16:]))  # the launcher's last lines
assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]""",
    ),
    (
        "md",
        """## 3. The validation curve

`summary.json` is the run's account: rounds, the books, and the validation loss of the
global model at every evaluated version (`curve`: version, seconds since the start,
examples applied, loss).""",
    ),
    (
        "code",
        """summary = json.loads((RUN / "summary.json").read_text())
curve = summary["curve"]
print(f"rounds {summary['rounds']}, version {summary['version']}, examples "
      f"{summary['leader_tokens']['applied']} applied, {summary['wall_seconds']:.0f} s")
for p in curve:
    print(f"version {p['version']:3d}  {p['tokens']:6d} examples  {p['t']:6.1f} s  "
          f"val MSE {p['val_loss']:.4f}")
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([p["tokens"] for p in curve], [p["val_loss"] for p in curve], marker="o")
ax.set_xlabel("examples applied to the global model")
ax.set_ylabel("validation MSE")
ax.set_yscale("log")
ax.grid(alpha=0.3)
plt.show()
assert curve[-1]["val_loss"] < 0.5 * curve[0]["val_loss"], curve""",
    ),
    (
        "md",
        """## 4. Export, load, evaluate

`dipsjax export RUN --out DIR` merges the followers' shards of the final version into an
orbax checkpoint and a safetensors file, with a `meta.json` naming the task and the run's
config. `load_model(DIR)` rebuilds the task from there (`my_task` must be importable: the
work folder goes on `sys.path`) and puts the parameters into a fresh `Regressor`: an
ordinary NNX module, here evaluated on the validation data (the run's last validation loss,
computed again) and drawn against the signal.""",
    ),
    (
        "code",
        """from dipsjax import export

EXPORT = WORK / "export"
out = subprocess.run([sys.executable, "-m", "dipsjax.cli", "export", str(RUN), "--out", str(EXPORT)],
                     capture_output=True, text=True, check=False)
print(out.stdout, out.stderr[-2000:])
assert out.returncode == 0
sys.path.insert(0, str(WORK))
model = export.load_model(EXPORT)
task = export.load_task(EXPORT)
print(type(model).__name__, "| meta:", {k: export.read_meta(EXPORT)[k] for k in ("version", "task")})
losses = [float(task.loss(model, b)) for b in task.validation]
val_mse = sum(losses) / len(losses)
print(f"validation MSE of the exported model {val_mse:.5f} (the run's last: {curve[-1]['val_loss']:.5f})")
assert abs(val_mse - curve[-1]["val_loss"]) <= 1e-5 * curve[-1]["val_loss"]

grid = np.linspace(-3, 3, 200, dtype=np.float32)[:, None]
fig, ax = plt.subplots(figsize=(6, 3.5))
data = np.load(WORK / "data.npz")
ax.scatter(data["x_val"][:, 0], data["y_val"][:, 0], s=4, alpha=0.4, label="validation data")
ax.plot(grid[:, 0], signal(grid[:, 0]), "k--", lw=1, label="signal")
ax.plot(grid[:, 0], np.asarray(model(grid))[:, 0], "C1", lw=2, label="exported model")
ax.legend()
plt.show()""",
    ),
    (
        "md",
        """The same task runs in the simulator (`dipsjax simulate` with a config whose `sim` names
it; see `examples/spirals`), and in a job on a cluster (`--executor slurm` or `kubernetes`),
where it must be importable on every node: install it as a package, or ship the folder.""",
    ),
]

write("own_task", cells)
