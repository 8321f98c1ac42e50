"""Small-batch MLP inference: dualk against tiny-cuda-nn's FullyFusedMLP, side by side in one run
(issue 32: dualk's per-call cost must not exceed tcnn's, 13.4 us on an H100 for 112-128-128-10).

    python3 bench/small_batch_latency.py --tcnn .peers/tcnn/tcnn_bench --json OUT.json
    python3 bench/small_batch_latency.py --dry-run     # the plan, runs nothing
    python3 bench/small_batch_latency.py --smoke       # tiny sizes on the CPU (CI)

1. Runs tcnn_bench (`--tcnn PATH`, the binary or its folder; without it the tcnn column is
   empty and the run goes on) and parses its `TCNN width=W hidden_layers=H in=I out=O batch=B
   us_per_call=X` lines. It runs first, alone on the GPU.
2. Times, in this process and with tcnn's method (20 warmup calls, and on a GPU more up to
   0.25 s: WARM_S; then 200 calls back to back between two CUDA events; median of 5 repeats), under torch.no_grad():
     fused_mlp auto / cuda / triton  dualk.fused_mlp(x, weights, biases, activation="relu")
     module                          dualk.fuse(nn.Sequential) (FusedMLP's inference fast path)
     eager                           the nn.Sequential itself
     graph                           a CUDA-graph replay of the eager model (PyTorch's best)
   and the host time per call: wall time of the 200-call enqueue loop / 200 (the loop has no
   sync; the end event is recorded after the clock stops). When the host time is the larger,
   the call is host-bound and the GPU time per call equals it.
3. Checks every path's output against a float64 reference of the same weights (relative norm
   error: fp16 <= 5e-3, fp32 <= 1e-4) and prints FAIL lines; the exit status is 1 if any check
   failed (after the table and the JSON are written).

Configs: tcnn's 112-128-128-10 ReLU fp16 at 256 and 4096 rows; the seed's 100-128-64-10 in fp16
and fp32 at 32, 256, 1024 and 4096 rows; tcnn's big ones in fp16 at 2^20 rows (64-wide x4 hidden,
64 in, 16 out; 128 x4, 128 in, 16 out; NeRF 32-64-64-64-16). A backend that is unavailable (or
raises) is reported with the reason (dualk.explain) and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import dualk
from dualk.dispatch import triton_tune

TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4}
TCNN_GOAL_US = 13.4  # tcnn on an H100, 112-128-128-10 (issue 32)
PATHS = ("auto", "cuda", "triton", "module", "eager", "graph")
DUALK_PATHS = ("auto", "cuda", "triton", "module")
TCNN_LINE = re.compile(
    r"^TCNN width=(\d+) hidden_layers=(\d+) in=(\d+) out=(\d+) batch=(\d+) us_per_call=([0-9.eE+-]+)"
)


@dataclass
class Config:
    name: str
    widths: tuple[int, ...]
    dtype: torch.dtype
    rows: int
    # (width, hidden_layers, in, out, batch) of the tcnn line that matches, if any
    tcnn_key: tuple[int, int, int, int, int] | None = None
    results: dict = field(default_factory=dict)


def _tcnn_key(widths, rows):
    """tcnn's description of an MLP: one hidden width; hidden_layers = number of hidden widths."""
    hidden = widths[1:-1]
    if not hidden or len(set(hidden)) != 1:
        return None
    return (hidden[0], len(hidden), widths[0], widths[-1], rows)


def configs(smoke: bool) -> list[Config]:
    half, single = torch.float16, torch.float32
    out = []

    def add(name, widths, dtype, rows):
        out.append(Config(name, tuple(widths), dtype, rows, _tcnn_key(widths, rows)))

    if smoke:  # the same shapes' structure, CPU-sized
        add("tcnn 112-128-128-10", (112, 128, 128, 10), single, 8)
        add("seed 100-128-64-10", (100, 128, 64, 10), single, 4)
        add("nerf 32-64-64-64-16", (32, 64, 64, 64, 16), single, 16)
        return out
    for rows in (256, 4096):
        add("tcnn 112-128-128-10", (112, 128, 128, 10), half, rows)
    for dtype in (half, single):
        for rows in (32, 256, 1024, 4096):
            add("seed 100-128-64-10", (100, 128, 64, 10), dtype, rows)
    big = 1 << 20
    add("64x4 64-in 16-out", (64, 64, 64, 64, 64, 16), half, big)
    add("128x4 128-in 16-out", (128, 128, 128, 128, 128, 16), half, big)
    add("nerf 32-64-64-64-16", (32, 64, 64, 64, 16), half, big)
    return out


