"""Event tape and token ledger: what happened, in a form that can be replayed and audited.

The **event tape** is a list of JSON records, one per outer round and one per membership
event (Decoupled DiLoCo keeps such a tape with vector clocks and per-learner token counts to
separate algorithmic behaviour from system noise). A round record holds everything needed
to recompute the round: participants with their base versions, tokens and steps, the vector
clock, anomaly scores, the accepted set, weights, the clip factor, the grace window used and
the phase timings.

The **token ledger** accounts for every token a learner reports consuming: each ends as
``applied`` (in an accepted contribution of an applied round), ``rejected`` (by the anomaly
penalty), ``dropped`` (stale, its learner evicted or crashed, or refused) or is still
``outstanding`` (pushed, not yet decided). Nothing disappears and nothing is counted twice:
``consumed == applied + rejected + dropped + outstanding`` at every moment.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

OUTCOMES = ("applied", "rejected", "dropped")


@dataclasses.dataclass
class TokenLedger:
    """Per-learner token accounting (see module docstring)."""

    consumed: dict[int, int] = dataclasses.field(default_factory=dict)
    settled: dict[str, dict[int, int]] = dataclasses.field(
        default_factory=lambda: {k: {} for k in OUTCOMES}
    )

    def consume(self, learner: int, tokens: int) -> None:
        """A learner reports ``tokens`` consumed (they are outstanding until settled)."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens} for learner {learner}")
        self.consumed[learner] = self.consumed.get(learner, 0) + int(tokens)

    def settle(self, learner: int, tokens: int, outcome: str) -> None:
        """Moves ``tokens`` of ``learner`` from outstanding to ``outcome``."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        if tokens > self.outstanding(learner):
            raise ValueError(
                f"learner {learner}: settling {tokens} tokens as {outcome} but only "
                f"{self.outstanding(learner)} are outstanding"
            )
        book = self.settled[outcome]
        book[learner] = book.get(learner, 0) + int(tokens)

    def outstanding(self, learner: int) -> int:
        done = sum(self.settled[k].get(learner, 0) for k in OUTCOMES)
        return self.consumed.get(learner, 0) - done

    def totals(self) -> dict[str, int]:
        """``{'consumed', 'applied', 'rejected', 'dropped', 'outstanding'}`` over learners."""
        out = {k: sum(v.values()) for k, v in self.settled.items()}
        out["consumed"] = sum(self.consumed.values())
        out["outstanding"] = out["consumed"] - sum(out[k] for k in OUTCOMES)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "settled": self.settled}


@dataclasses.dataclass
class EventTape:
    """An append-only list of JSON-able records (``kind`` = ``round`` or ``membership``)."""

    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"kind": kind, **fields}
        json.dumps(record)  # fail early on anything that would not serialise
        self.records.append(record)
        return record

    def rounds(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "round"]

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
