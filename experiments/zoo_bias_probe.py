"""Where the zoo's host-bound losses come from (issue 32), on a GPU, in one process:

A. A/A: the zoo's GPT-2 and BERT (bf16, 8x512 tokens): the original model, two copies made as
   dualk.fuse makes its copy (parameters shared), and fuse(original), timed in alternating bursts
   of calls (wall and host per forward, medians over the bursts), eval + no_grad.
B. mlp256x4 training step (the zoo's): original vs fuse(copy) with each path forced, host and
   wall per step; then torch.profiler's CPU self time by op over 5 steps of each model, with the
   fused path forced and with module_choice's own decision. C: the same for mlp_wide_train_bf16.
D: the same for nerf_mlp_train, plus a "floor" model: the same parameters behind one autograd
   Function that returns a stored output and stored gradients (no kernels), so the step's cost
   outside the model (zero_grad, the loss and its backward, autograd's engine, SGD) is measured
   alone: no model can make the step faster than that floor.
E. The host-bound vision rows (timm ViT-S and Mixer-B, the zoo's, eval + no_grad): the original,
   a copy, fuse(original) with module_choice's own decisions, and the same fused model with every
   forward object dualk set removed (each module's class forward, the fused modules left as
   unused children), so that what the fused model costs on the original path splits into
   dualk's per-call code and the rest (object layout, extra children).
F. Where the fused vision / BERT forward's extra host time goes: cProfile of 20 forwards of the
   original and of fuse(original) (eval, no_grad, after settling), the top functions by own
   time, and each _FusedForward's state (which branch a like call takes).

    python experiments/zoo_bias_probe.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

import dualk
from dualk import module_choice
from dualk.dispatch import triton_tune
from dualk.fuse import _copy_sharing_tensors, audit_verdicts
from dualk.tools.zoo import _burst as zoo_burst
from dualk.tools.zoo_models import MODELS


def _burst(fn, calls):
    """(wall, host) us per call of `calls` calls in a row: the zoo's own burst, without flush."""
    wall_ms, host_ms = zoo_burst(fn, calls, torch.device("cuda"), None)
    return wall_ms * 1e3, host_ms * 1e3


def alternate(fns: dict, rounds=16, calls=10):
    out = {k: {"wall": [], "host": []} for k in fns}
    names = list(fns)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for k in order:
            w, h = _burst(fns[k], calls)
            out[k]["wall"].append(w)
            out[k]["host"].append(h)
    return {
        k: {"wall_us": statistics.median(v["wall"]), "host_us": statistics.median(v["host"]),
            "host_min_us": min(v["host"])}
        for k, v in out.items()
    }  # fmt: skip


def part_a(device):
    res = {}
    for name in ("gpt2", "bert"):
        spec = MODELS[name]
        torch.manual_seed(0)
        built = spec.build(device, spec.dtype, "gpu")
        m = built.model.eval()
        args, kwargs = built.make_inputs()
        c1 = _copy_sharing_tensors(m)
        c2 = _copy_sharing_tensors(m)
        f = dualk.fuse(m)
        fns = {
            "original": lambda m=m: m(*args, **kwargs),
            "copy1": lambda m=c1: m(*args, **kwargs),
            "copy2": lambda m=c2: m(*args, **kwargs),
            "fused": lambda m=f: m(*args, **kwargs),
        }
        with torch.no_grad():
            for fn in fns.values():
                for _ in range(5):
                    fn()
            triton_tune.settle(lambda: (fns["fused"](), torch.cuda.synchronize()), 60)
            res[name] = alternate(fns)
        print(name, json.dumps(res[name], indent=1))
    return res


class _Stored(torch.autograd.Function):
    """Output and parameter gradients from storage: a model part that costs one Function call."""

    @staticmethod
    def forward(ctx, x, store, *params):
        ctx.store = store
        return store["out"].view_as(store["out"])

    @staticmethod
    def backward(ctx, grad):
        return None, None, *ctx.store["grads"]


class _Floor(torch.nn.Module):
    def __init__(self, model, args, kwargs):
        super().__init__()
        self.inner = model
        out = model(*args, **kwargs).detach()
        params = list(model.parameters())
        self.store = {"out": out, "grads": [torch.randn_like(p) * 1e-3 for p in params]}

    def forward(self, x):
        return _Stored.apply(x, self.store, *self.inner.parameters())