# ------------------------------------------------------------------------------------ tcnn
def run_tcnn(path: str | None, warmup: int, iters: int) -> dict:
    """{"ran": bool, "reason": str|None, "lines": [...], "by_key": {key: us}, "stderr": str}"""
    info: dict = {"path": path, "ran": False, "reason": None, "lines": [], "by_key": {}}
    if not path:
        info["reason"] = "no --tcnn PATH given"
        return info
    exe = Path(path)
    if exe.is_dir():
        exe = exe / "tcnn_bench"
    if not exe.is_file():
        info["reason"] = f"{exe} does not exist"
        return info
    if not os.access(exe, os.X_OK):
        info["reason"] = f"{exe} is not executable (chmod +x it)"
        return info
    try:
        proc = subprocess.run(
            [str(exe), str(warmup), str(iters), "rm"], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["reason"] = f"{type(exc).__name__}: {exc}"
        return info
    info.update(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr[-4000:])
    info["lines"] = parse_tcnn(proc.stdout)
    info["by_key"] = {tuple(d[k] for k in _TCNN_FIELDS): d["us_per_call"] for d in info["lines"]}
    info["ran"] = bool(info["lines"])
    if proc.returncode != 0:
        info["reason"] = f"exit status {proc.returncode}: {proc.stderr.strip()[-500:]}"
    elif not info["lines"]:
        info["reason"] = "no TCNN lines in its output"
    return info


_TCNN_FIELDS = ("width", "hidden_layers", "in", "out", "batch")


def parse_tcnn(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        m = TCNN_LINE.match(line.strip())
        if m:
            vals = [int(v) for v in m.groups()[:5]]
            out.append({**dict(zip(_TCNN_FIELDS, vals)), "us_per_call": float(m.group(6))})
    return out


# ---------------------------------------------------------------------------------- timing
WARM_S = 0.25  # the least warm-up time per path, on top of `warmup` calls


def _warm(fn, device: torch.device, warmup: int) -> None:
    """`warmup` calls, and more until WARM_S has passed: the first path timed in a process ran its
    five repeats at 63, 38, 29, 26, 22 us per call after tcnn's 20 warm-up calls (H100, session
    30: the host still warming), the same path in a later row at a steady 8-12."""
    t0, done = time.perf_counter(), 0
    least_s = WARM_S if device.type == "cuda" else 0.0  # (a CPU smoke run: its calls only)
    while done < warmup or time.perf_counter() - t0 < least_s:
        fn()
        done += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, device: torch.device, warmup: int, iters: int, repeats: int):
    """(median device us per call, median host us per call, all of both): `warmup` calls, then
    per repeat `iters` calls back to back between two CUDA events (tcnn's method). Host time:
    the enqueue loop's wall time / iters. On the CPU both are the wall time."""
    _warm(fn, device, warmup)
    # auto's final decision (no CUDA build or Triton tuning left in the background), then again
    if triton_tune.background_pending() and triton_tune.settle(fn, 90.0):
        _warm(fn, device, warmup)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    dev_us, host_us = [], []
    for _ in range(repeats):
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        if cuda:
            end.record()
            end.synchronize()
            dev_us.append(start.elapsed_time(end) * 1e3 / iters)
        else:
            dev_us.append((t1 - t0) * 1e6 / iters)
        host_us.append((t1 - t0) * 1e6 / iters)
    return statistics.median(dev_us), statistics.median(host_us), dev_us, host_us


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    diff = torch.linalg.vector_norm(y.double() - ref).item()
    norm = torch.linalg.vector_norm(ref).item()
    if not math.isfinite(diff):
        return math.inf
    return diff / norm if norm > 0 else diff


def build_model(widths, dtype, device) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))  # nn.Linear's init, in fp32 on the CPU (seeded)
        if i != len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def reference(x, weights, biases) -> torch.Tensor:
    h = x.double()
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = torch.nn.functional.linear(h, w.double(), b.double())
        if i != len(weights) - 1:
            h = torch.relu(h)
    return h


