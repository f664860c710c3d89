"""The code base is ruff-clean (lint rules and formatting from pyproject.toml)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATHS = ["dipsjax", "tests", "benchmarks", "launch", "colabs"]


def _ruff(*args):
    existing = [p for p in PATHS if (ROOT / p).exists()]
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *existing],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_ruff_check():
    result = _ruff("check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = _ruff("format", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
