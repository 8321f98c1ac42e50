#!/usr/bin/env bash
# Issue 35: Nsight Compute on linear_glu's wide Hopper kernel and dualk's Hopper GEMM of the same
# work at 8192 x 4096 -> 14336 (bf16), where the gated kernel ran 11-13% behind the GEMM
# (experiments/NOTES-linear-glu.md, session 26). On the GPU machine, after the install and a
# carried prebuilt folder (bench/gpu_session.sh's "build" step):
#
#   bash experiments/ncu_glu.sh OUT_DIR
#
# Writes OUT_DIR/ncu-glu.txt: Speed of Light, memory workload (L2 hit rate, L2 <-> SM bytes),
# warp states, scheduler and launch sections of the 4 launches (GEMM x 2, gated x 2: read the
# second of each), then OUT_DIR/glu-gap.json (the probe's timings). Clocks are left alone.
set -uo pipefail
OUT=${1:?usage: experiments/ncu_glu.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
ncu --clock-control none --kernel-name regex:"gemm_sm90_kernel|linear_glu_sm90_kernel" --launch-count 4 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --section Occupancy \
  python3 experiments/glu_gap_probe.py --ncu-cases > "$OUT/ncu-glu.txt" 2>&1
echo "ncu: rc=$? ($(grep -cE 'gemm_sm90_kernel|linear_glu_sm90_kernel' "$OUT/ncu-glu.txt") kernel lines) -> $OUT/ncu-glu.txt"
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|Registers Per|Achieved Occupancy|Issue Slots Busy|^  [a-z_]+.*sm90" "$OUT/ncu-glu.txt" | head -60
