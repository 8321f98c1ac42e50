#!/bin/bash
# Builds experiments/simt_bench.cu (fp32 SIMT GEMM candidates vs the current kernel vs cuBLAS)
# and runs it. Usage on the GPU machine, from the repository root:
#   bash experiments/simt_run.sh OUT [--quick]
# Writes OUT/ptxas.txt (registers / spills of every kernel), OUT/run.txt (checks, timings, summary).
# (bench/gpu_explore.sh OUT simt does the same build + run.)
#
# No GPU / no cuBLAS headers (any machine with nvcc):
#   bash experiments/simt_run.sh OUT --ptxas [library] [Cfg ...]
# compiles the library's fp32 path (gemm::launch_simt<float>: gemm_simt_wide_kernel and the
# gemm_simt_kernel fallback; the default) and any simt_v3 config given (needs the rejected
# candidates back from git history: NOTES-simt.md, "Rejected candidates") for sm_80 and sm_90a
# with all the epilogues
# the library instantiates (none; gelu tanh / erf with and without bias; relu, silu with bias),
# both B layouts, and writes OUT/ptxas_v3.txt: one line per kernel with registers and spill bytes.
set -u
OUT=${1:-/tmp}
shift || true
mkdir -p "$OUT"
if [ "${1:-}" = "--ptxas" ]; then
  shift
  CFGS=${*:-library}
  TMP=$(mktemp -d)
  for cfg in $CFGS; do
    if [ "$cfg" = library ]; then CALL="gemm::launch_simt<float, kAct, kBias>"; INC=gemm.cuh
    else CALL="simt_v3::L<simt_v3::$cfg>::launch<float, kAct, kBias>"; INC=simt_variants.cuh; fi
    cat > "$TMP/$cfg.cu" <<CU
#include "$INC"
using namespace dualk;
template <Activation kAct, bool kBias> void one(const GemmArgs& g) {
  (void)$CALL(g, 0);
}
void instantiate(const GemmArgs& g) {
  one<Activation::kNone, false>(g);
  one<Activation::kGeluTanh, true>(g);
  one<Activation::kGeluTanh, false>(g);
  one<Activation::kGeluErf, true>(g);
  one<Activation::kGeluErf, false>(g);
  one<Activation::kRelu, true>(g);
  one<Activation::kSilu, true>(g);
}
CU
    for arch in sm_80 sm_90a; do
      (nvcc -O3 -std=c++17 -Icuda_src -Iexperiments -gencode=arch=compute_${arch#sm_},code=$arch \
          -Xptxas -v -c "$TMP/$cfg.cu" -o "$TMP/$cfg.$arch.o" > "$TMP/$cfg.$arch.log" 2>&1 ||
        echo "BUILD FAILED $cfg $arch") &
    done
  done
  wait
  : > "$OUT/ptxas_v3.txt"
  for cfg in $CFGS; do
    for arch in sm_80 sm_90a; do
      grep -E "Compiling entry|registers|spill" "$TMP/$cfg.$arch.log" | paste - - - \
        | grep -E "simt_v3|simt_wide|simt_kernel" \
        | sed -E 's/ptxas info +: //g; s/Compiling entry function .(_Z[^ ]*). for .sm_[0-9a]*./\1/' | c++filt \
        | sed -E "s/^void dualk::simt_v3::kernel<dualk::simt_v3::Cfg<([^>]*)>, (true|false), \(dualk::Activation\)([0-9]), (true|false)>\(dualk::GemmArgs\)/$cfg $arch <\1> b_k_major=\2 act=\3 bias=\4/" \
        | sed -E "s/^void dualk::gemm::gemm_simt_wide_kernel<(true|false), \(dualk::Activation\)([0-9]), (true|false)>\(dualk::GemmArgs\)/$cfg $arch gemm_simt_wide_kernel b_k_major=\1 act=\2 bias=\3/" \
        | sed -E "s/^void dualk::gemm::gemm_simt_kernel<float, (true|false), \(dualk::Activation\)([0-9]), (true|false)>\(dualk::GemmArgs\)/$cfg $arch gemm_simt_kernel vec=\1 act=\2 bias=\3/" \
        | sed -E 's/[0-9]+ bytes stack frame, //; s/Used ([0-9]+) registers.*/\1 regs/; s/ bytes spill stores, / + /; s/ bytes spill loads/ spill/' \
        >> "$OUT/ptxas_v3.txt"
    done
  done
  cat "$OUT/ptxas_v3.txt"
  echo "kernels with spills: $(grep -vc ' 0 + 0 spill' "$OUT/ptxas_v3.txt")"
  rm -rf "$TMP"
  exit 0
fi
FLAGS="-O3 -std=c++17 -Icuda_src -Iexperiments -gencode=arch=compute_90a,code=sm_90a -Xptxas -v"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader \
  | tee "$OUT/gpu.txt"
if ! nvcc $FLAGS experiments/simt_bench.cu -lcublas -o /tmp/simt_bench > "$OUT/ptxas.txt" 2>&1; then
  echo "BUILD FAILED"; grep -i error "$OUT/ptxas.txt" | head -20; exit 1
fi
# One line per kernel: name, registers, spills.
grep -E "Compiling entry|registers|spill" "$OUT/ptxas.txt" | paste - - - \
  | sed -E 's/ptxas info +: //g; s/Compiling entry function .(_Z[^ ]*). for .sm_90a./\1/' | c++filt \
  | grep simt | sed -E 's/dualk:://g; s/\(GemmArgs\)//; s/, used 1 barriers//' | cut -c1-200 > "$OUT/ptxas_summary.txt"
cat "$OUT/ptxas_summary.txt"
timeout 240 /tmp/simt_bench "$@" 2>&1 | tee "$OUT/run.txt"
