"""CUDA-event timing shared by `dualk bench` (bench.time_device) and auto's tuner
(autotune.cuda_event_timer): each timed call comes after an L2 flush and a GPU sleep that
outlasts the call's host time, so the host has queued the call before the GPU reaches it and the
event window holds the kernels only; the samples are summarised by their interquartile mean."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

# The GPU's cycles per microsecond that sleeps are sized with (~1.98 GHz boost on H100 and H200;
# a lower clock only sleeps longer).
CYCLES_PER_US = 2000


def sleep_cycles(host_us: float, at_least_us: float = 0.0) -> int:
    """GPU sleep, in cycles, to queue ahead of a call whose host time is `host_us`: twice that
    plus 10 us (host time scatters), at least `at_least_us`."""
    return int(min(max(2 * host_us + 10, at_least_us) * CYCLES_PER_US, 2**31 - 1))


def sleep_ms(cycles: int) -> float:
    """Milliseconds a GPU sleep of `cycles` adds to a timed call (0 where torch.cuda._sleep is
    missing: timed_calls then does not sleep)."""
    return cycles / CYCLES_PER_US / 1e3 if hasattr(torch.cuda, "_sleep") else 0.0


def timed_calls(
    run: Callable[[], object], reps: int, flush: torch.Tensor | None, cycles: int
) -> list[float]:
    """Device ms of `reps` calls of `run`, each after `flush.zero_()` (when given) and a GPU
    sleep of `cycles` (where torch.cuda._sleep exists), CUDA events around the call. (Host time
    is `burst_host_ms`'s: calls in a row, not calls isolated like these.)"""
    sleep = getattr(torch.cuda, "_sleep", None)
    events = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if flush is not None:
            flush.zero_()
        if sleep is not None:
            sleep(cycles)
        s.record()
        run()
        e.record()
        events.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def burst_host_ms(run: Callable[[], object], calls: int) -> float:
    """Host milliseconds per call over `calls` back-to-back calls without synchronising, as a
    model issues them (then one synchronise, outside the clock)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / calls * 1e3


def isolated_host_ms(run: Callable[[], object], calls: int) -> list[float]:
    """Host milliseconds of each of `calls` calls started on an idle GPU (synchronised before
    each): the host's own cost, which no full launch queue stretches (burst_host_ms's calls of a
    device-bound model wait for room in the queue once it is full). Off the GPU: wall time."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    out = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        run()
        out.append((time.perf_counter() - t0) * 1e3)
    sync()
    return out


def interquartile_mean(samples: list[float]) -> float:
    """The mean of the middle half of the samples (below 4 samples: their median). CUDA-event
    times of a launch-bound call fall on two levels ~0.8 us apart on an H100, and a median lands
    on either by the mix (one kernel measured 7.17 and 7.65 us in one run); this weighs both
    levels and, like the median, ignores the outliers."""
    ordered = sorted(samples)
    n = len(ordered)
    if n < 4:
        return statistics.median(ordered)
    middle = ordered[n // 4 : n - n // 4]
    return sum(middle) / len(middle)
