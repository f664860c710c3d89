"""Every role's log lines (issue 19): time, level and role, at ``DIPSJAX_LOG_LEVEL``."""

import logging
import re

import pytest

from dipsjax.runtime import logs


@pytest.fixture
def role_log(monkeypatch, capsys):
    def setup(role, level=None):
        if level is None:
            monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
        else:
            monkeypatch.setenv(logs.LEVEL_ENV, level)
        logs.setup(role)
        return lambda: capsys.readouterr().out

    yield setup
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_dipsjax", False):
            root.removeHandler(h)
    root.setLevel(logging.WARNING)
    logging.getLogger("dipsjax").setLevel(logging.NOTSET)


def test_a_role_logs_with_time_level_and_role_at_info_by_default(role_log):
    out = role_log("learner0")
    logging.getLogger("dipsjax.runtime.learner").info("compiled in %.1f s", 31.24)
    logging.getLogger("dipsjax.runtime.learner").debug("not shown")
    logging.getLogger("absl").info("another library's chatter: not shown")
    logging.getLogger("absl").warning("another library's warning")
    lines = out().splitlines()
    assert len(lines) == 2, lines
    assert re.match(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO learner0: compiled in 31\.2 s$", lines[0]
    )
    assert re.match(logs.LINE + "another library's warning$", lines[1]) and " WARNING " in lines[1]


def test_the_level_comes_from_the_environment(role_log):
    out = role_log("follower1", "debug")
    logging.getLogger("dipsjax.runtime.follower").debug("checkpoint of version %d saved", 3)
    assert re.match(logs.LINE + "checkpoint of version 3 saved$", out())
    out = role_log("leader", "WARNING")
    logging.getLogger("dipsjax.runtime.leader").info("round 1 applied")
    logging.getLogger("dipsjax.runtime.leader").warning("follower 0: lost")
    lines = out().splitlines()
    assert len(lines) == 1 and re.match(logs.LINE + "follower 0: lost$", lines[0])
    assert logs.level_from_env() == logging.WARNING
    out = role_log("leader", "nonsense")  # not a level: the default
    assert logs.level_from_env() == logging.INFO
