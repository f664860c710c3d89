"""Rate-limited logging of refusals (issue 18 item 7): counted exactly, logged in summary.

A storm of refused handshakes or frames must not flood the log, the metrics or TensorBoard:
:class:`RefusalLog` counts every refusal by kind and emits at most one line per kind per
``interval`` seconds, carrying the count since the kind's previous line.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable


class RefusalLog:
    """Exact counts by kind; at most one line per kind per ``interval`` (``emit(line)``)."""

    def __init__(
        self,
        interval: float = 10.0,
        emit: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "",
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.interval, self.emit, self.clock, self.prefix = interval, emit, clock, prefix
        self.counts: collections.Counter[str] = collections.Counter()
        self._since: collections.Counter[str] = collections.Counter()  # not yet in a line
        self._last: dict[str, float] = {}  # kind -> when its last line went out
        self._lock = threading.Lock()

    def record(self, kind: str, message: str) -> bool:
        """Counts one refusal; True when a line went out for it now (the caller may then
        update its metrics: once per kind per interval, not per event)."""
        with self._lock:
            self.counts[kind] += 1
            self._since[kind] += 1
            now = self.clock()
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                return False
            n, self._since[kind], self._last[kind] = self._since[kind], 0, now
        self.emit(f"{self.prefix}refused ({kind}): {message} [{n} since the last line]")
        return True

    def summary(self) -> str:
        """All counts, e.g. for the log at shutdown."""
        with self._lock:
            parts = ", ".join(f"{k}: {n}" for k, n in sorted(self.counts.items()))
        return f"{self.prefix}refusals: {parts or 'none'}"
