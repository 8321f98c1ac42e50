"""Benchmark engine behind `dualk bench`: times every backend of every registry operator against
PyTorch's own paths in one run, on the registry's inputs, with the registry's cost model.

Method (see README "Benchmarks"): CUDA events around each call after an L2 flush and a GPU sleep
that outlasts the call's host time (device time only; interquartile mean and range); optional
CUDA-graph replay for launch-bound shapes; host cost per call measured separately (a loop without
synchronisation); build/compile time (the first call) kept apart from kernel time; every timed
output judged against a float64 reference, so a fast wrong kernel cannot hide; ceilings (copy
bandwidth, big GEMMs) measured at the start so each row shows its share of the roofline.
"""

from __future__ import annotations

import datetime
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

import dualk

from .. import registry
from ..backends import unavailable_reason
from ..core import timing
from ..dispatch import autotune, triton_tune
from ..ops import implementation_args
from ..registry import OPS, OpSpec, Sample
from ..testing import float64_reference, judge

SUITES = ("quick", "default", "full")


@dataclass
class Row:
    op: str
    case: str
    shape: str
    dtype: str
    impl: str  # "dualk:cuda", "dualk:triton", "torch eager", "cuBLAS", ...
    kind: str  # "dualk" or "peer"
    us: float | None = None  # device time per call (env["estimator"] of the samples)
    iqr_us: float | None = None
    host_us: float | None = None  # host time per call without synchronisation
    first_call_s: float | None = None  # includes JIT build / Triton compile / torch.compile
    tflops: float | None = None
    gbs: float | None = None
    roofline_pct: float | None = None  # floor time / measured time
    rel_err: float | None = None
    ok: bool | None = None
    speedup_vs_eager: float | None = None
    settle_s: float | None = None  # "auto": waiting for its background work after the first call
    note: str = ""


@dataclass
class Report:
    env: dict
    ceilings: dict
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"env": self.env, "ceilings": self.ceilings, "rows": [asdict(r) for r in self.rows]}


# ---------------------------------------------------------------------------- environment
def environment() -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dualk": dualk.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "platform": platform.platform(),
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        # per pass, of one implementation's CUDA-event samples (time_device); a row's time is the
        # median of its passes. A run without this key took medians (runs recorded before the key existed).
        "estimator": "interquartile mean",
        "timing": "each eager call after an L2 flush and a GPU sleep longer than its host time",
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"unavailable ({type(exc).__name__})"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_count=torch.cuda.device_count(), sm_count=p.multi_processor_count,
                   capability=f"{p.major}.{p.minor}", gpu_memory_gib=round(p.total_memory / 2**30, 1))  # fmt: skip
        env["driver"] = _smi("driver_version")
    else:
        env["gpu"] = None
    nvcc = shutil.which("nvcc")
    if nvcc:
        out = (
            subprocess.run([nvcc, "--version"], capture_output=True, text=True)
            .stdout.strip()
            .splitlines()
        )
        env["nvcc"] = out[-1] if out else "?"
    return env


def _smi(field_name: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field_name}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


# ---------------------------------------------------------------------------- timing
def time_device(
    fn: Callable[[], object], cuda_graph: bool = False, rep_ms: float = 100.0
) -> tuple[float, float]:
    """(interquartile mean, inter-quartile range) of one call's device time in microseconds,
    CUDA events, over about `rep_ms` of calls: eager calls each after an L2 flush and a GPU sleep
    (`_eager_samples`), or CUDA-graph replays (triton.testing.do_bench_cudagraph). The
    interquartile mean (`timing.interquartile_mean`): a launch-bound call's samples fall on two
    levels, and a median picks one by their mix."""
    if cuda_graph:
        samples = _graph_samples(fn, rep_ms)
        if isinstance(samples, tuple):  # an older Triton: its median and quartiles
            med, lo, hi = samples
            return med * 1e3, (hi - lo) * 1e3
    else:
        samples = _eager_samples(fn, rep_ms)
    return _summary(samples)


