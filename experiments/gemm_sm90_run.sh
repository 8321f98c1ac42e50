#!/bin/bash
# Builds experiments/gemm_sm90_bench.cu (sm_90a, ptxas -v report kept) and runs it: checks the
# Hopper GEMM (cuda_src/gemm_sm90.cuh) on odd shapes, then times it against cuBLAS / cuBLASLt and
# the mma.sync path. Usage on the GPU machine, from the repository root:
#   bash experiments/gemm_sm90_run.sh OUT_DIR [--quick]
# Writes OUT_DIR/ptxas.txt (full -Xptxas -v log), OUT_DIR/ptxas_sm90_kernels.txt (registers, spills
# per gemm_sm90 instantiation), OUT_DIR/run.txt (harness output), OUT_DIR/sass_hgmma.txt (HGMMA
# count per kernel). About 1 minute to build, 1-2 minutes to run on an H200.
set -u
OUT=${1:-${OUT:-/tmp/gemm_sm90}}
shift || true
mkdir -p "$OUT"
BIN=/tmp/gemm_sm90_bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader \
  | tee "$OUT/gpu.txt"
echo "building..."
start=$(date +%s)
if ! nvcc -O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
     experiments/gemm_sm90_bench.cu -lcublas -lcublasLt -o "$BIN" > "$OUT/ptxas.txt" 2>&1; then
  echo "BUILD FAILED"; grep -E "error" "$OUT/ptxas.txt" | head -20; exit 1
fi
echo "built in $(( $(date +%s) - start )) s"
# One line per gemm_sm90 kernel: name, registers, spills.
awk '/Compiling entry function .*gemm_sm90_kernel/ {name=$0; sub(/.*function ./, "", name); sub(/. for .*/, "", name)}
     /spill stores/ && name != "" {spill=$0}
     /Used [0-9]+ registers/ && name != "" {print name " | " $0 " | " spill; name=""}' "$OUT/ptxas.txt" \
  | sed 's/ptxas info *: //; s/  */ /g' > "$OUT/ptxas_sm90_kernels.txt"
echo "gemm_sm90 kernels: $(wc -l < "$OUT/ptxas_sm90_kernels.txt"), with spills: $(grep -vc ' 0 bytes spill stores, 0 bytes spill loads' "$OUT/ptxas_sm90_kernels.txt")"
grep -i -E "warning" "$OUT/ptxas.txt" | sort | uniq -c | head
cuobjdump -sass "$BIN" 2>/dev/null | awk '/Function : .*gemm_sm90_kernel/ {if (f) print n, f; f=$3; n=0} /HGMMA/ {n++} END {if (f) print n, f}' \
  > "$OUT/sass_hgmma.txt"
echo "HGMMA per gemm_sm90 kernel (count kernel): $(cut -d' ' -f1 "$OUT/sass_hgmma.txt" | sort | uniq -c | tr '\n' ' ')"
timeout 300 "$BIN" "$@" 2>&1 | tee "$OUT/run.txt"
echo "exit status ${PIPESTATUS[0]}"
