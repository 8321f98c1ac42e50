#!/usr/bin/env bash
# compute-sanitizer over the CUDA backend's GPU tests: memcheck, racecheck, synccheck, initcheck.
#
#   bash bench/sanitize.sh OUT_DIR [tool ...]      (or `make sanitize OUT=dir`; tools default to all four)
#
# Builds the extension first (outside the sanitizer), then runs each tool over a focused pytest
# selection of backend="cuda" tests (the registry's small parity cases, the fused MLP's Hopper
# tensor-core cases, the Hopper GEMM's CTA-pair cases, the stream tests but CUDA-graph capture)
# in ONE process per tool, with --target-processes all and PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every
# tensor is its own cudaMalloc, so memcheck sees the exact bounds of each input and output).
# racecheck and initcheck are the slow tools: they get a smaller selection (the kernels with shared
# memory / the output paths).
# Each tool has a time budget (SANITIZE_BUDGET_<TOOL> seconds); the whole run stays under ~8
# minutes on an H100.
#
# Files written (flat): env.txt, build.log, selection-<tool>.txt, <tool>.log (the tool's report
# and pytest's output), initcheck-control.log, summary.txt. One line per tool goes to stdout and summary.txt:
#   memcheck: ERROR SUMMARY: 0 errors | pytest: 171 passed in 95.1s | rc=0 | 140 s
set -uo pipefail
OUT=${1:?usage: bench/sanitize.sh OUT_DIR [memcheck] [racecheck] [synccheck] [initcheck]}
shift
TOOLS=${*:-memcheck racecheck synccheck initcheck}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export DUALK_CACHE_DIR=${DUALK_CACHE_DIR:-/tmp/dualk-cache}
export DUALK_AUTOTUNE=0                  # nothing here uses "auto", and nothing times anything
export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # exact allocation bounds for memcheck
: "${SANITIZE_BUDGET_MEMCHECK:=210}" "${SANITIZE_BUDGET_RACECHECK:=120}"
: "${SANITIZE_BUDGET_SYNCCHECK:=60}" "${SANITIZE_BUDGET_INITCHECK:=90}"
# API errors returned to PyTorch's own probes are not memory errors of dualk's kernels; set
# SANITIZE_API_ERRORS=all to see every one.
: "${SANITIZE_API_ERRORS:=explicit}"

SAN=$(command -v compute-sanitizer || true)
for dir in "${CUDA_HOME:-}" /usr/local/cuda; do
  [ -z "$SAN" ] && [ -n "$dir" ] && [ -x "$dir/bin/compute-sanitizer" ] && SAN="$dir/bin/compute-sanitizer"
done
[ -n "$SAN" ] || { echo "compute-sanitizer not found (PATH, CUDA_HOME, /usr/local/cuda)" | tee "$OUT/summary.txt"; exit 2; }

{
  date -u; nvidia-smi; "$SAN" --version | tail -1
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
} > "$OUT/env.txt" 2>&1

t0=$(date +%s)
if ! $PY -m dualk build > "$OUT/build.log" 2>&1; then
  echo "build failed (outside the sanitizer): see $OUT/build.log" | tee "$OUT/summary.txt"
  tail -n 20 "$OUT/build.log"
  exit 1
fi
echo "build: $(tail -n 1 "$OUT/build.log") ($(( $(date +%s) - t0 )) s)"

