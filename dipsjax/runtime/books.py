"""A learner's side of the token books, kept across its processes.

``RUN_DIR/learner{j}/reported.json`` is written whole (by rename) at each change:

* ``tokens``: of every push of the learner the leader booked (its answer came back, or
  the leader's word later said so), over all its incarnations: what
  :func:`dipsjax.runtime.audit.audit` balances against the leader's ledger;
* ``incarnation``: the process that wrote it; ``booked``: how many of that incarnation's
  pushes it knows were booked;
* ``doubt``: the tokens of a push request written down before it was sent, whose answer
  is not (0: none): a process killed at any moment leaves what may have reached the
  leader;
* ``asks``: ``[incarnation, booked, doubt]`` of an earlier incarnation that died with a
  push in doubt, until the leader's word on it comes (``Join.asks``,
  ``SendModel.asked``): a process that dies before that passes the question on;
* ``unresolved``: tokens of pushes in doubt the leader could not say anything of (not
  counted; what the audit reports as in doubt).

The rule that settles a push in doubt (:func:`settle`) is one, used by the learner with
the leader's answer and by the audit, for a push no later process settled, with the
leader's snapshot. JAX-free.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dipsjax.runtime.spec import write_json

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Books:
    """What ``reported.json`` holds (see the module docstring); ``stale``: the file is a
    newer incarnation's, not to be written by this process."""

    tokens: int = 0
    booked: int = 0
    doubt: int = 0
    asks: tuple[int, int, int] | None = None
    unresolved: int = 0
    stale: bool = False


def write_books(path: Path, incarnation: int, books: Books) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    d = {f.name: getattr(books, f.name) for f in dataclasses.fields(books) if f.name != "stale"}
    d["asks"] = None if books.asks is None else list(books.asks)
    write_json(path, {**d, "incarnation": incarnation})


def read_books(path: Path, incarnation: int, resume: bool) -> Books:
    """The books a learner process of ``incarnation`` starts from (``path``: its
    ``reported.json``). The same incarnation (``resume``) goes on with them, its push in
    doubt included (its rejoin settles it); a later one keeps the tokens, and asks about
    its predecessor's push in doubt (or passes on the question its predecessor had not
    had answered). A first process (incarnation 0, not resumed) starts from none."""
    if not (resume or incarnation > 0) or not path.exists():
        return Books()
    d = json.loads(path.read_text())
    tokens, was = int(d["tokens"]), d.get("incarnation")
    asks = tuple(d["asks"]) if d.get("asks") else None
    unresolved = int(d.get("unresolved", 0))
    if was is None:  # written before the record held more than the tokens
        return Books(tokens)
    if was == incarnation:
        return Books(tokens, int(d["booked"]), int(d["doubt"]), asks, unresolved)
    if was > incarnation:  # not this process's line of incarnations: left as it is
        log.warning("%s is incarnation %d's, newer than this one (%d)", path, was, incarnation)
        return Books(tokens, stale=True)
    if d["doubt"]:
        asks = (was, int(d["booked"]), int(d["doubt"]))
    return Books(tokens, asks=asks, unresolved=unresolved)


def settle(known: int, doubt: int, booked: int | None) -> tuple[int, int]:
    """A push in doubt of an incarnation whose record knew of ``known`` of its pushes
    booked, against the leader's count of them (``booked``; ``None``: not known): the
    tokens to count (``doubt`` if the leader booked more), and those left unresolved."""
    if booked is None:
        return 0, doubt
    if booked > known + 1:
        log.error(
            "the leader booked %d pushes of an incarnation whose record knew of %d and one "
            "in doubt: counted that one",
            booked,
            known,
        )
    return (doubt if booked > known else 0), 0


def settled_at_the_end(
    record: dict[str, Any], booked_of: Callable[[int], int | None]
) -> tuple[int, int]:
    """A finished run's ``reported.json`` (``record``) with what no later process of its
    learner settled settled by the leader's final word (``booked_of``: how many pushes of
    an incarnation of that learner it booked, ``Leader.booked_of``): (tokens counted,
    tokens left in doubt). A learner killed with a push in doubt, or with a question not
    answered, as the job stopped has no later process to do it."""
    counted, unresolved = 0, int(record.get("unresolved", 0))
    was = record.get("incarnation")
    pending = []
    if was is not None and record.get("doubt"):
        pending.append((int(was), int(record["booked"]), int(record["doubt"])))
    if record.get("asks"):
        pending.append(tuple(int(x) for x in record["asks"]))
    for incarnation, known, doubt in pending:
        got, left = settle(known, doubt, booked_of(incarnation))
        counted, unresolved = counted + got, unresolved + left
    return counted, unresolved
