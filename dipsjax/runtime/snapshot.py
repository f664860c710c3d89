"""A consistent snapshot of a running job, and a fresh set of processes started from it.

``dipsjax snapshot RUN_DIR DEST`` (or :func:`take`), while the job trains, copies into
``DEST`` a state of the whole system at one global version ``V``:

- the leader's metadata snapshot (membership, leases, rounds in flight, books, anomaly
  history) and its event tape up to the very event that snapshot follows (the leader
  writes how many tape records each snapshot follows, so a tape that grew meanwhile is
  cut back to that point);
- every follower's checkpoint (shard and FP32 outer state) at version ``V``.

A leader snapshot taken while a decided round is being carried out (its decision sent,
the followers merging and applying) is not taken: the followers hold that round's inputs
in memory only, so a copy could not redo it (a resumed job stopped on it). The leader
writes a new snapshot as the round ends, and that one is taken instead.

Why this is consistent, in the spirit of Decoupled DiLoCo's Chandy-Lamport snapshots: the
leader's decisions are the only messages that change the followers' state, and a
follower writes version ``V`` to disk before it tells the leader it applied it, so when
the leader's snapshot says ``V`` every follower holds ``V`` on disk (each keeps its three
newest, and the leader cannot reach ``V + 2`` before they all hold ``V + 1``). Pushes in
flight are channel state: a resumed leader drops them and counts their tokens, so none is
lost or merged twice. Learners are not part of it: they come back as new incarnations and
pull version ``V``, as after a crash, and their chunk leases go back to the ledger.

``dipsjax run --resume DEST`` then starts a fresh leader, followers (from ``V``) and
learners on new ports, and the job goes on to its token budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dipsjax.runtime.spec import RunSpec
from dipsjax.syncer.tape import TokenLedger

MARKER = "snapshot.json"  # in DEST: what was taken; learners start as new incarnations


def take(run_dir: str | Path, dest: str | Path, attempts: int = 5) -> dict[str, Any]:
    """Copies a consistent state of the running job in ``run_dir`` to ``dest`` (a new
    folder); returns what was taken (``version``, ``tape_records``, ``followers``)."""
    run_dir, dest = Path(run_dir), Path(dest)
    if dest.exists():
        raise FileExistsError(f"snapshot: {dest} already exists")
    spec_path = run_dir / "spec.json"
    if not spec_path.exists():
        raise FileNotFoundError(f"snapshot: {spec_path} not found (not a run folder?)")
    spec = RunSpec.read(spec_path)
    attempt, decided_until = 0, time.monotonic() + 60.0
    while attempt < attempts:
        leader_snap = (run_dir / "leader" / "snapshot.json").read_text()  # written atomically
        state = json.loads(leader_snap)
        if "tape_records" not in state:
            raise ValueError("snapshot: the leader's snapshot does not say its tape length")
        rnd = state.get("round")
        if rnd is not None and rnd.get("decision") is not None and time.monotonic() < decided_until:
            # A round decided and being carried out: the followers hold its inputs (the
            # staged pushes) in memory, not in their checkpoints, so a copy cannot redo it.
            # The leader snapshots again as the round ends; take that one.
            time.sleep(0.05)
            continue
        attempt += 1
        version = int(state["version"])
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for k in range(len(spec.followers)):
                src = run_dir / f"follower{k}" / "ckpt" / str(version)
                shutil.copytree(src, tmp / f"follower{k}" / "ckpt" / str(version))
        except (FileNotFoundError, shutil.Error):
            # A follower dropped version V from its three newest meanwhile: the job moved
            # on by two versions while copying. Take the leader's newer snapshot.
            time.sleep(0.1 * attempt)
            continue
        lines = (run_dir / "tape.jsonl").read_text().splitlines(keepends=True)
        lines = [x for x in lines if x.endswith("\n")]  # a line being written is not whole
        n = int(state["tape_records"])
        if len(lines) < n:  # cannot happen (the tape is written first); read again
            shutil.rmtree(tmp, ignore_errors=True)
            time.sleep(0.1 * attempt)
            continue
        (tmp / "leader").mkdir(parents=True)
        (tmp / "leader" / "snapshot.json").write_text(leader_snap)
        (tmp / "tape.jsonl").write_text("".join(lines[:n]))
        # Learners come back as new incarnations (their inner state is not part of it).
        members = {int(j): int(c) for j, c in state["incarnations"]}
        incarnations = {f"learner{j}": members.get(j, -1) + 1 for j in range(spec.sim.learners)}
        (tmp / "incarnations.json").write_text(json.dumps(incarnations))
        dataclasses.replace(spec, run_dir=str(dest)).write(tmp / "spec.json")
        taken = {
            "from": str(run_dir),
            "version": version,
            "tape_records": n,
            "followers": len(spec.followers),
            "tokens": TokenLedger.from_json(state["ledger"]).totals(),
        }
        (tmp / MARKER).write_text(json.dumps(taken, indent=1))
        tmp.rename(dest)
        return taken
    shutil.rmtree(dest.with_name(dest.name + ".partial"), ignore_errors=True)
    if not spec.checkpoints:
        raise ValueError("snapshot: the job does not checkpoint its followers (checkpoints=False)")
    raise RuntimeError(f"snapshot: the job moved on too fast to copy in {attempts} attempts")


def main(argv: Sequence[str] | None = None) -> int:
    from dipsjax.runtime import permissions

    permissions.private()  # the snapshot holds the model: its owner's alone
    parser = argparse.ArgumentParser(
        prog="dipsjax snapshot",
        description="Take a consistent snapshot of a running job (leader metadata and every "
        "follower's shard at one version); `dipsjax run --resume DEST` restarts from it.",
    )
    parser.add_argument("run_dir")
    parser.add_argument("dest")
    args = parser.parse_args(argv)
    try:
        taken = take(args.run_dir, args.dest)
    except (FileExistsError, FileNotFoundError, ValueError, RuntimeError) as e:
        parser.error(str(e))
    print(
        f"snapshot of {args.run_dir} at version {taken['version']} "
        f"({taken['tape_records']} tape records) in {args.dest}"
    )
    return 0
