"""CPU model of the 3xTF32 fused MLP's error (cuda_src/fused_mlp_tf32.cu), against PyTorch fp32
and dualk's GEMM budget (2 x PyTorch's max error + 4 fp32 ulps of the largest output).

Operands split into hi = tf32(v) (rounded, or truncated for weights) and lo = tf32(v - hi); each
mma sums 8 exact products and rounds toward zero into its accumulator (the pessimistic model of
the tensor core's fp32 accumulation); `steps` k steps of 8 share one accumulator, which is then
added to the running sum in round-to-nearest fp32 (steps=0: one accumulator for the whole k loop).
Usage: python experiments/tf32x3_error_model.py   (a few seconds on a CPU)"""

import torch


def tf32(x, truncate=False):
    i = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    i = (i if truncate else i + 0x1000) & 0xFFFFE000
    return torch.where(i >= 2**31, i - 2**32, i).to(torch.int32).view(torch.float32)


def add_toward_zero(a, b):
    exact = a.double() + b.double()
    s = exact.float()
    return torch.where(s.double().abs() > exact.abs(), torch.nextafter(s, torch.zeros_like(s)), s)


def matmul_3xtf32(h, w, steps, truncate_w):
    k = h.shape[1]
    kp = (k + 7) // 8 * 8
    h, w = torch.nn.functional.pad(h, (0, kp - k)), torch.nn.functional.pad(w, (0, kp - k))
    hh, wh = tf32(h), tf32(w, truncate_w)
    hl, wl = tf32(h - hh), tf32(w - wh)
    acc = torch.zeros(h.shape[0], w.shape[0])
    part = torch.zeros_like(acc)
    for i, k0 in enumerate(range(0, kp, 8)):
        for a, b in ((hl, wh), (hh, wl), (hh, wh)):
            part = add_toward_zero(
                part, (a[:, k0 : k0 + 8].double() @ b[:, k0 : k0 + 8].double().T).float()
            )
        if steps and ((i + 1) % steps == 0 or k0 + 8 == kp):
            acc, part = (acc.double() + part.double()).float(), torch.zeros_like(acc)
    return acc if steps else part


ACTS = {"relu": torch.relu, "silu": torch.nn.functional.silu,
        "gelu": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}  # fmt: skip


def mlp(x, ws, bs, act, mm):
    for i, (w, b) in enumerate(zip(ws, bs)):
        x = mm(x, w) + b
        x = ACTS[act](x) if i < len(ws) - 1 else x
    return x


for widths, m, act in (((100, 128, 64, 10), 4096, "relu"), ((64, 64, 64, 64, 16), 8192, "relu"),
                       ((27 * 4, 52, 100, 160, 12), 2048, "silu"), ((96, 160, 40, 12), 4096, "gelu")):  # fmt: skip
    torch.manual_seed(0)
    x = torch.randn(m, widths[0])
    lins = [torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    ws, bs = [lin.weight.detach() for lin in lins], [lin.bias.detach() for lin in lins]
    ref = mlp(
        x.double(), [w.double() for w in ws], [b.double() for b in bs], act, lambda h, w: h @ w.T
    )
    torch_err = (mlp(x, ws, bs, act, lambda h, w: h @ w.T).double() - ref).abs().max().item()
    budget = 2 * torch_err + 4 * 2**-23 * ref.abs().max().item()
    errs = []
    for steps, trunc in ((0, False), (1, False), (1, True), (4, True)):
        out = mlp(x, ws, bs, act, lambda h, w: matmul_3xtf32(h, w, steps, trunc)).double()
        errs.append(
            f"steps={steps}{' trunc-w' if trunc else ''}: {(out - ref).abs().max().item():.2e}"
        )
    print(
        f"{'-'.join(map(str, widths))} B{m} {act}: torch {torch_err:.2e}, budget {budget:.2e}; "
        + ", ".join(errs)
    )
