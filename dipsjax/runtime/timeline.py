"""The event tape as a timeline: per learner, when it trained, pushed, waited for the
update and pulled; per round, its grace window, transfers, update and pull. ``dipsjax run``
writes ``RUN_DIR/timeline.png`` at the end of every run; ``dipsjax timeline RUN_DIR
[--out PNG]`` draws it for any tape (a finished run, or one still training).

:func:`spans` turns a tape into labelled intervals (pure; what the picture draws):

* a learner's ``push``: from its push request to the end of its round's transfers;
  ``update``: transfers done to the outer step applied (or the round's end, when nothing
  was applied); ``pull``: applied to the round's end; ``train``: from the end of its
  previous round (or its activation) to its next push request;
* a round's ``grace`` (quorum to close), ``transfers``, ``update`` and ``pull``.

A push that was rejected or dropped ends its ``push`` span with a mark (its kind).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

from dipsjax.syncer.tape import EventTape, RoundRecord

COLORS = {
    "train": "#c8c8c8",
    "push": "#1f77b4",
    "update": "#ff7f0e",
    "pull": "#2ca02c",
    "grace": "#9467bd",
    "transfers": "#1f77b4",
}


class Span(NamedTuple):
    row: str  # "learner J" or "rounds"
    kind: str
    start: float
    end: float
    round_id: int


def spans(tape: EventTape) -> tuple[list[Span], list[tuple[str, float, str]]]:
    """``(spans, marks)``: the intervals of every learner and round, and the pushes that
    were not applied, as ``(row, time, "rejected" | "dropped")``."""
    out: list[Span] = []
    marks: list[tuple[str, float, str]] = []
    free: dict[int, float] = {}  # when each learner was last free to train
    for r in tape.records:  # in the tape's order: memberships and rounds as they happened
        if r["kind"] == "membership":
            if r["event"] == "active":
                free[r["learner"]] = r["t"]
            elif r["event"] in ("leave", "evict", "restart"):
                free.pop(r["learner"], None)  # it trains again once a new one is active
            continue
        if r["kind"] != "round":
            continue
        rec = RoundRecord.from_json(r)
        tm = rec.timings
        opened, ended = tm.get("opened"), tm.get("ended")
        if opened is None or ended is None:
            continue
        done = tm.get("transfers_done") or ended
        applied = tm.get("applied") if rec.applied else None
        quorum, closed = tm.get("quorum"), tm.get("closed")
        if quorum is not None and closed is not None and closed > quorum:
            out.append(Span("rounds", "grace", quorum, closed, rec.round_id))
        if closed is not None and done > closed:
            out.append(Span("rounds", "transfers", closed, done, rec.round_id))
        out.append(Span("rounds", "update", done, applied or ended, rec.round_id))
        if applied is not None and ended > applied:
            out.append(Span("rounds", "pull", applied, ended, rec.round_id))
        accepted = dict(zip(range(len(rec.participants)), rec.accepted, strict=False))
        pushes = [(p, accepted.get(i, True)) for i, p in enumerate(rec.participants)]
        pushes += [(p, None) for p in rec.dropped]
        for p, ok in pushes:
            row = f"learner {p.learner}"
            start = free.get(p.learner)
            if start is not None and p.pushed_at > start:
                out.append(Span(row, "train", start, p.pushed_at, rec.round_id))
            out.append(Span(row, "push", p.pushed_at, max(done, p.pushed_at), rec.round_id))
            if ok is None or not ok:
                marks.append((row, max(done, p.pushed_at), "dropped" if ok is None else "rejected"))
            out.append(Span(row, "update", max(done, p.pushed_at), applied or ended, rec.round_id))
            if applied is not None and ended > applied:
                out.append(Span(row, "pull", applied, ended, rec.round_id))
            if start is not None:  # (an older incarnation's push: the new one is not yet in)
                free[p.learner] = ended
    return out, marks


def plot(tape: EventTape, path: Path, title: str = "") -> Path:
    """Draws the timeline of ``tape`` into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    got, marks = spans(tape)
    rows = sorted({s.row for s in got if s.row != "rounds"}, key=lambda r: int(r.split()[1]))
    rows = ["rounds", *rows]
    y = {r: i for i, r in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
    for s in got:
        ax.broken_barh(
            [(s.start, s.end - s.start)], (y[s.row] - 0.35, 0.7), color=COLORS[s.kind], lw=0
        )
    for row, t, kind in marks:
        ax.plot([t], [y[row]], "x" if kind == "rejected" else "v", color="#d62728", ms=6)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("leader time (s)")
    ax.set_title(title or "event tape")
    handles = [Patch(color=c, label=k) for k, c in COLORS.items() if k != "transfers"]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dipsjax timeline", description=__doc__)
    parser.add_argument("run_dir", help="a run folder (holds tape.jsonl)")
    parser.add_argument("--out", default=None, help="the PNG (default RUN_DIR/timeline.png)")
    args = parser.parse_args(argv)
    tape_path = Path(args.run_dir) / "tape.jsonl"
    if not tape_path.exists():
        parser.error(f"no tape.jsonl in {args.run_dir}")
    out = Path(args.out) if args.out else Path(args.run_dir) / "timeline.png"
    plot(EventTape.read(tape_path), out, title=str(args.run_dir))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