def _unavailable(x, ws, bs, backend) -> str | None:
    """Why dualk.fused_mlp(backend=...) cannot run this call (dualk.explain), or None."""
    try:
        expl = dualk.explain("fused_mlp", x, ws, bs, activation="relu", backend=backend)
    except Exception as exc:
        return f"explain raised {type(exc).__name__}: {exc}"
    reason = expl.availability.get(expl.backend)
    return None if reason is None else f"{expl.backend}: {reason}"


def _explain_text(x, ws, bs, backend) -> str:
    try:
        return str(dualk.explain("fused_mlp", x, ws, bs, activation="relu", backend=backend))
    except Exception as exc:
        return f"explain raised {type(exc).__name__}: {exc}"


def _graph_fn(model, x, device):
    """A CUDA graph of the eager model on x (static input); returns (replay fn, its output)."""
    if device.type != "cuda":
        return None, "CUDA graphs need a CUDA device"
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    return graph, out


def measure(cfg: Config, device, args, failures: list) -> None:
    torch.manual_seed(0)
    model = build_model(cfg.widths, cfg.dtype, device).eval()
    linears = [m for m in model if isinstance(m, nn.Linear)]
    ws, bs = [m.weight for m in linears], [m.bias for m in linears]
    x = torch.randn(cfg.rows, cfg.widths[0], device=device, dtype=cfg.dtype)
    with torch.no_grad():
        ref = reference(x, ws, bs)
    tol = TOLERANCE[cfg.dtype]
    fused, fuse_note = None, None
    try:
        fused = dualk.fuse(model)
        n_fused = sum(isinstance(m, dualk.nn.FusedMLP) for m in fused.modules())
        if n_fused != 1:
            fuse_note = f"fuse made {n_fused} FusedMLPs: {fused.dualk_fuse_report}"
    except Exception as exc:
        fuse_note = f"dualk.fuse raised {type(exc).__name__}: {exc}"

    fns: dict = {}
    reasons: dict = {}
    for be in ("auto", "cuda", "triton"):
        why = _unavailable(x, ws, bs, be)
        if why is not None:
            reasons[be] = why
        else:
            fns[be] = lambda be=be: dualk.fused_mlp(x, ws, bs, activation="relu", backend=be)
    if fused is not None:
        fns["module"] = lambda: fused(x)
        if fuse_note:
            reasons["module"] = fuse_note  # still timed, with the note
    else:
        reasons["module"] = fuse_note
    fns["eager"] = lambda: model(x)
    graph_out = None
    try:
        with torch.no_grad():
            graph, graph_out = _graph_fn(model, x, device)
        if graph is None:
            reasons["graph"] = graph_out
            graph_out = None
        else:
            fns["graph"] = graph.replay
    except Exception as exc:
        reasons["graph"] = f"capture raised {type(exc).__name__}: {exc}"

    for path in PATHS:
        res: dict = {"us": None, "host_us": None, "reason": reasons.get(path)}
        cfg.results[path] = res
        fn = fns.get(path)
        if fn is None:
            continue
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                y = fn()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                res["first_call_ms"] = (time.perf_counter() - t0) * 1e3
                if path == "graph":
                    y = graph_out
                err = rel_error(y, ref)
                del y
                res["rel_error"], res["ok"] = err, err <= tol
                if not res["ok"]:
                    failures.append(
                        f"{cfg.name} {_dt(cfg.dtype)} rows={cfg.rows} {path}: relative error "
                        f"{err:.3g} > {tol:g}"
                    )
                us, host, us_all, host_all = time_calls(
                    fn, device, args.warmup, args.iters, args.repeats
                )
            res.update(us=us, host_us=host, us_all=us_all, host_all=host_all)
            if path == "module" and args.diagnose:
                res["diagnosis"] = _diagnose_module(fused, fn, args.iters)
        except Exception as exc:
            res["reason"] = f"raised {type(exc).__name__}: {exc}"
            res["traceback"] = traceback.format_exc()[-2000:]
            if path in ("auto", "module", "eager"):  # these must run on any machine
                failures.append(f"{cfg.name} {_dt(cfg.dtype)} rows={cfg.rows} {path}: {exc}")
    # What auto settled on (after its warmup and tuning), and the CUDA kernel.
    cfg.results["auto"]["explain"] = _explain_text(x, ws, bs, "auto")


