"""Every role's log: the standard :mod:`logging` module, set up once per process.

Each role process (leader, follower, learner, evaluator) calls :func:`setup` with its name
first thing; its lines go to its standard output (``RUN_DIR/logs/NAME.log`` under the
local launcher, the job step's or pod's log on a cluster), one line per record, with the
time, the level and the role::

    2026-12-04 07:41:02.123 INFO learner0: compiled in 31.2 s

``DIPSJAX_LOG_LEVEL`` sets the level of dipsjax's own loggers (``DEBUG``, ``INFO`` (the
default), ``WARNING``, ``ERROR``); other libraries' loggers (orbax, absl, grpc) log their
warnings and errors only, with the same prefix.
"""

from __future__ import annotations

import logging
import os
import sys

LEVEL_ENV = "DIPSJAX_LOG_LEVEL"
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(role)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
#: A line of a role's log (``(date) (time) (level) (role): (message)``), for readers.
LINE = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "


class _Role(logging.Filter):
    """Stamps each record with the process's role (the ``%(role)s`` of :data:`FORMAT`)."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        return True


def level_from_env(default: int = logging.INFO) -> int:
    """``DIPSJAX_LOG_LEVEL`` as a :mod:`logging` level (a name or a number); ``default``
    when unset or not a level."""
    text = os.environ.get(LEVEL_ENV, "").strip()
    if not text:
        return default
    if text.isdigit():
        return int(text)
    level = logging.getLevelName(text.upper())
    return level if isinstance(level, int) else default


def setup(role: str) -> logging.Logger:
    """This process's logging: one handler on its standard output (the role's log), the
    time, level and ``role`` on every line; dipsjax's loggers at ``DIPSJAX_LOG_LEVEL``,
    others at WARNING. Called again (a test, a role run in-process), it replaces its own
    handler. Returns the ``dipsjax`` logger."""
    level = level_from_env()
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_dipsjax", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(sys.stdout)
    handler._dipsjax = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    handler.addFilter(_Role(role))
    root.addHandler(handler)
    root.setLevel(max(level, logging.WARNING))
    ours = logging.getLogger("dipsjax")
    ours.setLevel(level)
    return ours
