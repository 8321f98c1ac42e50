"""Where linear_glu's CUDA forward loses its margin over eager (issue 35), on a GPU, in one run.

For bf16, K = 4096, N = 11008 / 14336, rows 512 / 8192 (no bias, silu), device time of:
  eager        F.silu(F.linear(x, Wg)) * F.linear(x, Wu)   (two cuBLAS GEMMs + two passes)
  two_gemms    F.linear(x, Wg); F.linear(x, Wu)            (eager's GEMMs alone)
  packed_cublas  F.linear(x, [Wg; Wu])                     (one cuBLAS GEMM of 2N columns)
  packed_dualk   dualk.matmul(x, [Wg; Wu].T, backend="cuda") (dualk's Hopper GEMM, same work)
  glu_cuda     dualk.linear_glu(x, Wg, Wu, backend="cuda") (the gated kernel)
so the gated kernel is compared with the same FLOPs on cuBLAS and on dualk's own GEMM: if
packed_dualk matches packed_cublas and glu_cuda does not, the gap is in the gated kernel; if
packed_dualk is short too, it is the GEMM's main loop on this shape.

    python3 experiments/glu_gap_probe.py --json OUT.json
    python3 experiments/glu_gap_probe.py --ncu-cases   # for experiments/ncu_glu.sh: 8192 x 14336,
                                                       # dualk's GEMM then the gated kernel, twice
    python3 experiments/glu_gap_probe.py --cluster-ab --json OUT.json

--cluster-ab (session 35): the gated kernel with DUALK_GLU_CLUSTER=0 (single CTAs) and =1 (the
wide tile in CTA pairs multicasting the weight boxes), and eager, in the same rounds of one
process (the launcher reads the variable on every call), at rows 8192 / 2048 / 512: isolated
calls (L2 flushed, as above) and sustained ones (back to back between two events: the H200 is
power-bound there, and that is where the pairs should show). Shapes whose route is not the wide
tile (the mid tile at 512 rows) run the same kernel in both arms: an A/A control of the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import dualk
from dualk.core import timing


def device_us(fn, reps=15, rounds=3):
    flush = torch.empty(2**25, dtype=torch.int32, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    host_ms = timing.burst_host_ms(fn, 3)
    cycles = timing.sleep_cycles(host_ms * 1e3)
    per_round = []
    for _ in range(rounds):
        ms = timing.timed_calls(fn, reps, flush, cycles)
        per_round.append(timing.interquartile_mean(ms))
    return statistics.median(per_round) * 1e3, [round(v * 1e3, 1) for v in per_round]


def sustained_us(fn, calls=20, warm=10):
    """Device us per call over `calls` back-to-back calls between two CUDA events, after `warm`
    untimed ones in the same burst (no flush, no synchronise between them): the clocks and power a
    model's stream of such calls runs at, which isolated calls with sleeps between them miss."""
    for _ in range(warm):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / calls


def gpu_state():
    """SM clock (MHz) and board power (W) as NVML last sampled them ({} without pynvml)."""
    try:
        return {"sm_mhz": torch.cuda.clock_rate(), "power_w": round(torch.cuda.power_draw() / 1e3)}
    except Exception:  # pynvml missing or the query refused: the times stand alone
        return {}


CLUSTER_ENV = "DUALK_GLU_CLUSTER"


