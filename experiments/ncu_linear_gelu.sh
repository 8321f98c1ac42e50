#!/usr/bin/env bash
# Issue 14: Nsight Compute on the CUDA backend's linear_gelu and on the same GEMM without its
# epilogue (experiments/probe_linear_gelu.py --ncu-cases: 8192x768->3072, 4096x4096->16384 and
# 1000^3, bf16), then the probe's timings against cuBLASLt's fused epilogue. On the GPU machine:
#
#   python3 -m pip install --no-deps --no-build-isolation -e . && python3 -m dualk build
#   bash experiments/ncu_linear_gelu.sh OUT_DIR
#
# Writes OUT_DIR/ncu-linear-gelu.txt (Speed of Light, warp states, scheduler and launch sections of
# all 12 gemm_sm90_kernel launches: per shape and case a warm-up, then the one to read) and
# OUT_DIR/probe-linear-gelu.txt. Not yet run (written at the end of session 15).
# Clocks are left alone (--clock-control none).
set -uo pipefail
OUT=${1:?usage: experiments/ncu_linear_gelu.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
python3 experiments/probe_linear_gelu.py > "$OUT/probe-linear-gelu.txt" 2>&1
python3 experiments/probe_linear_gelu.py --kernels >> "$OUT/probe-linear-gelu.txt" 2>&1
echo "probe: rc=$?"; cat "$OUT/probe-linear-gelu.txt"
ncu --clock-control none --kernel-name regex:gemm_sm90_kernel --launch-count 12 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  python3 experiments/probe_linear_gelu.py --ncu-cases > "$OUT/ncu-linear-gelu.txt" 2>&1
echo "ncu: rc=$? ($(grep -c 'gemm_sm90_kernel' "$OUT/ncu-linear-gelu.txt") kernel lines) -> $OUT/ncu-linear-gelu.txt"
