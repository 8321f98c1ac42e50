"""Writes experiments/mlp_v_stamp.cu: cuda_src/fused_mlp.cu (simt) or fused_mlp_tf32.cu (tc), the
translation unit of the kernel stamped, with globaltimer stamps in one
fp32 kernel (thread 0 of every block, first tile, batches 32 and 4096 only). On the 50th
launch of each of those batches the last block to finish prints, per stamp, the min / mean / max
over blocks in ns after the earliest block's first instruction.
  simt (default): 0 entry, 1 barriers armed, 2 copies issued by warp 0, 3+2l layer l weights
    landed (thread 0), 4+2l layer l start (after the block barrier), 11 tile done, 12 kernel end,
    12+l (l = 1, 2) layer l reached by thread 0 (before its waits).
  tc (the 3xTF32 kernel, fused_mlp_tf32.cu): 0 entry, 2 x tile loaded and split (after the
    block barrier), 4+2l layer l weights landed, 5+2l layer l done (after its block barrier),
    12 end.
Usage: python experiments/mkstamp.py [simt|tc]  (then bench/gpu_explore.sh builds it as
variant "stamp").
"""

import pathlib
import re
import sys

kernel = sys.argv[1] if len(sys.argv) > 1 else "simt"
assert kernel in ("simt", "tc"), kernel
clock_end = 13 if kernel == "simt" else 5  # the stamp that closes layer 0

root = pathlib.Path(__file__).resolve().parents[1]
unit = "cuda_src/fused_mlp.cu" if kernel == "simt" else "cuda_src/fused_mlp_tf32.cu"
src = (root / unit).read_text()

helpers = r"""
__device__ unsigned long long g_stamp[1024][16];
__device__ long long g_clock[1024][2];
__device__ unsigned int g_stamp_done;
__device__ unsigned int g_stamp_launch[2];
__device__ __forceinline__ unsigned long long stamp_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define STAMP(i) do { if (stamping && threadIdx.x == 0) g_stamp[blockIdx.x][(i)] = stamp_now(); } while (0)
__device__ void stamp_finish(bool stamping, long long m) {
  if (!stamping || threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&g_stamp_done, 1u) != gridDim.x - 1) return;
  g_stamp_done = 0;
  __threadfence();
  const int key = m == 32 ? 0 : 1;
  if (++g_stamp_launch[key] != 50) return;
  unsigned long long t0 = ~0ull;
  for (unsigned b = 0; b < gridDim.x; ++b) t0 = min(t0, g_stamp[b][0]);
  printf("stamps m=%lld blocks=%u (ns after the first block's entry: min mean max)\n", m, gridDim.x);
  for (int i = 0; i < 16; ++i) {
    unsigned long long lo = ~0ull, hi = 0, sum = 0; unsigned n = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) {
      const unsigned long long v = g_stamp[b][i];
      if (v < t0) continue;
      lo = min(lo, v - t0); hi = max(hi, v - t0); sum += v - t0; ++n;
    }
    if (n) printf("  stamp %2d: %7llu %7llu %7llu  (%u blocks)\n", i, lo, sum / n, hi, n);
  }
  {
    // SM clock over the first layer of block 0: cycles (clock64) per ns (globaltimer)
    const double cycles = double(g_clock[0][1] - g_clock[0][0]);
    const double ns = double(g_stamp[0][CLOCK_END] - g_stamp[0][4]);
    printf("  block 0, layer 0: %.0f cycles in %.0f ns = %.2f GHz\n", cycles, ns, ns > 0 ? cycles / ns : 0.0);
  }
  for (unsigned b = 0; b < gridDim.x; ++b)
    for (int i = 0; i < 16; ++i) g_stamp[b][i] = 0;
}
"""


helpers = helpers.replace("CLOCK_END", str(clock_end))


def sub(pattern, repl, text, count=1):
    new, n = re.subn(pattern, repl, text, count=count)
    assert n == count, pattern
    return new


