"""Standalone benchmark of dualk's Triton GEMM / linear_gelu / fused_mlp kernels against PyTorch.

Imports triton_src/* directly (repo root on sys.path): no CUDA extension is built. For each case
it checks the result against a float64 reference (max |err| / max |ref|, next to PyTorch's own
error in the same dtype), then times device time with triton.testing.do_bench (median, L2
flushed), host time per call (200 calls without a sync, divided), and the peers.

    python3 experiments/triton_bench.py [--quick] [--baseline DIR]

--baseline DIR: DIR holds a package ``triton_baseline`` (an older copy of triton_src, imports
renamed) timed next to the current one. Writes the table to $OUT/triton_table.txt when OUT is set.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ROWS: list[str] = []


def log(line: str = "") -> None:
    print(line, flush=True)
    ROWS.append(line)


def dev_us(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.25, 0.75])[0] * 1e3


def graph_us(fn, reps: int = 20) -> float:
    """Device time per call with launch gaps removed: ``reps`` calls in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return dev_us(g.replay) / reps


def host_us(fn, n: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def check(name, out, ref, torch_out):
    e, te = rel_err(out, ref), rel_err(torch_out, ref)
    ok = e <= 2 * te + 1e-6
    log(f"  check {name}: err {e:.2e} (torch {te:.2e}) {'OK' if ok else 'FAIL'}")
    return ok


def rnd(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def row(case, impl, dev, host=None, note=""):
    h = f"{host:8.1f}" if host is not None else "       -"
    log(f"| {case:<34} | {impl:<26} | {dev:9.1f} | {h} | {note}")


def show_tuning(mod, top=4):
    for key, timings in mod.TUNING_LOG.items():
        best = ", ".join(f"{cfg}:{ms * 1e3:.1f}" for ms, cfg in timings[:top])
        log(f"  tuned {str(key)[:70]}... -> {best}")
    mod.TUNING_LOG.clear()


def bench_linear_gelu(mods, M, K, N, dtype, quick):
    case = f"linear_gelu {str(dtype)[6:]} {M}x{K}x{N}"
    x = rnd(M, K, dtype=dtype)
    w = rnd(N, K, dtype=dtype, scale=K**-0.5)
    b = rnd(N, dtype=dtype)
    ref = F.gelu(x.double() @ w.double().t() + b.double(), approximate="tanh")
    lt = importlib.import_module("triton_src.linear_gelu")
    mm = importlib.import_module("triton_src.matmul")
    peer = torch._addmm_activation(b, x, w.t(), use_gelu=True)
    eager = F.gelu(F.linear(x, w, b), approximate="tanh")
    for name, mod in mods:
        f = importlib.import_module(f"{mod}.linear_gelu").linear_gelu
        out = f(x, w, b, approximate="tanh", allow_tf32=False)
        check(f"{case} {name}", out, ref, eager)
        row(
            case,
            f"triton {name}",
            dev_us(lambda f=f: f(x, w, b, approximate="tanh", allow_tf32=False)),
        )
    best = next(iter(mm.TUNING_LOG.values()))[0][1] if mm.TUNING_LOG else None
    show_tuning(mm, top=20)
    # Same config: activation math variants, and no GELU at all (the epilogue's cost).
    c = torch.empty(M, N, dtype=dtype, device="cuda")
    sx, sw = x.stride(), w.stride()
    mm.FORCE_CONFIG[:] = [best]
    for level in (1, 2):
        mm.FAST_ACT_LEVEL[0] = level
        out = lt.linear_gelu(x, w, b, approximate="tanh", allow_tf32=False)
        check(f"{case} fast={level}", out, ref, eager)
        row(
            case,
            f"new {best} fast={level}",
            dev_us(lambda: lt.linear_gelu(x, w, b, approximate="tanh", allow_tf32=False)),
        )
    mm.FAST_ACT_LEVEL[0] = 2

    def nogelu():
        mm._gemm(x, w, b, c, 1, M, N, K, 0, sx[0], sx[1], 0, sw[1], sw[0], 0, N, 1, 0, False)

    nogelu()
    row(case, f"new {best} bias only", dev_us(nogelu))
    mm.FORCE_CONFIG.clear()
    cub = dev_us(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))
    row(case, "cuBLASLt addmm_activation", cub)
    check(f"{case} cuBLASLt", peer, ref, eager)
    row(case, "eager gelu(linear)", dev_us(lambda: F.gelu(F.linear(x, w, b), approximate="tanh")))


def bench_matmul(mods, M, K, N, dtype):
    case = f"matmul {str(dtype)[6:]} {M}x{K}x{N}"
    a = rnd(M, K, dtype=dtype)
    bm = rnd(K, N, dtype=dtype, scale=K**-0.5)
    ref = a.double() @ bm.double()
    tout = a @ bm
    for name, mod in mods:
        f = importlib.import_module(f"{mod}.matmul").matmul
        out = f(a, bm, allow_tf32=False)
        check(f"{case} {name}", out, ref, tout)
        row(case, f"triton {name}", dev_us(lambda f=f: f(a, bm, allow_tf32=False)))
    show_tuning(importlib.import_module("triton_src.matmul"), top=20)
    row(case, "torch.matmul (cuBLAS)", dev_us(lambda: a @ bm))


def mlp_eager(x, ws, bs):
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = F.linear(h, w, b)
        if i < len(ws) - 1:
            h = F.relu(h)
    return h


def bench_mlp(mods, widths, dtype, batch, small=False):
    case = f"mlp {'-'.join(map(str, widths))} {str(dtype)[6:]} b{batch}"
    x = rnd(batch, widths[0], dtype=dtype)
    ws = [
        rnd(widths[i + 1], widths[i], dtype=dtype, scale=widths[i] ** -0.5)
        for i in range(len(widths) - 1)
    ]
    bs = [rnd(widths[i + 1], dtype=dtype, scale=0.1) for i in range(len(widths) - 1)]
    ref = mlp_eager(x.double(), [w.double() for w in ws], [b.double() for b in bs])
    tout = mlp_eager(x, ws, bs)
    for name, mod in mods:
        f = importlib.import_module(f"{mod}.fused_mlp").fused_mlp

        def call(f=f):
            return f(x, ws, bs, activation="relu")

        out = call()
        check(f"{case} {name}", out, ref, tout)
        if small:
            row(case, f"triton {name} (graph)", graph_us(call), host_us(call))
        else:
            row(case, f"triton {name}", dev_us(call), host_us(call) if batch <= 4096 else None)
    show_tuning(importlib.import_module("triton_src.fused_mlp"), top=12)
    e = lambda: mlp_eager(x, ws, bs)  # noqa: E731
    row(case, "eager", dev_us(e), host_us(e) if small else None)
    row(case, "eager CUDA graph", graph_us(e))


def bench_small_host(mods):
    """Host us per call for small GEMMs (launch path only)."""
    for dtype in (torch.float16, torch.float32):
        x = rnd(32, 64, dtype=dtype)
        w = rnd(64, 64, dtype=dtype)
        b = rnd(64, dtype=dtype)
        case = f"small linear_gelu {str(dtype)[6:]} 32x64x64"
        for name, mod in mods:
            lg = importlib.import_module(f"{mod}.linear_gelu").linear_gelu
            mm = importlib.import_module(f"{mod}.matmul").matmul

            def f(lg=lg, x=x, w=w, b=b):
                return lg(x, w, b, approximate="tanh", allow_tf32=False)

            def g(mm=mm, x=x, w=w):
                return mm(x, w, allow_tf32=False)

            f()
            g()
            torch.cuda.synchronize()
            row(case, f"triton {name}", graph_us(f), host_us(f))
            row(
                f"small matmul {str(dtype)[6:]} 32x64x64", f"triton {name}", graph_us(g), host_us(g)
            )
    show_tuning(importlib.import_module("triton_src.matmul"))


def profile_host(mods):
    """cProfile of 300 calls of the small cases: where the host time goes."""
    import cProfile
    import pstats

    fm = importlib.import_module("triton_src.fused_mlp").fused_mlp
    lg = importlib.import_module("triton_src.linear_gelu").linear_gelu
    x = rnd(32, 100, dtype=torch.float32)
    ws = [
        rnd(128, 100, dtype=torch.float32),
        rnd(64, 128, dtype=torch.float32),
        rnd(10, 64, dtype=torch.float32),
    ]
    bs = [rnd(128, dtype=torch.float32), rnd(64, dtype=torch.float32), rnd(10, dtype=torch.float32)]
    xs, wsm, bsm = (
        rnd(32, 64, dtype=torch.float16),
        rnd(64, 64, dtype=torch.float16),
        rnd(64, dtype=torch.float16),
    )
    for name, fn in (
        ("mlp", lambda: fm(x, ws, bs, activation="relu")),
        ("lg", lambda: lg(xs, wsm, bsm, approximate="tanh", allow_tf32=False)),
    ):
        fn()
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        for modname in ("matmul", "fused_mlp"):
            m = importlib.import_module(f"triton_src.{modname}")
            for ln in (
                getattr(m, "_launchers", {}).values() if modname == "matmul" else [m._launcher]
            ):
                log(
                    f"  {modname} launcher: {ln.fast_launches} fast, {ln.slow_launches} slow, "
                    f"{len(ln.compiled)} cached"
                )
        kn = triton.knobs.runtime
        log(f"  hooks: {kn.launch_enter_hook} {kn.launch_exit_hook}")
        st = pstats.Stats(pr)
        st.sort_stats("tottime")
        log(f"  profile {name}: top functions by total time (300 calls)")
        for (file, line, func), (_cc, nc, tt, ct, _) in sorted(
            st.stats.items(), key=lambda kv: -kv[1][2]
        )[:12]:
            log(
                f"    {tt / 300 * 1e6:7.2f} us/call  {ct / 300 * 1e6:7.2f} cum  "
                f"{os.path.basename(file)}:{line} {func} x{nc / 300:.0f}"
            )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    mods = [("new", "triton_src")]
    if args.baseline:
        sys.path.insert(0, os.path.abspath(args.baseline))
        mods.append(("old", "triton_baseline"))
    torch.manual_seed(0)
    log(
        f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{triton.__version__}"
    )
    log(f"| {'case':<34} | {'impl':<26} | {'dev us':>9} | {'host us':>8} | note")
    only = args.only.split(",") if args.only else None

    def want(tag):
        return only is None or tag in only

    if want("small"):
        bench_small_host(mods)
    if want("profile"):
        profile_host(mods)
    if want("mlpsmall"):
        bench_mlp(mods, [100, 128, 64, 10], torch.float32, 32, small=True)
    mods = mods[:1]  # the baseline's device times are in NOTES-triton.md; host times above
    if want("lg"):
        bench_linear_gelu(mods, 8192, 768, 3072, torch.bfloat16, args.quick)
    if want("mlp"):
        for dt in (torch.float16, torch.bfloat16):
            bench_mlp(mods, [64, 64, 64, 64, 16], dt, 1 << 20)
        bench_mlp(mods, [128, 128, 128, 128, 16], torch.float16, 1 << 20)
    if want("mm"):
        bench_matmul(mods, 4096, 4096, 4096, torch.float16)
        bench_matmul(mods, 4096, 4096, 4096, torch.bfloat16)
    if want("lgbig"):
        bench_linear_gelu(mods, 4096, 4096, 16384, torch.bfloat16, args.quick)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "triton_table.txt"), "w") as fh:
            fh.write("\n".join(ROWS) + "\n")


if __name__ == "__main__":
    main()
