#!/usr/bin/env bash
# The GPU loop: on a machine with an NVIDIA GPU and no network, install dualk, build the CUDA
# extension, run the whole test suite and the benchmark, and leave logs and results in OUT_DIR.
#
#   bench/gpu_check.sh OUT_DIR [all|tests|bench|integration|tests+integration] [bench suite: quick|default|full] [extra bench args...]
#
# Files written (at most 8, flat, so a remote runner can bring them all back):
#   env.txt  setup.log  pytest.log  junit.xml  bench.json  bench.txt  integration.json  integration.txt
# A carried build/cuda-cache.tar.xz (or .tgz) seeds the CUDA build cache; SAVE_CUDA_CACHE=FILE
# writes one (xz -9e: ~7 MB, where gzip's 16+ MB missed the 16 MiB limit on files coming back).
# TEST_SELECTION="tests/test_x.py tests/test_y.py" and TEST_K="pytest -k expression" run part of
# the suite (tests/test_fuzz.py, if named there, runs without its budget); FUZZ_BUDGET=0 (exactly)
# skips the fuzz tests.
set -uo pipefail
OUT=${1:?usage: bench/gpu_check.sh OUT_DIR [all|tests|bench|integration|tests+integration] [suite] [bench args...]}
STAGE=${2:-all}
SUITE=${3:-default}
shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export DUALK_CACHE_DIR=${DUALK_CACHE_DIR:-/tmp/dualk-cache}
export DUALK_HYPOTHESIS_PROFILE=${DUALK_HYPOTHESIS_PROFILE:-gpu}  # tests/conftest.py: more fuzz examples on the GPU
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
PY=${PYTHON:-python3}

{
  date -u; nvidia-smi; nvcc --version | tail -2
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); print(torch.cuda.get_device_name(0))"
} > "$OUT/env.txt" 2>&1
head -n 30 "$OUT/env.txt"

# A CUDA build carried from an earlier call (build/cuda-cache.tar.xz, named in the device call's
# carry; SAVE_CUDA_CACHE=FILE below writes one): the loader checks the build key (sources,
# toolchain, architecture), so a stale one is rebuilt, and a matching one saves the ~105 s build.
for seed in build/cuda-cache.tar.xz build/cuda-cache.tgz; do
  if [ -f "$seed" ]; then
    mkdir -p "$DUALK_CACHE_DIR" && tar xf "$seed" -C "$DUALK_CACHE_DIR" --strip-components=1
    break
  fi
done
t0=$(date +%s)
{
  $PY -m pip install --no-deps --no-build-isolation -e . && $PY -m dualk build --verbose
} > "$OUT/setup.log" 2>&1
rc=$?
echo "setup (install + CUDA build): rc=$rc in $(( $(date +%s) - t0 )) s"
tail -n 3 "$OUT/setup.log"
[ $rc -eq 0 ] || { grep -n -i -E "error" "$OUT/setup.log" | head -40; exit $rc; }
if [ -n "${SAVE_CUDA_CACHE:-}" ]; then  # e.g. SAVE_CUDA_CACHE=$OUT/cuda-cache.tar.xz (a 9th file: drop one)
  pack=z; command -v xz > /dev/null && pack=J  # gzip where xz is missing (then name it .tgz)
  XZ_OPT=-9e tar c${pack}f "$SAVE_CUDA_CACHE" -C "$(dirname "$DUALK_CACHE_DIR")" "$(basename "$DUALK_CACHE_DIR")/cuda"
fi

