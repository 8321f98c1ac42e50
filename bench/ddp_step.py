"""A DistributedDataParallel training step through `dualk.fuse` against the same nn.Linear model,
one process per GPU over NCCL (issue 32: the fused step must be >= 0.98x the nn.Linear step, fp32
and bf16). No torchrun: this script spawns the ranks itself.

    python3 bench/ddp_step.py --json OUT.json            # every visible GPU (needs >= 2)
    python3 bench/ddp_step.py --smoke                    # 2 CPU processes over gloo, tiny sizes
    python3 bench/ddp_step.py --dry-run                  # the plan, runs nothing

Model: nn.Sequential 256-512-512-512-128 with ReLU, 65536 rows per rank (each rank its own
data), parameters in fp32 or bf16, MSE loss (in fp32), plain SGD. Per rank two DDP models from
the same weights: the original, and `dualk.fuse(copy.deepcopy(original))`. Both take the same
steps on the same data: 3 warmup steps each, a wait for background tuning (`--settle`, as the
zoo's settle step: auto's final decisions), 3 more steps each, then `--rounds` rounds that time
`--steps` steps of each in turn (the order alternates per round; a barrier and a CUDA sync before
each timed block, CUDA events around it). A step's time is the slowest rank's; the result per
model is the median over rounds. After the steps: losses step by step, final weights (fused vs
original) and the replicas (every rank against rank 0) are compared; the ratio printed is
original / fused time (above 1: fused is faster).

NCCL runs with NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, set before any process group exists). Habits from
tests/test_distributed.py: a file store (no port to race for), a process-group timeout inside
the parent's wait, gc before destroy_process_group, an exit barrier, daemon workers.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from queue import Empty

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(NO_MULTICAST)  # before torch (and NCCL) is imported in this process

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WIDTHS = (256, 512, 512, 512, 128)
SMOKE_WIDTHS = (32, 64, 64, 64, 16)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Fused vs original after identical steps: relative error of each loss and of each weight
# (norm of the difference / norm of the original's). The kernels are not cuBLAS's, so fp32 is
# not bitwise; bf16 parameters round each update.
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
LR = 1e-3


def build_model(widths, device, dtype) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i != len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------- workers
def _worker(rank: int, world: int, store: str, cfg: dict, queue, exit_barrier) -> None:
    os.environ.update(NO_MULTICAST)
    try:
        use_cuda = cfg["device"] == "cuda"
        kw = {}
        if use_cuda:  # this rank's GPU before the group exists (NCCL binds to it)
            torch.cuda.set_device(rank)
            kw["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl" if use_cuda else "gloo", init_method=f"file://{store}", rank=rank,
            world_size=world, timeout=timedelta(seconds=cfg["pg_timeout_s"]), **kw,
        )  # fmt: skip
        queue.put((rank, _run_rank(rank, world, cfg)))
    except Exception as exc:  # the parent reports it instead of waiting for a result
        queue.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        # DDP's hooks keep each wrapper in a reference cycle: collect them before the group
        # goes, so that no reducer is left for interpreter shutdown.
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        exit_barrier.wait(timeout=60)  # no rank exits while a peer still tears its group down


def _run_rank(rank: int, world: int, cfg: dict) -> dict:
    import dualk

    use_cuda = cfg["device"] == "cuda"
    device = torch.device(f"cuda:{rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # two ranks on a small CI machine: no oversubscription
    out: dict = {"rank": rank, "dtypes": {}}
    for name in cfg["dtypes"]:
        out["dtypes"][name] = _run_dtype(rank, device, DTYPES[name], name, cfg, dualk)
        gc.collect()
        if use_cuda:
            torch.cuda.empty_cache()
    return out


def _run_dtype(rank, device, dtype, name, cfg, dualk) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    use_cuda = device.type == "cuda"
    torch.manual_seed(0)
    original = build_model(cfg["widths"], device, dtype)
    fused = dualk.fuse(copy.deepcopy(original), backend=cfg["backend"])
    report = str(fused.dualk_fuse_report)
    n_fused = sum(isinstance(m, dualk.nn.FusedMLP) for m in fused.modules())
    kw = {"device_ids": [rank]} if use_cuda else {}
    models = {"original": DDP(original, **kw), "fused": DDP(fused, **kw)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=LR) for k, m in models.items()}
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(cfg["rows"], cfg["widths"][0], generator=gen).to(device, dtype)
    y = torch.randn(cfg["rows"], cfg["widths"][-1], generator=gen).to(device)
    losses: dict = {k: [] for k in models}

    def step(k):
        opts[k].zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(models[k](x).float(), y)
        loss.backward()
        opts[k].step()
        losses[k].append(loss.detach())

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)

    first_step_s = {}
    for k in models:  # warmup: builds, compiles, autotuning, NCCL buckets
        t0 = time.perf_counter()
        step(k)
        sync()
        first_step_s[k] = time.perf_counter() - t0
        for _ in range(cfg["warmup"] - 1):
            step(k)
    sync()
    # auto's final decisions before timing, as the zoo's (a Triton class still tuning in the
    # background leaves them provisional: asked again on every call), then as many steps again
    # on each model and rank (DDP's all-reduce and the loss comparison need the same steps)
    from dualk.dispatch import triton_tune

    t0 = time.perf_counter()
    settled = triton_tune.settle(None, cfg["settle_s"]) if cfg["settle_s"] > 0 else None
    settle_s = time.perf_counter() - t0
    dist.barrier()
    for k in models:
        for _ in range(cfg["warmup"]):
            step(k)
    sync()

    times: dict = {k: [] for k in models}  # ms per step, per round
    host: dict = {k: [] for k in models}  # wall ms per step (sync included), per round
    for r in range(cfg["rounds"]):
        order = list(models) if r % 2 == 0 else list(reversed(models))
        for k in order:
            dist.barrier()
            sync()
            if use_cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            for _ in range(cfg["steps"]):
                step(k)
            if use_cuda:
                end.record()
                end.synchronize()
            wall = (time.perf_counter() - t0) * 1e3 / cfg["steps"]
            times[k].append(start.elapsed_time(end) / cfg["steps"] if use_cuda else wall)
            host[k].append(wall)

    # Checks: losses step by step, final weights, replicas against rank 0.
    loss_vals = {k: torch.stack(v).cpu().tolist() for k, v in losses.items()}
    loss_err = max(
        abs(a - b) / max(abs(b), 1e-12) for a, b in zip(loss_vals["fused"], loss_vals["original"])
    )
    sd_o = models["original"].module.state_dict()
    sd_f = models["fused"].module.state_dict()
    key_problem = None if sd_o.keys() == sd_f.keys() else (sorted(sd_o), sorted(sd_f))
    weight_err = 0.0
    for key in sd_o.keys() & sd_f.keys():
        a, b = sd_f[key].double(), sd_o[key].double()
        denom = max(torch.linalg.vector_norm(b).item(), 1e-12)
        weight_err = max(weight_err, torch.linalg.vector_norm(a - b).item() / denom)
    replica_diff = 0.0
    for m in models.values():
        for p in m.module.parameters():
            t = p.detach().clone()
            dist.broadcast(t, 0)
            replica_diff = max(replica_diff, (t.float() - p.detach().float()).abs().max().item())
    explain = None
    fmlp = [m for m in fused.modules() if isinstance(m, dualk.nn.FusedMLP)]
    if fmlp:
        ws = [lin.weight for lin in fmlp[0].layers]
        bs = [lin.bias for lin in fmlp[0].layers]
        try:
            explain = str(dualk.explain("fused_mlp", x, ws, bs, activation="relu",
                                        backend=cfg["backend"]))  # fmt: skip
        except Exception as exc:
            explain = f"explain raised {type(exc).__name__}: {exc}"
    result = {
        "times_ms": times,
        "host_ms": host,
        "first_step_s": first_step_s,
        "settled": settled,
        "settle_s": settle_s,
        "loss_rel_err": loss_err,
        "weight_rel_err": weight_err,
        "replica_max_abs_diff": replica_diff,
        "state_dict_keys_differ": key_problem,
        "losses_first_last": {k: (v[0], v[-1]) for k, v in loss_vals.items()},
        "n_steps": len(loss_vals["original"]),
        "fused_modules": n_fused,
        "fuse_report": report,
        "explain": explain,
    }
    return result  # the models go with this frame (the caller collects DDP's cycles)


# ----------------------------------------------------------------------------------- parent
def _next_result(queue, procs, timeout_s: float):
    """The next worker's result; fails at once when a worker died without sending one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=1.0)
        except Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a worker died without a result (exit codes {dead})") from None
    raise RuntimeError(f"no result from the workers within {timeout_s:.0f} s")