def cluster_ab(rounds):
    """The A/B of --cluster-ab: per shape, a correctness check, then `rounds` rounds of the three
    arms, each timed isolated (device_us) and sustained (sustained_us). The order rotates, and
    reverses every third round, so that over 6 rounds each arm runs in each position twice and
    each arm runs before each other as often as after it (a GPU that heats up favours none)."""
    from dualk.backends import cuda as cuda_backend

    dt = torch.bfloat16
    before = os.environ.get(CLUSTER_ENV)
    rows_out = []
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            for n in (11008, 14336):
                wg = torch.randn(n, 4096, device="cuda", dtype=dt) * 0.02
                wu = torch.randn(n, 4096, device="cuda", dtype=dt) * 0.02
                for m in (8192, 2048, 512):
                    x = torch.randn(m, 4096, device="cuda", dtype=dt)
                    glu = lambda: dualk.linear_glu(x, wg, wu, backend="cuda")  # noqa: E731
                    eager = lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu)  # noqa: E731
                    arms = {"single": (glu, "0"), "pairs": (glu, "1"), "eager": (eager, "0")}
                    row = {"rows": m, "n": n, "k": 4096}
                    for name in ("single", "pairs"):
                        os.environ[CLUSTER_ENV] = arms[name][1]
                        row["route_" + name] = cuda_backend.linear_glu_route(x, wg, wu)
                    # The two arms' outputs: the same wgmma over the same tiles, so equal; else
                    # each within bf16 tolerance of eager (which rounds three times, we once).
                    os.environ[CLUSTER_ENV] = "0"
                    single = glu()
                    os.environ[CLUSTER_ENV] = "1"
                    pairs = glu()
                    ref = eager().float()
                    row["pairs_equal_single"] = bool(torch.equal(single, pairs))
                    close = [
                        torch.allclose(o.float(), ref, rtol=2e-2, atol=2e-2)
                        for o in (single, pairs)
                    ]
                    row["max_abs_vs_eager"] = {
                        k: round((o.float() - ref).abs().max().item(), 4)
                        for k, o in (("single", single), ("pairs", pairs))
                    }
                    row["agree"] = row["pairs_equal_single"] or all(close)
                    del single, pairs, ref
                    names = list(arms)
                    iso = {k: [] for k in names}
                    sus = {k: [] for k in names}
                    state = {k: [] for k in names}
                    for r in range(rounds):
                        order = names[r % 3 :] + names[: r % 3]
                        for name in order[::-1] if (r // 3) % 2 else order:
                            fn, value = arms[name]
                            os.environ[CLUSTER_ENV] = value
                            iso[name].append(round(device_us(fn, reps=10, rounds=2)[0], 1))
                            sus[name].append(round(sustained_us(fn), 1))
                            state[name].append(gpu_state())
                    row["isolated_us"] = iso
                    row["sustained_us"] = sus
                    row["gpu_after_sustained"] = state
                    for kind, times in (("isolated", iso), ("sustained", sus)):
                        med = {k: statistics.median(v) for k, v in times.items()}
                        row[kind + "_median_us"] = med
                        # > 1: the pairs are faster (single CTAs' time over the pairs')
                        row[kind + "_single_over_pairs"] = round(med["single"] / med["pairs"], 4)
                        row[kind + "_eager_over_pairs"] = round(med["eager"] / med["pairs"], 4)
                        row[kind + "_eager_over_single"] = round(med["eager"] / med["single"], 4)
                    print_ab_row(row)
                    rows_out.append(row)
    finally:
        if before is None:
            os.environ.pop(CLUSTER_ENV, None)
        else:
            os.environ[CLUSTER_ENV] = before
    return rows_out


def print_ab_row(row):
    if not hasattr(print_ab_row, "header"):
        print_ab_row.header = True
        print(
            f"{'rows x N':>14} {'pairs route':>12} | {'isolated us: single':>19} {'pairs':>8} "
            f"{'eager':>8} {'s/p':>6} | {'sustained us: single':>20} {'pairs':>8} {'eager':>8} "
            f"{'s/p':>6} {'e/p':>6} | agree"
        )
    paired = row["route_pairs"].endswith("CTA pairs")
    im, sm = row["isolated_median_us"], row["sustained_median_us"]
    print(
        f"{row['rows']:>6} x {row['n']:>5} {'pairs' if paired else 'A/A (same)':>12} | "
        f"{im['single']:>19.1f} {im['pairs']:>8.1f} {im['eager']:>8.1f} "
        f"{row['isolated_single_over_pairs']:>6.3f} | {sm['single']:>20.1f} {sm['pairs']:>8.1f} "
        f"{sm['eager']:>8.1f} {row['sustained_single_over_pairs']:>6.3f} "
        f"{row['sustained_eager_over_pairs']:>6.3f} | "
        f"{'equal' if row['pairs_equal_single'] else ('close' if row['agree'] else 'NO')}",
        flush=True,
    )
    if not row["agree"]:
        print(f"  !! outputs disagree: max |out - eager| {row['max_abs_vs_eager']}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument(
        "--ncu-cases", action="store_true", help="two launches of each kernel, no timing"
    )
    p.add_argument(
        "--cluster-ab",
        action="store_true",
        help="DUALK_GLU_CLUSTER=0 vs 1 (CTA pairs) vs eager, isolated and sustained",
    )
    p.add_argument("--rounds", type=int, default=6, help="--cluster-ab rounds per shape")
    a = p.parse_args()
    if a.ncu_cases:
        ncu_cases()
        return
    if a.cluster_ab:
        out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "sms": torch.cuda.get_device_properties(0).multi_processor_count,
               "date": time.strftime("%Y-%m-%d %H:%M"), "cluster_ab": cluster_ab(a.rounds)}  # fmt: skip
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=1)
        return
    dt = torch.bfloat16
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M"), "rows": []}  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        for n in (11008, 14336):
            wg = torch.randn(n, 4096, device="cuda", dtype=dt) * 0.02
            wu = torch.randn(n, 4096, device="cuda", dtype=dt) * 0.02
            packed = torch.cat([wg, wu])
            packed_t = packed.t()
            for m in (512, 8192):
                x = torch.randn(m, 4096, device="cuda", dtype=dt)
                paths = {
                    "eager": lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu),
                    "two_gemms": lambda: (F.linear(x, wg), F.linear(x, wu)),
                    "packed_cublas": lambda: F.linear(x, packed),
                    "packed_dualk": lambda: dualk.matmul(x, packed_t, backend="cuda"),
                    "glu_cuda": lambda: dualk.linear_glu(x, wg, wu, backend="cuda"),
                }
                row = {"rows": m, "n": n, "k": 4096}
                # two passes in alternating order: a GPU that warms (clocks, power) hits both
                for order in (list(paths), list(paths)[::-1]):
                    for name in order:
                        us, rounds = device_us(paths[name])
                        row.setdefault(name, []).append(round(us, 1))
                        row.setdefault(name + "_rounds", []).extend(rounds)
                for name in paths:
                    row[name + "_us"] = statistics.median(row[name])
                flops = 2 * m * 4096 * 2 * n
                row["tflops"] = {k: round(flops / (row[k + "_us"] * 1e-6) / 1e12, 1)
                                 for k in paths if k != "eager"}  # fmt: skip
                row["glu_vs_eager"] = round(row["eager_us"] / row["glu_cuda_us"], 3)
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("_rounds")}),
                      flush=True)  # fmt: skip
                out["rows"].append(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


def ncu_cases():
    """8192 x 4096 -> 14336 (bf16, silu): dualk's Hopper GEMM on the packed weight (2N columns),
    then the gated kernel, each launched twice (a warm-up, then the one to read), so that ncu's
    kernel filter sees gemm_sm90_kernel, gemm_sm90_kernel, linear_glu_sm90_kernel x 2."""
    torch.manual_seed(0)
    dt = torch.bfloat16
    wg = torch.randn(14336, 4096, device="cuda", dtype=dt) * 0.02
    wu = torch.randn(14336, 4096, device="cuda", dtype=dt) * 0.02
    packed_t = torch.cat([wg, wu]).t()
    x = torch.randn(8192, 4096, device="cuda", dtype=dt)
    with torch.no_grad():
        for _ in range(2):
            dualk.matmul(x, packed_t, backend="cuda")
        for _ in range(2):
            dualk.linear_glu(x, wg, wu, backend="cuda")
    torch.cuda.synchronize()
    print(dualk.explain("linear_glu", x, wg, wu, backend="cuda"))


if __name__ == "__main__":
    main()
