"""dualk bench's device timer (dualk.tools.bench.time_device): on fake CUDA primitives (CPU), the order
of flush, sleep and events and the interquartile mean; on a GPU, that a slow launch path is not
timed as kernel time."""

import contextlib
import time
import types

import pytest
import torch
from conftest import HAS_CUDA

import dualk.core.timing
import dualk.tools.bench
from dualk.registry import OPS


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
    monkeypatch.setattr(dualk.tools.bench, "_flush_buffer", Flush)
    us, iqr = dualk.tools.bench.time_device(fn, rep_ms=5.0)
    first_sleep = next(i for i, x in enumerate(log) if isinstance(x, tuple))
    steady = log[first_sleep - 1 :]
    assert steady[:5] == ["flush", steady[1], "record", "call", "record"]
    cycles = steady[1][1]
    assert cycles >= 10 * dualk.core.timing.CYCLES_PER_US  # at least the 10 us floor
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
    assert dualk.tools.bench.time_device(fn, cuda_graph=True) == pytest.approx((7.5, 0.8))


def test_the_tuner_counts_flush_and_sleep_in_its_budget(monkeypatch):
    """auto's timer (measure.cuda_event_timer) on fake CUDA primitives: the repetitions that fit
    its budget are counted with each one's L2 flush and GPU sleep, not the kernel alone (a first
    call on an unseen class took 96 ms of a 60 ms budget on an H100 that way)."""
    from dualk.dispatch import measure

    clock = [0.0]  # GPU milliseconds
    calls = []

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    class Flush:
        def zero_(self):
            clock[0] += 0.05

    def sleep(cycles):
        clock[0] += cycles / dualk.core.timing.CYCLES_PER_US / 1e3

    def kernel():
        calls.append(1)
        clock[0] += 0.02

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", sleep)
    monkeypatch.setattr(measure, "_l2_flush_buffer", Flush)
    # The host clock follows the fake GPU clock: the call counts below follow from the probe's
    # host time, which a busy CI host's real clock would vary.
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: clock[0] / 1e3))
    # The sleep as sized for a fast launch (the real host time of kernel() would vary it)
    monkeypatch.setattr(dualk.core.timing, "sleep_cycles", lambda host_us, at_least_us=0.0: int(at_least_us * dualk.core.timing.CYCLES_PER_US))  # fmt: skip
    device_us, host_us = measure.cuda_event_timer(kernel, "cuda", budget_ms=1.75)
    assert device_us == pytest.approx(20.0) and host_us > 0
    # After the probe (0.02 ms kernel + 0.05 flush + 0.1 sleep, measure._MIN_SLEEP_US): a burst
    # of back-to-back calls in BURST_SHARE of the budget (0.4375 / 0.02 -> 21), then as many
    # flushed and slept calls as the rest holds (1.33 / 0.17 -> 7): within the budget.
    assert len(calls) == 1 + 7 + 21
    assert clock[0] - 0.17 <= 1.75
    # A slow kernel: one timed call and a burst of one, whatever the budget.
    calls.clear()

    def slow_kernel():
        calls.append(1)
        clock[0] += 1.0

    device_us, _ = measure.cuda_event_timer(slow_kernel, "cuda", budget_ms=1.75)
    assert device_us == pytest.approx(1000.0) and len(calls) == 1 + 1 + 1


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

    kernel_us, _ = dualk.tools.bench.time_device(lambda: x.add(1.0), rep_ms=20.0)
    slow_us, _ = dualk.tools.bench.time_device(slow_launch, rep_ms=20.0)
    assert 0 < kernel_us < 50
    assert slow_us < kernel_us + 20, (slow_us, kernel_us)


