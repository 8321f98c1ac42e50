"""Host cost per call, layer by layer: what dualk's Python adds above the kernel launch
(issue 32's host-cost goal, issue 34's before/after check).

    python3 bench/host_cost.py --json OUT.json [--label NAME] [--profile-compiled]

Every row is a callable timed the same way: N calls back to back with no synchronisation, the
wall time of that loop / N (the GPU is never the bottleneck at these sizes, so this is the host
time per call; the device time is given beside it for the MLP rows), median of R repeats, the
rows interleaved within each repeat so a host that slows down slows every row alike.

Rows (CUDA tensors, no_grad):
  add n=16 fp32:         torch.add, dualk.add auto / cuda, the extension's launcher alone
  seed MLP b32 fp32:     torch.empty of the output alone, the mlp extension's launcher alone
                         (output preallocated), the planned runner, dualk.fused_mlp cuda / auto
                         (a planned call: one C++ crossing) and cuda by the full route (planned
                         calls off: the route before them), the ops compiled graphs call:
                         fused_mlp_infer (its C++ CUDA kernel) and the autograd op fused_mlp
                         (custom_op's Python wrappers), a FusedMLP over the model's Linears, the
                         fuse'd DNNModel, the original
  gated / gelu bf16:     a LinearGELU (BERT's 768 -> 3072) and a GatedMLP's gated part (1024 ->
                         2816, silu) on a batched (2, 8, in) input: PyTorch's ops, the operator
                         on the cuda backend, the module on the cuda backend (dualk's path
                         forced: the module's cost over the operator, issue 32's 2 us bound)
                         and on auto (whichever path it chose)
  --profile-compiled:    NeRF 32-64-64-64-16 fp16 at 2^20 rows, torch.compile of the fuse'd
                         model, of dualk.fused_mlp (a function: fused_mlp_infer in its graph),
                         of the autograd op called directly (the graph before fused_mlp_infer)
                         and of the original: host and device time per call, the dualk ops in
                         the fused model's graph, and a cProfile of the compiled fused call
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import dualk
from dualk.dispatch import triton_tune


def host_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def device_us(fn, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def interleaved(rows: dict, calls: int, repeats: int, measure=host_us) -> dict:
    samples: dict = {name: [] for name in rows}
    for fn in rows.values():  # warm up every path (plans, decisions, allocator)
        for _ in range(20):
            fn()
    # auto's final decisions (no CUDA build or Triton tuning left in the background), then again
    if triton_tune.settle(lambda: [fn() for fn in rows.values()], 90.0):
        for fn in rows.values():
            for _ in range(5):
                fn()
    for _ in range(repeats):
        for name, fn in rows.items():
            samples[name].append(measure(fn, calls))
    return {name: round(statistics.median(v), 2) for name, v in samples.items()}


class DNNModel(nn.Module):  # the seed's model (examples/seed_dnn.py), attribute names kept
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(100, 128)
        self.relu1 = nn.ReLU()
        self.layer2 = nn.Linear(128, 64)
        self.relu2 = nn.ReLU()
        self.layer3 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.relu1(self.layer1(x))
        x = self.relu2(self.layer2(x))
        return self.layer3(x)


def add_rows() -> dict:
    from dualk.backends import cuda

    a = torch.randn(16, device="cuda")
    b = torch.randn(16, device="cuda")
    ext = cuda.extension("elementwise")
    dualk.add(a, b, backend="cuda")
    dualk.add(a, b)
    rows = {
        "add torch.add": lambda: torch.add(a, b),
        "add dualk auto": lambda: dualk.add(a, b),
        "add dualk cuda": lambda: dualk.add(a, b, backend="cuda"),
    }
    rows["add extension alone"] = lambda: ext.add_dense(a, b, 1.0)  # allocates and launches
    return rows


def mlp_rows() -> tuple[dict, dict]:
    from dualk.backends import cuda

    torch.manual_seed(0)
    model = DNNModel().cuda().eval()
    x = torch.randn(32, 100, device="cuda")
    fused = dualk.fuse(model)
    ws = [model.layer1.weight, model.layer2.weight, model.layer3.weight]
    bs = [model.layer1.bias, model.layer2.bias, model.layer3.bias]
    out = torch.empty(32, 10, device="cuda")
    launch = cuda.extension("mlp").fused_mlp
    code = cuda.ACTIVATION_CODES["relu"]
    runner = cuda.fused_mlp_runner(ws, bs, "relu")
    module = dualk.nn.FusedMLP.from_linears([model.layer1, model.layer2, model.layer3])
    infer, generic = torch.ops.dualk.fused_mlp_infer.default, torch.ops.dualk.fused_mlp.default
    present, mask = [b for b in bs if b is not None], 0b111
    planned = cuda.PLANNED_MLP

    def full_route():  # dualk.fused_mlp with planned calls off: the route before them
        run = planned.run
        planned.run = None
        try:
            return dualk.fused_mlp(x, ws, bs, backend="cuda")
        finally:
            planned.run = run

    ref = model(x)
    for name, got in (("fused", fused(x)), ("cuda", dualk.fused_mlp(x, ws, bs, backend="cuda")),
                      ("module", module(x)), ("full route", full_route()),
                      ("infer op", infer(x, ws, bs, "relu", "cuda")),
                      ("autograd op", generic(x, ws, present, mask, "relu", "cuda"))):  # fmt: skip
        err = (got - ref).abs().max().item()
        assert err < 1e-3, f"{name} differs from the original by {err}"
    rows = {
        "mlp torch.empty alone": lambda: torch.empty((32, 10), dtype=torch.float32, device="cuda"),
        "mlp launcher alone": lambda: launch(x, ws, bs, out, code),
        "mlp planned runner": lambda: runner(x),
        "mlp dualk.fused_mlp cuda": lambda: dualk.fused_mlp(x, ws, bs, backend="cuda"),
        "mlp dualk.fused_mlp auto": lambda: dualk.fused_mlp(x, ws, bs),
        "mlp dualk.fused_mlp cuda, full route": full_route,
        "mlp op fused_mlp_infer cuda": lambda: infer(x, ws, bs, "relu", "cuda"),
        "mlp op fused_mlp (autograd) cuda": lambda: generic(x, ws, present, mask, "relu", "cuda"),
        "mlp FusedMLP module": lambda: module(x),
        "mlp fuse'd DNNModel": lambda: fused(x),
        "mlp original DNNModel": lambda: model(x),
    }
    device_rows = {k: rows[k] for k in ("mlp launcher alone", "mlp fuse'd DNNModel")}
    device_rows["mlp original DNNModel"] = rows["mlp original DNNModel"]
    return rows, device_rows


def module_rows() -> dict:
    import torch.nn.functional as F

    torch.manual_seed(0)
    kw = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(2, 8, 768, **kw)
    lin = nn.Linear(768, 3072, **kw)
    gelu_cuda = dualk.nn.LinearGELU.from_linear(lin, approximate="tanh", backend="cuda")
    gelu_auto = dualk.nn.LinearGELU.from_linear(lin, approximate="tanh")
    w, b = lin.weight, lin.bias
    xg = torch.randn(2, 8, 1024, **kw)
    glu_cuda = dualk.nn.GatedMLP(1024, 2816, backend="cuda", **kw).eval()
    glu_auto = dualk.nn.GatedMLP(1024, 2816, **kw).eval()
    glu_auto.load_state_dict(glu_cuda.state_dict())
    wg, wu = glu_cuda.gate_proj.weight, glu_cuda.up_proj.weight
    ref_gelu = F.gelu(F.linear(x, w, b), approximate="tanh").float()
    ref_glu = (F.silu(F.linear(xg, wg)) * F.linear(xg, wu)).float()
    for name, got, ref in (("gelu op", dualk.linear_gelu(x, w, b, backend="cuda"), ref_gelu),
                           ("gelu module", gelu_cuda(x), ref_gelu),
                           ("glu op", dualk.linear_glu(xg, wg, wu, backend="cuda"), ref_glu),
                           ("glu module", glu_cuda._glu(xg), ref_glu)):  # fmt: skip
        err = (got.float() - ref).norm() / ref.norm()
        assert err < 2e-2, f"{name} differs from PyTorch's by {err:.3g} (relative norm)"
    return {
        "gelu F.gelu(F.linear)": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "gelu dualk.linear_gelu cuda": lambda: dualk.linear_gelu(x, w, b, backend="cuda"),
        "gelu LinearGELU module cuda": lambda: gelu_cuda(x),
        "gelu LinearGELU module auto": lambda: gelu_auto(x),
        "glu silu(linear) * linear": lambda: F.silu(F.linear(xg, wg)) * F.linear(xg, wu),
        "glu dualk.linear_glu cuda": lambda: dualk.linear_glu(xg, wg, wu, backend="cuda"),
        "glu GatedMLP gated part cuda": lambda: glu_cuda._glu(xg),
        "glu GatedMLP gated part auto": lambda: glu_auto._glu(xg),
    }


def profile_compiled(report: dict) -> None:
    torch.manual_seed(0)
    widths = [32, 64, 64, 64, 16]
    layers: list = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).cuda().half().eval()
    x = torch.randn(2**20, 32, device="cuda", dtype=torch.float16)
    fused = dualk.fuse(model)
    seen: set = set()

    def inductor_noting_dualk_ops(gm, example_inputs):  # Inductor, as torch.compile's default
        from torch._inductor.compile_fx import compile_fx

        seen.update(str(n.target) for n in gm.graph.nodes
                    if n.op == "call_function" and "dualk" in str(n.target))  # fmt: skip
        return compile_fx(gm, example_inputs)

    c_fused = torch.compile(fused, backend=inductor_noting_dualk_ops)
    c_orig = torch.compile(model)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    ws, bs = [m.weight for m in linears], [m.bias for m in linears]
    c_fn = torch.compile(lambda x: dualk.fused_mlp(x, ws, bs))
    c_fn_autograd_op = torch.compile(
        lambda x: torch.ops.dualk.fused_mlp(x, ws, bs, 0b1111, "relu", "auto")
    )
    for _ in range(5):
        c_fused(x)
        c_orig(x)
        fused(x)
        c_fn(x)
        c_fn_autograd_op(x)
    rows = {"nerf compiled fused": lambda: c_fused(x), "nerf compiled original": lambda: c_orig(x),
            "nerf eager fused": lambda: fused(x),
            "nerf compiled dualk.fused_mlp": lambda: c_fn(x),
            "nerf compiled autograd op": lambda: c_fn_autograd_op(x)}  # fmt: skip
    report["nerf_host_us"] = interleaved(rows, 50, 5)
    report["nerf_device_us"] = interleaved(rows, 50, 5, measure=device_us)
    report["nerf_paths"] = {n: getattr(m, "_last_path", None) for n, m in fused.named_modules()
                            if hasattr(m, "_last_path")}  # fmt: skip
    report["nerf_compiled_dualk_ops"] = sorted(seen)
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(50):
        c_fused(x)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    report["nerf_compiled_fused_profile"] = text.getvalue()[:8000]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        for _ in range(20):
            c_fused(x)
        torch.cuda.synchronize()
    report["nerf_compiled_fused_ops"] = p.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=25
    )


def compare(paths: list[str]) -> int:
    """Before / after table: per row, the median over the runs of each label's prefix (the part
    before the last '-': `old-1`, `old-2`, ... are one tree), and new / old."""
    runs: dict[str, list[dict]] = {}
    for path in paths:
        report = json.loads(Path(path).read_text())
        runs.setdefault(report["label"].rsplit("-", 1)[0], []).append(report)
    trees = sorted(runs, key=lambda t: (t != "old", t))  # the tree before first
    first = runs[trees[0]][0]
    print(f"{first['device']}  torch {first['torch']}  runs: "
          + ", ".join(f"{t} x{len(runs[t])}" for t in trees))  # fmt: skip
    print(f"{'host us per call (median of runs)':34s}" + "".join(f"{t:>10s}" for t in trees)
          + (f"{trees[-1] + ' / ' + trees[0]:>14s}" if len(trees) == 2 else ""))  # fmt: skip
    for name in first["host_us"]:
        meds = [statistics.median(r["host_us"][name] for r in runs[t] if name in r["host_us"])
                for t in trees]  # fmt: skip
        ratio = f"{meds[-1] / meds[0]:14.3f}" if len(meds) == 2 else ""
        print(f"  {name:32s}" + "".join(f"{m:10.2f}" for m in meds) + ratio)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json")
    parser.add_argument("--compare", nargs="+", metavar="JSON",
                        help="print a before/after table of earlier runs' JSON files and exit")  # fmt: skip
    parser.add_argument("--label", default="", help="a name for this tree (before/after runs)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile-compiled", action="store_true")
    args = parser.parse_args()
    if args.compare:
        return compare(args.compare)
    if not args.json:
        parser.error("--json is required")
    props = torch.cuda.get_device_properties(0)
    report: dict = {
        "label": args.label,
        "device": props.name,
        "torch": torch.__version__,
        "dualk_file": dualk.__file__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with torch.no_grad():
        rows = add_rows()
        more, device_rows = mlp_rows()
        rows.update(more)
        rows.update(module_rows())
        report["host_us"] = interleaved(rows, args.calls, args.repeats)
        report["device_us"] = interleaved(device_rows, args.calls, args.repeats, device_us)
        if args.profile_compiled:
            profile_compiled(report)
    print(f"{props.name}  torch {torch.__version__}  {args.label}  ({dualk.__file__})")
    print(f"{'host us per call':32s}")
    for name, v in report["host_us"].items():
        dev = report["device_us"].get(name)
        print(f"  {name:32s} {v:8.2f}" + (f"   device {dev:.2f}" if dev is not None else ""))
    for key in ("nerf_host_us", "nerf_device_us", "nerf_paths", "nerf_compiled_dualk_ops"):
        if key in report:
            print(key, report[key])
    for key in ("nerf_compiled_fused_profile", "nerf_compiled_fused_ops"):
        if key in report:
            print(report[key])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
