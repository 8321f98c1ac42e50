"""dualk bench's device timer (dualk.bench.time_device): on fake CUDA primitives (CPU), the order
of flush, sleep and events and the interquartile mean; on a GPU, that a slow launch path is not
timed as kernel time."""

import contextlib
import time

import pytest
import torch
from conftest import HAS_CUDA

import dualk.bench
import dualk.timing


def test_time_device_sleeps_past_the_host_time_and_reports_the_interquartile_mean(monkeypatch):
    """The eager loop on fake CUDA primitives: every timed call comes after a flush and a GPU
    sleep sized from the call's host time, inside its own pair of events, and the row's time is
    the interquartile mean of the samples; the CUDA-graph path falls back to an older Triton's
    quartiles."""
    import triton.testing

    log = []
    clock = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            log.append("record")
            self.t = clock[0]

        def elapsed_time(self, other):
            return other.t - self.t

    class Flush:
        def zero_(self):
            log.append("flush")

    durations = iter([0.00717, 0.00803] * 10_000)

    def fn():
        log.append("call")
        clock[0] += next(durations)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))
    monkeypatch.setattr(dualk.bench, "_flush_buffer", Flush)
    us, iqr = dualk.bench.time_device(fn, rep_ms=5.0)
    first_sleep = next(i for i, x in enumerate(log) if isinstance(x, tuple))
    steady = log[first_sleep - 1 :]
    assert steady[:5] == ["flush", steady[1], "record", "call", "record"]
    cycles = steady[1][1]
    assert cycles >= 10 * dualk.timing.CYCLES_PER_US  # at least the 10 us floor
    assert len(steady) % 5 == 0 and all(
        steady[i : i + 5] == ["flush", ("sleep", cycles), "record", "call", "record"]
        for i in range(0, len(steady), 5)
    )
    assert us == pytest.approx((7.17 + 8.03) / 2, abs=0.01)  # the middle half holds both levels
    assert iqr == pytest.approx(0.86)

    def old_graph_bench(fn, rep=20, quantiles=None, return_mode="mean"):
        assert return_mode in ("min", "max", "mean", "median")
        return [0.0075, 0.0072, 0.0080]  # the median and the two quartiles asked for

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", old_graph_bench)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    assert dualk.bench.time_device(fn, cuda_graph=True) == pytest.approx((7.5, 0.8))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_a_slow_launch_is_not_timed_as_kernel_time():
    """A call that spends 300 us on the host before launching a few-us kernel (more than the
    L2 flush's GPU time, as the Triton GEMM's launch on a slow host) times as its kernel: the GPU
    sleep queued ahead of it outlasts the host time."""
    x = torch.randn(1 << 16, device="cuda")

    def slow_launch():
        end = time.perf_counter() + 300e-6
        while time.perf_counter() < end:
            pass
        return x.add(1.0)

    kernel_us, _ = dualk.bench.time_device(lambda: x.add(1.0), rep_ms=20.0)
    slow_us, _ = dualk.bench.time_device(slow_launch, rep_ms=20.0)
    assert 0 < kernel_us < 50
    assert slow_us < kernel_us + 20, (slow_us, kernel_us)
