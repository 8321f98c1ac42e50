"""A data-parallel training step (DistributedDataParallel, one process per device) through
dualk.nn.FusedMLP gives the same loss and gradients as the same model built from nn.Linear.

On GPUs: NCCL, one process per GPU (needs >= 2 GPUs; skipped otherwise, with the reason). On the
CPU: gloo with two processes, which checks the same integration (parameters registered with DDP,
gradient hooks firing through dualk's autograd) with the torch backend."""

from __future__ import annotations

import gc
import os
import time
from datetime import timedelta
from pathlib import Path
from queue import Empty

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WIDTHS = (24, 32, 32, 8)
# NVLink multicast stays off (NCCL's NVLS, symmetric memory, NVSHMEM): set here, before any
# process exists, so that the spawned ranks inherit it, and again in each rank before init.
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(NO_MULTICAST)


def _twins(device, dtype):
    from dualk.nn import FusedMLP

    torch.manual_seed(0)
    fused = FusedMLP(WIDTHS, activation="gelu", approximate="tanh", device=device, dtype=dtype)
    torch.manual_seed(0)
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
        layers.append(torch.nn.Linear(fan_in, fan_out, device=device, dtype=dtype))
        if i != len(WIDTHS) - 2:
            layers.append(torch.nn.GELU(approximate="tanh"))
    plain = torch.nn.Sequential(*layers)
    # Same parameters: Sequential's Linear i is module 2 i (activations in between).
    with torch.no_grad():
        for i, lin in enumerate(fused.layers):
            plain[2 * i].weight.copy_(lin.weight)
            plain[2 * i].bias.copy_(lin.bias)
    return fused, plain


def _worker(
    rank: int, world: int, store: str, use_cuda: bool, backend: str, mode: str, queue, exit_barrier
) -> None:
    os.environ.update(NO_MULTICAST)
    try:
        # A file store (no port to race for) and a timeout well inside the parent's wait.
        dist.init_process_group(
            "nccl" if use_cuda else "gloo", init_method=f"file://{store}", rank=rank,
            world_size=world, timeout=timedelta(seconds=90),
        )  # fmt: skip
        queue.put((rank, _step(rank, use_cuda, backend, mode)))
    except Exception as exc:  # the parent reports it instead of waiting for a result
        import traceback

        queue.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        # DDP's hooks put each wrapper in a reference cycle: collect them now, so that no reducer
        # (holding the process group and its gloo threads) is left for interpreter shutdown,
        # where destroying it aborted a CI run ("terminate called without an active exception").
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        # And no rank exits (closing its sockets) while a peer is still tearing its group down.
        exit_barrier.wait(timeout=60)


def _step(rank: int, use_cuda: bool, backend: str, mode: str = "module"):
    """mode "module": a dualk.nn.FusedMLP against the nn.Sequential of the same weights;
    "fuse": dualk.fuse(copy of the nn.Sequential), as a user would convert a model."""
    device = torch.device(f"cuda:{rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    fused, plain = _twins(device, torch.float32)
    if mode == "fuse":
        import copy

        import dualk

        fused = dualk.fuse(copy.deepcopy(plain), backend=backend)
        assert any(isinstance(m, dualk.nn.FusedMLP) for m in fused.modules()), str(
            fused.dualk_fuse_report
        )
    else:
        fused.backend = backend
    ddp_fused = torch.nn.parallel.DistributedDataParallel(fused)
    ddp_plain = torch.nn.parallel.DistributedDataParallel(plain)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(64, WIDTHS[0], generator=gen).to(device)
    y = torch.randn(64, WIDTHS[-1], generator=gen).to(device)
    results = []
    for model in (ddp_fused, ddp_plain):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        dist.all_reduce(loss.detach())
        # Plain lists: tensors through a queue need their sender alive when they are read.
        grads = [p.grad.detach().cpu().tolist() for p in model.parameters()]
        results.append((loss.item(), grads))
    return results


def _run(world: int, use_cuda: bool, backend: str, tmp: Path, mode: str = "module"):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    exit_barrier = ctx.Barrier(world)
    store = str(tmp / "store")
    # Daemons, terminated on the way out: a rank stuck in a collective after its peer failed
    # must not hold pytest at exit.
    procs = [ctx.Process(target=_worker, args=(r, world, store, use_cuda, backend, mode, queue, exit_barrier),
                         daemon=True)
             for r in range(world)]  # fmt: skip
    try:
        for p in procs:
            p.start()
        out = [_next_result(queue, procs) for _ in procs]
        errors = [r for _, r in out if isinstance(r, str)]
        assert not errors, errors[0]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    return out


def _next_result(queue, procs, timeout_s: float = 180.0):
    """The next worker's result; fails at once, with the exit codes, when a worker died without
    sending one (a crash), instead of waiting out the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=1.0)
        except Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a worker died without a result (exit codes {dead})"
    raise AssertionError(f"no result from the workers within {timeout_s:.0f} s")


def _check(results) -> None:
    results = [
        (rank, [(loss, [torch.tensor(g) for g in grads]) for loss, grads in pair])
        for rank, pair in results
    ]
    for _, ((loss_f, grads_f), (loss_p, grads_p)) in results:
        assert abs(loss_f - loss_p) <= 1e-5 * max(1.0, abs(loss_p))
        for gf, gp in zip(grads_f, grads_p):
            torch.testing.assert_close(gf, gp, rtol=1e-4, atol=1e-6)
    # DDP averaged the gradients: every rank holds the same ones.
    first = results[0][1][0][1]
    for _, ((_, grads), _) in results[1:]:
        for a, b in zip(first, grads):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["module", "fuse"])
def test_ddp_on_cpu_gloo(mode, tmp_path):
    _check(_run(2, use_cuda=False, backend="torch", tmp=tmp_path, mode=mode))


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"DDP over NCCL needs >= 2 GPUs; this machine has {torch.cuda.device_count()}",
)
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_ddp_on_gpus_nccl(backend, tmp_path):
    _check(_run(torch.cuda.device_count(), use_cuda=True, backend=backend, tmp=tmp_path))


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"DDP over NCCL needs >= 2 GPUs; this machine has {torch.cuda.device_count()}",
)
def test_ddp_fuse_on_gpus_nccl(tmp_path):
    """DDP of a dualk.fuse'd nn.Sequential (backend auto) over NCCL: the loss and the averaged
    gradients of the nn.Linear model."""
    _check(_run(torch.cuda.device_count(), use_cuda=True, backend="auto", tmp=tmp_path,
                mode="fuse"))  # fmt: skip
