"""The evaluator process: validation loss of the versions a run saves, while it trains.

The followers save the model every ``eval_every`` versions (``RUN_DIR/follower{k}/vV.npz``,
one shard each). This process, which the local launcher starts beside the roles at the
lowest CPU priority (``os.nice``) and ends with the job, polls for a version whose shards
are all written, evaluates it on the run's validation data
(``dipsjax.sim.world.World(spec.sim).evaluate``: the task's loss (for a language model in
nats per token), its loss-derived figures (the bits per byte) and its own ``eval_metrics``
(a classifier's accuracy)), and reports it:

* ``RUN_DIR/eval.jsonl``: one line per version (``version``, ``tokens`` applied by then,
  ``val_loss``, ``val_bpb`` (NaN for a task without it), ``val_<name>`` for each of the
  task's other figures, the leader's ``t`` when the version was applied, ``time`` (Unix) and
  ``seconds`` the evaluation took), which the launcher's console and ``dipsjax status``
  show;
* TensorBoard, ``RUN_DIR/tb/eval``: ``live/val_loss``, ``live/val_bpb`` and
  ``live/val_<name>`` against the tokens applied, with the wall time (the end-of-run
  evaluation writes ``eval/val_loss`` and the others there for every saved version).

It never touches the learners' path: it reads files the followers have written. It starts
with version 0 (the initialization: the baseline) unless a later one is saved. Fallen
behind, it skips to the newest version (the end-of-run evaluation has them all). It exits
once the leader has stopped the job and nothing newer is left, on SIGTERM, or with its
launcher.

Run: ``python -m dipsjax.runtime.evaluator RUN_DIR/spec.json [--poll 1.0] [--nice 19]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dipsjax.runtime import logs, progress
from dipsjax.runtime.spec import RunSpec

log = logging.getLogger("dipsjax.runtime.evaluator")  # not __name__: "__main__" when run

_VERSION_FILE = re.compile(r"^v(\d+)\.npz$")


def saved_versions(run_dir: Path, followers: int) -> list[int]:
    """The versions every follower has saved a shard of (``follower{k}/vV.npz``), oldest
    first."""
    have: set[int] | None = None
    for k in range(followers):
        mine = {
            int(m.group(1))
            for p in (run_dir / f"follower{k}").glob("v*.npz")
            if (m := _VERSION_FILE.match(p.name))
        }
        have = mine if have is None else have & mine
    return sorted(have or ())


def applied(run_dir: Path) -> dict[int, tuple[int, float]]:
    """``{version: (tokens applied by then, the leader's time it ended)}`` from the tape
    (a line being written is skipped)."""
    out: dict[int, tuple[int, float]] = {0: (0, 0.0)}
    total = 0
    try:
        lines = (run_dir / "tape.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") != "round" or not r.get("applied"):
            continue
        parts = zip(r["participants"], r["accepted"], strict=False)
        total += sum(p["meta"]["tokens"] for p, ok in parts if ok)
        ended = r.get("timings", {}).get("ended")
        out[int(r["version"])] = (total, float(ended) if isinstance(ended, int | float) else 0.0)
    return out


def job_stopped(run_dir: Path) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return bool(json.loads((run_dir / "leader" / "snapshot.json").read_text()).get("stopped"))
    return False


def final_version(run_dir: Path) -> int | None:
    """The global version the leader's snapshot holds (after the job stopped: its last)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        v = json.loads((run_dir / "leader" / "snapshot.json").read_text()).get("version")
        return None if v is None else int(v)
    return None


class Evaluator:
    """Evaluates the newest saved version not yet evaluated (see module docstring)."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.run_dir = Path(spec.run_dir)
        self.done = {int(p["version"]) for p in progress.read_validation(self.run_dir)}
        self.failed: dict[int, int] = {}  # version -> tries that could not read it
        self._world: Any = None
        self._tb: Any = None

    @property
    def world(self) -> Any:
        if self._world is None:
            from dipsjax.sim.world import World

            t0 = time.perf_counter()
            self._world = World(self.spec.sim)
            log.info("validation data and model ready in %.1f s", time.perf_counter() - t0)
        return self._world

    def pending(self) -> int | None:
        """The newest version every follower saved that is newer than any evaluated; at
        first, with none saved yet, version 0 (the model's initialization: the baseline)."""
        versions = saved_versions(self.run_dir, len(self.spec.followers))
        if not self.done:
            versions = [0, *versions]
        newest = max(self.done, default=-1)
        fresh = [v for v in versions if v > newest and self.failed.get(v, 0) < 5]
        return fresh[-1] if fresh else None

    def step(self) -> dict[str, Any] | None:
        """Evaluates one version if one is pending; returns its point."""
        v = self.pending()
        if v is None:
            return None
        from dipsjax.launch.run import load_params, shard_files

        try:
            if v == 0:  # the initialization, as the end-of-run evaluation takes it
                version, params = 0, self.world.init_params
            else:
                version, params = load_params(shard_files(self.run_dir, f"v{v}"))
        except Exception as e:  # a shard still being written: try again at the next poll
            self.failed[v] = self.failed.get(v, 0) + 1
            log.debug("version %d not readable yet (%s: %s)", v, type(e).__name__, e)
            return None
        return self.evaluate(version, params)

    def final(self) -> dict[str, Any] | None:
        """After the job stopped: its last version, from the followers' final shards
        (``follower{k}/final.npz``, written as they shut down), unless it was evaluated
        already; ``None`` while they are not all there (or not of that version yet)."""
        from dipsjax.launch.run import load_params, shard_files

        last = final_version(self.run_dir)
        if last is None or last in self.done or last <= max(self.done, default=-1):
            return None
        files = shard_files(self.run_dir, "final")
        if len(files) < len(self.spec.followers):
            return None
        try:
            version, params = load_params(files)
        except Exception as e:  # still being written, or an older run's
            log.debug("final shards not readable yet (%s: %s)", type(e).__name__, e)
            return None
        return self.evaluate(version, params) if version == last else None

    def evaluate(self, version: int, params: Any) -> dict[str, Any]:
        """Evaluates ``params`` as ``version``: appends its point to ``eval.jsonl``, writes
        TensorBoard and the log; returns the point."""
        t0 = time.perf_counter()
        figures = {k: float(v) for k, v in self.world.evaluate(params).point().items()}
        seconds = time.perf_counter() - t0
        tokens, t = applied(self.run_dir).get(version, (None, None))
        point = {
            "version": version,
            "tokens": tokens,
            **figures,
            "t": t,
            "time": time.time(),
            "seconds": seconds,
        }
        with (self.run_dir / progress.EVAL_FILE).open("a") as fh:
            fh.write(json.dumps(point, allow_nan=True) + "\n")
        self.done.add(version)
        self.tensorboard(point)
        log.info(
            "version %d: %s, %s tokens applied; evaluated in %.1f s",
            version,
            progress.validation_text([point]).rsplit(" at version", 1)[0],
            tokens,
            seconds,
        )
        return point

    def tensorboard(self, point: dict[str, Any]) -> None:
        if self._tb is None:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb" / "eval"))
        step = point["tokens"] if point["tokens"] is not None else point["version"]
        for key in ("val_loss", "val_bpb", *progress.other_figures(point)):
            if math.isfinite(point[key]):
                self._tb.add_scalar(f"live/{key}", point[key], step, walltime=point["time"])
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()

    def run(self, poll: float = 1.0, final_wait: float = 60.0) -> None:
        """Evaluates versions as they are saved until the job stopped; then waits up to
        ``final_wait`` seconds for the followers' final shards, so the last version the job
        reached is evaluated too (whether or not it was a save point)."""
        log.info(
            "watching %s for versions (every %d versions the followers save one)",
            self.run_dir,
            self.spec.sim.eval_every,
        )
        try:
            while True:
                stopped = job_stopped(self.run_dir)  # before looking: nothing newer comes after
                if self.step() is not None:
                    continue
                if stopped:
                    break
                time.sleep(poll)
            last = final_version(self.run_dir)
            deadline = time.monotonic() + final_wait
            while self.spec.checkpoints and self.final() is None:
                if last is None or last <= max(self.done, default=-1):
                    break
                if time.monotonic() > deadline:
                    log.warning(
                        "the job's last version %d was not saved within %.0f s: not evaluated "
                        "here (the end-of-run evaluation has it)",
                        last,
                        final_wait,
                    )
                    break
                time.sleep(poll)
            log.info("the job stopped: %d versions evaluated", len(self.done))
        finally:
            self.close()


def main(argv: list[str] | None = None) -> int:
    from dipsjax.runtime import permissions

    permissions.private()  # what this process writes is its owner's alone
    logs.setup("evaluator")
    parser = argparse.ArgumentParser(prog="dipsjax-evaluator", description=__doc__)
    parser.add_argument("spec", help="RUN_DIR/spec.json written by the launcher")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between looks")
    parser.add_argument("--nice", type=int, default=19, help="niceness increment (os.nice)")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(args.nice)  # the learners' cores come first
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # through the finally blocks
    Evaluator(RunSpec.read(args.spec)).run(args.poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
