"""What a finished run's own records say about it, each side counted on its own.

:func:`audit` reads a run directory (the leader's tape, snapshot and status, the learners'
``reported.json``, the followers' ``decisions.jsonl``) and returns counts, not verdicts:
tokens the learners reported against the leader's books, batches trained twice or lost,
versions applied out of order, followers that applied different rounds. A healthy run,
faulted or not, has every count at 0 (``audit(...)["problems"] == []``);
``benchmarks/chaos.py`` sums them over runs with random kills.

Batches, not chunks: a push names the pieces of chunks it trained (``PushMeta.spans``)
and the leader's ledger settles batches, so data a dropped push trained part of a chunk
of is seen here. Batches are named by (chunk, batch), not by epoch: a run longer than
one epoch would count each batch's second epoch as trained twice.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from dipsjax.data import ledger as chunks
from dipsjax.runtime.books import settled_at_the_end
from dipsjax.syncer.leader import Leader
from dipsjax.syncer.tape import EventTape


def _follower_version(run: Path, k: int) -> int:
    """The version follower ``k`` ended at: its ``final.npz`` (a clean exit), else its
    newest checkpoint (orbax names each step's folder by its number)."""
    final = run / f"follower{k}" / "final.npz"
    if final.exists():
        with np.load(final) as z:
            return int(z["__version__"])
    steps = [int(d.name) for d in (run / f"follower{k}" / "ckpt").glob("*") if d.name.isdigit()]
    return max(steps, default=0)


def audit(run_dir: str | Path, learners: int, followers: int) -> dict[str, Any]:
    """Counts over the run in ``run_dir`` (see the module docstring); ``problems`` lists
    each nonzero count in words."""
    run = Path(run_dir)
    tape = EventTape.read(run / "tape.jsonl")
    rounds = tape.round_records()
    applied = [r for r in rounds if r.applied]
    versions = [r.version for r in applied]
    out_of_order = int(versions != list(range(1, len(applied) + 1)))
    # Batches of decided pushes (accepted or rejected: their data was used), once each;
    # the ledger's settled batches are exactly those. A push of a round discarded after its
    # Decide was dropped (its batches trained again by someone) unless it was rejected,
    # which settles it at the Decide.
    used = [
        (sp.chunk, b)
        for r in rounds
        for p, ok in zip(r.participants, r.accepted, strict=False)  # undecided: no flags
        if r.applied or not ok
        for sp in p.meta.spans
        for b in range(sp.start, sp.end)
    ]
    snap = json.loads((run / "leader" / "snapshot.json").read_text())
    ledger = chunks.ChunkLedger.from_dict(snap["data"])
    done = set().union(*(chunks.settled_batches(ledger, e) for e in range(ledger.epoch + 1)))
    twice = len(used) - len(set(used))
    lost = len(done - set(used))
    books = json.loads((run / "leader" / "status.json").read_text())["tokens"]
    reported = doubt = 0
    leader = Leader.restore(snap)
    for j in range(learners):
        path = run / f"learner{j}" / "reported.json"
        if path.exists():
            record = json.loads(path.read_text())
            # A push in doubt no later process of its learner settled (killed as the job
            # stopped): settled by the same rule, with the leader's final word.
            counted, unresolved = settled_at_the_end(record, functools.partial(leader.booked_of, j))
            reported += record["tokens"] + counted
            doubt += unresolved
    unbooked = abs(reported - books["reported"])
    unsettled = abs(books["reported"] - books["applied"] - books["rejected"] - books["dropped"])
    # Followers: each ended at the leader's last version, and applied versions in order (a
    # log may lack the line of a step whose process died right after reporting it, and a
    # step redone after a whole-run resume is logged again: versions, not lines).
    last = versions[-1] if versions else 0
    diverged = 0
    for k in range(followers):
        path = run / f"follower{k}" / "decisions.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        logged = list(dict.fromkeys(json.loads(x)["version"] for x in lines))
        in_order = logged == sorted(logged) and set(logged) <= set(versions)
        diverged += not in_order or _follower_version(run, k) != last
    counts = {
        "versions_out_of_order": out_of_order,
        "batches_twice": twice,
        "batches_lost": lost,
        "tokens_unbooked": unbooked,
        "tokens_unsettled": unsettled,
        "followers_diverged": diverged,
    }
    problems = [f"{name.replace('_', ' ')}: {n}" for name, n in counts.items() if n]
    return {
        **counts,
        "problems": problems,
        "tokens_in_doubt": doubt,
        "applied": len(applied),
        "tokens": books,
        "tape": tape,
    }
