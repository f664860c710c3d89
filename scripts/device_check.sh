#!/usr/bin/env bash
# One prepared accelerator check (issue 21), under 8 minutes on one GPU host: the learner's
# model and step on the GPU, its FLOPs utilization, and a 2-learner run with a GPU each.
#
#   bash scripts/device_check.sh            # on a machine with an NVIDIA GPU
#   DEVICE_CHECK_PLATFORM=cpu bash scripts/device_check.sh   # the same steps on the CPU
#
# Set-up: a virtual environment at $VENV (default /tmp/dipsjax-device) that sees the
# system's packages (an image with JAX for CUDA keeps its own); if JAX there sees no GPU,
# `pip install "jax[cuda12]"` (or, offline, the wheels in ./.whl); then dipsjax itself,
# without its pins (the image's JAX may be older than pyproject.toml's range: the check
# says which it ran), and whatever dipsjax needs that is missing (from ./.whl if present).
# Steps, each printing its figures as `name: value` lines, the last block a summary:
#   1. the model and inner-step equivalence tests (tests/model, tests/learner/test_step.py)
#      with JAX on the GPU;
#   2. benchmarks/learner_mfu.py for `small` (float32) and `llama3.2-1b` (bfloat16);
#   3. `dipsjax run` of `small`, 2 learners, one GPU each (both on GPU 0 when the host has
#      one: two partitions of one host).
set -uo pipefail
cd "$(dirname "$0")/.."
PLATFORM=${DEVICE_CHECK_PLATFORM:-gpu}
OUT=${OUT:-$PWD/runs/device_check}
VENV=${VENV:-/tmp/dipsjax-device}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
t0=$(date +%s)
note() { echo "$*" | tee -a "$SUMMARY"; }
step() { echo "== $* ($(($(date +%s) - t0)) s)"; }

step "set-up"
if [ "$PLATFORM" = cpu ] && [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  "$PYTHON" -m venv --system-site-packages "$VENV" || exit 1
  PY="$VENV/bin/python"
  pip_in() { "$PY" -m pip install -q "$@"; }
  wheels=()
  [ -d .whl ] && wheels=(--no-index --find-links .whl)
  if ! "$PY" -c "import jax, sys; sys.exit(0 if jax.devices()[0].platform == 'gpu' else 1)" 2>/dev/null; then
    [ "$PLATFORM" = gpu ] && pip_in "${wheels[@]}" -U "jax[cuda12]"
  fi
  pip_in --no-deps -e . || exit 1
  missing=$("$PY" - <<'EOF'
import importlib.metadata as md, re
need = md.requires("dipsjax") or []
out = []
for r in need:
    if "extra ==" in r and "extra == \"run\"" not in r:
        continue
    name = re.split(r"[ <>=!;\[]", r, maxsplit=1)[0]
    try:
        md.version(name)
    except md.PackageNotFoundError:
        out.append(name)
print(" ".join(out))
EOF
)
  [ -n "$missing" ] && pip_in "${wheels[@]}" $missing
fi
if [ "$PLATFORM" = gpu ]; then
  export JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false
else
  export JAX_PLATFORMS=cpu
fi
"$PY" -c "import jax, dipsjax; print('jax', jax.__version__, jax.devices())" | tee -a "$SUMMARY" || exit 1

step "1. model and step equivalence on $PLATFORM"
# The sharded cases need 8 devices: on one GPU the unsharded and single-device ones run.
"$PY" -m pytest -q -p no:cacheprovider -n 0 -o addopts="" tests/model \
  tests/learner/test_step.py -k "not sharded or shape0" 2>&1 | tee "$OUT/tests.log" | tail -3
passed=$(grep -Eo "[0-9]+ passed" "$OUT/tests.log" | tail -1 | cut -d' ' -f1)
failed=$(grep -Eo "[0-9]+ failed" "$OUT/tests.log" | tail -1 | cut -d' ' -f1)
note "device_equivalence_tests_passed: ${passed:-0}"
note "device_equivalence_tests_failed: ${failed:-0}"

step "2. learner MFU"
for spec in "small float32 128 5" "llama3.2-1b bfloat16 512 3"; do
  read -r cfg dtype seq trials <<<"$spec"
  [ "$PLATFORM" = cpu ] && [ "$cfg" = llama3.2-1b ] && continue  # 3 x 20 GB: not on a CPU host
  "$PY" benchmarks/learner_mfu.py --config "$cfg" --dtype "$dtype" --seq "$seq" \
    --batch 8 --steps 4 --trials "$trials" --warmup 1 2>&1 | tee "$OUT/mfu_$cfg.log" | tail -8
  for k in step_mfu plain_mfu learner_step_ratio learner_tokens_per_s; do
    v=$(grep -E "^$k: " "$OUT/mfu_$cfg.log" | awk '{print $2}')
    note "mfu_${cfg//[.-]/_}_$k: ${v:-missing}"
  done
done

step "3. dipsjax run, 2 learners with a device each"
if [ "$PLATFORM" = gpu ]; then
  n=$("$PY" -c "import jax; print(len(jax.devices()))")
  second=$([ "$n" -ge 2 ] && echo 1 || echo 0)
  devs=(--set "launch.learner.platform='gpu'" --set "launch.learner.accelerators=(0,)"
    --set "launch.learners={'1': {'platform': 'gpu', 'accelerators': ($second,)}}")
else
  devs=(--set launch.learner.cpu_devices=1)
fi
"$PY" -m dipsjax.cli run quickstart --arg ci --set sim.learners=2 "--set=sim.speeds=(1.0, 1.0)" \
  --set "sim.model='small'" "${devs[@]}" --out "$OUT/run" 2>&1 | tee "$OUT/run.log" | tail -6
rc=${PIPESTATUS[0]}
note "device_run_exit: $rc"
note "device_run_final_bpb: $(grep -Eo '\(([0-9.]+) bits/byte\)' "$OUT/run.log" | tail -1 | tr -dc '0-9.')"
note "device_check_seconds: $(($(date +%s) - t0)) (goal: < 480)"
echo "== summary"
cat "$SUMMARY"
