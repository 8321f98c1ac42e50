#!/usr/bin/env bash
# Issue 14, session 14: CTA pairs multicasting B (gemm_sm90.cuh kCluster = 2) in one device call.
# Builds the harness (experiments/gemm_sm90_bench.cu: every config, single and paired, checked on
# odd shapes and timed against cuBLAS) beside the extension, runs the harness, the GEMM-side GPU
# tests, then dualk's bench of matmul and linear_gelu (peers in the same run):
#
#   bash experiments/gemm_pairs_run.sh OUT_DIR
#
# Writes OUT_DIR/{env.txt, harness-build.txt, harness.txt, pytest.log, bench-gemm.json, bench-gemm.txt}.
set -uo pipefail
OUT=${1:?usage: experiments/gemm_pairs_run.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export DUALK_CACHE_DIR=${DUALK_CACHE_DIR:-/tmp/dualk-cache}
BIN=/tmp/gemm_sm90_bench
t0=$(date +%s)
# CPU only: overlaps the extension's build.
( nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
    experiments/gemm_sm90_bench.cu -lcublas -lcublasLt -o "$BIN" > /tmp/harness-ptxas.txt 2>&1
  echo "harness build rc=$?" > "$OUT/harness-build.txt"
  grep -E "error|warning" /tmp/harness-ptxas.txt | sort | uniq -c | head -20 >> "$OUT/harness-build.txt"
  grep -c " [1-9][0-9]* bytes spill stores" /tmp/harness-ptxas.txt | sed 's/^/kernels with spills: /' >> "$OUT/harness-build.txt" ) &
{ python3 -m pip install --no-deps --no-build-isolation -e . && python3 -m dualk build; } > /tmp/setup.log 2>&1
echo "setup rc=$? at $(( $(date +%s) - t0 )) s"; tail -n 2 /tmp/setup.log
wait
cat "$OUT/harness-build.txt"
[ -x "$BIN" ] && timeout 200 "$BIN" > "$OUT/harness.txt" 2>&1
echo "harness: rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "correctness|CTA pairs|FAIL" "$OUT/harness.txt" | head -20
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/env.txt"
timeout 200 python3 -m pytest -q -x -n 8 -p no:cacheprovider tests/test_parity.py tests/test_gemm_tma.py tests/test_cuda_wrappers.py \
  -k "matmul or linear_gelu or gemm or tma" > "$OUT/pytest.log" 2>&1
echo "pytest: rc=$? at $(( $(date +%s) - t0 )) s"; tail -n 2 "$OUT/pytest.log"
python3 -m dualk bench --op matmul --op linear_gelu --json "$OUT/bench-gemm.json" > "$OUT/bench-gemm.txt" 2>&1
echo "bench: rc=$? at $(( $(date +%s) - t0 )) s"; python3 bench/criteria.py "$OUT/bench-gemm.json" | sed -n "/issue 14/,\$p"