def _train_pair(name, device, copy_original: bool):
    """The zoo's training model `name` at its GPU size and fuse(deep copy of it), both in train
    mode, each with its SGD: (original, fused, opt_o, opt_f, args, kwargs). copy_original: the
    original side a deep copy as well, made after the fused one (as the zoo does)."""
    spec = MODELS[name]
    torch.manual_seed(0)
    built = spec.build(device, spec.dtype, "gpu")
    original = built.model.train()
    args, kwargs = built.make_inputs()
    fused = dualk.fuse(copy.deepcopy(original)).train()
    if copy_original:
        original = copy.deepcopy(original)
    opt_o = torch.optim.SGD(original.parameters(), lr=1e-6)
    opt_f = torch.optim.SGD(fused.parameters(), lr=1e-6)
    return original, fused, opt_o, opt_f, args, kwargs


def part_b(device, name="mlp256x4_train", floor=False):
    from dualk.tools.zoo import _step

    orig, fused, opt_o, opt_f, args, kwargs = _train_pair(name, device, copy_original=False)
    step = lambda model, opt: _step(model, opt, args, kwargs)

    # As the zoo: the fused model's decisions final (Triton's background tuner done), not the
    # provisional ones of a fresh process, which are asked again on every call.
    triton_tune.settle(lambda: (step(fused, opt_f), torch.cuda.synchronize()), 120.0)
    res = {}
    if floor:
        floor_model = _Floor(copy.deepcopy(orig), args, kwargs)
        opt_floor = torch.optim.SGD(floor_model.parameters(), lr=1e-6)
        for _ in range(5):
            step(floor_model, opt_floor)
        res["floor"] = alternate(
            {"original": lambda: step(orig, opt_o), "fused": lambda: step(fused, opt_f),
             "floor": lambda: step(floor_model, opt_floor)},
            rounds=12, calls=10,
        )  # fmt: skip
        print(name, "train with the floor model", json.dumps(res["floor"], indent=1))
    real_choose = module_choice.choose
    for forced in ("choice", "fused", "original"):
        for m in fused.modules():
            m.__dict__.pop("_choice_memo", None)
        if forced != "choice":
            module_choice.choose = lambda *a, _p=forced, **k: _p
        for _ in range(5):
            step(orig, opt_o)
            step(fused, opt_f)
        res[forced] = alternate(
            {"original": lambda: step(orig, opt_o), "fused": lambda: step(fused, opt_f)},
            rounds=10, calls=10,
        )  # fmt: skip
        print(name, "train, fused path", forced, json.dumps(res[forced], indent=1))
        if forced in ("fused", "choice"):
            from torch.profiler import ProfilerActivity, profile

            for which, model, opt in (("fused", fused, opt_f), ("original", orig, opt_o)):
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(5):
                        step(model, opt)
                    torch.cuda.synchronize()
                table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
                ops = sum(e.count for e in prof.key_averages())
                print(f"--- profile ({forced}), {which} model (5 steps, {ops} ops)\n{table}")
                res[f"profile_{forced}_{which}"] = table
        module_choice.choose = real_choose
    if floor:  # where the fused model's own host time goes: Python's profile of 50 steps
        res["cprofile_fused"] = _cprofile(lambda: step(fused, opt_f), 50, 35)[1]
        print(res["cprofile_fused"])
    res["decisions"] = module_choice.details()
    return res


