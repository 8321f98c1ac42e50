#!/bin/bash
# Builds the harness against cuda_src/fused_mlp*.cu and every experiments/mlp_v_*.cu variant (one
# stands in for cuda_src/fused_mlp.cu, or for the file its first line names: "// replaces: cuda_src/..."),
# in parallel; checks + times each, optionally profiles with ncu (NCU=1).
# Usage on the GPU machine: bash experiments/mlp_run.sh   (writes logs to ${OUT:-/tmp})
set -u
OUT=${OUT:-/tmp}
FLAGS="-O3 -std=c++17 -Icuda_src -gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
declare -A SRC=([base]=cuda_src/fused_mlp.cu)
for v in experiments/mlp_v_*.cu; do [ -e "$v" ] && SRC[$(basename "$v" .cu | sed 's/^mlp_v_//')]=$v; done
for name in "${!SRC[@]}"; do
  replaced=$(sed -n '1s|^// replaces: ||p' "${SRC[$name]}"); replaced=${replaced:-cuda_src/fused_mlp.cu}
  units=$(ls cuda_src/fused_mlp*.cu | grep -v -x "$replaced")
  (nvcc $FLAGS -Xptxas -v experiments/mlp_bench.cu "${SRC[$name]}" $units -o /tmp/mb_$name \
     > $OUT/ptxas_$name.txt 2>&1 || echo "BUILD FAILED $name") &
done
wait
for name in $(echo "${!SRC[@]}" | tr ' ' '\n' | sort); do
  echo "==================== $name"
  grep -q "error" $OUT/ptxas_$name.txt && { grep error $OUT/ptxas_$name.txt | head; continue; }
  /tmp/mb_$name ${MB_ARGS:-} --csv $OUT/times_$name.csv 2>&1 | tee $OUT/run_$name.txt
done
if [ "${NCU:-0}" = 1 ]; then
  for c in "fp32 100-128-64-10 B32" "fp16 64-64-64-64-16" "fp16 128-128"; do
    ncu --clock-control none -k regex:fused_mlp --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section LaunchStats --print-details all \
      /tmp/mb_base --quick --reps 1 --case "$c" > "$OUT/ncu_$(echo $c | tr -c 'a-zA-Z0-9\n' _).txt" 2>&1
  done
  grep -h -E "fused_mlp|Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|Grid Size|Block Limit" $OUT/ncu_*.txt | cut -c1-150
fi
