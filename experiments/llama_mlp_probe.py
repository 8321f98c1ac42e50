"""What dualk's gated MLP is worth inside the zoo's LLaMA-style model (issue 35: ">= 1.05x the
original in eager inference"), on a GPU, in one process.

The zoo's llama (transformers LlamaModel, 4 layers, hidden 2048, intermediate 5504, bf16, 8x512
tokens) three ways, timed in alternating rounds:
  original   the model as built
  pinned     each layer's MLP as down_proj(dualk.linear_glu(x, gate, up, backend=B)): the fused
             path with no choice and no check (B = cuda, and auto)
  fused      dualk.fuse(model) after its warm-up calls: what the zoo times (its in-model check's
             medians are printed: fuse.audit_times)
Per variant: device ms per forward (CUDA events, L2 flushed before each), host ms per forward
(back-to-back calls), and a kernel breakdown of one forward (torch.profiler: the top kernels'
device us), so the MLP's share of the model and what the fused path saves are read off directly.

    python3 experiments/llama_mlp_probe.py --json OUT.json
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import io
import json
import pstats
import statistics
import time
from collections import defaultdict

import torch
from torch import nn

import dualk
from dualk.fuse import audit_times, audit_verdicts
from dualk.core import timing
from dualk.dispatch import autotune, triton_tune
from dualk.tools.zoo_models import MODELS


class PinnedGatedMLP(nn.Module):
    """LlamaMLP's forward through dualk.linear_glu on one backend (the model's own parameters)."""

    def __init__(self, mlp: nn.Module, backend: str):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.backend = backend

    def forward(self, x):
        h = dualk.linear_glu(
            x, self.gate_proj.weight, self.up_proj.weight, activation="silu", backend=self.backend
        )
        return self.down_proj(h)


def pinned(model: nn.Module, backend: str) -> nn.Module:
    out = copy.deepcopy(model)
    for layer in out.layers:
        layer.mlp = PinnedGatedMLP(layer.mlp, backend)
    return out


def profiled(run, calls: int, stream=None, isolated: bool = False) -> pstats.Stats:
    """cProfile's statistics of `calls` calls of `run` (the GPU synchronised after); isolated:
    the GPU synchronised after each call too, so that no launch waits for room in a full launch
    queue (in a device-bound burst those waits land on whichever launch comes next)."""
    prof = cProfile.Profile()
    sync = torch.cuda.synchronize
    prof.enable()
    for _ in range(calls):
        run()
        if isolated:
            sync()
    prof.disable()
    torch.cuda.synchronize()
    return pstats.Stats(prof, stream=stream)


def kernel_breakdown(run, forwards: int = 3) -> tuple[float, list]:
    """(device us per forward, [(kernel name, us per forward)] top 12) from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            run()
        torch.cuda.synchronize()
    per: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:90]] += e.device_time / forwards
    top = sorted(per.items(), key=lambda kv: -kv[1])[:12]
    return sum(per.values()), [(n, round(us, 1)) for n, us in top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    built = MODELS["llama"].build(device, torch.bfloat16, "gpu")
    model = built.model
    a, kw = built.make_inputs()
    variants = {"original": model}
    variants["pinned_cuda"] = pinned(model, "cuda")
    variants["pinned_auto"] = pinned(model, "auto")
    fused = dualk.fuse(copy.deepcopy(model))
    variants["fused"] = fused
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "note": built.note}  # fmt: skip
    with torch.no_grad():
        ref = model(*a, **kw).last_hidden_state.float()
        for name, m in variants.items():
            for _ in range(60):  # builds, tunes, the fused model's choices and in-model check
                out = m(*a, **kw)
            torch.cuda.synchronize()
            err = (out.last_hidden_state.float() - ref).abs().max().item()
            print(f"{name}: max abs diff vs original {err:.3e}", flush=True)
        # As the zoo does: wait for the background work (Triton's tuner) that auto's decisions
        # wait for, calling the models meanwhile, then a few more calls so the decisions and
        # the fused model's choices and in-model check are final before anything is timed.
        t0 = time.perf_counter()
        settled = triton_tune.settle(
            lambda: ([m(*a, **kw) for m in variants.values()], torch.cuda.synchronize()), 180.0
        )
        for _ in range(40):
            for m in variants.values():
                m(*a, **kw)
        torch.cuda.synchronize()
        result["settle_s"] = round(time.perf_counter() - t0, 1)
        result["settled"] = settled
        result["provisional"] = autotune.provisional_now()
        print(f"settled {settled} in {result['settle_s']} s; provisional: {result['provisional']}")
        result["audit_times"] = [list(t) for t in audit_times(fused)]
        result["audit_verdicts"] = audit_verdicts(fused)
        print("fused: in-model check (path, fused ms, original ms):", result["audit_times"])
        print("fused: verdicts", result["audit_verdicts"])
        # What auto runs for the layers' gated call, and what the fused owner's module chose
        h = torch.randn(8, 512, 2048, device=device, dtype=torch.bfloat16)
        mlp = model.layers[0].mlp
        explained = dualk.explain(
            "linear_glu", h, mlp.gate_proj.weight, mlp.up_proj.weight, activation="silu"
        )
        result["auto"] = f"{explained.backend} ({explained.source}); {explained.notes}"
        print("auto for the gated call:", result["auto"])
        flush = torch.empty(64 << 20, dtype=torch.int32, device=device)
        dev: dict[str, list] = defaultdict(list)
        host: dict[str, list] = defaultdict(list)
        alone: dict[str, list] = defaultdict(list)  # timing.isolated_host_ms
        alone_nogc: dict[str, list] = defaultdict(list)  # the same with the collector off
        for r in range(args.rounds):
            order = list(variants.items())
            if r % 2:
                order.reverse()
            for name, m in order:
                run = lambda m=m: m(*a, **kw)  # noqa: E731
                dev[name] += timing.timed_calls(run, args.reps, flush, 0)
                host[name].append(timing.burst_host_ms(run, args.reps))
                alone[name] += timing.isolated_host_ms(run, args.reps)
                gc.disable()
                try:
                    alone_nogc[name] += timing.isolated_host_ms(run, args.reps)
                finally:
                    gc.enable()
        base = statistics.median(dev["original"])
        rows = {}
        for name in variants:
            d, h = statistics.median(dev[name]), statistics.median(host[name])
            i, g = statistics.median(alone[name]), statistics.median(alone_nogc[name])
            rows[name] = {"device_ms": round(d, 4), "host_ms": round(h, 4),
                          "isolated_host_ms": round(i, 4), "isolated_host_nogc_ms": round(g, 4),
                          "device_ratio": round(base / d, 4)}  # fmt: skip
            print(f"{name:12s} device {d:.3f} ms  host {h:.3f} ms (burst), {i:.3f} ms (one "
                  f"forward on an idle GPU; {g:.3f} with gc off)  original/this (device) "
                  f"{base / d:.3f}x", flush=True)  # fmt: skip
        result["rows"] = rows
        # The MLP alone at the model's shape, and its share of the forward.
        x = torch.randn(8, 512, 2048, device=device, dtype=torch.bfloat16)
        mlp0 = model.layers[0].mlp
        pin0 = variants["pinned_cuda"].layers[0].mlp
        mlp_dev = {}
        for name, m in (("eager_mlp", mlp0), ("pinned_mlp", pin0)) * 3:
            mlp_dev.setdefault(name, []).extend(timing.timed_calls(lambda m=m: m(x), 10, flush, 0))
        result["mlp_alone_ms"] = {n: round(statistics.median(v), 4) for n, v in mlp_dev.items()}
        print("one MLP alone (device ms):", result["mlp_alone_ms"])
        # Host us per call of one layer's MLP: the original, the pinned call, and the fused
        # model's owner (what dualk.fuse put in the layer: its wrapper's cost shows here)
        owners = (("original", mlp0), ("pinned_cuda", pin0), ("fused_owner", fused.layers[0].mlp))
        mlp_host: dict[str, list] = defaultdict(list)
        for _ in range(5):
            for name, m in owners:
                mlp_host[name].append(timing.burst_host_ms(lambda m=m: m(x), 50) * 1e3)
        result["mlp_host_us"] = {n: round(statistics.median(v), 2) for n, v in mlp_host.items()}
        print("one MLP's host us per call:", result["mlp_host_us"])
        owner = fused.layers[0].mlp
        text = io.StringIO()
        profiled(lambda: owner(x), 300, text).sort_stats("tottime").print_stats(24)
        print("\nthe fused owner, 300 calls under cProfile (tottime):")
        print("\n".join(line[:150] for line in text.getvalue().splitlines()[6:40]))
        # The whole forward's Python on the host, original vs fused: the functions whose time
        # or call count differ most (the fused model's host per forward read higher than the
        # original's in the zoo although each owner's call alone is cheaper; session 36), each
        # forward started on an idle GPU (profiled's isolated).
        stats = {}
        for name in ("original", "fused"):
            m = variants[name]
            # {(file, line, fn): (cc, nc, tt, ct, callers)}
            st = profiled(lambda m=m: m(*a, **kw), 20, isolated=True).stats
            stats[name] = {f"{k[0].split('/')[-1]}:{k[1]}({k[2]})": (v[1] / 20, v[2] / 20 * 1e6)
                           for k, v in st.items() if "synchronize" not in k[2]}  # fmt: skip
        diffs = []
        for fn in set(stats["original"]) | set(stats["fused"]):
            oc, ot = stats["original"].get(fn, (0, 0.0))
            fc, ft = stats["fused"].get(fn, (0, 0.0))
            diffs.append((ft - ot, fn, oc, fc, ot, ft))
        diffs.sort(key=lambda d: -abs(d[0]))
        result["host_profile_diff"] = [
            {"fn": fn, "calls": [oc, fc], "tottime_us": [round(ot, 1), round(ft, 1)]}
            for _, fn, oc, fc, ot, ft in diffs[:30]
        ]
        host = {n: sum(t for _, t in v.values()) for n, v in stats.items()}
        print(f"\nhost per forward under cProfile: original {host['original']:.0f} us, fused "
              f"{host['fused']:.0f} us; largest differences (fused - original tottime us; calls):")  # fmt: skip
        for d, fn, oc, fc, _ot, _ft in diffs[:30]:
            print(f"  {d:+8.1f}  {fn[:100]}  calls {oc:g} -> {fc:g}")
        result["kernels"] = {}
        for name in variants:
            m = variants[name]
            total, top = kernel_breakdown(lambda m=m: m(*a, **kw))
            result["kernels"][name] = {"total_us": round(total, 1), "top": top}
            print(f"\n{name}: kernels {total:.1f} us per forward")
            for n, us in top:
                print(f"  {us:9.1f}  {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