def part_t(device, name="mlp256x4_train"):
    """The zoo's training row exactly as the zoo builds it (deep copy vs fuse(deep copy), zoo's
    _step and _settle), then: the state of the process (threads, the Triton tuner), alternating
    bursts, the same after the tuner has finished, cProfile and torch.profiler of both steps, and
    two variants of the fused model: its owner forward replaced by the unfused graph's, and the
    unfused graph (the fuse result's `original`) stepped as a model of its own."""
    import threading

    from dualk.fuse import FUSED_TYPES
    from dualk.nn import choice_final
    from dualk.tools import zoo

    orig, fused, opt_o, opt_f, args, kwargs = _train_pair(name, device, copy_original=True)
    run_o = lambda: zoo._step(orig, opt_o, args, kwargs)
    run_f = lambda: zoo._step(fused, opt_f, args, kwargs)
    for fn in (run_o, run_f):
        fn()
        torch.cuda.synchronize()
    zoo._settle(run_f, device)
    for fn in (run_o, run_f):
        fn()
        fn()

    def state(tag):
        st = {
            "threads": sorted(t.name for t in threading.enumerate()),
            "tuner_running": len(triton_tune.running()),
            "background_pending": triton_tune.background_pending(),
            "paths": _paths(fused),
            "finals": [str(choice_final(m)) for m in fused.modules()
                       if isinstance(m, FUSED_TYPES)],
            "params": [len(list(orig.parameters())), len(list(fused.parameters()))],
            "opt_params": [len(opt_o.param_groups[0]["params"]),
                           len(opt_f.param_groups[0]["params"])],
        }  # fmt: skip
        ff = fused.__dict__.get("forward")
        if ff is not None:
            st["ff"] = {k: str(getattr(ff, k, None))[:120] for k in
                        ("last_original", "last_graph", "single_mlp", "original_streak")}  # fmt: skip
        print(tag, json.dumps(st))
        return st

    res = {"state_0": state("after settle")}
    gc_was = __import__("gc")
    gc_was.collect()
    gc_was.freeze()
    res["alt_1"] = alternate({"original": run_o, "fused": run_f}, rounds=16, calls=8)
    print("alt_1", json.dumps(res["alt_1"]))
    res["state_1"] = state("after alt_1")
    t0 = time.perf_counter()
    while triton_tune.background_pending() and time.perf_counter() - t0 < 90:
        triton_tune.poll()
        time.sleep(0.5)
    res["tuner_wait_s"] = round(time.perf_counter() - t0, 1)
    for _ in range(3):
        run_f()
    res["alt_2"] = alternate({"original": run_o, "fused": run_f}, rounds=16, calls=8)
    print("alt_2 (tuner done)", res["tuner_wait_s"], json.dumps(res["alt_2"]))
    res["state_2"] = state("after alt_2")
    for which, fn in (("original", run_o), ("fused", run_f)):
        host, text = _cprofile(fn, 40, 30)
        res[f"cprofile_{which}"] = {"host_us": host, "top": text}
        print(f"--- cProfile {which}: {host:.0f} us per step under the profiler\n{text}")
    from torch.profiler import ProfilerActivity, profile

    for which, fn in (("original", run_o), ("fused", run_f)):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        ka = prof.key_averages()
        res[f"ops_{which}"] = sum(e.count for e in ka)
        table = ka.table(sort_by="self_cpu_time_total", row_limit=20)
        print(f"--- torch.profiler {which}: {res[f'ops_{which}']} ops in 5 steps\n{table}")
    ff = fused.__dict__.get("forward")
    if ff is not None and getattr(ff, "original", None) is not None:
        unfused = ff.original
        run_u = lambda: zoo._step(unfused, opt_f, args, kwargs)
        object.__setattr__(fused, "forward", unfused.forward)
        res["alt_3_owner_forward_unfused"] = alternate(
            {"original": run_o, "fused": run_f, "unfused_graph": run_u}, rounds=16, calls=8
        )
        print("alt_3", json.dumps(res["alt_3_owner_forward_unfused"]))
        object.__setattr__(fused, "forward", ff)
    twin2 = copy.deepcopy(orig)
    opt_2 = torch.optim.SGD(twin2.parameters(), lr=1e-6)
    run_2 = lambda: zoo._step(twin2, opt_2, args, kwargs)
    for _ in range(3):
        run_2()
    res["alt_4_aa"] = alternate({"original": run_o, "copy": run_2, "fused": run_f}, rounds=16,
                                calls=8)  # fmt: skip
    print("alt_4 (A/A copy)", json.dumps(res["alt_4_aa"]))
    gc_was.unfreeze()
    res["decisions"] = module_choice.details()
    return res