def _summary(samples_ms: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_ms)
    n = len(ordered)
    iqr = ordered[(3 * n) // 4 if n > 1 else 0] - ordered[n // 4]
    return timing.interquartile_mean(ordered) * 1e3, iqr * 1e3


def _graph_samples(fn: Callable[[], object], rep_ms: float):
    import triton.testing

    with torch.cuda.stream(torch.cuda.Stream()):
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
        except (AssertionError, TypeError, ValueError):  # no return_mode="all"
            q = [0.5, 0.25, 0.75]
            return tuple(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, quantiles=q))


# Bytes zeroed before each timed call (triton.testing's L2 flush: 256 MB, several times the L2).
FLUSH_BYTES = 256 << 20


def _flush_buffer() -> torch.Tensor:
    return torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")


def _eager_samples(fn: Callable[[], object], rep_ms: float, warmup_ms: float = 25.0) -> list[float]:
    """Milliseconds per call, as triton.testing.do_bench times them (an L2 flush before each
    call, CUDA events around it), plus a GPU sleep between the flush and the call that outlasts
    the call's host time, so the host has queued the call before the GPU reaches it and the
    window holds the kernels only. Without it, a call whose host time exceeds the flush's GPU time
    was timed with its launch: the Triton GEMM (97 us of host a call on an H100 host) measured
    99.9 us for linear_gelu 8192x768->3072 bf16 whose kernel autotune timed at 68.8 us. The host
    cost is reported apart (`time_host`)."""
    flush = _flush_buffer()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = []
    start.record()
    for _ in range(5):
        flush.zero_()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)  # flush included, as in do_bench
    cycles = timing.sleep_cycles(statistics.median(host) * 1e6)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    n = max(1, int(rep_ms / (estimate_ms + timing.sleep_ms(cycles))))
    return timing.timed_calls(fn, n, flush, cycles)


# Each (op, shape, dtype) is timed in ROUNDS passes over its implementations, each pass ~100/ROUNDS
# ms per implementation; a row's time is the median of its passes. Timing each implementation
# once, in a fixed order, let the GPU's clock drift between neighbours decide close calls (H100,
# 8192^3: one run put cuBLAS 9% behind dualk's CUDA kernel, the next 4% ahead).
ROUNDS = 3