def test_auto_is_timed_after_its_background_work_settles(monkeypatch):
    """`dualk bench` times "auto" once nothing its decision waits for runs in the background: the
    row's calls made while pending keep going until the tuner is done, then until the decision
    is no longer provisional, then a few more, and the row says how long that took. A run that
    does not settle in time says so in the row's note."""
    bench = dualk.tools.bench
    tune = bench.triton_tune
    pending = {"polls": 3}
    provisional = {"left": 0}

    def background_pending():
        pending["polls"] -= 1
        return pending["polls"] >= 0

    def settle(call, limit_s):
        while background_pending():
            call()
        return True

    def still_provisional(spec, args):
        provisional["left"] -= 1
        return provisional["left"] >= 0

    calls = []
    monkeypatch.setattr(tune, "background_pending", background_pending)
    monkeypatch.setattr(tune, "settle", settle)
    monkeypatch.setattr(bench.autotune, "provisional", still_provisional)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    spec = OPS["linear_gelu"]
    sample = spec.cases[0].make(torch.float32, torch.device("cpu"), torch.Generator())

    def settle_row():
        row = bench.Row("linear_gelu", "c", "s", "float32", "dualk:auto", "dualk")
        return bench._settle_auto(lambda: calls.append(1), row, spec, sample), row

    settled, row = settle_row()
    assert settled is True
    # two calls while pending (final then), three after it settled
    assert len(calls) == 2 + 3
    assert row.settle_s is not None and row.settle_s >= 0

    # nothing pending: no extra calls, no settle time
    calls.clear()
    settled, row = settle_row()
    assert settled is True and calls == [] and row.settle_s is None

    # nothing in the background, but the decision provisional for the first 4 checks (the
    # first is _settle_auto's own): called until it is final, then three more
    calls.clear()
    provisional["left"] = 4
    settled, row = settle_row()
    assert settled is True and len(calls) == 3 + 3 and row.settle_s is not None

    # provisional for ever: stops after SETTLE_CALLS calls and says it did not settle
    calls.clear()
    provisional["left"] = 10**6
    settled, row = settle_row()
    assert settled is False and len(calls) == bench.SETTLE_CALLS + 3

    # never settles within the limit: reported as such
    monkeypatch.setattr(tune, "background_pending", lambda: True)
    monkeypatch.setattr(tune, "settle", lambda call, limit_s: False)
    provisional["left"] = 0
    settled, row = settle_row()
    assert settled is False


@pytest.mark.parametrize("op", sorted(OPS))
def test_settle_asks_auto_with_the_key_arguments(op, monkeypatch):
    """The settle asks autotune.provisional with the implementation's positional arguments, as
    auto keys its decisions: every op's sample (keyword arguments included: linear_glu's
    activation) gives a key. Session 36's first version passed the sample's positional arguments
    alone and every GPU "auto" row of the default suite failed (IndexError, ValueError)."""
    bench = dualk.tools.bench
    asked = []

    def provisional(spec, args):
        asked.append(spec.key(args))
        return False

    monkeypatch.setattr(bench.triton_tune, "background_pending", lambda: False)
    monkeypatch.setattr(bench.autotune, "provisional", provisional)
    spec = OPS[op]
    for case in spec.cases[:2]:
        sample = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        row = bench.Row(op, case.name, sample.label, "float32", "dualk:auto", "dualk")
        assert bench._settle_auto(lambda: None, row, spec, sample) is True
    assert len(asked) == min(2, len(spec.cases)) and all(asked)


def test_settle_waits_again_when_a_load_sends_the_class_back_to_the_tuner(monkeypatch):
    """A call during the provisional wait can put the class back into Triton's tuner (a load that
    would still search): the settle then waits for the tuner again, within SETTLE_S, instead of
    spending its calls in milliseconds and reporting "not settled"."""
    bench = dualk.tools.bench
    state = {"pending": False, "provisional": 2, "settles": 0}

    def settle(call, limit_s):
        state["settles"] += 1
        state["pending"] = False
        return True

    def provisional(spec, args):
        state["provisional"] -= 1
        return state["provisional"] >= 0

    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 1:
            state["pending"] = True  # the first call's load requeued the class

    monkeypatch.setattr(bench.triton_tune, "background_pending", lambda: state["pending"])
    monkeypatch.setattr(bench.triton_tune, "settle", settle)
    monkeypatch.setattr(bench.autotune, "provisional", provisional)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    spec = OPS["linear_gelu"]
    sample = spec.cases[0].make(torch.float32, torch.device("cpu"), torch.Generator())
    row = bench.Row("linear_gelu", "c", "s", "float32", "dualk:auto", "dualk")
    assert bench._settle_auto(fn, row, spec, sample) is True
    assert state["settles"] == 2  # once at the start, once after the requeue


def test_isolated_host_ms_times_each_call():
    """One sample per call, each at least the call's own host time (a 2 ms sleep)."""
    samples = dualk.core.timing.isolated_host_ms(lambda: time.sleep(0.002), 3)
    assert len(samples) == 3 and all(s >= 2.0 for s in samples), samples