def part_z(device, name="mlp256x4_train"):
    """The zoo's own measurement of `name` (dualk.tools.zoo, where its 0.89-0.94x shows), with
    diagnostics run inside it just before its timed rounds: one step of each model under
    torch.cuda.set_sync_debug_mode("error") (the traceback of any synchronising op), cProfile
    of 30 steps of each, and the plain alternating bursts of part t beside the zoo's own rounds."""
    import traceback

    from dualk.tools import zoo

    res = {}
    real_rounds = zoo._rounds

    def rounds(run_o, run_f, dev, n_rounds, calls, burst_calls, flush, samples):
        zoo.gc.unfreeze()
        for which, fn in (("original", run_o), ("fused", run_f)):
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
                res[f"sync_{which}"] = None
            except RuntimeError:
                res[f"sync_{which}"] = traceback.format_exc()[-3000:]
            finally:
                torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
            print(f"--- sync check, {which}:", res[f"sync_{which}"] or "no synchronising op")
            fn()
        for which, fn in (("original", run_o), ("fused", run_f)):
            host, text = _cprofile(fn, 30, 25)
            res[f"cprofile_{which}"] = {"host_us": host, "top": text}
            print(f"--- cProfile {which}: {host:.0f} us per step\n{text}")
        res["alternate_before"] = alternate({"original": run_o, "fused": run_f}, 16, burst_calls)
        print("alternate before the zoo's rounds", json.dumps(res["alternate_before"]))
        zoo.gc.collect()
        zoo.gc.freeze()
        real_rounds(run_o, run_f, dev, n_rounds, calls, burst_calls, flush, samples)
        zoo.gc.unfreeze()
        res["alternate_after"] = alternate({"original": run_o, "fused": run_f}, 16, burst_calls)
        print("alternate after the zoo's rounds", json.dumps(res["alternate_after"]))
        zoo.gc.freeze()

    zoo._rounds = rounds
    try:
        results = zoo.run(models=[name], modes=["train"])
    finally:
        zoo._rounds = real_rounds
    r = results[0]
    res["zoo"] = {k: getattr(r, k) for k in ("ratio", "ratio_ci", "orig_host_us", "fused_host_us",
                                             "orig_device_ms", "fused_device_ms", "background")}  # fmt: skip
    print("zoo row", json.dumps(res["zoo"], default=str))
    return res


def _built(name, device):
    """The zoo's `name` at its GPU size, eval: (model, args, kwargs)."""
    spec = MODELS[name]
    torch.manual_seed(0)
    built = spec.build(device, spec.dtype, "gpu")
    args, kwargs = built.make_inputs()
    return built.model.eval(), args, kwargs


def _warm(fns: dict, fused_key: str = "fused") -> None:
    """Five calls of each, then auto's background work settled on the fused one."""
    for fn in fns.values():
        for _ in range(5):
            fn()
    triton_tune.settle(lambda: (fns[fused_key](), torch.cuda.synchronize()), 60)


def _paths(model) -> list[str]:
    """The paths the fused modules took on their last call."""
    return sorted(
        {str(q.__dict__.get("_last_path")) for q in model.modules() if "_last_path" in q.__dict__}
    )


def _cprofile(fn, calls: int, lines: int) -> tuple[float, str]:
    """(host us per call under the profiler, pstats' top `lines` by own time) of `calls` calls
    of fn, the GPU synchronised after."""
    import cProfile
    import io
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(lines)
    return host, text.getvalue()


def part_e(device):
    res = {}
    from dualk.fuse import RESTORE_AFTER, forward_restored

    for name in ("vit_small", "mixer_b16", "bert"):
        m, args, kwargs = _built(name, device)
        copied = _copy_sharing_tensors(m)
        fused = dualk.fuse(m)
        plain = dualk.fuse(_copy_sharing_tensors(m))
        fns = {
            "original": lambda m=m: m(*args, **kwargs),
            "copy": lambda m=copied: m(*args, **kwargs),
            "fused": lambda m=fused: m(*args, **kwargs),
            "fused, class forwards": lambda m=plain: m(*args, **kwargs),
        }
        with torch.no_grad():
            _warm(fns)
            for _ in range(RESTORE_AFTER + 3):  # (past the restore of all-original owners)
                fns["fused"]()
                fns["fused, class forwards"]()
            paths = _paths(fused)
            restored = sum(forward_restored(q) for q in fused.modules())
            stripped = 0
            for q in plain.modules():
                if "forward" in q.__dict__:
                    del q.__dict__["forward"]
                    stripped += 1
            res[name] = alternate(fns)
            res[name]["paths"] = paths
            res[name]["stripped_forwards"] = stripped
            res[name]["restored_owners"] = restored
        print(name, json.dumps(res[name], indent=1))
    return res


def part_f(device):
    from dualk.fuse import _FusedForward

    res = {}
    for name in ("bert", "vit_small"):
        m, args, kwargs = _built(name, device)
        fused = dualk.fuse(_copy_sharing_tensors(m))
        runs = {"original": lambda: m(*args, **kwargs), "fused": lambda: fused(*args, **kwargs)}
        out = {}
        with torch.no_grad():
            _warm(runs)
            for _ in range(5):
                runs["fused"]()
            for which, fn in runs.items():
                host, top = _cprofile(fn, 20, 18)
                out[which] = {"host_us_profiled": host, "top": top[-4000:]}
                print(f"== {name} {which}: {host:.0f} us per forward under cProfile")
                print(top[-3500:])
        forwards = [
            q.__dict__["forward"]
            for q in fused.modules()
            if isinstance(q.__dict__.get("forward"), _FusedForward)
        ]
        out["forward_objects"] = [
            {
                "owner": type(f.owner).__name__,
                "last_original": f.last_original is not None,
                "last_graph": f.last_graph is not None,
                "original_calls": len(f.original_calls),
                "single_mlp": f.single_mlp,
            }
            for f in forwards[:3]
        ]
        out["paths"] = _paths(fused)
        print(name, "forward objects:", len(forwards), out["forward_objects"], out["paths"])
        res[name] = out
    return res


