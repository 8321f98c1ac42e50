#!/usr/bin/env bash
# One device call's work for the model-level issues (zoo, first contact, small-batch latency,
# DDP), in stages that each fit one 10-minute call; logs and JSON land flat in OUT_DIR.
#
#   bench/gpu_session.sh OUT_DIR first   # fresh caches: first contact, build, GPU tests of the
#                                        # model layer, small-batch latency vs tiny-cuda-nn;
#                                        # writes OUT_DIR/cuda-cache.tar.xz for the next call
#   bench/gpu_session.sh OUT_DIR models  # the zoo (all models x modes), DDP step, NCCL tests
#   bench/gpu_session.sh OUT_DIR suite   # the whole GPU test suite
#
# A carried build/cuda-cache.tar.xz seeds the CUDA build cache (as bench/gpu_check.sh).
# .peers/tcnn (carried: a copy of ../shared/peers/tcnn) is the tiny-cuda-nn peer.
set -uo pipefail
OUT=${1:?usage: bench/gpu_session.sh OUT_DIR first|models|suite}
STAGE=${2:?stage}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DUALK_CACHE_DIR=${DUALK_CACHE_DIR:-/tmp/dualk-cache}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
PY=${PYTHON:-python3}
LOG="$OUT/session-$STAGE.log"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }

{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
  nproc
} >> "$LOG" 2>&1
cat "$LOG"
$PY -m pip install -q --no-deps --no-build-isolation -e . >> "$LOG" 2>&1 || { say "install failed"; exit 1; }

seed_cache() {
  if [ -f build/cuda-cache.tar.xz ]; then
    mkdir -p "$DUALK_CACHE_DIR" && tar xf build/cuda-cache.tar.xz -C "$DUALK_CACHE_DIR" --strip-components=1
    say "seeded the CUDA cache from build/cuda-cache.tar.xz"
  fi
}

build() {
  local t0=$(date +%s)
  $PY -m dualk build >> "$LOG" 2>&1
  say "dualk build: rc=$? in $(( $(date +%s) - t0 )) s"
}

case "$STAGE" in
first)
  if [ -f bench/first_contact.py ]; then
    t0=$(date +%s)
    # Empty caches: the first calls must answer at once while the CUDA backend builds.
    DUALK_CACHE_DIR=/tmp/fc-cache TRITON_CACHE_DIR=/tmp/fc-triton timeout 330 \
      $PY bench/first_contact.py --json "$OUT/first_contact.json" > "$OUT/first_contact.log" 2>&1
    say "first_contact: rc=$? in $(( $(date +%s) - t0 )) s"
    tail -n 25 "$OUT/first_contact.log"
    # what it built is this call's cache too
    [ -d /tmp/fc-cache/cuda ] && mkdir -p "$DUALK_CACHE_DIR" && cp -r /tmp/fc-cache/cuda "$DUALK_CACHE_DIR/" 2>/dev/null
  fi
  seed_cache
  build
  XZ_OPT=-6 tar cJf "$OUT/cuda-cache.tar.xz" -C "$(dirname "$DUALK_CACHE_DIR")" "$(basename "$DUALK_CACHE_DIR")/cuda" 2>> "$LOG"
  ls -la "$OUT/cuda-cache.tar.xz" | tee -a "$LOG"
  t0=$(date +%s)
  timeout 200 $PY -m pytest -q -x -p no:cacheprovider tests/test_fuse_patterns.py tests/test_fuse.py \
    tests/test_nn.py $(ls tests/test_zoo.py 2>/dev/null) > "$OUT/pytest-model-layer.log" 2>&1
  say "pytest (model layer): rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest-model-layer.log" | head -20; tail -n 2 "$OUT/pytest-model-layer.log"
  t0=$(date +%s)
  tcnn=""; [ -x .peers/tcnn/tcnn_bench ] && tcnn="--tcnn .peers/tcnn"
  timeout 200 $PY bench/small_batch_latency.py $tcnn --json "$OUT/small_batch_latency.json" > "$OUT/small_batch_latency.log" 2>&1
  say "small_batch_latency: rc=$? in $(( $(date +%s) - t0 )) s"
  tail -n 40 "$OUT/small_batch_latency.log"
  ;;
models)
  seed_cache
  build
  t0=$(date +%s)
  timeout ${ZOO_TIMEOUT:-330} $PY -m dualk bench --models all --modes eager,compiled,train ${ZOO_ARGS:-} \
    --json "$OUT/zoo.json" > "$OUT/zoo.log" 2>&1
  say "zoo: rc=$? in $(( $(date +%s) - t0 )) s"
  tail -n 45 "$OUT/zoo.log"
  ngpu=$($PY -c "import torch; print(torch.cuda.device_count())")
  if [ "$ngpu" -ge 2 ]; then
    t0=$(date +%s)
    timeout 150 $PY bench/ddp_step.py --json "$OUT/ddp_step.json" > "$OUT/ddp_step.log" 2>&1
    say "ddp_step: rc=$? in $(( $(date +%s) - t0 )) s"
    tail -n 12 "$OUT/ddp_step.log"
    t0=$(date +%s)
    timeout 120 $PY -m pytest -q -p no:cacheprovider tests/test_distributed.py >> "$OUT/ddp_step.log" 2>&1
    say "test_distributed: rc=$? in $(( $(date +%s) - t0 )) s"
    tail -n 3 "$OUT/ddp_step.log"
  fi
  ;;
suite)
  seed_cache
  build
  FUZZ_BUDGET=${FUZZ_BUDGET:-0} bash bench/gpu_check.sh "$OUT" tests
  ;;
esac
say "done"
