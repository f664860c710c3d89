"""A run's config is validated whole, up front: every field has a rule (type, range or
allowed set) and the cross-field rules hold, or ``dipsjax run`` refuses it with the field
named, exit code 2, no traceback, and nothing written (issue 18, item 8)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dipsjax.launch import config as run_config

ROOT = Path(__file__).resolve().parents[2]

# The issue's examples: each was accepted up front (or ended in a traceback after
# credentials/ was written). (override, field the error must name).
ISSUE_EXAMPLES = [
    ("sim.batch_size=0", "sim.batch_size"),
    ("sim.outer_lr=-1.0", "sim.outer_lr"),
    ("heartbeat_interval=1e999", "heartbeat_interval"),
    ("sim.speeds=(1e999, 1.0, 1.0, 1.0)", "sim.speeds"),
    ("sim.learners=5000", "sim.learners"),
    ("sim.method='dp'", "sim.method"),
    ("name='../../escaped'", "name"),
    ("name='a/b'", "name"),
    ("name='.hidden'", "name"),
    ("name=''", "name"),
    ("name='" + "x" * 300 + "'", "name"),
    ("sim.corpus='/nonexistent'", "sim.corpus"),
    ("sim.seed=-1", "sim.seed"),
    ("sim.seed=" + str(2**64), "sim.seed"),
    ("sim.heartbeat_interval=nan", "sim.heartbeat_interval"),
]


@pytest.mark.parametrize(("override", "field"), ISSUE_EXAMPLES)
def test_the_issues_nonsense_values_are_refused_up_front_with_the_field_named(override, field):
    if override.endswith("=nan"):
        cfg = run_config.load("quickstart", "ci")
        cfg.sim.heartbeat_interval = math.nan
    else:
        cfg = run_config.load("quickstart", "ci", [override])
    with pytest.raises(ValueError) as info:
        run_config.sim_config(cfg)
    message = str(info.value)
    assert f"config {field}: must be " in message, message
    assert "got " in message


def _run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dipsjax.cli", "run", "quickstart", "--arg", "ci", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("sim.corpus='/nonexistent'", "sim.corpus"),
        ("sim.seed=-1", "sim.seed"),
        ("sim.batch_size=0", "sim.batch_size"),
    ],
)
def test_dipsjax_run_refuses_a_bad_value_with_one_line_exit_2_and_writes_nothing(
    tmp_path, override, field
):
    out = tmp_path / "run"
    proc = _run_cli(tmp_path, "--out", str(out), "--set", override)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"config {field}: must be " in lines[0]
    assert not out.exists()  # no run folder, no credentials/
    assert list(tmp_path.iterdir()) == []