def after(anchor: str, code: str) -> None:
    """Inserts `code` right after the one match of the regex `anchor`."""
    global src
    src = sub(f"({anchor})", lambda m: m.group(1) + code, src)


def before(anchor: str, code: str) -> None:
    global src
    src = sub(f"({anchor})", lambda m: code + m.group(1), src)


CLOCK = "      if (stamping && stamp_first && layer == {l} && threadIdx.x == 0) g_clock[blockIdx.x][{l}] = clock64();\n"

# right after the unit's anonymous namespace opens
after(r"namespace dualk \{\nnamespace mlp \{\nnamespace \{\n", helpers)
if kernel == "simt":
    after(
        r"fused_mlp_simt_kernel\(const __grid_constant__ MlpKernelParams p\) \{\n",
        "  const bool stamping = p.m == 32 || p.m == 4096;\n  bool stamp_first = true;\n  STAMP(0);\n",
    )
    after(r"    __syncthreads\(\);  // barriers initialized[^\n]*\n", "    STAMP(1);\n")
    before(r"\n  load_biases_async\(p, bias_smem, 4, x\);", "\n  STAMP(2);")
    before(
        r"      cp_async_wait_dynamic\(resident && first_tile[^\n]*\n",
        "      if (stamp_first && layer >= 1 && layer < 3) STAMP(12 + layer);\n"
        + CLOCK.format(l=1),
    )
    after(
        r"      if \(bulk\) sm90::mbar_wait\(sm90::smem_u32\(layer_bars \+ layer\), 0\);[^\n]*\n",
        "      if (stamp_first && layer < 4) STAMP(3 + 2 * layer);\n",
    )
    after(
        r"      __syncthreads\(\);  // src complete[^\n]*\n",
        "      if (stamp_first && layer < 4) STAMP(4 + 2 * layer);\n" + CLOCK.format(l=0),
    )
    before(
        r"\n    first_tile = false;", "\n    if (stamp_first) STAMP(11);\n    stamp_first = false;"
    )
    # kernel end: the closing of the tile loop followed by the kernel's closing brace
    after(
        r"    __syncthreads\(\);  // all reads of h0/h1 done[^\n]*\n  \}\n",
        "  STAMP(12);\n  stamp_finish(stamping, p.m);\n",
    )
else:
    after(
        r"fused_mlp_tf32x3_kernel\(const __grid_constant__ MlpTf32Params params\) \{\n",
        "  const bool stamping = params.p.m == 32 || params.p.m == 4096;\n  bool stamp_first = true;\n  STAMP(0);\n",
    )
    after(
        r"    __syncthreads\(\);     // x split \(and[^\n]*\n", "    if (stamp_first) STAMP(2);\n"
    )
    after(
        r"      sm90::mbar_wait\(sm90::smem_u32\(layer_bars \+ layer\), 0\);[^\n]*\n",
        "      if (stamp_first && layer < 4) STAMP(4 + 2 * layer);\n" + CLOCK.format(l=0),
    )
    after(
        r"      __syncthreads\(\);  // dst complete[^\n]*\n",
        "      if (stamp_first && layer < 4) STAMP(5 + 2 * layer);\n"
        "      if (stamping && stamp_first && layer == 0 && threadIdx.x == 0) g_clock[blockIdx.x][1] = clock64();\n",
    )
    after(
        r"layer == 0 && threadIdx.x == 0\) g_clock\[blockIdx.x\]\[1\] = clock64\(\);\n    \}\n",
        "    stamp_first = false;\n",
    )
    after(
        r"    stamp_first = false;\n  \}\n", "  STAMP(12);\n  stamp_finish(stamping, params.p.m);\n"
    )
# gpu_explore.sh / mlp_run.sh build the variant in place of the unit it names on its first line.
(root / "experiments/mlp_v_stamp.cu").write_text(f"// replaces: {unit}\n" + src)
print("wrote experiments/mlp_v_stamp.cu")