status=0
if [ "$STAGE" = all ] || [ "$STAGE" = tests ] || [ "$STAGE" = tests+integration ]; then
  t0=$(date +%s)
  xdist=""
  $PY -c "import xdist" 2>/dev/null && xdist="-n ${XDIST:-8}"  # XDIST: workers (16-core hosts: 12)
  # A hung test fails alone (pytest-timeout, where installed) instead of stopping the run.
  per_test=""
  $PY -c "import pytest_timeout" 2>/dev/null && per_test="--timeout ${TEST_TIMEOUT:-240}"
  # tests/test_cuda_compile.py is nvcc's static check, which CI runs; the GPU run is about kernels.
  # The property tests (tests/test_fuzz.py) run after, within FUZZ_BUDGET seconds: every drawn
  # shape is a new Triton specialization to compile.
  # TEST_SELECTION (files) and TEST_K (a -k expression): a part of the suite (default: all).
  $PY -m pytest ${TEST_SELECTION:-tests} ${TEST_K:+-k "$TEST_K"} $xdist -q -rs $per_test --durations=15 --deselect tests/test_cuda_compile.py \
    --ignore tests/test_fuzz.py --junitxml="$OUT/junit.xml" -p no:cacheprovider > "$OUT/pytest.log" 2>&1
  status=$?
  echo "pytest: rc=$status in $(( $(date +%s) - t0 )) s"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -40
  tail -n 2 "$OUT/pytest.log"
  if [ "${FUZZ_BUDGET:-180}" = 0 ]; then
    echo "fuzz: skipped (FUZZ_BUDGET=0)"
  else
    t0=$(date +%s)
    echo "=== tests/test_fuzz.py (hypothesis profile $DUALK_HYPOTHESIS_PROFILE, budget ${FUZZ_BUDGET:-180} s)" >> "$OUT/pytest.log"
    # SIGINT: pytest stops and still prints the failures so far.
    # Its own process group, killed afterwards: xdist workers must not outlive the budget (they
    # would load the GPU and the CPUs under whatever runs next).
    setsid timeout -s INT -k 30 "${FUZZ_BUDGET:-180}" $PY -m pytest tests/test_fuzz.py $xdist -q -rfEs \
      $per_test --durations=10 -p no:cacheprovider >> "$OUT/pytest.log" 2>&1 &
    fuzz_pid=$!
    wait $fuzz_pid
    rc=$?
    kill -9 -- -$fuzz_pid 2>/dev/null
    echo "fuzz: rc=$rc in $(( $(date +%s) - t0 )) s"
    [ $rc -eq 124 ] && { echo "fuzz: stopped at its budget (FUZZ_BUDGET)"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | tail -20; }
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && { grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | tail -20; status=$rc; }
  fi
fi

if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
  t0=$(date +%s)
  $PY -m dualk bench --suite "$SUITE" --all-backends --json "$OUT/bench.json" "$@" > "$OUT/bench.txt" 2>&1
  rc=$?
  echo "bench: rc=$rc in $(( $(date +%s) - t0 )) s"
  cat "$OUT/bench.txt" | tail -n 120
  [ $rc -eq 0 ] || status=$rc
  # The issues' targets against this run (appended to bench.txt: the file count stays at 8);
  # exit 1 only when a timed result was wrong.
  { echo; echo "== bench/criteria.py"; $PY bench/criteria.py "$OUT/bench.json"; } >> "$OUT/bench.txt" 2>&1 || status=1
  sed -n '/== bench\/criteria.py/,$p' "$OUT/bench.txt" | grep -E "MISS|WRONG|n/a|criteria missed" | tail -n 40
fi
if [ "$STAGE" = all ] || [ "$STAGE" = integration ] || [ "$STAGE" = tests+integration ]; then
  t0=$(date +%s)
  # dualk inside real models: host cost, training step, fuse(), autotuning costs, GPT-2 (bench/integration.py)
  $PY bench/integration.py --json "$OUT/integration.json" ${INTEGRATION_ONLY:+--only $INTEGRATION_ONLY} > "$OUT/integration.txt" 2>&1
  rc=$?
  echo "integration: rc=$rc in $(( $(date +%s) - t0 )) s"
  tail -n 150 "$OUT/integration.txt"
  [ $rc -eq 0 ] || status=$rc
fi
exit $status
