#!/usr/bin/env bash
# Issue 14, session 14: TMA against cp.async operand loads in the Hopper GEMM (gemm_sm90.cuh
# OperandLoad) in one device call. Builds the harness (experiments/gemm_sm90_bench.cu) beside the
# extension, runs the GEMM-side GPU tests, then the harness's --loads comparison, then dualk's
# bench of matmul and linear_gelu (default suite, peers in the same run):
#
#   bash experiments/gemm_loads_run.sh OUT_DIR
#
# Writes OUT_DIR/{env.txt, pytest.log, harness-build.txt, loads.txt, bench-gemm.json, bench-gemm.txt}.
set -uo pipefail
OUT=${1:?usage: experiments/gemm_loads_run.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export DUALK_CACHE_DIR=${DUALK_CACHE_DIR:-/tmp/dualk-cache}
BIN=/tmp/gemm_sm90_bench
# CPU only: overlaps the extension's build below.
( nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
    experiments/gemm_sm90_bench.cu -lcublas -lcublasLt -o "$BIN" 2>&1 \
    | grep -E "error|warning|spill stores|gemm_sm90_kernel" | grep -B1 -E "error|warning| [1-9][0-9]* bytes spill" \
    > "$OUT/harness-build.txt"; echo "harness build rc=${PIPESTATUS[0]}" >> "$OUT/harness-build.txt" ) &
TEST_SELECTION="${TEST_SELECTION:-tests/test_parity.py tests/test_gemm_tma.py tests/test_large.py tests/test_hopper_sass.py tests/test_cuda_wrappers.py}" \
  FUZZ_BUDGET=0 bash bench/gpu_check.sh "$OUT/t" tests > "$OUT/t-console.txt" 2>&1
wait
tail -n 4 "$OUT/t-console.txt"; tail -n 2 "$OUT/harness-build.txt"
mv "$OUT/t/env.txt" "$OUT/t/pytest.log" "$OUT/"; rm -rf "$OUT/t" "$OUT/t-console.txt"
[ -x "$BIN" ] && timeout 240 "$BIN" --loads > "$OUT/loads.txt" 2>&1
echo "harness: rc=$?"; sed -n '/== summary/,$p' "$OUT/loads.txt"
python3 -m dualk bench --op matmul --op linear_gelu --json "$OUT/bench-gemm.json" > "$OUT/bench-gemm.txt" 2>&1
echo "bench: rc=$?"; python3 bench/criteria.py "$OUT/bench-gemm.json" | sed -n "/issue 14/,\$p"
