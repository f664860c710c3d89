#!/usr/bin/env bash
# Sets up dipsjax on a fresh machine: a virtual environment in .venv/ (Python 3.12),
# the package with its test tools, and the text corpus. Safe to run again: it only
# reinstalls when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  for cand in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 \
              /usr/local/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$cand"; return
    fi
  done
  echo "setup: no working python3.12 found; install Python 3.12 or set PYTHON=/path/to/python3.12" >&2
  exit 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(find_python)
  echo "setup: creating .venv with $py"
  "$py" -m venv .venv
fi

stamp=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat .venv/.dipsjax-stamp 2>/dev/null)" != "$stamp" ]; then
  echo "setup: installing dipsjax and its dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$stamp" > .venv/.dipsjax-stamp
fi

# A real SLURM for the SLURM executor's tests (tests/launch/test_slurm.py starts and stops
# a cluster of its own on this machine): Debian's slurm-wlm and munge, when missing. It
# needs root and apt-get; elsewhere the run itself is not affected (that test says why).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/slurm_cluster.sh install
else
  echo "setup: not installing SLURM (needs root and apt-get); tests/launch/test_slurm.py will skip"
fi

if [ -f dipsjax/data/fetch.py ]; then
  .venv/bin/python -m dipsjax.data.fetch
fi
echo "setup: ready (.venv/bin/dipsjax)"
