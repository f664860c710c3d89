"""Event tape, round records and token ledger: what happened, replayable and auditable.

The **event tape** is a list of JSON records: one per outer round (a :class:`RoundRecord`),
one per membership event (join, active, restart, outage, evict, leave) and one per follower
event (Decoupled DiLoCo keeps such a tape with vector clocks and per-learner token counts to
separate algorithmic behaviour from system noise). A round record holds everything needed to
recompute the round: participants with their :class:`~dipsjax.syncer.messages.PushMeta`
(base version, tokens, steps, data position), the vector clock (accepted contributions per
learner, monotone across eviction and rejoin), anomaly scores, the accepted set, weights, the
clip factor, the grace window used and the phase timings. The leader writes it and
:func:`dipsjax.sim.replay.replay` reads it, through the same :class:`RoundRecord` type.

The **token ledger** is the leader's side of the accounting, counted from events only: the
tokens learners *reported* in their pushes (refused pushes included) and how they were
settled -- ``applied`` (an accepted contribution of an applied round), ``rejected`` (the
anomaly penalty or a non-finite norm), ``dropped`` (stale, refused, its learner evicted or
restarted, its round discarded). Tokens still pending are the leader's
:meth:`~dipsjax.syncer.Leader.outstanding_tokens`, summed over its pending pushes, not a
remainder. Learners count what they consumed on their own side; the test of the invariant
compares the two.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dipsjax.syncer.messages import PushMeta, spans_of

OUTCOMES = ("applied", "rejected", "dropped")
_NONFINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float spelled ``"Infinity"``, ``"-Infinity"`` or
    ``"NaN"``, so it is strict JSON (``allow_nan=False``; protobuf-safe)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    return obj


def from_strict_json(obj: Any) -> Any:
    """Inverse of :func:`strict_json`."""
    if isinstance(obj, str) and obj in _NONFINITE:
        return _NONFINITE[obj]
    if isinstance(obj, dict):
        return {k: from_strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_strict_json(v) for v in obj]
    return obj


@dataclasses.dataclass
class TokenLedger:
    """Per-learner tokens reported and settled at the leader (see module docstring)."""

    reported: dict[int, int] = dataclasses.field(default_factory=dict)
    settled: dict[str, dict[int, int]] = dataclasses.field(
        default_factory=lambda: {k: {} for k in OUTCOMES}
    )

    def report(self, learner: int, tokens: int) -> None:
        """A push of ``learner`` reported ``tokens``."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens} for learner {learner}")
        self.reported[learner] = self.reported.get(learner, 0) + int(tokens)

    def settle(self, learner: int, tokens: int, outcome: str) -> None:
        """Records how ``tokens`` of ``learner`` ended; never more than were reported."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        done = sum(self.settled[k].get(learner, 0) for k in OUTCOMES)
        if done + tokens > self.reported.get(learner, 0):
            raise ValueError(
                f"learner {learner}: settling {tokens} tokens as {outcome} but only "
                f"{self.reported.get(learner, 0) - done} reported tokens are unsettled"
            )
        book = self.settled[outcome]
        book[learner] = book.get(learner, 0) + int(tokens)

    def totals(self) -> dict[str, int]:
        """``{'reported', 'applied', 'rejected', 'dropped'}`` summed over learners."""
        out = {k: sum(v.values()) for k, v in self.settled.items()}
        out["reported"] = sum(self.reported.values())
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "reported": [[j, n] for j, n in self.reported.items()],
            "settled": {k: [[j, n] for j, n in v.items()] for k, v in self.settled.items()},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TokenLedger:
        return cls(
            reported={j: n for j, n in d["reported"]},
            settled={k: {j: n for j, n in v} for k, v in d["settled"].items()},
        )


@dataclasses.dataclass
class Participant:
    """One push of a round: its learner, arrival time, staleness and reported metadata."""

    learner: int
    pushed_at: float
    staleness: int
    meta: PushMeta

    @property
    def base_version(self) -> int:
        return self.meta.base_version

    @property
    def tokens(self) -> int:
        return self.meta.tokens

    @property
    def steps(self) -> int:
        return self.meta.steps


@dataclasses.dataclass
class RoundRecord:
    """One finished round, as the leader decided it (the tape's ``round`` record)."""

    round_id: int
    version: int  # the global version after the round
    applied: bool
    participants: list[Participant]
    dropped: list[Participant]  # pushes too stale to use (dropped before the norms)
    vector_clock: dict[str, int]
    sq_norms: list[float]
    scores: list[float]
    threshold: float | None
    accepted: list[bool]
    weights: list[float]
    clip_factor: float | None
    merged_sq_norm: float | None
    grace: float
    grace_policy: dict[str, Any]
    timings: dict[str, float | None]

    def to_json(self) -> dict[str, Any]:
        return strict_json(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RoundRecord:
        d = from_strict_json({k: v for k, v in d.items() if k != "kind"})

        def part(p: dict[str, Any]) -> Participant:
            meta = dict(p["meta"])
            meta["spans"] = spans_of(meta["spans"])
            return Participant(p["learner"], p["pushed_at"], p["staleness"], PushMeta(**meta))

        d["participants"] = [part(p) for p in d["participants"]]
        d["dropped"] = [part(p) for p in d["dropped"]]
        return cls(**d)


PHASES = {
    "push": ("closed", "transfers_done"),
    "update": ("transfers_done", "applied"),
    "pull": ("applied", "ended"),
}


def records_so_far(path: str | Path) -> list[dict[str, Any]]:
    """The records of a tape file a running leader is still writing: every whole line up
    to the first one being written (none if the file is not there yet)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return out


def phase_seconds(timings: dict[str, Any], grace: float) -> dict[str, float | None]:
    """A round's time in each phase, as the paper's production table: ``grace`` (the
    window after the quorum), ``push`` (window closed to transfers done), ``update``
    (norms, decision, merge, apply) and ``pull``; ``None`` for a phase it did not reach."""
    out: dict[str, float | None] = {"grace": grace}
    for name, (a, b) in PHASES.items():
        ta, tb = timings.get(a), timings.get(b)
        ok = isinstance(ta, float | int) and isinstance(tb, float | int)
        out[name] = float(tb - ta) if ok else None
    return out


@dataclasses.dataclass
class EventTape:
    """An append-only list of JSON-able records (``kind`` = ``round`` or ``membership``)."""

    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = strict_json({"kind": kind, **fields})
        json.dumps(record, allow_nan=False)  # fail early on anything that would not serialise
        self.records.append(record)
        return record

    def rounds(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "round"]

    def round_records(self) -> list[RoundRecord]:
        return [RoundRecord.from_json(r) for r in self.rounds()]

    def membership(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "membership"]

    def write(self, path: str | Path) -> None:
        """One JSON record per line."""
        Path(path).write_text("".join(json.dumps(r) + "\n" for r in self.records))

    @classmethod
    def read(cls, path: str | Path) -> EventTape:
        lines = Path(path).read_text().splitlines()
        records = []
        for i, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON tape record ({e.msg})") from e
        return cls(records)

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]]) -> EventTape:
        return cls(list(records))
