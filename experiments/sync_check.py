"""Does a dualk call make the host wait for the GPU? (issue 32: BERT's LinearGELU on dualk's path
cost 68-127 us more host time per call inside the model than the original path, although a
standalone measurement put its host time below the original's.)

Method: a long torch.cuda._sleep is queued first, then N calls of the op are enqueued; the host
time of those N calls is printed next to the sleep's length. A call that synchronizes waits for
the sleep (host time ~ the sleep); one that does not costs its launch overhead only. Then the
plain host time per call back to back (the GPU idle, as in a host-bound model), and the same
with the model's neighbours in between (a layer_norm, an add).

    python experiments/sync_check.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import dualk

SLEEP_CYCLES = 20_000_000  # ~10 ms at ~2 GHz


def _host_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def behind_a_sleep(fn, calls: int = 10) -> dict:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(SLEEP_CYCLES)
    queued = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return {
        "host_us_per_call": (enqueued - queued) / calls * 1e6,
        "sleep_to_done_ms": (done - t0) * 1e3,
        "waited": (enqueued - queued) > 0.5 * (done - t0),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bf = torch.bfloat16
    x3 = torch.randn(8, 512, 768, device=dev, dtype=bf)
    x2 = x3.reshape(-1, 768)
    w = torch.randn(3072, 768, device=dev, dtype=bf) * 0.03
    b = torch.randn(3072, device=dev, dtype=bf) * 0.1
    ln_w = torch.ones(768, device=dev, dtype=bf)
    lg = dualk.nn.LinearGELU(768, 3072, approximate="none", backend="cuda", device=dev, dtype=bf)
    mlp_ws = [torch.randn(128, 100, device=dev) * 0.1, torch.randn(10, 128, device=dev) * 0.1]
    mlp_x = torch.randn(32, 100, device=dev)
    cases = {
        "F.gelu(F.linear) (original)": lambda: F.gelu(F.linear(x3, w, b)),
        "dualk.linear_gelu cuda 3-dim": lambda: dualk.linear_gelu(
            x3, w, b, approximate="none", backend="cuda"
        ),
        "dualk.linear_gelu cuda 2-dim": lambda: dualk.linear_gelu(
            x2, w, b, approximate="none", backend="cuda"
        ),
        "dualk.linear_gelu auto 3-dim": lambda: dualk.linear_gelu(x3, w, b, approximate="none"),
        "LinearGELU module (cuda)": lambda: lg(x3),
        "dualk.matmul cuda": lambda: dualk.matmul(x2, w.t(), backend="cuda"),
        "dualk.fused_mlp cuda (seed)": lambda: dualk.fused_mlp(
            mlp_x, mlp_ws, [None, None], backend="cuda"
        ),
    }
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with torch.no_grad():
        for name, fn in cases.items():
            for _ in range(20):  # loaded, tuned, allocator warm
                fn()
            torch.cuda.synchronize()
            res = behind_a_sleep(fn)
            torch.cuda.synchronize()
            res["back_to_back_host_us"] = min(_host_us(fn, 50) for _ in range(3))
            torch.cuda.synchronize()

            def with_neighbours(fn=fn):
                y = F.layer_norm(x3, (768,), ln_w)
                fn()
                return y + 1

            res["with_neighbours_host_us"] = min(_host_us(with_neighbours, 50) for _ in range(3))
            torch.cuda.synchronize()
            out[name] = res
            print(f"{name:32s} {json.dumps({k: round(v, 2) for k, v in res.items()})}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
