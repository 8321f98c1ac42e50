#!/bin/bash
# One device call for the standalone experiments (no torch needed for the CUDA ones): builds every
# harness in parallel, then runs them one after another (timings never overlap).
#   bash bench/gpu_explore.sh OUT [mlp] [simt] [sm90] [triton] [rsv] [wide]
# Logs: OUT/<part>/... ; a short summary of each part goes to stdout.
set -u
OUT=${1:?usage: gpu_explore.sh OUT [parts...]}
shift
PARTS=${*:-mlp simt sm90}
mkdir -p "$OUT"
F="-O3 -std=c++17 -Icuda_src -Iexperiments -gencode=arch=compute_90a,code=sm_90a -Xptxas -v"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
nvcc --version | tail -2 >> "$OUT/gpu.txt"
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
if has mlp; then
  mkdir -p "$OUT/mlp"
  rm -f /tmp/mb_*  # a warm machine keeps the last call's binaries
  shopt -s nullglob  # no experiments/mlp_v_*.cu variants: only the base
  # fused_mlp is four translation units; a variant mlp_v_NAME.cu stands in for cuda_src/fused_mlp.cu,
  # or for the file its first line names ("// replaces: cuda_src/fused_mlp_tf32.cu").
  for src in cuda_src/fused_mlp.cu experiments/mlp_v_*.cu; do
    name=$(basename "$src" .cu | sed 's/^mlp_v_//; s/^fused_mlp$/base/')
    replaced=$(sed -n '1s|^// replaces: ||p' "$src"); replaced=${replaced:-cuda_src/fused_mlp.cu}
    units=$(ls cuda_src/fused_mlp*.cu | grep -v -x "$replaced")
    (nvcc $F experiments/mlp_bench.cu "$src" $units -o /tmp/mb_$name > "$OUT/mlp/ptxas_$name.txt" 2>&1 || echo "BUILD FAILED mlp $name") &
  done
fi
has simt && { mkdir -p "$OUT/simt"; (nvcc $F experiments/simt_bench.cu -lcublas -o /tmp/simt_bench > "$OUT/simt/ptxas.txt" 2>&1 || echo "BUILD FAILED simt") & }
has sm90 && { mkdir -p "$OUT/sm90"; (nvcc $F experiments/gemm_sm90_bench.cu -lcublas -lcublasLt -o /tmp/sm90_bench > "$OUT/sm90/ptxas.txt" 2>&1 || echo "BUILD FAILED sm90") & }
has wide && { mkdir -p "$OUT/wide"; (nvcc $F experiments/mlp_wide_sm90.cu -lcublas -o /tmp/mlp_wide > "$OUT/wide/ptxas.txt" 2>&1 || echo "BUILD FAILED wide") & }
has rsv && { mkdir -p "$OUT/rsv"; (nvcc $F experiments/relu_scale_variants.cu -o /tmp/rsv > "$OUT/rsv/ptxas.txt" 2>&1 || echo "BUILD FAILED rsv") & }
wait
echo "builds done in $(( $(date +%s) - t0 )) s"
if has mlp; then
  for b in /tmp/mb_*; do
    name=${b#/tmp/mb_}
    echo "==================== mlp $name"
    timeout 120 "$b" ${MB_ARGS:-} --csv "$OUT/mlp/times_$name.csv" > "$OUT/mlp/run_$name.txt" 2>&1
    grep -E "probe|FAIL|timed|us  |PASSED|FAILED" "$OUT/mlp/run_$name.txt" | cut -c1-160
  done
fi
if has sm90 && [ -x /tmp/sm90_bench ]; then
  echo "==================== sm90"
  cuobjdump -sass /tmp/sm90_bench 2>/dev/null | grep -c HGMMA | sed 's/^/HGMMA instructions: /'
  timeout ${SM90_TIMEOUT:-400} /tmp/sm90_bench > "$OUT/sm90/run.txt" 2>&1; echo "exit $?"
  tail -40 "$OUT/sm90/run.txt"
fi
if has simt && [ -x /tmp/simt_bench ]; then
  echo "==================== simt"
  timeout 200 /tmp/simt_bench > "$OUT/simt/run.txt" 2>&1; echo "exit $?"
  tail -25 "$OUT/simt/run.txt"
fi
if has wide && [ -x /tmp/mlp_wide ]; then
  echo "==================== wide fused MLP (experiments/mlp_wide_sm90.cu)"
  cuobjdump -sass /tmp/mlp_wide 2>/dev/null | grep -c HGMMA | sed 's/^/HGMMA instructions: /'
  grep -E "registers|spill" "$OUT/wide/ptxas.txt" | sort | uniq -c
  timeout 120 /tmp/mlp_wide > "$OUT/wide/run.txt" 2>&1; echo "exit $?"
  cat "$OUT/wide/run.txt"
fi
if has rsv && [ -x /tmp/rsv ]; then
  echo "==================== relu_scale variants"
  timeout 120 /tmp/rsv > "$OUT/rsv/run.txt" 2>&1; echo "exit $?"
  cat "$OUT/rsv/run.txt"
fi
if has triton; then
  echo "==================== triton linear_gelu sweep"
  mkdir -p "$OUT/triton"
  timeout 420 python3 experiments/linear_gelu_sweep.py --out "$OUT/triton/sweep.json" > "$OUT/triton/run.txt" 2>&1; echo "exit $?"
  tail -60 "$OUT/triton/run.txt"
fi
echo "total $(( $(date +%s) - t0 )) s"
