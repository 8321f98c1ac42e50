#!/usr/bin/env bash
# Nsight Compute on dualk's Hopper GEMM for 3000x5000x2000 bf16 with B's rows of 10000 bytes
# against n = 5120 and the same B as a view with rows of 10240 bytes (issue 14; NOTES-gemm-sm90.md
# "Session 12": the B loads cost +40%). Run on the GPU machine after `python3 -m dualk build`:
#
#   bash experiments/ncu_gemm_n5000.sh OUT_DIR
#
# Writes OUT_DIR/ncu-gemm-n5000.txt: Speed of Light, memory workload and warp-state sections of
# the three profiled launches (every second gemm_sm90_kernel launch: the first of each pair is a
# warm-up). Clocks are left alone (--clock-control none, as the device notes ask).
set -uo pipefail
OUT=${1:?usage: experiments/ncu_gemm_n5000.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
ncu --clock-control none --kernel-name regex:gemm_sm90_kernel --launch-skip 0 --launch-count 6 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section WarpStateStats --section SchedulerStats \
  --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,dram__bytes_read.sum,lts__t_sectors_op_read.sum,lts__t_requests_op_read.sum \
  python3 experiments/probe_gemm_n5000.py --ncu-cases > "$OUT/ncu-gemm-n5000.txt" 2>&1
echo "ncu: rc=$? ($(grep -c 'gemm_sm90_kernel' "$OUT/ncu-gemm-n5000.txt") kernel sections) -> $OUT/ncu-gemm-n5000.txt"