def spawn(world: int, cfg: dict, timeout_s: float) -> list:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    exit_barrier = ctx.Barrier(world)
    with tempfile.TemporaryDirectory(prefix="dualk-ddp-") as tmp:
        store = str(Path(tmp) / "store")
        procs = [ctx.Process(target=_worker, args=(r, world, store, cfg, queue, exit_barrier),
                             daemon=True)
                 for r in range(world)]  # fmt: skip
        try:
            for p in procs:
                p.start()
            out = [_next_result(queue, procs, timeout_s) for _ in procs]
            for p in procs:
                p.join(timeout=60)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=10)
    return sorted(out, key=lambda r: r[0])


def summarize(results: list, cfg: dict) -> tuple[dict, list[str]]:
    """Per dtype: the slowest rank's ms per step in each round, its median over rounds, the
    ratio original / fused; and the checks' failures."""
    failures: list[str] = []
    summary: dict = {}
    per_rank = [r for _, r in results]
    for name in cfg["dtypes"]:
        tol = TOLERANCE[name]
        rows = [r["dtypes"][name] for r in per_rank]
        s: dict = {}
        for k in ("original", "fused"):
            rounds = [max(r["times_ms"][k][i] for r in rows) for i in range(cfg["rounds"])]
            host = [max(r["host_ms"][k][i] for r in rows) for i in range(cfg["rounds"])]
            s[k] = {"ms_per_step": statistics.median(rounds), "rounds_ms": rounds,
                    "host_ms_per_step": statistics.median(host)}  # fmt: skip
        s["ratio_original_over_fused"] = s["original"]["ms_per_step"] / s["fused"]["ms_per_step"]
        s["loss_rel_err"] = max(r["loss_rel_err"] for r in rows)
        s["weight_rel_err"] = max(r["weight_rel_err"] for r in rows)
        s["replica_max_abs_diff"] = max(r["replica_max_abs_diff"] for r in rows)
        s["fused_modules"] = rows[0]["fused_modules"]
        if s["loss_rel_err"] > tol:
            failures.append(f"{name}: losses differ, relative {s['loss_rel_err']:.3g} > {tol:g}")
        if s["weight_rel_err"] > tol:
            failures.append(
                f"{name}: final weights differ, relative {s['weight_rel_err']:.3g} > {tol:g}"
            )
        if s["replica_max_abs_diff"] != 0.0:
            failures.append(
                f"{name}: replicas differ from rank 0 by {s['replica_max_abs_diff']:.3g}"
            )
        if any(r["state_dict_keys_differ"] for r in rows):
            failures.append(f"{name}: the fused model's state_dict keys differ from the original's")
        if s["fused_modules"] < 1:
            failures.append(f"{name}: dualk.fuse made no FusedMLP: {rows[0]['fuse_report']}")
        summary[name] = s
    return summary, failures


