"""Seed-model (100-128-64-10, fp32) timing through the library, next to eager PyTorch: the same
do_bench method as `dualk bench`, plus the kernels one call launches (torch.profiler), to compare
with the standalone harness (experiments/mlp_bench.cu), which times the kernel alone."""

import torch

import dualk
from dualk.tools.bench import time_device

torch.manual_seed(0)
widths = (100, 128, 64, 10)
layers = [torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
model = torch.nn.Sequential(
    layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2]
).cuda()
ws = [m.weight.detach() for m in layers]
bs = [m.bias.detach() for m in layers]
for batch in (32, 4096):
    x = torch.randn(batch, widths[0], device="cuda")
    fn = lambda: dualk.ops.fused_mlp(x, ws, bs, activation="relu", backend="cuda")  # noqa: E731
    torch.testing.assert_close(fn(), model(x), rtol=1e-4, atol=1e-4)
    cuda_us, _ = time_device(fn)
    eager_us, _ = time_device(lambda: model(x))
    print(
        f"B{batch}: dualk cuda {cuda_us:.2f} us, eager {eager_us:.2f} us, ratio {eager_us / cuda_us:.2f}x"
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA or "kernel" in evt.key.lower():
            print(f"   {evt.key[:90]:90s} calls {evt.count:3d} avg {evt.device_time:.2f} us")