def _diagnose_module(fused, fn, iters: int) -> dict:
    """Which path the fuse'd module's calls take after timing (its C++ plan, its Python plan,
    its memoized choice, module_choice's decision) and Python's profile of `iters` more calls:
    where a module call's host time goes when it is far above the functional call's."""
    import cProfile
    import io
    import pstats

    from dualk import module_choice

    fm = next(m for m in fused.modules() if isinstance(m, dualk.nn.FusedMLP))
    state = {
        "fast_plan": fm.__dict__.get("_fast") is not None,
        "plan": fm.__dict__.get("_plan") is not None,
        "choice_memo": repr(fm.__dict__.get("_choice_memo"))[:300],
        "last_path": fm.__dict__.get("_last_path"),
        "decisions": {k: {f: v.get(f) for f in ("path", "provisional", "source")}
                      for k, v in module_choice.details().items()},
    }  # fmt: skip
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(iters):
            fn()
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    state["cprofile"] = text.getvalue()[-3500:]
    return state


def warm_up(device) -> dict:
    """One tiny call per GPU backend before any timing, so that the CUDA extension's build or
    load and Triton's start-up are reported apart (the configs' first calls still compile their
    own Triton kernels and tune auto: each path's first_call_ms in the JSON)."""
    t0 = time.perf_counter()
    errors = {}
    x = torch.randn(4, 16, device=device)
    ws, bs = [torch.randn(8, 16, device=device)], [torch.randn(8, device=device)]
    for be in ("cuda", "triton"):
        why = _unavailable(x, ws, bs, be)
        if why is not None:
            errors[be] = why
            continue
        try:
            dualk.fused_mlp(x, ws, bs, activation="relu", backend=be)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:
            errors[be] = f"raised {type(exc).__name__}: {exc}"
    return {"seconds": time.perf_counter() - t0, "errors": errors}