def _nccl_version() -> str:
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"


def environment(device: str, world: int) -> dict:
    import dualk

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nccl": _nccl_version() if device == "cuda" else None,
        "dualk": dualk.__version__,
        "world": world,
        "backend": "nccl" if device == "cuda" else "gloo",
        "env": dict(NO_MULTICAST),
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"unavailable ({type(exc).__name__}: {exc})"
    if device == "cuda":
        env["devices"] = [torch.cuda.get_device_name(i) for i in range(world)]
    return env


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--world", type=int, help="processes (default: every visible GPU)")
    ap.add_argument("--rows", type=int, default=65536, help="rows per rank")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per model per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--settle",
        type=float,
        default=60.0,
        help="seconds to wait for background tuning after warmup (0: none)",
    )
    ap.add_argument("--backend", default="auto", help="dualk.fuse(backend=)")
    ap.add_argument("--timeout", type=float, default=170.0, help="seconds for the whole run")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--smoke", action="store_true", help="2 CPU processes over gloo, tiny sizes")
    args = ap.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in args.dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes: unknown {bad}; choose from {sorted(DTYPES)}")
    if args.smoke:
        args.rows, args.rounds, args.steps = min(args.rows, 64), min(args.rounds, 2), 2
        args.warmup = min(args.warmup, 1)
        args.world = args.world or 2
    if args.warmup < 1 or args.rounds < 1 or args.steps < 1:
        ap.error("--warmup, --rounds and --steps must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    world = args.world or (torch.cuda.device_count() if device == "cuda" else 2)
    cfg = {
        "device": device,
        "widths": SMOKE_WIDTHS if args.smoke else WIDTHS,
        "rows": args.rows,
        "dtypes": args.dtypes,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "settle_s": args.settle,
        "backend": args.backend,
        "pg_timeout_s": max(30.0, args.timeout - 20.0),
    }
    plan = (f"{world} x {device} ({'nccl' if device == 'cuda' else 'gloo'}), widths "
            f"{'-'.join(map(str, cfg['widths']))} ReLU, {cfg['rows']} rows per rank, "
            f"{','.join(cfg['dtypes'])}, {cfg['warmup']} warmup + {cfg['rounds']} rounds x "
            f"{cfg['steps']} steps per model, fuse backend {cfg['backend']!r}")  # fmt: skip
    print(plan)
    if args.dry_run:
        return 0
    gpus = torch.cuda.device_count()
    if device == "cuda" and (world > gpus or (args.world is None and gpus < 2)):
        print(f"needs {max(world, 2) if args.world is None else world} GPUs (one per rank; "
              f"--world 1 for a single-GPU check); this machine has {gpus}; --smoke runs 2 CPU "
              "processes", file=sys.stderr)  # fmt: skip
        return 2
    t0 = time.perf_counter()
    try:
        results = spawn(world, cfg, args.timeout)
    except RuntimeError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    errors = [r for _, r in results if isinstance(r, str)]
    if errors:
        print(f"FAIL: a rank raised:\n{errors[0]}", file=sys.stderr)
        return 1
    summary, failures = summarize(results, cfg)
    total = time.perf_counter() - t0

    print(f"{'dtype':5s}  {'original ms':>11s}  {'fused ms':>9s}  {'orig/fused':>10s}  "
          f"{'loss err':>9s}  {'weight err':>10s}  {'replicas':>8s}")  # fmt: skip
    for name, s in summary.items():
        print(f"{name:5s}  {s['original']['ms_per_step']:11.3f}  {s['fused']['ms_per_step']:9.3f}  "
              f"{s['ratio_original_over_fused']:9.3f}x  {s['loss_rel_err']:9.2g}  "
              f"{s['weight_rel_err']:10.2g}  {s['replica_max_abs_diff']:8.2g}")  # fmt: skip
    r0 = results[0][1]["dtypes"]
    for name in summary:
        first = r0[name]["first_step_s"]
        print(f"{name}: first step (builds, tuning) original {first['original']:.1f} s, "
              f"fused {first['fused']:.1f} s; settled {r0[name]['settled']} after "
              f"{r0[name]['settle_s']:.1f} s")  # fmt: skip
        if r0[name]["explain"]:
            print("  " + r0[name]["explain"].replace("\n", "\n  "))
    print(f"total {total:.1f} s")
    if failures:
        print("\n" + "!" * 78)
        for f in failures:
            print(f"FAIL {f}")
        print("!" * 78)
    if args.json:
        out = {
            **environment(device, world),
            "config": {**cfg, "widths": list(cfg["widths"]), "lr": LR, "tolerance": TOLERANCE},
            "summary": summary,
            "ranks": [r for _, r in results],
            "failures": failures,
            "total_s": total,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
