#!/usr/bin/env bash
# Sets up dipsjax on a fresh machine: a virtual environment in .venv/ (Python 3.12 when
# there is one, else the newest Python >= 3.12 found; or PYTHON=/path/to/python), the
# package with every extra and its test tools, and the text corpus in data/. Safe to run
# again: it only reinstalls when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# A Python that runs and is >= 3.12 (with venv).
usable() {
  command -v "$1" >/dev/null 2>&1 &&
    "$1" -c 'import sys, venv; assert sys.version_info >= (3, 12)' 2>/dev/null
}

find_python() {
  if [ -n "${PYTHON:-}" ]; then
    if usable "$PYTHON"; then command -v "$PYTHON"; return; fi
    echo "setup: PYTHON=$PYTHON is not a working Python >= 3.12" >&2
    exit 1
  fi
  # 3.12 first (what the project is tested with), then newer ones, newest first.
  local cand minor
  for cand in python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12 \
              /root/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if usable "$cand"; then command -v "$cand"; return; fi
  done
  for minor in 20 19 18 17 16 15 14 13; do
    for cand in "python3.$minor" "/usr/bin/python3.$minor" "/usr/local/bin/python3.$minor" \
                /root/.pyenv/versions/3."$minor"*/bin/python3."$minor" \
                "$HOME"/.pyenv/versions/3."$minor"*/bin/python3."$minor"; do
      if usable "$cand"; then command -v "$cand"; return; fi
    done
  done
  for cand in python3 python; do
    if usable "$cand"; then command -v "$cand"; return; fi
  done
  echo "setup: no working Python >= 3.12 found; install one or set PYTHON=/path/to/python3" >&2
  exit 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(find_python)
  echo "setup: creating .venv with $py"
  "$py" -m venv .venv
fi

stamp=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat .venv/.dipsjax-stamp 2>/dev/null)" != "$stamp" ]; then
  echo "setup: installing dipsjax, every extra and the test tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[all,dev]'
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

# The corpus goes to data/corpus here ($DIPSJAX_DATA if set): in a clone that has data/,
# dipsjax reads it from there (dipsjax.data.fetch.data_dir). The subword tokenizer of the
# demos (bpe:1024) is trained offline on each corpus's train split here, once, and cached
# beside it (data/tokenizers), so no run trains it on first use.
if [ -f dipsjax/data/fetch.py ]; then
  mkdir -p data
  .venv/bin/python -m dipsjax.data.fetch --tokenizer bpe:1024
fi
echo "setup: ready (.venv/bin/dipsjax)"