def part_g(device, name="bert", module_cls=None):
    """A model with its fused modules forced onto dualk's path (module_choice answers "fused"):
    host per forward against the original, alternating, then a cProfile of each, and what
    module_choice holds; then the zoo's own way (module_choice decides, the in-model check
    runs) alternating again. Part g: BERT's LinearGELUs; part l: the LLaMA-style decoder's
    GatedMLPs."""
    module_cls = module_cls or dualk.nn.LinearGELU
    m, args, kwargs = _built(name, device)
    fused = dualk.fuse(_copy_sharing_tensors(m))
    real_choose = module_choice.choose
    module_choice.choose = lambda *a, **k: "fused"
    res = {}
    try:
        runs = {"original": lambda: m(*args, **kwargs), "fused": lambda: fused(*args, **kwargs)}
        with torch.no_grad():
            _warm(runs)
            res["alternate"] = alternate(runs)
            res["paths"] = _paths(fused)
            print(f"{name} forced fused:", json.dumps(res["alternate"]), res["paths"])
            for which, fn in runs.items():
                top = _cprofile(fn, 20, 25)[1]
                res[f"cprofile_{which}"] = top[-5000:]
                print(f"== {name} {which} ({module_cls.__name__} forced fused)")
                print(top[-4500:])
    finally:
        module_choice.choose = real_choose
    # the zoo's own way: module_choice decides, then the in-model check; what a forward costs
    fused2 = dualk.fuse(_copy_sharing_tensors(m))
    runs = {"original": lambda: m(*args, **kwargs), "fused": lambda: fused2(*args, **kwargs)}
    with torch.no_grad():
        _warm(runs)
        for _ in range(40):
            runs["fused"]()
        res["decided_alternate"] = alternate(runs)
    res["decided_paths"] = _paths(fused2)
    res["choice_final"] = [
        dualk.nn.choice_final(q) for q in fused2.modules() if isinstance(q, module_cls)
    ]
    res["audit_verdicts"] = str(audit_verdicts(fused2))
    res["module_choice"] = {k: str(v)[:600] for k, v in module_choice.details().items()}
    print(f"{name} decided:", json.dumps(res["decided_alternate"]), res["decided_paths"])
    print("choice_final:", res["choice_final"], "audit:", res["audit_verdicts"])
    print(json.dumps(res["module_choice"], indent=1)[:3000])
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument(
        "--parts",
        default="a,b",
        help="a (A/A copies), b (mlp256x4 training step), c (the wide bf16 one), d (NeRF's), "
        "e (ViT, Mixer and BERT on the original path, after the restore), f (cProfile of BERT and ViT, original vs fused), g (BERT with its LinearGELUs forced fused), l (the LLaMA-style decoder with its GatedMLPs forced fused), t (the zoo's 256x4 training row as the zoo builds it, cProfile, tuner state), z (the zoo's own 256x4 row with sync check, cProfile and plain bursts inside it)",
    )
    a = p.parse_args()
    device = torch.device("cuda")
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if "a" in a.parts.split(","):
        out["a_a"] = part_a(device)
    if "b" in a.parts.split(","):
        out["train_256x4"] = part_b(device)
    if "c" in a.parts.split(","):
        out["train_wide_bf16"] = part_b(device, "mlp_wide_train_bf16")
    if "d" in a.parts.split(","):
        out["train_nerf"] = part_b(device, "nerf_mlp_train", floor=True)
    if "e" in a.parts.split(","):
        out["vision_original_path"] = part_e(device)
    if "f" in a.parts.split(","):
        out["profile"] = part_f(device)
    if "t" in a.parts.split(","):
        out["train_256x4_zoo_setup"] = part_t(device)
    if "z" in a.parts.split(","):
        out["train_256x4_in_zoo"] = part_z(device)
    if "g" in a.parts.split(","):
        out["bert_forced_fused"] = part_g(device)
    if "l" in a.parts.split(","):
        out["llama_forced_fused"] = part_g(device, "llama", dualk.nn.GatedMLP)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