def _dt(dtype) -> str:
    return {torch.float16: "fp16", torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")


def _auto_backend(text: str | None) -> str:
    m = re.search(r"runs on '(\w+)'", text or "")
    return m.group(1) if m else "?"


def table(cfgs: list[Config], tcnn: dict) -> str:
    head = ["config", "dtype", "rows", "tcnn", "auto", "cuda", "triton", "module", "eager",
            "graph", "| host:", "auto", "cuda", "triton", "module", "auto ran"]  # fmt: skip
    rows = []
    for c in cfgs:
        r = c.results
        tc = tcnn["by_key"].get(c.tcnn_key) if c.tcnn_key else None
        rows.append(
            [c.name, _dt(c.dtype), str(c.rows), _fmt(tc)]
            + [_fmt(r[p]["us"]) for p in PATHS]
            + ["|"]
            + [_fmt(r[p]["host_us"]) for p in DUALK_PATHS]
            + [_auto_backend(r["auto"].get("explain"))]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = [
        "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths)))
    ]
    for row in rows:
        lines.append(
            "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
        )
    return "\n".join(lines)


def goal_lines(cfgs: list[Config], tcnn: dict) -> list[str]:
    """Issue 32's small-batch goal: dualk's per-call time <= tcnn's, per config with a tcnn
    number (or, without tcnn, against 13.4 us, its H100 figure for 112-128-128-10)."""
    out = []
    for c in cfgs:
        tc = tcnn["by_key"].get(c.tcnn_key) if c.tcnn_key else None
        if tc is None and not c.name.startswith("tcnn 112"):
            continue
        peer, label = (tc, "tcnn") if tc is not None else (TCNN_GOAL_US, "tcnn's H100 figure")
        for p in ("auto", "module"):
            us = c.results[p]["us"]
            if us is None:
                continue
            verdict = "met" if us <= peer else "NOT met"
            out.append(
                f"goal {c.name} {_dt(c.dtype)} rows={c.rows} {p}: {us:.1f} us vs {label} "
                f"{peer:.1f} us: {verdict} (host {c.results[p]['host_us']:.1f} us/call)"
            )
    return out


def environment(device) -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "dualk": dualk.__version__,
        "device": str(device),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"unavailable ({type(exc).__name__}: {exc})"
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(device_name=p.name, capability=f"{p.major}.{p.minor}",
                   sm_count=p.multi_processor_count)  # fmt: skip
    else:
        env["device_name"] = platform.processor() or "cpu"
    return env


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tcnn", help="tcnn_bench (the binary or its folder); optional")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", help="comma-separated substrings of config names to keep")
    ap.add_argument(
        "--diagnose", action="store_true", help="the module path's state and Python profile"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny configs on the CPU, few calls (CI check)"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.warmup, args.iters, args.repeats = min(args.warmup, 2), min(args.iters, 5), 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfgs = configs(args.smoke)
    if args.only:
        keep = [s.strip() for s in args.only.split(",") if s.strip()]
        cfgs = [c for c in cfgs if any(k in c.name for k in keep)]
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if args.dry_run:
        print(f"device {device}; tcnn: {args.tcnn or 'not given'}; paths {', '.join(PATHS)}")
        print(f"{args.warmup} warmup, {args.iters} calls x {args.repeats} repeats per path")
        for c in cfgs:
            print(f"  {c.name:22s} {_dt(c.dtype)} rows={c.rows} widths={list(c.widths)} "
                  f"tcnn key={c.tcnn_key}")  # fmt: skip
        return 0
    if device.type != "cuda" and not args.smoke:
        print("no CUDA device: use --smoke for the CPU check", file=sys.stderr)
        return 2

    if args.smoke:
        torch.set_num_threads(1)  # CI machines: OpenMP threads on busy cores stall tiny calls
    t_start = time.perf_counter()
    env = environment(device)
    print(f"{env['device_name']}  torch {env['torch']}  triton {env['triton']}  {env['date']}")
    tcnn = (
        run_tcnn(args.tcnn, args.warmup, args.iters)
        if not args.smoke or args.tcnn
        else {"ran": False, "reason": "smoke mode", "lines": [], "by_key": {}}
    )
    if tcnn["ran"]:
        print(f"tcnn: {len(tcnn['lines'])} configs from {tcnn['path']}")
        for line in tcnn.get("stderr", "").strip().splitlines()[-6:]:
            print(f"  tcnn stderr: {line}")
    if tcnn["reason"]:
        print(f"tcnn: {tcnn['reason']} (its column stays empty; the run goes on)")
    t_tcnn = time.perf_counter() - t_start
    setup = warm_up(device)
    print(f"setup (CUDA extension build or load, first Triton launch): {setup['seconds']:.1f} s")
    for be, why in setup["errors"].items():
        print(f"  setup: {be}: {why}")

    failures: list[str] = []
    for c in cfgs:
        t0 = time.perf_counter()
        measure(c, device, args, failures)
        if device.type == "cuda":  # the big configs' buffers (and the graph's pool) go back
            torch.cuda.empty_cache()
        print(f"  {c.name} {_dt(c.dtype)} rows={c.rows}: {time.perf_counter() - t0:.1f} s",
              flush=True)  # fmt: skip

    print()
    print("us per call (CUDA events over back-to-back calls; median of repeats); host = enqueue "
          "wall time per call")  # fmt: skip
    print(table(cfgs, tcnn))
    notes = []
    for c in cfgs:
        for p in PATHS:
            reason = c.results[p].get("reason")
            if reason:
                notes.append(f"  {c.name} {_dt(c.dtype)} rows={c.rows} {p}: {reason}")
    if notes:
        print("\nnot run / notes:")
        print("\n".join(dict.fromkeys(notes)))
    goals = goal_lines(cfgs, tcnn) if device.type == "cuda" else []
    if goals:
        print()
        print("\n".join(goals))
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.1f} s (tcnn {t_tcnn:.1f} s)")
    if failures:
        print("\n" + "!" * 78)
        for f in failures:
            print(f"FAIL {f}")
        print("!" * 78)

    if args.json:
        out = {
            **env,
            "method": {
                "warmup": args.warmup,
                "iters": args.iters,
                "repeats": args.repeats,
                "estimator": "median of repeats",
                "grad": "torch.no_grad()",
                "host_us": "wall time of the enqueue loop / iters",
                "tolerance": {_dt(k): v for k, v in TOLERANCE.items()},
            },
            "tcnn": {k: v for k, v in tcnn.items() if k != "by_key"},
            "rows": [
                {
                    "config": c.name,
                    "widths": list(c.widths),
                    "dtype": _dt(c.dtype),
                    "rows": c.rows,
                    "tcnn_us": tcnn["by_key"].get(c.tcnn_key) if c.tcnn_key else None,
                    "paths": c.results,
                }
                for c in cfgs
            ],
            "setup": setup,
            "goals": goals,
            "failures": failures,
            "total_s": total,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
