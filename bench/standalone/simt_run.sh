#!/bin/bash
# Builds bench/standalone/simt_bench.cu (fp32 SIMT GEMM candidates vs the current kernel vs cuBLAS)
# and runs it. Usage on the GPU machine, from the repository root:
#   bash bench/standalone/simt_run.sh OUT [--quick]
# Writes OUT/ptxas.txt (registers / spills of every kernel), OUT/run.txt (checks, timings, summary).
set -u
OUT=${1:-/tmp}
shift || true
mkdir -p "$OUT"
FLAGS="-O3 -std=c++17 -Icuda_src -Ibench/standalone -gencode=arch=compute_90a,code=sm_90a -Xptxas -v"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader \
  | tee "$OUT/gpu.txt"
if ! nvcc $FLAGS bench/standalone/simt_bench.cu -lcublas -o /tmp/simt_bench > "$OUT/ptxas.txt" 2>&1; then
  echo "BUILD FAILED"; grep -i error "$OUT/ptxas.txt" | head -20; exit 1
fi
# One line per kernel: name, registers, spills.
grep -E "Compiling entry|registers|spill" "$OUT/ptxas.txt" | paste - - - \
  | sed -E 's/ptxas info +: //g; s/Compiling entry function .(_Z[^ ]*). for .sm_90a./\1/' | c++filt \
  | grep simt | sed -E 's/dualk:://g; s/\(GemmArgs\)//; s/, used 1 barriers//' | cut -c1-200 > "$OUT/ptxas_summary.txt"
cat "$OUT/ptxas_summary.txt"
timeout 240 /tmp/simt_bench "$@" 2>&1 | tee "$OUT/run.txt"