# The pytest node ids per tool, from the registry (test_parity) and the collected stream tests.
select_tests() {
  $PY - "$1" <<'EOF'
import subprocess, sys

from dualk.registry import DTYPES, OPS

tool = sys.argv[1]
names = {str(d)[6:] for d in DTYPES}


def parity(op, case, dtype):
    return f"tests/test_parity.py::test_matches_float64_reference[{op}-{case}-cuda-{dtype}]"


small = {op: [c.name for c in spec.cases if not c.gpu_only] for op, spec in OPS.items()}
# The fused MLP's Hopper kernels: fp32 3xTF32 (>= ~31 rows per SM), 16-bit wgmma.
hopper_mlp = ["tc_silu_tail_b5003", "tc_gelu_row_stride_b4133"]
# The Hopper GEMM's CTA clusters (B's rows 16 bytes off a sector), 16-bit: pairs (1000^3 on an
# H100; odd tile-row counts) and 2 x 2 clusters (700x512x1000, batched 3 x 300x264x200,
# linear_gelu 600x1000->1256).
clusters = {"matmul": ["sm90_rows_16b_off", "sm90_rows_16b_off_b", "sm90_rows_16b_off_batched",
                    "sm90_pairs_odd_tile_rows"],
         "linear_gelu": ["sm90_rows_16b_off", "sm90_pairs_odd_tile_rows"]}
cluster_ids = [parity(op, c, d) for op, cases in clusters.items() for c in cases for d in ("float16", "bfloat16")]
collected = subprocess.run(
    [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
     "tests/test_streams.py"], capture_output=True, text=True,
).stdout.splitlines()
# CUDA-graph capture needs PyTorch's caching allocator (no cudaMalloc while capturing), which
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns off: the capture tests stay out.
streams = [t for t in collected if "::" in t and "capture" not in t
           and ("cuda]" in t or "[cuda" in t or "-cuda-" in t or "dense_entry" in t)]
ids = []
if tool == "memcheck":  # every op, dtype and small case; the Hopper MLP cases; streams
    ids += [parity(op, c, d) for op, cases in small.items() for c in cases for d in sorted(names)]
    ids += [parity("fused_mlp", c, d) for c in hopper_mlp for d in sorted(names)]
    ids += cluster_ids
    ids += streams
elif tool in ("racecheck", "synccheck"):  # the kernels with shared memory and barriers
    # The clusters first: racecheck's budget ran out in session 15 before it reached them.
    ids += cluster_ids
    pick = {
        "matmul": ["odd", "square", "batched", "transposed", "sliced"],
        "linear_gelu": ["odd", "weight_view", "square"],
        "fused_mlp": ["seed_b32", "odd_widths_b257", "eight_layers", "too_wide_fallback", *hopper_mlp],
    }
    ids += [parity(op, c, d) for op, cases in pick.items() for c in cases
            for d in ("float32", "float16", "bfloat16")]
    if tool == "synccheck":
        ids += [t for t in streams if "side_stream" in t]
else:  # initcheck: every op once per dtype family, Hopper MLP in fp32 and fp16
    pick = {"add": ["n=4097", "broadcast"], "relu_scale": ["misaligned"], "matmul": ["square", "odd"],
            "linear_gelu": ["odd", "no_bias"], "fused_mlp": ["seed_b32", "odd_widths_b257"]}
    ids += [parity(op, c, d) for op, cases in pick.items() for c in cases for d in ("float32", "float16")]
    ids += [parity("fused_mlp", hopper_mlp[0], d) for d in ("float32", "bfloat16")]
print("\n".join(ids))
EOF
}

status=0
: > "$OUT/summary.txt"
for tool in $TOOLS; do
  budget_var="SANITIZE_BUDGET_${tool^^}"
  budget=${!budget_var:-120}
  select_tests "$tool" > "$OUT/selection-$tool.txt" 2> "$OUT/selection-$tool.err"
  mapfile -t tests < "$OUT/selection-$tool.txt"
  if [ ${#tests[@]} -eq 0 ]; then
    echo "$tool: no tests selected (see $OUT/selection-$tool.err)" | tee -a "$OUT/summary.txt"
    status=1
    continue
  fi
  t0=$(date +%s)
  yardstick=gpu
  if [ "$tool" = initcheck ]; then
    # The control: PyTorch alone (an fp16 GEMM, then a read of its output). initcheck does not
    # see the writes of cuBLAS's Hopper kernels, so this reports "uninitialized" reads with no
    # dualk code in the process; the tests then compute PyTorch's low-precision yardstick on
    # the CPU (dualk/testing.py), and only the real inputs and dualk's outputs stay on the GPU.
    "$SAN" --tool initcheck --print-limit 5 "$PY" -c "
import torch
a = torch.randn(64, 64, device='cuda', dtype=torch.float16)
print(float((a @ a).double().abs().sum()))" > "$OUT/initcheck-control.log" 2>&1
    control=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$OUT/initcheck-control.log" | awk '{s += $3} END {print s + 0}')
    echo "initcheck control (PyTorch alone: fp16 a @ a, then .double()): ERROR SUMMARY: $control errors" | tee -a "$OUT/summary.txt"
    yardstick=cpu
  fi
  DUALK_YARDSTICK_DEVICE=$yardstick timeout --signal=INT --kill-after=20 "$budget" \
    "$SAN" --tool "$tool" --target-processes all --print-limit 50 \
      --report-api-errors "$SANITIZE_API_ERRORS" \
      "$PY" -m pytest -q -rs -p no:cacheprovider "${tests[@]}" > "$OUT/$tool.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  # One "ERROR SUMMARY: N errors" per sanitized process; add them up.
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$OUT/$tool.log" | awk '{s += $3} END {print s + 0}')
  procs=$(grep -cE "ERROR SUMMARY: [0-9]+ error" "$OUT/$tool.log")
  result=$(grep -E "(passed|failed|error|skipped|no tests ran).* in [0-9.]+s" "$OUT/$tool.log" | tail -n 1 | tr -d '=' | sed 's/^ *//; s/ *$//')
  if [ $rc -eq 124 ] || [ $rc -eq 130 ] || [ $rc -eq 137 ]; then
    result="TIMED OUT after ${budget}s (SANITIZE_BUDGET_${tool^^}); ${result:-no pytest summary}"
  fi
  line="$tool: ERROR SUMMARY: $errors errors ($procs process(es)) | pytest: ${result:-?} | ${#tests[@]} tests | rc=$rc | $secs s"
  echo "$line" | tee -a "$OUT/summary.txt"
  if [ "$errors" != 0 ]; then
    grep -m 20 -E "^========= (Invalid|Program hit|Race|Error|Barrier|Uninitialized|.*hazard)" "$OUT/$tool.log"
    status=1
  fi
  [ $rc -eq 0 ] || status=1
done
exit $status