def time_host(fn: Callable[[], object], calls: int = 200) -> float:
    """Host microseconds per call, without synchronising between calls (launch-bound shapes)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    return timing.burst_host_ms(fn, calls) * 1e3


def measure_ceilings() -> dict:
    """Copy bandwidth (bytes read + written) and dense GEMM rates, measured now on this GPU."""
    dev = torch.device("cuda")
    src = torch.randn(2**28, device=dev)
    dst = torch.empty_like(src)
    us, _ = time_device(lambda src=src, dst=dst: dst.copy_(src))
    ceilings = {"copy_gbs": 2 * src.numel() * 4 / us / 1e3, "copy_shape": "2^28 fp32"}
    del src, dst
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for dtype, n in ((torch.bfloat16, 8192), (torch.float16, 8192), (torch.float32, 4096)):
            a = torch.randn(n, n, device=dev).to(dtype)
            b = torch.randn(n, n, device=dev).to(dtype)
            us, _ = time_device(lambda a=a, b=b: torch.mm(a, b))
            ceilings[f"mm_tflops_{str(dtype)[6:]}"] = 2 * n**3 / us / 1e6
            ceilings[f"mm_shape_{str(dtype)[6:]}"] = f"{n}^3"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return ceilings


# ---------------------------------------------------------------------------- peers
# The peer (of `peers` below) that computes what dualk's "torch" backend runs, per operator:
# 16-bit linear_gelu runs cuBLASLt's fused epilogue (backends.torch_ref.linear_gelu_fastest).
# bench/auto_table.py uses it to tell when "auto" ran the best path's own kernel.
TORCH_BACKEND_PEER = {
    "add": "torch eager",
    "relu_scale": "torch eager relu(x)*s",
    "matmul": "cuBLAS (torch.matmul)",
    "linear_gelu": "torch eager gelu(linear)",
    "fused_mlp": "torch eager nn.Sequential",
    "linear_glu": "torch eager act(linear)*linear",
}


def torch_backend_peer(op: str, dtype: str) -> str | None:
    """TORCH_BACKEND_PEER's entry for `op` at `dtype` (a dtype name as in a run's rows)."""
    if op == "linear_gelu" and dtype != "float32":
        return "cuBLASLt addmm+gelu"
    return TORCH_BACKEND_PEER.get(op)


def peers(
    spec: OpSpec, sample: Sample, with_compile: bool
) -> dict[str, tuple[Callable[[], torch.Tensor], bool]]:
    """PyTorch's own ways of computing the same thing: name -> (function, time as a CUDA-graph
    replay). The first entry is eager PyTorch, the base of every speedup."""
    args, kwargs = sample.args, sample.kwargs
    out: dict[str, Callable[[], torch.Tensor]] = {}
    graphed: set[str] = set()
    if spec.name == "add":
        a, b = args
        out["torch eager"] = lambda: torch.add(a, b, alpha=kwargs["alpha"])
    elif spec.name == "relu_scale":
        x, s = args
        out["torch eager relu(x)*s"] = lambda: torch.relu(x) * s
    elif spec.name == "matmul":
        a, b = args
        out["cuBLAS (torch.matmul)"] = lambda: torch.matmul(a, b)
    elif spec.name == "linear_gelu":
        x, w, bias = args
        approx = kwargs["approximate"]
        out["torch eager gelu(linear)"] = lambda: F.gelu(F.linear(x, w, bias), approximate=approx)
        if bias is not None and approx == "tanh" and x.dim() == 2:
            # cuBLASLt's fused bias+GELU(tanh) epilogue.
            out["cuBLASLt addmm+gelu"] = lambda: torch._addmm_activation(
                bias, x, w.t(), use_gelu=True
            )
    elif spec.name == "linear_glu":
        # The eager gated MLP (issue 35's baseline): two GEMMs, the activation and the product.
        out["torch eager act(linear)*linear"] = lambda: spec.reference(*args, **kwargs)
    elif spec.name == "fused_mlp":
        x, weights, biases = args
        out["torch eager nn.Sequential"] = lambda: spec.reference(*args, **kwargs)
        out["torch eager +cudagraph"] = out["torch eager nn.Sequential"]
        graphed.add("torch eager +cudagraph")
    if with_compile:
        compiled = torch.compile(spec.reference, dynamic=False)
        out["torch.compile"] = lambda: compiled(*args, **kwargs)
    return {name: (fn, name in graphed) for name, fn in out.items()}


# ---------------------------------------------------------------------------- the run
def select_cases(spec: OpSpec, suite: str, shapes: Iterable[str] = ()) -> list[registry.ShapeCase]:
    shapes = list(shapes)
    if shapes:
        return [spec.case(s) for s in shapes]
    if suite == "quick":
        return [c for c in spec.cases if c.quick]
    if suite == "default":
        return [c for c in spec.cases if c.bench]
    return [c for c in spec.cases if c.bench or c.gpu_only]


def plan(
    ops: Iterable[str], suite: str, dtypes: Iterable[torch.dtype] | None, shapes: Iterable[str] = ()
):
    """(spec, case, dtype) triples the run will time."""
    items = []
    shapes = list(shapes)
    for name in ops:
        spec = OPS[name]
        for case in select_cases(spec, suite, shapes if shapes else ()):
            for dtype in dtypes or case.bench_dtypes:
                items.append((spec, case, dtype))
    return items


def _roofline(row: Row, flops: float, nbytes: float, ceilings: dict, dtype: torch.dtype) -> None:
    if row.us is None or row.us <= 0:
        return
    row.tflops = flops / row.us / 1e6
    row.gbs = nbytes / row.us / 1e3
    if not ceilings:
        return
    key = f"mm_tflops_{str(dtype)[6:]}"
    floor_us = max(flops / (ceilings[key] * 1e6) if key in ceilings else 0.0,
                   nbytes / (ceilings["copy_gbs"] * 1e3))  # fmt: skip
    row.roofline_pct = 100.0 * floor_us / row.us


def run_case(spec: OpSpec, case, dtype, backends, *, with_peers=True, with_compile=False,
             cuda_graph=False, ceilings=None, seed=0) -> list[Row]:  # fmt: skip
    """Rows for one (op, shape, dtype): each dualk backend, then each peer."""
    device = torch.device("cuda")
    sample = case.make(dtype, device, torch.Generator().manual_seed(seed))
    cost = spec.cost(sample)
    ref = float64_reference(spec, sample)
    dname = str(dtype)[6:]
    op = getattr(dualk, spec.name)
    candidates = [(f"dualk:{b}", "dualk", lambda b=b: op(*sample.args, **sample.kwargs, backend=b), False)
                  for b in backends]  # fmt: skip
    if with_peers:
        candidates += [(n, "peer", f, g) for n, (f, g) in peers(spec, sample, with_compile).items()]
    rows = []
    timed = []  # (row, fn, time as a CUDA-graph replay): those whose first call was right
    for impl, kind, fn, graph_peer in candidates:
        row = Row(spec.name, case.name, sample.label, dname, impl, kind)
        rows.append(row)
        backend = impl.split(":")[1] if kind == "dualk" else None
        if backend is not None:
            reason = unavailable_reason(backend, device)
            if reason is not None:
                row.note = f"unavailable: {reason}"
                continue
        try:
            t0 = time.perf_counter()
            out = fn()  # builds, compiles, tunes ("auto"): the first call, not timed below
            torch.cuda.synchronize()
            row.first_call_s = time.perf_counter() - t0
            settled = _settle_auto(fn, row, spec, sample) if backend == "auto" else True
            if row.settle_s is not None:  # it waited: the settled choice's answer is judged
                out = fn()
                torch.cuda.synchronize()
            verdict = judge(spec, sample, out, ref)
            row.rel_err, row.ok = verdict.rel_err, verdict.ok
            if not verdict.ok:
                row.note = verdict.message[:200]
            elif backend == "auto":
                row.note = f"ran {_auto_choice(spec, sample)}"
                if not settled:
                    row.note += (
                        f"; timed before its decision settled ({SETTLE_S:.0f} s, "
                        f"{SETTLE_CALLS} calls)"
                    )
        except Exception as exc:  # one broken implementation must not stop the run
            row.note = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        timed.append((row, fn, cuda_graph or graph_peer))
    passes: dict[int, list[tuple[float, float]]] = {id(row): [] for row, _, _ in timed}
    for _ in range(ROUNDS):
        for row, fn, graph in timed:
            if row.note.startswith("error"):
                continue
            try:
                passes[id(row)].append(time_device(fn, cuda_graph=graph, rep_ms=100.0 / ROUNDS))
            except Exception as exc:
                row.note = f"error: {type(exc).__name__}: {str(exc)[:200]}"
    eager_us = None
    for row, fn, _ in timed:
        if row.note.startswith("error") or not passes[id(row)]:
            continue
        row.us = statistics.median(p[0] for p in passes[id(row)])
        row.iqr_us = statistics.median(p[1] for p in passes[id(row)])
        if row.us < 50:
            row.host_us = time_host(fn)
        _roofline(row, cost.flops, cost.bytes, ceilings or {}, dtype)
        if row.kind == "peer" and eager_us is None:
            eager_us = row.us
    for row in rows:
        if eager_us and row.us:
            row.speedup_vs_eager = eager_us / row.us
    return rows


# At most this long waiting for what auto's decision waits for (a CUDA family building, Triton's
# background tuner) before timing "auto".
SETTLE_S = 120.0
SETTLE_CALLS = 20


def _settle_auto(fn: Callable[[], object], row: Row, spec: OpSpec, sample: Sample) -> bool:
    """Call `fn` ("auto") until nothing its decision waits for runs in the background, then a few
    more times, so that the timed calls run auto's final choice among every backend, as a user's
    long-running program gets it. Timed right after its first call, "auto" ran the provisional
    choice of the candidates ready then: linear_gelu fp32 8192x768->3072 ran torch.linear + gelu
    at 832 us while Triton's tuner was still at work, against Triton's 566 us in its own row
    (H200, session 35). A decision still provisional once the background work is done takes a
    few more calls (one loads Triton's kernel, the next decides again): called until it is final,
    at most SETTLE_CALLS times. Returns whether it settled within SETTLE_S and SETTLE_CALLS."""
    # (the implementation's positional arguments, which spec.key reads: the sample's keyword
    # arguments such as linear_glu's activation included)
    key_args = implementation_args(spec.name, *sample.args, **sample.kwargs)[0]
    if not triton_tune.background_pending() and not autotune.provisional(spec, key_args):
        return True
    t0 = time.perf_counter()
    deadline = t0 + SETTLE_S

    def call():
        fn()
        torch.cuda.synchronize()

    settled = triton_tune.settle(call, SETTLE_S)
    calls = 0
    while settled and autotune.provisional(spec, key_args):
        if calls == SETTLE_CALLS:
            settled = False
            break
        fn()
        calls += 1
        if triton_tune.background_pending():  # (a kernel's load sent the class back to the tuner)
            settled = triton_tune.settle(call, max(0.0, deadline - time.perf_counter()))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    row.settle_s = round(time.perf_counter() - t0, 2)
    return settled


def _auto_choice(spec: OpSpec, sample: Sample) -> str:
    """The backend "auto" ran for this sample (dualk.explain), for the row's note."""
    try:
        explained = dualk.explain(spec.name, *sample.args, **sample.kwargs)
    except Exception as exc:  # the note is informative only
        return f"? ({type(exc).__name__})"
    measured = [n for n in explained.notes if n.startswith("measured: ")]
    note = f"{explained.backend} ({explained.source}{'; ' + measured[0] if measured else ''})"
    # A backend that took no part says why (Triton pending, failed or rejected for this class).
    left_out = {b: why for b, why in explained.availability.items()
                if why is not None and not (measured and f"{b} " in measured[0])}  # fmt: skip
    for backend, why in left_out.items():
        note += f"; {backend}: {why[:160]}"
    return note


def dispatch_overhead(calls: int = 2000) -> list[Row]:
    """Host microseconds per call of a 16-element add: dualk (auto, cached) vs bare torch.add."""
    a = torch.randn(16, device="cuda")
    b = torch.randn(16, device="cuda")
    rows = []
    dualk.add(a, b)  # build / compile and cache the auto decision
    for impl, fn in (("torch.add", lambda: torch.add(a, b)), ("dualk.add auto", lambda: dualk.add(a, b)),
                     ("dualk.add cuda", lambda: dualk.add(a, b, backend="cuda")),
                     ("dualk.add triton", lambda: dualk.add(a, b, backend="triton"))):  # fmt: skip
        samples = [time_host(fn, calls) for _ in range(5)]
        rows.append(Row("dispatch", "n=16", "n=16", "float32", impl, "overhead",
                        host_us=statistics.median(samples)))  # fmt: skip
    return rows


def run(ops, suite="default", dtypes=None, shapes=(), backends=("cuda", "triton"), *, with_peers=True,
        with_compile=False, cuda_graph=False, progress=None) -> Report:  # fmt: skip
    if not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA GPU: the benchmark times GPU kernels (see `dualk bench` for the CPU smoke check)"
        )
    report = Report(environment(), measure_ceilings())
    items = plan(ops, suite, dtypes, shapes)
    for i, (spec, case, dtype) in enumerate(items):
        if progress:
            progress(i, len(items), f"{spec.name} {case.name} {str(dtype)[6:]}")
        report.rows += run_case(spec, case, dtype, backends, with_peers=with_peers,
                                with_compile=with_compile, cuda_graph=cuda_graph,
                                ceilings=report.ceilings)  # fmt: skip
        torch.cuda.empty_cache()
    if progress:
        progress(len(items), len(items), "dispatch overhead")
    report.rows += dispatch_overhead()
    return report
