"""Does dualk's gated MLP pay inside a torch.compile'd LLaMA now that compiled inference graphs
call `dualk::linear_glu_infer` (no custom_op wrappers per call)? Session 37 on an H200: with the
compiled choice sent to dualk's op (then through the custom op `dualk::linear_glu`), the zoo's
compiled LLaMA ran 0.88x (device 2.99 -> 2.81 ms, host 2.89 -> 3.55 ms per forward).

The zoo's llama (transformers LlamaModel, bf16, 8x512 tokens on a GPU; the CPU size elsewhere)
compiled three ways in one process, timed in alternating rounds:
  original      torch.compile(model)
  fused_auto    torch.compile(dualk.fuse(model)): the compiled choice as dualk makes it
  fused_op      the same with the compiled choice forced to dualk's op (module_choice.choose
                patched while Dynamo traces: the answer is a constant of the graph)
Per variant: device ms per forward (CUDA events, L2 flushed), host ms per forward started on an
idle GPU and back to back, and which ops the graphs hold.

    python3 experiments/compiled_glu_probe.py --json OUT.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections import defaultdict

import torch

import dualk
from dualk import module_choice
from dualk.core import timing
from dualk.tools.bench import environment
from dualk.tools.zoo_models import MODELS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    torch.manual_seed(0)
    built = MODELS["llama"].build(device, torch.bfloat16 if on_gpu else torch.float32,
                                  "gpu" if on_gpu else "cpu")  # fmt: skip
    model = built.model
    a, kw = built.make_inputs()
    fused = dualk.fuse(copy.deepcopy(model))
    forced_copy = dualk.fuse(copy.deepcopy(model))
    result: dict = {"env": environment(), "note": built.note}
    graphs: dict[str, set] = defaultdict(set)

    def recording(name):
        from torch._inductor.compile_fx import compile_fx

        def backend(gm, example_inputs):
            graphs[name] |= {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
            return compile_fx(gm, example_inputs)

        return backend

    variants = {}
    real_choose = module_choice.choose
    with torch.no_grad():
        for _ in range(30):  # the fused models' eager choices and in-model checks, as the zoo
            fused(*a, **kw)
            forced_copy(*a, **kw)
        for name, m, forced in (("original", model, None), ("fused_auto", fused, None),
                                ("fused_op", forced_copy, "fused")):  # fmt: skip
            if forced is not None:
                module_choice.choose = lambda mode, *x, _f=forced, **k: (
                    _f if mode == "compiled" else real_choose(mode, *x, **k)
                )
            try:
                compiled = torch.compile(m, backend=recording(name))
                t0 = time.perf_counter()
                out = compiled(*a, **kw)
                if on_gpu:
                    torch.cuda.synchronize()
                print(f"{name}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
            finally:
                module_choice.choose = real_choose
            variants[name] = compiled
            ref = model(*a, **kw).last_hidden_state.float()
            err = (out.last_hidden_state.float() - ref).abs().max().item()
            print(f"  max abs diff vs eager original {err:.3e}; dualk ops in its graphs: "
                  f"{sorted(t for t in graphs[name] if 'dualk' in t)}", flush=True)  # fmt: skip
        result["dualk_ops"] = {n: sorted(t for t in g if "dualk" in t) for n, g in graphs.items()}
        flush = torch.empty(64 << 20, dtype=torch.int32, device=device) if on_gpu else None
        dev: dict[str, list] = defaultdict(list)
        host_iso: dict[str, list] = defaultdict(list)
        host_burst: dict[str, list] = defaultdict(list)
        for r in range(args.rounds):
            order = list(variants.items())
            if r % 2:
                order.reverse()
            for name, m in order:
                run = lambda m=m: m(*a, **kw)  # noqa: E731
                if on_gpu:
                    dev[name] += timing.timed_calls(run, args.reps, flush, 0)
                iso = timing.isolated_host_ms(run, args.reps)
                host_iso[name].append(statistics.median(iso))
                # (off the GPU calls in a row are the isolated ones: nothing runs behind them)
                burst = timing.burst_host_ms(run, args.reps) if on_gpu else sum(iso) / len(iso)
                host_burst[name].append(burst)
        rows = {}
        base = statistics.median(dev["original"]) if on_gpu else None
        for name in variants:
            d = statistics.median(dev[name]) if on_gpu else None
            hi, hb = statistics.median(host_iso[name]), statistics.median(host_burst[name])
            rows[name] = {"device_ms": d, "host_isolated_ms": round(hi, 4),
                          "host_burst_ms": round(hb, 4)}  # fmt: skip
            ratio = f"original/this (device) {base / d:.3f}x" if on_gpu else ""
            dtxt = f"device {d:.3f} ms  " if on_gpu else ""
            print(f"{name:11s} {dtxt}host {hi:.3f} ms (idle GPU), {hb:.3f} ms (burst)  {ratio}",
                  flush=True)  # fmt: skip
        result["rows"] = rows
        result["choices"] = module_choice.details()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
