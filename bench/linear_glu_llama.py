"""linear_glu on LLaMA's feed-forward shapes (issue 35): dualk against eager PyTorch and
torch.compile, forward and backward, in one run.

    python3 bench/linear_glu_llama.py --json OUT.json            # the GPU run (~3-4 min, H100)
    python3 bench/linear_glu_llama.py --sweep-triton --json OUT   # + every Triton config per shape
    python3 bench/linear_glu_llama.py --quick                     # tiny shapes on the CPU (CI)
    python3 bench/linear_glu_llama.py --dry-run                   # the plan, runs nothing

Shapes: bf16, K = 4096, N = 11008 (LLaMA-7B) and 14336 (LLaMA-3-8B), rows 16 (decode), 512 and
8192 (prefill); no biases, silu (SwiGLU), separate gate and up weights as nn.Linear holds them.
Paths, each timed in the same process:
  eager     F.silu(F.linear(x, Wg)) * F.linear(x, Wu)          (the issue's yardstick)
  compile   torch.compile of that same function (compiled here, per shape)
  cuda / triton / auto   dualk.linear_glu(x, Wg, Wu, backend=...)
Forward under torch.no_grad(); backward: torch.autograd.grad of the same output (a fixed random
upstream gradient) with respect to x, Wg and Wu, the forward run once outside the timed window
(retain_graph), so the backward alone is timed; dualk's backward is its registered formula: the
training forward (dualk::linear_glu_train) keeps both pre-activations, as eager does, so the
backward runs the four gradient GEMMs and one fused elementwise pass (Triton on a GPU); the
"bwd" route lines say what each dualk path's forward saved ((M, N) tensors: 2 = gate and up).
Timing: dualk.tools.bench.time_device (CUDA events, an L2 flush and a GPU sleep before each call,
interquartile mean), ROUNDS passes over the paths, a row's time is the median of its passes.
Checks: every output (and every gradient) against eager's, relative Frobenius error within the
dtype's tolerance (bf16 2e-2); FAIL lines, exit status 1 on any failure (after table and JSON).
Goals (issue 35), judged on "auto" (what a user gets), the best backend shown beside it:
forward 8192 rows >= 1.10x eager and >= 1.05x compile; 512 rows >= 1.05x eager; 16 rows
>= 1.0x eager; backward >= 1.0x eager's backward at every shape.
--sweep-triton: times every config of triton_src/linear_glu.py's CONFIGS for the dtype (forced
one at a time, nothing written to the config store) on each shape and prints the best per shape.
--quick: rows (3, 17), K = 32, N = (24, 40), on the CPU unless a GPU is present; paths that cannot
run there (cuda, compile without a GPU, triton without its interpreter) are reported with the
reason and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

import dualk
from dualk.dispatch import triton_tune

PATHS = ("eager", "compile", "cuda", "triton", "auto")
DUALK_PATHS = ("cuda", "triton", "auto")
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
ROUNDS = 3
# (rows, minimum speedup over eager, minimum over compile) of the forward goals; backward >= 1.0x.
FORWARD_GOALS = {8192: (1.10, 1.05), 512: (1.05, None), 16: (1.0, None)}
BACKWARD_GOAL = 1.0


@dataclass(frozen=True)
class Shape:
    rows: int
    k: int
    n: int

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.k}->{self.n}"


def shapes(quick: bool, rows=None, ns=None) -> list[Shape]:
    if quick:
        return [Shape(r, 32, n) for n in (ns or (24, 40)) for r in (rows or (3, 17))]
    return [Shape(r, 4096, n) for n in (ns or (11008, 14336)) for r in (rows or (16, 512, 8192))]


def eager_glu(x, wg, wu):
    return F.silu(F.linear(x, wg)) * F.linear(x, wu)


@dataclass
class Result:
    us: float | None = None
    iqr_us: float | None = None
    ok: bool | None = None
    error: float | None = None  # relative Frobenius error against eager (worst gradient: bwd)
    reason: str | None = None  # why it did not run
    route: str | None = None  # the CUDA kernel's route, or auto's choice


@dataclass
class Row:
    shape: Shape
    forward: dict[str, Result] = field(default_factory=dict)
    backward: dict[str, Result] = field(default_factory=dict)
    sweep: list[dict] = field(default_factory=list)


# ---------------------------------------------------------------------------- timing
def _timer(device: torch.device, quick_reps: int):
    """A function (fn) -> (us, iqr_us): dualk's CUDA-event timer on a GPU, wall clock on the CPU."""
    if device.type == "cuda":
        from dualk.tools.bench import time_device

        return lambda fn, rep_ms: time_device(fn, rep_ms=rep_ms)

    def wall(fn, rep_ms):
        fn()
        samples = []
        for _ in range(quick_reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
        return statistics.median(samples), q[2] - q[0]

    return wall


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref64 = ref.double()
    return ((out.double() - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()


def _why_not(path: str, device: torch.device) -> str | None:
    """Why `path` cannot run here (None when it can)."""
    if path == "compile" and device.type != "cuda":
        return "torch.compile is timed on the GPU only (CPU inductor builds a C++ kernel per shape)"
    if path == "cuda":
        from dualk.backends import cuda

        return cuda.unavailable_reason(device, "linear_glu")
    if path == "triton" and device.type != "cuda":
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            return "Triton needs a GPU (or TRITON_INTERPRET=1)"
    return None


def _functions(path: str):
    if path == "eager":
        return eager_glu
    if path == "compile":
        return torch.compile(eager_glu, dynamic=False)
    return lambda x, wg, wu: dualk.linear_glu(x, wg, wu, backend=path)


def _route(path: str, x, wg, wu) -> str | None:
    with contextlib.suppress(Exception):
        if path == "cuda":
            from dualk.backends import cuda

            out = torch.empty((x.shape[0], wg.shape[0]), dtype=x.dtype, device=x.device)
            return cuda.extension("gemm").linear_glu_route(x, wg, wu, out)
        if path == "auto":
            return dualk.explain("linear_glu", x, wg, wu).backend
    return None


def run_shape(shape: Shape, dtype, device, args, timer) -> Row:
    row = Row(shape)
    gen = torch.Generator().manual_seed(shape.rows * 1_000_003 + shape.n)
    scale = 1.0 / math.sqrt(shape.k)
    x = torch.randn(shape.rows, shape.k, generator=gen).to(dtype).to(device)
    wg = (torch.randn(shape.n, shape.k, generator=gen) * scale).to(dtype).to(device)
    wu = (torch.randn(shape.n, shape.k, generator=gen) * scale).to(dtype).to(device)
    upstream = torch.randn(shape.rows, shape.n, generator=gen).to(dtype).to(device)
    tol = TOLERANCE[dtype]
    fns = {}
    with torch.no_grad():
        ref = eager_glu(x, wg, wu)
    for path in PATHS:
        res = row.forward[path] = Result()
        res.reason = _why_not(path, device)
        if res.reason is not None:
            continue
        try:
            fns[path] = fn = _functions(path)
            with torch.no_grad():
                out = fn(x, wg, wu)
                if (
                    path == "auto"
                ):  # time auto's final decision, not a fresh process's provisional one
                    triton_tune.settle(lambda fn=fn: fn(x, wg, wu), 90.0)
                    for _ in range(3):
                        fn(x, wg, wu)
            res.error = _rel_err(out, ref)
            res.ok = res.error <= tol
            res.route = _route(path, x, wg, wu)
            del out
        except Exception as exc:  # a path that raises is reported; the run goes on
            res.reason = f"{type(exc).__name__}: {exc}"[:300]
            fns.pop(path, None)
            if args.verbose:
                traceback.print_exc()

    # Forward, ROUNDS passes over the paths that ran.
    samples: dict[str, list[tuple[float, float]]] = {p: [] for p in fns}
    for _ in range(ROUNDS):
        for path, fn in fns.items():
            with torch.no_grad():
                samples[path].append(timer(lambda fn=fn: fn(x, wg, wu), args.rep_ms))
    for path, got in samples.items():
        row.forward[path].us = statistics.median(s[0] for s in got)
        row.forward[path].iqr_us = statistics.median(s[1] for s in got)

    if not args.no_backward:
        run_backward(row, shape, (x, wg, wu), upstream, fns, timer, args, tol)
    if args.sweep_triton and "triton" in fns:
        row.sweep = sweep_triton(x, wg, wu, ref, timer, args, tol)
    return row


def run_backward(row, shape, inputs, upstream, fns, timer, args, tol) -> None:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    ref_grads = torch.autograd.grad(eager_glu(*leaves), leaves, upstream)
    graphs = {}
    for path in PATHS:
        res = row.backward[path] = Result(reason=row.forward[path].reason)
        if path not in fns:
            res.reason = res.reason or "its forward did not run"
            continue
        try:
            if path == "compile":  # a fresh compile: the forward's was traced under no_grad
                fns[path] = torch.compile(eager_glu, dynamic=False)
            kept: list = []
            with torch.autograd.graph.saved_tensors_hooks(
                lambda t, kept=kept: kept.append(tuple(t.shape)) or t, lambda t: t
            ):
                out = fns[path](*leaves)
            if path in DUALK_PATHS:
                mn = tuple(out.shape)
                res.route = f"{type(out.grad_fn).__name__}, saved {kept.count(mn)} (M, N) tensors"
            grads = torch.autograd.grad(out, leaves, upstream, retain_graph=True)
            res.error = max(_rel_err(g, r) for g, r in zip(grads, ref_grads))
            res.ok = res.error <= tol
            graphs[path] = out
            del grads
        except Exception as exc:
            res.reason = f"{type(exc).__name__}: {exc}"[:300]
            if args.verbose:
                traceback.print_exc()
    samples: dict[str, list[tuple[float, float]]] = {p: [] for p in graphs}
    for _ in range(ROUNDS):
        for path, out in graphs.items():

            def backward(out=out):
                return torch.autograd.grad(out, leaves, upstream, retain_graph=True)

            samples[path].append(timer(backward, args.rep_ms))
    for path, got in samples.items():
        row.backward[path].us = statistics.median(s[0] for s in got)
        row.backward[path].iqr_us = statistics.median(s[1] for s in got)
    graphs.clear()


def sweep_triton(x, wg, wu, ref, timer, args, tol) -> list[dict]:
    """Every CONFIGS entry of the dtype's kind, forced one at a time (tuned_config replaced by one
    that returns it without timing or storing), timed like the paths."""
    from dualk.triton_src import linear_glu as tl_glu

    kind = "fp32" if x.dtype == torch.float32 else "tensor_core"
    original = tl_glu.tuned_config
    out = []
    try:
        for cfg in tl_glu.CONFIGS[kind]:
            tl_glu._best_config.clear()
            tl_glu.tuned_config = lambda *a, cfg=cfg, **k: (astuple(cfg), [], False)
            entry = {"config": asdict(cfg)}
            try:
                with torch.no_grad():
                    got = dualk.linear_glu(x, wg, wu, backend="triton")
                    entry["error"] = _rel_err(got, ref)
                    entry["ok"] = entry["error"] <= tol
                    del got
                    entry["us"] = statistics.median(
                        timer(lambda: dualk.linear_glu(x, wg, wu, backend="triton"), args.rep_ms)[0]
                        for _ in range(ROUNDS)
                    )
            except Exception as exc:  # a config that does not compile (shared memory) or fails
                entry["reason"] = f"{type(exc).__name__}: {exc}"[:300]
            out.append(entry)
    finally:
        tl_glu.tuned_config = original
        tl_glu._best_config.clear()
    return out


# ---------------------------------------------------------------------------- report
def _speedup(base: Result, ours: Result) -> float | None:
    if base.us is None or ours.us is None or ours.us <= 0:
        return None
    return base.us / ours.us


def _best(results: dict[str, Result]) -> tuple[str | None, Result]:
    ran = [(p, results[p]) for p in DUALK_PATHS if p in results and results[p].us is not None]
    if not ran:
        return None, Result()
    return min(ran, key=lambda pr: pr[1].us)


def goals(row: Row) -> list[dict]:
    """The issue's goals for this shape, judged on auto (the best backend beside it)."""
    out = []
    fwd, bwd = row.forward, row.backward
    eager_goal, compile_goal = FORWARD_GOALS.get(row.shape.rows, (None, None))
    best_name, best = _best(fwd)
    for what, base, need in (
        ("fwd vs eager", "eager", eager_goal),
        ("fwd vs compile", "compile", compile_goal),
    ):
        if need is None:
            continue
        got = _speedup(fwd.get(base, Result()), fwd.get("auto", Result()))
        out.append({"goal": f"{what} >= {need:.2f}x", "auto": got, "best": _speedup(fwd.get(base, Result()), best),
                    "best_backend": best_name, "met": got is not None and got >= need})  # fmt: skip
    if bwd:
        best_name, best = _best(bwd)
        got = _speedup(bwd.get("eager", Result()), bwd.get("auto", Result()))
        out.append({"goal": f"bwd vs eager >= {BACKWARD_GOAL:.2f}x", "auto": got,
                    "best": _speedup(bwd.get("eager", Result()), best), "best_backend": best_name,
                    "met": got is not None and got >= BACKWARD_GOAL})  # fmt: skip
    return out


def _fmt(v: float | None, spec: str = "8.1f") -> str:
    return format(v, spec) if v is not None else "-".rjust(int(spec.split(".")[0]))


def print_table(rows: list[Row], dtype) -> None:
    print(f"\nlinear_glu silu, {str(dtype)[6:]}, no bias; us per call (IQR) and error vs eager")
    for kind in ("forward", "backward"):
        head = f"{'shape':>18} " + " ".join(f"{p:>10}" for p in PATHS)
        print(f"\n[{kind}]\n{head}")
        for row in rows:
            results = getattr(row, kind)
            if not results:
                continue
            cells = []
            for p in PATHS:
                r = results.get(p, Result())
                mark = "" if r.ok is not False else "!"
                cells.append(
                    f"{_fmt(r.us, '9.1f')}{mark or ' '}" if r.us is not None else f"{'n/a':>10}"
                )
            print(f"{row.shape.label:>18} " + " ".join(cells))
    print("\n[goals] (judged on auto; best dualk backend beside it)")
    for row in rows:
        for g in goals(row):
            status = "met" if g["met"] else "NOT met"
            print(f"{row.shape.label:>18}  {g['goal']:<22} auto {_fmt(g['auto'], '5.2f')}x  "
                  f"best {_fmt(g['best'], '5.2f')}x ({g['best_backend']})  {status}")  # fmt: skip
    for row in rows:
        for p, r in row.forward.items():
            if r.route:
                print(f"{row.shape.label:>18}  {p}: {r.route}")
        for p, r in row.backward.items():
            if r.route:
                print(f"{row.shape.label:>18}  bwd {p}: {r.route}")
        if row.sweep:
            ran = [e for e in row.sweep if e.get("us") is not None]
            best = min(ran, key=lambda e: e["us"]) if ran else None
            print(f"{row.shape.label:>18}  triton sweep: " + ", ".join(
                f"{tuple(e['config'].values())} {_fmt(e.get('us'), '.1f')}" for e in row.sweep))  # fmt: skip
            if best is not None:
                print(f"{row.shape.label:>18}  triton best: {best['config']} {best['us']:.1f} us")


def failures(rows: list[Row]) -> list[str]:
    out = []
    for row in rows:
        for kind in ("forward", "backward"):
            for p, r in getattr(row, kind).items():
                if r.ok is False:
                    out.append(f"FAIL {row.shape.label} {kind} {p}: error {r.error:.3g} vs eager")
        for e in row.sweep:
            if e.get("ok") is False:
                out.append(
                    f"FAIL {row.shape.label} triton config {e['config']}: error {e['error']:.3g}"
                )
    return out


def environment(device: torch.device) -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dualk": getattr(dualk, "__version__", None),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"unavailable ({type(exc).__name__})"
    if device.type == "cuda":
        from dualk.tools.bench import environment as bench_environment

        env["details"] = bench_environment()
    return env


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU unless a GPU is present)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--sweep-triton", action="store_true", help="time every Triton config per shape")
    p.add_argument("--no-backward", action="store_true", help="forward only")
    p.add_argument("--rows", type=int, nargs="+", help="rows (default 16 512 8192)")
    p.add_argument("--n", type=int, nargs="+", help="N (default 11008 14336)")
    p.add_argument("--rep-ms", type=float, default=None, help="ms of calls per timing pass")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing paths")
    args = p.parse_args(argv)
    if args.rep_ms is None:
        args.rep_ms = 5.0 if args.quick else 25.0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    plan = shapes(args.quick, args.rows, args.n)
    if args.dry_run:
        print(f"device {device}, {str(dtype)[6:]}, paths {', '.join(PATHS)}, rounds {ROUNDS}")
        for s in plan:
            print(f"  {s.label}: forward" + ("" if args.no_backward else " + backward")
                  + (" + triton sweep" if args.sweep_triton else ""))  # fmt: skip
        return 0
    if device.type != "cuda" and not args.quick:
        print("no CUDA device: use --quick for the CPU check", file=sys.stderr)
        return 2
    if device.type == "cuda":  # build the CUDA extension before auto meets it (auto never waits)
        with contextlib.suppress(Exception):
            from dualk.backends import cuda

            cuda.extension("gemm")
    timer = _timer(device, quick_reps=5)
    t0 = time.perf_counter()
    rows = []
    for shape in plan:
        rows.append(run_shape(shape, dtype, device, args, timer))
        print(f"{shape.label}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
        torch._dynamo.reset()  # one shape's compiled graphs are not reused by the next
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(rows, dtype)
    fails = failures(rows)
    for line in fails:
        print(line)
    if args.json is not None:
        data = {
            **environment(device),
            "dtype": str(dtype)[6:],
            "seconds": time.perf_counter() - t0,
            "rows": [
                {
                    "shape": asdict(r.shape),
                    "label": r.shape.label,
                    "forward": {p: asdict(v) for p, v in r.forward.items()},
                    "backward": {p: asdict(v) for p, v in r.backward.items()},
                    "goals": goals(r),
                    "triton_sweep": r.sweep,
                }
                for r in rows
            ],  # fmt: skip
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1))
        print(f"wrote {args.json}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
