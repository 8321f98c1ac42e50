"""The autotuned backend="auto" (dualk/dispatch/autotune.py) on the CPU: keys and bucketing, the choice of
the fastest candidate by a FAKE timer (no GPU here: candidates are made available by patching
`autotune.candidate_reason`, and cuda/triton stand in as the torch reference), persistence
across processes, corruption recovery, concurrent writers, no timing when it is not allowed, the
hit path's cost, the Triton config store and config pruning, and the `dualk tune` / `dualk cache`
commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import timeit
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import dualk
import dualk.core.timing
from dualk import cli, registry
from dualk.backends import torch_ref
from dualk.dispatch import autotune, heuristic, measure, shared, store
from dualk.registry import OPS

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
TIMES = {"cuda": 3.0, "triton": 2.0, "torch": 5.0}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test has its own cache directory, no DUALK_AUTOTUNE and an empty memory."""
    monkeypatch.setenv("DUALK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DUALK_AUTOTUNE", raising=False)
    autotune.clear_memory()
    yield
    autotune.set_timer(None)
    autotune.clear_memory()


class FakeTimer:
    """Preset microseconds per backend; counts calls; runs the call once like a real timer."""

    def __init__(self, times=None):
        self.times = dict(TIMES if times is None else times)
        self.calls: list[str] = []

    def __call__(self, run, backend, budget_ms):
        assert 0 < budget_ms <= autotune.TUNE_BUDGET_MS
        self.calls.append(backend)
        run()
        return self.times[backend]


@pytest.fixture
def fake_gpu(monkeypatch):
    """Every backend is a candidate on the CPU; cuda and triton run the torch reference; returns
    the installed FakeTimer."""
    monkeypatch.setattr(autotune, "candidate_reason", lambda backend, device: None)
    for spec in OPS.values():
        for name in ("cuda", "triton"):
            monkeypatch.setitem(spec._resolved, name, spec.reference)
    timer = FakeTimer()
    autotune.set_timer(timer)
    return timer


def no_timer(run, backend, budget_ms):
    raise AssertionError(f"timed {backend} although timing is not allowed")


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def add_args(n, dtype=torch.float32):
    return (r(n, dtype=dtype), r(n, dtype=dtype), 1.0)


def mlp_args(batch, widths, bias=True, activation="relu"):
    weights = [r(o, i) * 0.1 for i, o in zip(widths[:-1], widths[1:])]
    biases = [r(o) if bias else None for o in widths[1:]]
    return (r(batch, widths[0]), weights, biases, activation)


def key(op, args):
    return autotune.make_key(OPS[op], args)


def cache_files(tmp_path) -> list[Path]:
    directory = tmp_path / "cache" / "autotune"
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


# ---------------------------------------------------------------------------- keys
def test_elementwise_keys_bucket_numel_and_keep_layout_flags():
    assert key("add", add_args(1000)) == key("add", add_args(1024))
    assert key("add", add_args(1024)) != key("add", add_args(1025))
    assert key("add", add_args(1000)) != key("add", add_args(1000, torch.float16))
    bcast = (r(16, 1, 33), r(9, 33), 1.0)
    assert key("add", bcast) != key("add", (r(16, 9, 33), r(16, 9, 33), 1.0))
    strided = (r(33, 64)[:, ::2], r(33, 32), 1.0)
    assert key("add", strided) != key("add", (r(33, 32), r(33, 32), 1.0))
    assert key("add", add_args(0)) != key("add", add_args(1)) != key("add", add_args(2))
    # Scalars do not change the cost, so they are not part of the key.
    assert key("add", (*add_args(64)[:2], -2.0)) == key("add", add_args(64))
    assert key("relu_scale", (r(300), 1.5)) == key("relu_scale", (r(512), -0.5))
    assert key("relu_scale", (r(40, 24).t(), 1.5)) != key("relu_scale", (r(24, 40), 1.5))
    text = autotune.key_string(key("add", bcast))
    assert text == "add|float32|n<=1024|broadcast|layout=c", text  # 16 * 33


def test_matrix_keys_round_rows_up_and_keep_k_n_and_parameters_exact(monkeypatch):
    mm = lambda m, k, n, **kw: key("matmul", (r(m, k), r(k, n)))  # noqa: E731
    assert mm(100, 64, 32) == mm(128, 64, 32)
    assert mm(100, 64, 32) != mm(129, 64, 32)
    assert mm(100, 64, 32) != mm(100, 65, 32) != mm(100, 64, 33)
    assert key("matmul", (r(3, 20, 8), r(3, 8, 4))) == key("matmul", (r(4, 17, 8), r(4, 8, 4)))
    assert key("matmul", (r(3, 20, 8), r(8, 4))) != key("matmul", (r(3, 20, 8), r(3, 8, 4)))
    assert key("matmul", (r(8, 20).t(), r(8, 4))) != key("matmul", (r(20, 8), r(8, 4)))

    def lg(shape, n=16, bias=True, approximate="tanh"):
        x = r(*shape)
        return key("linear_gelu", (x, r(n, shape[-1]), r(n) if bias else None, approximate))

    assert lg((30, 24)) == lg((32, 24)) == lg((2, 16, 24))
    assert lg((30, 24)) != lg((33, 24))
    assert lg((30, 24)) != lg((30, 24), n=17)
    assert lg((30, 24)) != lg((30, 24), bias=False)
    assert lg((30, 24)) != lg((30, 24), approximate="none")
    assert autotune.key_string(key("linear_gelu", (r(32, 768), r(3072, 768), None, "tanh"))) == (
        "linear_gelu|float32|m<=32|k=768|n=3072|no-bias|tanh|layout=cc"
    )

    seed = (100, 128, 64, 10)
    assert key("fused_mlp", mlp_args(20, seed)) == key("fused_mlp", mlp_args(32, seed))
    assert key("fused_mlp", mlp_args(20, seed)) != key("fused_mlp", mlp_args(33, seed))
    assert key("fused_mlp", mlp_args(20, seed)) != key("fused_mlp", mlp_args(20, (100, 64, 10)))
    assert key("fused_mlp", mlp_args(20, seed)) != key("fused_mlp", mlp_args(20, seed, bias=False))
    assert key("fused_mlp", mlp_args(20, seed)) != key(
        "fused_mlp", mlp_args(20, seed, activation="gelu")
    )
    assert autotune.key_string(key("fused_mlp", mlp_args(4096, seed))) == (
        "fused_mlp|float32|m<=4096|w=100-128-64-10|bias=111|relu|layout=c"
    )

    # fp32 with TF32 allowed is its own class for the matrix ops (not for elementwise ones).
    plain = mm(64, 64, 64)
    monkeypatch.setattr(registry, "tf32_allowed", lambda: True)
    assert mm(64, 64, 64) != plain
    assert "float32+tf32" in autotune.key_string(mm(64, 64, 64))
    assert key("add", add_args(64))[3] is False


def test_implementation_args_follow_the_registry_samples():
    for spec in OPS.values():
        case = next(c for c in spec.cases if not c.gpu_only and c.name != "empty")
        sample = case.make(torch.float32, CPU, torch.Generator().manual_seed(0))
        args = autotune.implementation_args(spec, sample.args, sample.kwargs)
        out = spec.implementation("torch")(*args)
        torch.testing.assert_close(out, spec.reference(*sample.args, **sample.kwargs))
        autotune.make_key(spec, args)  # every op's key accepts them


# ---------------------------------------------------------------------------- choosing
def test_cpu_tensors_run_torch_without_timing_or_disk(tmp_path):
    autotune.set_timer(no_timer)
    for spec in OPS.values():
        case = next(c for c in spec.cases if not c.gpu_only)
        s = case.make(torch.float32, CPU, torch.Generator().manual_seed(0))
        args = autotune.implementation_args(spec, s.args, s.kwargs)
        assert autotune.choose(spec, args) == "torch"
        info = autotune.explain(spec, args)
        assert info["source"] == "only candidate"
        assert "interpreter" in info["rejected"]["triton"]
        assert "CUDA" in info["rejected"]["cuda"]
    assert cache_files(tmp_path) == []


class SequenceTimer(FakeTimer):
    """Each backend's timings in turn (the last one repeated)."""

    def __init__(self, sequences):
        super().__init__()
        self.sequences = {b: list(v) for b, v in sequences.items()}

    def __call__(self, run, backend, budget_ms):
        super().__call__(run, backend, budget_ms)
        seq = self.sequences[backend]
        return seq.pop(0) if len(seq) > 1 else seq[0]


def test_close_millisecond_calls_get_a_second_look(fake_gpu):
    """Two candidates of a millisecond or more within 15% of each other are timed again in more
    passes: a slow first look at the faster one does not decide."""
    timer = SequenceTimer({"cuda": [1700.0] * 3 + [1620.0], "triton": [1600.0] * 3 + [1820.0],
                           "torch": [5000.0]})  # fmt: skip
    autotune.set_timer(timer)
    assert autotune.choose(OPS["add"], add_args(1000)) == "cuda"
    rounds = measure.SECOND_LOOK_ROUNDS
    assert (
        timer.calls
        == ["cuda", "triton", "torch"] * autotune.TUNE_ROUNDS + ["triton", "cuda"] * rounds
    )


@pytest.mark.parametrize("times", [{"cuda": 900.0, "triton": 880.0, "torch": 5000.0},
                                   {"cuda": 2000.0, "triton": 1600.0, "torch": 5000.0}])  # fmt: skip
def test_no_second_look_for_short_or_distant_calls(fake_gpu, times):
    fake_gpu.times = times
    assert autotune.choose(OPS["add"], add_args(1000)) == "triton"
    assert len(fake_gpu.calls) == 3 * autotune.TUNE_ROUNDS


@pytest.mark.parametrize("winner", ["cuda", "triton", "torch"])
def test_winner_is_the_fastest_and_a_class_is_timed_once(fake_gpu, tmp_path, winner):
    fake_gpu.times = {b: (1.0 if b == winner else 4.0 + i) for i, b in enumerate(TIMES)}
    spec = OPS["add"]
    assert autotune.choose(spec, add_args(1000)) == winner
    # TUNE_ROUNDS passes, each taking every candidate in turn (clock drift falls on all alike)
    assert fake_gpu.calls == ["cuda", "triton", "torch"] * autotune.TUNE_ROUNDS
    assert autotune.choose(spec, add_args(1000)) == winner
    assert autotune.choose(spec, add_args(600)) == winner  # same class: no timing
    assert len(fake_gpu.calls) == 3 * autotune.TUNE_ROUNDS
    info = autotune.explain(spec, add_args(1024))
    assert info["source"] == "tuned" and info["backend"] == winner
    assert info["times_us"] == fake_gpu.times
    autotune.choose(spec, add_args(5000))  # another class is timed
    assert len(fake_gpu.calls) == 6 * autotune.TUNE_ROUNDS
    (path,) = cache_files(tmp_path)
    entries = json.loads(path.read_text())["entries"]["backend"]
    assert entries["add|float32|n<=1024|same-shape|layout=c"]["winner"] == winner


def test_warm_up_call_is_untimed_and_inputs_are_not_modified(fake_gpu, monkeypatch):
    events = []

    def impl(backend):
        def run(*args):
            events.append(("call", backend))
            return torch_ref.relu_scale(*args)

        return run

    spec = OPS["relu_scale"]
    for b in ("cuda", "triton", "torch"):
        monkeypatch.setitem(spec._resolved, b, impl(b))

    def timer(run, backend, budget_ms):
        events.append(("timer", backend))
        run()
        return TIMES[backend]

    autotune.set_timer(timer)
    x = r(100)
    before = x.clone()
    assert autotune.choose(spec, (x, 2.0)) == "triton"
    assert torch.equal(x, before)
    # Every candidate's untimed call comes before any timing, then the passes take them in turn.
    untimed = [("call", b) for b in ("cuda", "triton", "torch")]
    assert events[:3] == untimed
    timed = [("timer", b) if i % 2 == 0 else ("call", b)
             for b in ("cuda", "triton", "torch") for i in range(2)]  # fmt: skip
    assert events[3:] == timed * autotune.TUNE_ROUNDS


def test_a_candidate_that_raises_is_skipped_with_its_reason(fake_gpu, monkeypatch, tmp_path):
    def broken(*args):
        raise RuntimeError("kernel exploded")

    spec = OPS["matmul"]
    monkeypatch.setitem(spec._resolved, "triton", broken)  # the fastest by the fake timer
    args = (r(64, 32), r(32, 16))
    assert autotune.choose(spec, args) == "cuda"
    info = autotune.explain(spec, args)
    assert "kernel exploded" in info["rejected"]["triton"]
    assert set(info["times_us"]) == {"cuda", "torch"}
    (path,) = cache_files(tmp_path)
    (entry,) = json.loads(path.read_text())["entries"]["backend"].values()
    assert "RuntimeError" in entry["rejected"]["triton"]


def test_every_candidate_raising_falls_back_to_torch_unrecorded(fake_gpu, monkeypatch, tmp_path):
    def broken(*args):
        raise RuntimeError("no")

    spec = OPS["add"]
    for b in ("cuda", "triton", "torch"):
        monkeypatch.setitem(spec._resolved, b, broken)
    assert autotune.choose(spec, add_args(8)) == "torch"
    assert cache_files(tmp_path) == []


# ---------------------------------------------------------------------------- no timing
@pytest.mark.parametrize("how", ["env", "compiling", "capturing"])
def test_no_timing_when_not_allowed_cached_winner_else_heuristic(fake_gpu, monkeypatch, how):
    fake_gpu.times = {"cuda": 1.0, "triton": 2.0, "torch": 3.0}  # heuristic would say torch
    spec = OPS["add"]
    tuned_args, new_args = add_args(100), add_args(10_000)
    assert autotune.choose(spec, tuned_args) == "cuda"
    mlp_small, mlp_wide = mlp_args(32, (100, 128, 64, 10)), mlp_args(32, (256, 256, 10))
    autotune.set_timer(no_timer)
    blocked = [True]
    if how == "env":
        monkeypatch.setenv("DUALK_AUTOTUNE", "0")
    elif how == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: blocked[0])
    else:
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: blocked[0])

    assert autotune.choose(spec, tuned_args) == "cuda"  # cached winner (memory)
    autotune.clear_memory()
    assert autotune.choose(spec, tuned_args) == "cuda"  # cached winner (disk)
    assert autotune.explain(spec, tuned_args)["source"] == "cache"
    assert autotune.choose(spec, new_args) == "torch"  # heuristic
    info = autotune.explain(spec, new_args)
    assert info["source"] == "heuristic" and "bandwidth" in info["rule"]
    assert "not timed" in info["reason"]
    assert autotune.choose(OPS["fused_mlp"], mlp_small) == "cuda"
    assert autotune.choose(OPS["fused_mlp"], mlp_wide) == "torch"
    assert autotune.choose(OPS["matmul"], (r(8, 8), r(8, 8))) == "torch"
    assert autotune.choose(OPS["linear_gelu"], (r(8, 8), r(4, 8), None, "tanh")) == "torch"

    # The heuristic was not stored as tuned: allowed again, the next call times.
    blocked[0] = False
    monkeypatch.delenv("DUALK_AUTOTUNE", raising=False)
    timer = FakeTimer({"cuda": 1.0, "triton": 2.0, "torch": 3.0})
    autotune.set_timer(timer)
    assert autotune.choose(spec, new_args) == "cuda"
    assert len(timer.calls) == 3 * autotune.TUNE_ROUNDS


def test_one_slow_pass_does_not_decide_and_a_candidate_failing_later_is_dropped(fake_gpu):
    """Each candidate's time is the median of its passes; one raising in a later pass is
    rejected with its reason, not timed with the passes it had."""
    passes = {"cuda": iter([1.0, 9.0, 1.0]), "triton": iter([2.0, 2.0, 2.0]),
              "torch": iter([0.5, RuntimeError("lost the GPU"), 0.5])}  # fmt: skip
    assert autotune.TUNE_ROUNDS == 3

    def timer(run, backend, budget_ms):
        value = next(passes[backend])
        if isinstance(value, Exception):
            raise value
        return value

    autotune.set_timer(timer)
    assert autotune.choose(OPS["add"], add_args(100)) == "cuda"
    info = autotune.explain(OPS["add"], add_args(100))
    assert info["times_us"] == {"cuda": 1.0, "triton": 2.0}
    assert "lost the GPU" in info["rejected"]["torch"]


def test_device_and_host_times_score_and_are_explained(fake_gpu):
    """A real timer answers (device, host) medians. The host time the cheapest path needs is paid
    whichever runs; beyond it, host time counts once it exceeds the candidate's kernel: a fast
    kernel behind a slow launch path loses, and close launch costs leave the kernels to decide
    (an H100 run had picked a kernel 1.5x slower on the GPU for 1 us less host time)."""
    parts = {"cuda": (14.6, 27.5), "triton": (11.6, 85.4), "torch": (9.1, 28.7)}
    autotune.set_timer(lambda run, backend, budget_ms: parts[backend])
    args = add_args(100)
    assert autotune.choose(OPS["add"], args) == "torch"
    info = autotune.explain(OPS["add"], args)
    # floor 27.5: cuda max(14.6, 0), triton max(11.6, 57.9), torch max(9.1, 1.2)
    assert info["times_us"] == pytest.approx({"cuda": 14.6, "triton": 57.9, "torch": 9.1})
    assert info["device_host_us"] == {b: list(p) for b, p in parts.items()}
    text = str(dualk.explain("add", args[0], args[1], backend="auto"))
    assert "triton 57.9 us (device 11.6, host 85.4)" in text
    autotune.clear_memory()  # the next process reads both from disk
    assert autotune.explain(OPS["add"], args)["device_host_us"]["cuda"] == [14.6, 27.5]

    # Kernels within the tie margin (3%, at least 0.25 us): the cheaper launch wins.
    assert autotune.pick({"cuda": (2.3, 2.3, 9.4), "torch": (2.4, 2.4, 8.6)}) == "torch"
    assert autotune.pick({"cuda": (100.0, 100.0, 9.0), "torch": (102.9, 102.9, 8.0)}) == "torch"
    assert autotune.pick({"cuda": (100.0, 100.0, 9.0), "torch": (103.5, 103.5, 8.0)}) == "cuda"

    # A launch slower than the cheapest by more than its kernel decides against it.
    assert autotune.scores({"a": (5.0, 40.0), "b": (8.0, 10.0)}) == {
        "a": (30.0, 5.0, 40.0), "b": (8.0, 8.0, 10.0)}  # fmt: skip


def test_host_time_is_the_least_over_the_passes(fake_gpu):
    """Host noise only adds time, so one quiet burst of three must be enough: an H100 whose host
    was busy read cuBLASLt's host time at 47.3 us per call (the bench's bursts: ~30), and auto ran
    a kernel 1.5x slower on the GPU. Device time stays the median of the passes."""
    passes = {"cuda": iter([(14.3, 33.5), (14.4, 34.0), (14.2, 36.1)]),
              "triton": iter([(20.0, 60.0), (20.0, 61.0), (20.0, 62.0)]),
              "torch": iter([(9.3, 52.0), (9.2, 50.0), (9.4, 30.0)])}  # fmt: skip

    def timer(run, backend, budget_ms):
        return next(passes[backend])

    autotune.set_timer(timer)
    args = add_args(100)
    # With medians: floor 34.0, torch max(9.3, 50.0 - 34.0) = 16.0 > cuda 14.3, and cuda won.
    assert autotune.choose(OPS["add"], args) == "torch"
    info = autotune.explain(OPS["add"], args)
    assert info["device_host_us"] == {"cuda": [14.3, 33.5], "triton": [20.0, 60.0],
                                      "torch": [9.3, 30.0]}  # fmt: skip
    assert info["times_us"] == pytest.approx({"cuda": 14.3, "triton": 30.0, "torch": 9.3})


def test_interquartile_mean_weighs_both_levels_and_ignores_outliers():
    """Two-level samples (a launch-bound kernel's CUDA-event times): the median jumps with the
    mix, the interquartile mean moves with it smoothly; an outlier changes neither."""
    iqm = dualk.core.timing.interquartile_mean
    assert iqm([7.17] * 49 + [8.03] * 51) == pytest.approx(7.17 * 24 / 50 + 8.03 * 26 / 50)
    assert iqm([7.17] * 51 + [8.03] * 49) == pytest.approx(7.17 * 26 / 50 + 8.03 * 24 / 50)
    assert iqm([1.0] * 7 + [50.0]) == 1.0
    assert iqm([5.0, 100.0, 5.0]) == 5.0  # below 4 samples: the median
    assert iqm([3.0]) == 3.0


def test_explain_without_tune_runs_nothing(fake_gpu):
    autotune.set_timer(no_timer)
    info = autotune.explain(OPS["add"], add_args(100), tune=False)
    assert info["source"] == "heuristic" and info["pending"] is True
    assert info["backend"] == "torch"


# ---------------------------------------------------------------------------- disk
SUBPROCESS = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import torch
    from dualk.dispatch import autotune
    from dualk.registry import OPS

    sizes = json.loads(sys.argv[1])
    barrier = sys.argv[2] if len(sys.argv) > 2 else None
    calls = []

    def timer(run, backend, budget_ms):
        calls.append(backend)
        return {"cuda": 3.0, "triton": 2.0, "torch": 5.0}[backend]

    autotune.set_timer(timer)
    autotune.candidate_reason = lambda backend, device: None
    spec = OPS["add"]
    spec._resolved.update(cuda=spec.reference, triton=spec.reference)
    if barrier:  # start writing together
        Path(barrier, str(sizes[0])).touch()
        deadline = time.time() + 60
        while len(list(Path(barrier).iterdir())) < 4 and time.time() < deadline:
            time.sleep(0.005)
    winners, sources = [], []
    for n in sizes:
        a = torch.randn(n)
        winners.append(autotune.choose(spec, (a, a, 1.0)))
        sources.append(autotune.explain(spec, (a, a, 1.0))["source"])
    print(json.dumps({"calls": len(calls), "winners": winners, "sources": sources}))
    """
)


def run_child(tmp_path, sizes, *extra, wait=True):
    env = {**os.environ, "DUALK_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DUALK_AUTOTUNE", None)
    cmd = [sys.executable, "-c", SUBPROCESS, json.dumps(sizes), *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not wait:
        return proc
    return finish(proc)


def finish(proc) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def test_tuning_persists_across_processes(tmp_path):
    sizes = [100, 3000, 70_000]
    first = run_child(tmp_path, sizes)
    assert first["calls"] == 9 * autotune.TUNE_ROUNDS and first["winners"] == ["triton"] * 3
    assert first["sources"] == ["tuned"] * 3
    second = run_child(tmp_path, [*sizes, 90])  # 90: same class as 100
    assert second["calls"] == 0, "the second process timed again"
    assert second["winners"] == ["triton"] * 4
    assert second["sources"] == ["cache"] * 4


def test_concurrent_writers_lose_nothing(tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    groups = [[2**e + 1 for e in range(i, 24, 4)] for i in range(4)]  # 4 x 6 distinct classes
    procs = [run_child(tmp_path, g, str(barrier), wait=False) for g in groups]
    results = [finish(p) for p in procs]
    assert all(res["calls"] == 3 * len(g) * autotune.TUNE_ROUNDS for res, g in zip(results, groups))
    (path,) = cache_files(tmp_path)
    data = json.loads(path.read_text())  # valid JSON
    keys = set(data["entries"]["backend"])
    expected = {autotune.key_string(key("add", (r(n), r(n), 1.0))) for g in groups for n in g}
    assert expected <= keys, sorted(expected - keys)
    assert len(keys) == 24
    assert not list(path.parent.glob("*.tmp")) and not list(path.parent.glob(".*.tmp"))


def _valid_file_text() -> bytes:
    fp = autotune.fingerprint(CPU)
    entry = {"winner": "cuda", "times_us": {"cuda": 1.0, "triton": 2.0, "torch": 3.0}}
    data = {
        "schema": autotune.SCHEMA,
        "fingerprint": fp,
        "entries": {"backend": {"add|float32|n<=8|same-shape|layout=c": entry}},
    }
    return json.dumps(data, indent=1).encode()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_schema", "not_utf8", "list"])
def test_a_bad_cache_file_is_set_aside_with_one_warning(fake_gpu, tmp_path, damage):
    path = autotune.cache_file(CPU)
    path.parent.mkdir(parents=True)
    good = _valid_file_text()
    bad = {
        "garbage": b"this is not json {",
        "truncated": good[: len(good) // 2],
        "wrong_schema": good.replace(b'"schema": 1', b'"schema": 999'),
        "not_utf8": b"\xff\xfe\x00garbage",
        "list": b"[1, 2, 3]",
    }[damage]
    path.write_bytes(bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert autotune.choose(OPS["add"], add_args(8)) == "triton"  # tuned again
        assert autotune.choose(OPS["add"], add_args(3000)) == "triton"
    mine = [w for w in caught if issubclass(w.category, autotune.AutotuneCacheWarning)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert "unusable" in str(mine[0].message)
    (aside,) = path.parent.glob(path.name + ".corrupt-*")
    assert aside.read_bytes() == bad
    data = json.loads(path.read_text())  # rebuilt
    assert data["schema"] == autotune.SCHEMA and len(data["entries"]["backend"]) == 2


def test_a_good_cache_file_is_read(fake_gpu):
    path = autotune.cache_file(CPU)
    path.parent.mkdir(parents=True)
    path.write_bytes(_valid_file_text())
    autotune.set_timer(no_timer)
    assert autotune.choose(OPS["add"], add_args(7)) == "cuda"


def test_an_unwritable_cache_dir_warns_once_and_keeps_working(fake_gpu, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DUALK_CACHE_DIR", str(blocker))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert autotune.choose(OPS["add"], add_args(8)) == "triton"
        assert autotune.choose(OPS["add"], add_args(3000)) == "triton"
    mine = [w for w in caught if issubclass(w.category, autotune.AutotuneCacheWarning)]
    assert len(mine) == 1 and "cannot write" in str(mine[0].message)
    assert len(fake_gpu.calls) == 6 * autotune.TUNE_ROUNDS
    assert autotune.choose(OPS["add"], add_args(8)) == "triton"  # remembered in memory
    assert len(fake_gpu.calls) == 6 * autotune.TUNE_ROUNDS


def test_a_new_source_or_device_fingerprint_is_a_new_file(monkeypatch):
    name = autotune.cache_file(CPU).name
    fp = dict(autotune.fingerprint(CPU))
    monkeypatch.setitem(store._device_fingerprints, "cpu", {**fp, "dualk_source": "0" * 16})
    assert autotune.cache_file(CPU).name != name
    assert len(autotune.source_hash()) == 16
    names = {p.name for p in autotune.source_files()}
    assert {"autotune.py", "matmul.py", "binding_gemm.cpp", "cuda_build.py"} <= names


# ---------------------------------------------------------------------------- hit path
def test_hit_path_cost():
    a, b = r(1000), r(1000)
    args = (a, b, 1.0)
    spec = OPS["add"]
    assert autotune.choose(spec, args) == "torch"
    n = 20_000
    choose_us = min(timeit.repeat(lambda: autotune.choose(spec, args), number=n, repeat=5)) / n
    direct = spec.implementation("torch")
    direct_us = min(timeit.repeat(lambda: direct(*args), number=n, repeat=5)) / n
    print(
        f"\nautotune.choose hit path: {choose_us * 1e6:.2f} us per call "
        f"(direct torch add of 1000 floats: {direct_us * 1e6:.2f} us)"
    )
    assert choose_us < 20e-6


# ------------------------------------------------------- the exact-signature table (ops.py)
@pytest.fixture
def ran(fake_gpu, monkeypatch):
    """fake_gpu, and every backend of every op records its name in the returned list before
    running the reference; named backends are available too."""
    from dualk import dispatch

    monkeypatch.setattr(dispatch, "unavailable_reason", lambda backend, device, op=None: None)
    monkeypatch.setattr(
        "dualk.runtime.operators.mlp_fallback_reason", lambda backend, x, weights: None
    )
    calls: list[str] = []
    for op in OPS:
        spec = OPS[op]
        for b in ("cuda", "triton", "torch"):

            def run(*args, b=b, ref=spec.reference):
                calls.append(b)
                return ref(*args)

            monkeypatch.setitem(spec._resolved, b, run)
    return calls


def plant(op, args, backend):
    """auto's remembered decision for args' key, as a timing would leave it."""
    k = key(op, args)
    autotune._remember(k, {"op": op, "key": autotune.key_string(k), "backend": backend})


def last_backend(ran, fn):
    ran.clear()
    fn()
    return ran[-1]


def test_exact_table_follows_new_decisions_clears_and_tuning(ran, monkeypatch):
    import dualk

    a, b = r(100), r(100)
    call = lambda: dualk.add(a, b)  # noqa: E731
    assert last_backend(ran, call) == "triton"  # timed: the fake timer's fastest
    assert "triton" in autotune.exact_hits.values()
    assert last_backend(ran, call) == "triton"  # the table's answer
    plant("add", (a, b, 1.0), "cuda")  # a new decision for the key empties the table
    assert autotune.exact_hits == {}
    assert last_backend(ran, call) == "cuda"
    assert last_backend(ran, call) == "cuda"
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)
    res = CliRunner().invoke(cli.main, ["cache", "clear"])  # memory and files
    assert res.exit_code == 0, res.output
    assert autotune.exact_hits == {}
    autotune.set_timer(FakeTimer({"cuda": 1.0, "triton": 2.0, "torch": 3.0}))
    assert last_backend(ran, call) == "cuda"  # timed again
    autotune.set_timer(FakeTimer({"cuda": 3.0, "triton": 2.0, "torch": 1.0}))
    autotune.tune(OPS["add"], (a, b, 1.0), force=True)  # `dualk tune --force`
    assert last_backend(ran, call) == "torch"


def _one_call(op):
    """call(backend) of `op` on CPU-sized arguments drawn once (every call the same shapes)."""
    import dualk as dk

    a, b, x, w, bias, m = r(64), r(64), r(8, 16), r(32, 16), r(32), r(16, 32)
    mlp = mlp_args(8, [16, 32, 8])
    return {
        "add": lambda be: dk.add(a, b, backend=be),
        "relu_scale": lambda be: dk.relu_scale(a, 2.0, backend=be),
        "matmul": lambda be: dk.matmul(x, m, backend=be),
        "linear_gelu": lambda be: dk.linear_gelu(x, w, bias, backend=be),
        "fused_mlp": lambda be: dk.fused_mlp(*mlp[:3], backend=be),
        "linear_glu": lambda be: dk.linear_glu(x, w, w, bias, None, backend=be),
    }[op]


@pytest.mark.parametrize("op", list(OPS))
def test_exact_table_never_outranks_an_override(op, ran, monkeypatch, tmp_path):
    """Every operator's auto fast path (an exact-hit table answer) yields to each override
    source set after the first calls: the op's variable, DUALK_BACKEND, use_backend,
    set_default_backend and the config file; a named backend too."""
    import dualk

    run = _one_call(op)
    call = lambda: run("auto")  # noqa: E731

    def ran_cuda(call):
        """ "cuda" when the op has a CUDA kernel; else the override must still win: it raises
        (linear_glu has none yet) rather than take the table's answer."""
        if "cuda" in OPS[op].backends:
            return last_backend(ran, call)
        with pytest.raises(dualk.BackendUnavailableError, match="no CUDA kernel"):
            call()
        return "cuda"

    assert last_backend(ran, call) == "triton"
    assert last_backend(ran, call) == "triton"  # from the table
    assert autotune.exact_hits
    monkeypatch.setenv(f"DUALK_BACKEND_{op.upper()}", "torch")  # set after the first calls
    assert last_backend(ran, call) == "torch"
    monkeypatch.delenv(f"DUALK_BACKEND_{op.upper()}")
    monkeypatch.setenv("DUALK_BACKEND", "cuda")
    assert ran_cuda(call) == "cuda"
    monkeypatch.delenv("DUALK_BACKEND")
    with dualk.use_backend("torch"):
        assert last_backend(ran, call) == "torch"
    dualk.set_default_backend("cuda")
    try:
        assert ran_cuda(call) == "cuda"
    finally:
        dualk.set_default_backend(None)
    config = tmp_path / "dualk.toml"
    config.write_text(f'[backend]\n{op} = "torch"\n')
    monkeypatch.setenv("DUALK_CONFIG", str(config))
    dualk.dispatch.config.reload()
    try:
        assert last_backend(ran, call) == "torch"
    finally:
        monkeypatch.delenv("DUALK_CONFIG")
        dualk.dispatch.config.reload()
    assert last_backend(ran, call) == "triton"  # and the table's answer stands again
    assert ran_cuda(lambda: run("cuda")) == "cuda"


@pytest.mark.parametrize(
    "op, first, second",
    [
        ("add", lambda: (r(32, 32), r(32, 32), 1.0), lambda: (r(32, 64)[:, ::2], r(32, 32), 1.0)),
        ("add", lambda: (r(32, 32), r(32, 32), 1.0), lambda: (r(32, 33), r(32, 33), 1.0)),
        ("add", lambda: (r(64), r(64), 1.0),
         lambda: (r(64, dtype=torch.float16), r(64, dtype=torch.float16), 1.0)),
        ("relu_scale", lambda: (r(40, 24), 2.0), lambda: (r(24, 40).t(), 2.0)),
        ("relu_scale", lambda: (r(64), 2.0), lambda: (r(64, dtype=torch.bfloat16), 2.0)),
        ("linear_gelu", lambda: (r(8, 16), r(32, 16), None, "tanh"),
         lambda: (r(8, 16), r(32, 16), r(32), "tanh")),
        ("linear_gelu", lambda: (r(8, 16), r(32, 16), None, "tanh"),
         lambda: (r(8, 16), r(32, 16), None, "none")),
        ("linear_gelu", lambda: (r(8, 16), r(32, 16), None, "tanh"),
         lambda: (r(16, 8).t(), r(32, 16), None, "tanh")),
        ("linear_gelu", lambda: (r(8, 16), r(32, 16), None, "tanh"),
         lambda: (r(8, 16), r(16, 32).t(), None, "tanh")),
        ("linear_gelu", lambda: (r(8, 16), r(32, 16), None, "tanh"),
         lambda: (r(9, 16), r(32, 16), None, "tanh")),
        ("matmul", lambda: (r(8, 16), r(16, 32)), lambda: (r(16, 8).t(), r(16, 32))),
        ("matmul", lambda: (r(8, 16), r(16, 32)), lambda: (r(8, 16), r(32, 16).t())),
        ("matmul", lambda: (r(8, 16), r(16, 32)), lambda: (r(8, 16), r(16, 33))),
        ("matmul", lambda: (r(8, 16), r(16, 32)), lambda: (r(2, 8, 16), r(16, 32))),
        ("matmul", lambda: (r(8, 16), r(16, 32)), lambda: (r(9, 16), r(16, 32))),
        ("matmul", lambda: (r(8, 16), r(16, 32)),
         lambda: (r(8, 16, dtype=torch.float16), r(16, 32, dtype=torch.float16))),
        ("fused_mlp", lambda: mlp_args(8, [16, 32, 8]), lambda: mlp_args(8, [16, 32, 8], bias=False)),
        ("fused_mlp", lambda: mlp_args(8, [16, 32, 8]),
         lambda: mlp_args(8, [16, 32, 8], activation="gelu")),
        ("fused_mlp", lambda: mlp_args(8, [16, 32, 8]), lambda: mlp_args(8, [16, 32, 9])),
        ("fused_mlp", lambda: mlp_args(8, [16, 32, 8]), lambda: mlp_args(8, [16, 24, 8])),
        ("fused_mlp", lambda: mlp_args(8, [16, 32, 8]), lambda: mlp_args(9, [16, 32, 8])),
        ("fused_mlp", lambda: mlp_args(8, [16, 32, 8]),
         lambda: (r(16, 8).t(), *mlp_args(8, [16, 32, 8])[1:])),
        ("fused_mlp", lambda: mlp_args(8, [16, 32, 8]), lambda: mlp_args(8, [16, 32, 32, 8])),
    ],
)  # fmt: skip
def test_exact_table_entries_of_other_keys_never_answer(ran, op, first, second):
    """Calls of different keys (layout, bucket, dtype, bias, approximate) get their own
    decision, whatever the table holds for the other."""
    import dualk

    def fn(*args):  # the public call of implementation arguments
        if op == "add":
            return dualk.add(args[0], args[1], alpha=args[2])
        if op == "linear_gelu":
            return dualk.linear_gelu(*args[:3], approximate=args[3])
        if op == "fused_mlp":
            return dualk.fused_mlp(*args[:3], activation=args[3])
        if op == "matmul":
            return dualk.matmul(*args)
        return dualk.relu_scale(*args)

    a1, a2 = first(), second()
    plant(op, a1, "cuda")
    plant(op, a2, "triton")
    for _ in range(2):  # the second round answers from the table
        assert last_backend(ran, lambda: fn(*a1)) == "cuda"
        assert last_backend(ran, lambda: fn(*a2)) == "triton"
    assert len(autotune.exact_hits) == 2


def test_exact_table_holds_no_heuristic_answer(ran, monkeypatch):
    import dualk

    monkeypatch.setenv("DUALK_AUTOTUNE", "0")
    a, b = r(100), r(100)
    assert last_backend(ran, lambda: dualk.add(a, b)) == "torch"  # the heuristic, untimed
    assert autotune.exact_hits == {}
    monkeypatch.delenv("DUALK_AUTOTUNE")
    assert last_backend(ran, lambda: dualk.add(a, b)) == "triton"  # timed now


@pytest.mark.parametrize("op", ["linear_gelu", "matmul", "fused_mlp"])
def test_gemm_exact_tables_keep_the_tf32_switch(ran, monkeypatch, op):
    import dualk

    args, call = {
        "linear_gelu": ((r(8, 16), r(32, 16), None, "tanh"), lambda a: dualk.linear_gelu(*a[:3])),
        "matmul": ((r(8, 16), r(16, 32)), lambda a: dualk.matmul(*a)),
        "fused_mlp": (mlp_args(8, [16, 32, 8]), lambda a: dualk.fused_mlp(*a[:3])),
    }[op]  # fmt: skip
    monkeypatch.setattr(registry, "tf32_allowed", lambda: False)
    monkeypatch.setattr("dualk.runtime.operators._tf32", lambda: False)
    plant(op, args, "cuda")
    monkeypatch.setattr(registry, "tf32_allowed", lambda: True)
    plant(op, args, "triton")
    monkeypatch.setattr("dualk.runtime.operators._tf32", lambda: True)
    assert last_backend(ran, lambda: call(args)) == "triton"
    monkeypatch.setattr(registry, "tf32_allowed", lambda: False)
    monkeypatch.setattr("dualk.runtime.operators._tf32", lambda: False)
    assert last_backend(ran, lambda: call(args)) == "cuda"


# ---------------------------------------------------------------------------- Triton configs
def test_triton_configs_are_stored_per_class_and_recalled(monkeypatch):
    from dualk.triton_src import common

    monkeypatch.setattr(common, "_config_store", [])  # resolve the store afresh
    assert common.config_store() is autotune.TRITON_STORE
    timed = []

    def fake_bench(launch_with, configs, quantile=0.5):
        timed.append(list(configs))
        return sorted(((float(i + 1), c) for i, c in enumerate(reversed(configs))))

    monkeypatch.setattr(common, "bench_configs", fake_bench)
    candidates = [(False, 64, 64, 64, 8, 4, 4), (False, 32, 64, 64, 8, 5, 2)]
    cfg, timings, keep = common.tuned_config(CPU, "matmul", "k1", candidates, None)
    assert cfg == candidates[1] and keep and len(timed) == 1
    autotune.clear_memory()  # as a new process: read back from disk
    cfg2, timings2, keep2 = common.tuned_config(CPU, "matmul", "k1", candidates, None)
    assert (cfg2, keep2, len(timed)) == (cfg, True, 1)
    assert timings2 == timings
    # A stored config that is not allowed any more is tuned again.
    cfg3, _, _ = common.tuned_config(CPU, "matmul", "k1", candidates[:1], None)
    assert cfg3 == candidates[0] and len(timed) == 2
    # Under capture or tracing: nothing timed, the first candidate, not to be kept.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cfg4, timings4, keep4 = common.tuned_config(CPU, "matmul", "k2", candidates, None)
    assert (cfg4, timings4, keep4, len(timed)) == (candidates[0], [], False, 2)


def test_triton_launchers_tune_a_class_once_across_processes(monkeypatch):
    """matmul and fused_mlp outside the interpreter (launches stubbed): the first shape of a
    class is timed, a second shape of the class and a fresh process recall the config."""
    from dualk.triton_src import common, fused_mlp, matmul

    monkeypatch.setattr(common, "_config_store", [])
    launched, timed = [], []

    def fake_bench(launch_with, configs, quantile=0.5):
        timed.append(list(configs))
        for cfg in configs:
            launch_with(cfg)
        return [(float(i + 1), c) for i, c in enumerate(configs)]

    monkeypatch.setattr(common, "bench_configs", fake_bench)
    for mod, launch in ((matmul, "_gemm_launch"), (fused_mlp, "_launch")):
        monkeypatch.setattr(mod, "interpreting", lambda: False)
        monkeypatch.setattr(mod, launch, lambda cfg, *a: launched.append(cfg))
        monkeypatch.setattr(mod, "_best_config", {})
        monkeypatch.setattr(mod, "TUNING_LOG", {})

    matmul.matmul(r(100, 48), r(48, 40), allow_tf32=False)
    assert len(timed) == 1 and launched[-1] == timed[0][0]
    matmul.matmul(r(128, 48), r(48, 40), allow_tf32=False)  # same class (M <= 128)
    assert len(timed) == 1
    matmul.matmul(r(128, 48), r(48, 41), allow_tf32=False)  # N differs: a new class
    assert len(timed) == 2
    widths = (100, 128, 64, 10)
    x, weights, biases, _ = mlp_args(32, widths)
    fused_mlp.fused_mlp(x, weights, biases, activation="relu")
    assert len(timed) == 3 and set(timed[2]) <= set(fused_mlp.fused_mlp_configs())

    # A new process: empty launcher dicts and memory, the cache file on disk.
    autotune.clear_memory()
    matmul._best_config.clear()
    fused_mlp._best_config.clear()
    matmul.matmul(r(120, 48), r(48, 40), allow_tf32=False)
    fused_mlp.fused_mlp(r(20, 100), weights, biases, activation="relu")
    assert len(timed) == 3
    assert launched[-2] == timed[0][0] and launched[-1] == timed[2][0]
    path = autotune.cache_file(CPU)
    sections = json.loads(path.read_text())["entries"]
    assert len(sections["triton.matmul"]) == 2 and len(sections["triton.fused_mlp"]) == 1


def test_triton_candidate_lists_are_small_and_keep_the_measured_winners():
    from dualk.triton_src import fused_mlp, gemm_tma, matmul

    for (kind, cls), configs in matmul.GEMM_CONFIGS.items():
        extra = len(gemm_tma.TMA_CONFIGS) if (kind, cls) == ("tensor_core", "large") else 0
        assert len(configs) + extra <= 6, (kind, cls)
        assert configs[0] in matmul.gemm_configs(kind)
    winners = {
        "tensor_core": [
            (False, 128, 128, 64, 8, 3, 4),
            (False, 128, 256, 64, 8, 3, 8),
            (True, 128, 256, 64, 8, 3, 8),
            (False, 64, 64, 64, 8, 4, 4),
            (False, 32, 64, 64, 8, 5, 2),
        ],
        # 3xTF32 (experiments/results/2026-11-26-h100-triton-fp32-tf32x3-s16.txt)
        "fp32": [(False, 128, 64, 32, 8, 4, 4)],
    }
    for kind, configs in winners.items():
        assert set(configs) <= set(matmul.gemm_configs(kind))
    big = matmul._candidate_configs("tensor_core", 1, 8192, 3072, torch.device("cpu"))
    assert (False, 128, 128, 64, 8, 3, 4) in big
    small = matmul._candidate_configs("tensor_core", 1, 32, 3072, torch.device("cpu"))
    assert all(c[1] <= 64 for c in small) and len(small) <= 6
    for m, dtype, widths, winner in [
        (32, torch.float32, (100, 128, 64, 10), (16, 4, 4)),
        (2**20, torch.float16, (64, 64, 64, 64, 16), (64, 4, 8)),
        (2**20, torch.float16, (128, 128, 128, 128, 16), (128, 8, 3)),
        (2**16, torch.bfloat16, (256, 256, 256, 10), None),
        (40, torch.bfloat16, (64, 64), None),
    ]:
        configs = fused_mlp._candidate_configs(m, dtype, widths)
        assert 1 <= len(configs) <= 5 and set(configs) <= set(fused_mlp.fused_mlp_configs())
        assert winner is None or winner in configs


# ---------------------------------------------------------------------------- CLI
def test_cli_cache_show_and_clear(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)
    runner = CliRunner()
    res = runner.invoke(cli.main, ["cache", "show"])
    assert res.exit_code == 0, res.output
    assert "no cache files yet" in res.output and str(tmp_path / "cache") in res.output
    autotune.choose(OPS["add"], add_args(1000))
    res = runner.invoke(cli.main, ["cache", "show"])
    assert res.exit_code == 0, res.output
    assert "(this machine)" in res.output
    assert "add|float32|n<=1024|same-shape|layout=c" in res.output and "triton" in res.output

    builds = tmp_path / "cache" / "cuda" / "0123"
    builds.mkdir(parents=True)
    # Files whose names dualk does not give its own stay (and are named as left).
    theirs = [tmp_path / "cache" / "autotune" / n for n in ("other.json", "notes.txt")]
    for path in theirs:
        path.write_text("{}")
    ours = list((tmp_path / "cache" / "autotune").glob("*-*.json"))
    assert ours and all(autotune.CACHE_FILE_NAME.fullmatch(p.name) for p in ours)
    res = runner.invoke(cli.main, ["cache", "show"])
    assert all(f"not a dualk cache file: {path.name}" in res.output for path in theirs)
    res = runner.invoke(cli.main, ["cache", "clear"])
    assert res.exit_code == 0, res.output
    assert "removed" in res.output and ".json" in res.output
    assert all(
        path.exists() and f"left {path}: not a dualk cache file" in res.output for path in theirs
    )
    assert not any(p.exists() for p in ours) and builds.is_dir()
    for path in theirs:
        path.unlink()
    assert cache_files(tmp_path) == []
    res = runner.invoke(cli.main, ["cache", "clear"])
    assert "nothing to remove" in res.output
    res = runner.invoke(cli.main, ["cache", "clear", "--all"])
    assert res.exit_code == 0 and "removed" in res.output and not builds.exists()

    # A cuda/ that links to a shared build cache: --all removes the link, not the builds.
    shared = tmp_path / "shared-builds" / "0123"
    shared.mkdir(parents=True)
    (tmp_path / "cache" / "cuda").symlink_to(shared.parent, target_is_directory=True)
    res = runner.invoke(cli.main, ["cache", "clear", "--all"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "cache" / "cuda").exists() and shared.is_dir()


def test_cli_tune_without_gpu_says_it_cannot(monkeypatch):
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)
    res = CliRunner().invoke(cli.main, ["tune", "--suite", "quick"])
    assert res.exit_code == 1
    assert "No CUDA GPU found: cannot tune" in res.output
    res = CliRunner().invoke(cli.main, ["tune", "--op", "add", "--shape", "nope"])
    assert res.exit_code == 2 and "no shape case" in res.output


def test_heuristic_gives_wide_mlps_to_cuda_only_where_the_planner_takes_the_wide_kernel(
    monkeypatch,
):
    """The untimed rule for fused_mlp: CUDA up to 128 wide; 129-256 wide only where the CUDA
    planner says its wide Hopper kernel runs the call (asked, here faked), else torch. The GPU
    side (the planner's real answers) is tests/test_parity.py's wide-kernel test."""
    spec = OPS["fused_mlp"]
    gen = torch.Generator().manual_seed(7)

    def args(widths):
        weights, biases = registry.mlp_parameters(widths, torch.float16, "cpu", gen)
        return (registry.randn((5, widths[0]), torch.float16, "cpu", gen), weights, biases, "relu")

    everything = ["cuda", "triton", "torch"]
    assert autotune.heuristic(spec, args((64, 128, 10)), everything)[0] == "cuda"
    for planner_says, expected in ((True, "cuda"), (False, "torch")):
        monkeypatch.setattr(heuristic, "_takes_wide_mlp_kernel", lambda a, s=planner_says: s)
        chosen, rule = autotune.heuristic(spec, args((256, 256, 64)), everything)
        assert chosen == expected, rule
    assert autotune.heuristic(spec, args((256, 320, 64)), everything)[0] == "torch"  # > 256
    assert autotune.heuristic(spec, args((64, 128, 10)), ["triton", "torch"])[0] == "torch"
    monkeypatch.undo()
    assert not heuristic._takes_wide_mlp_kernel(args((256, 256, 64)))  # CPU tensors: never


def test_heuristic_gives_linear_glu_to_cuda_only_on_its_hopper_route_above_64_rows(monkeypatch):
    """The untimed rule for linear_glu (session 27's measurements): CUDA where its planner takes
    the Hopper wgmma route (asked, here faked) and x has more than 64 rows; torch at decode sizes,
    off that route, or without the CUDA backend."""
    spec = OPS["linear_glu"]
    gen = torch.Generator().manual_seed(8)

    def args(rows):
        x = registry.randn((rows, 64), torch.bfloat16, "cpu", gen)
        wg = registry.randn((96, 64), torch.bfloat16, "cpu", gen)
        wu = registry.randn((96, 64), torch.bfloat16, "cpu", gen)
        return (x, wg, wu, None, None, "silu", "tanh")

    everything = ["cuda", "triton", "torch"]
    for route_says, rows, expected in (
        (True, 512, "cuda"), (True, 65, "cuda"), (True, 64, "torch"), (True, 16, "torch"),
        (False, 512, "torch"),
    ):  # fmt: skip
        monkeypatch.setattr(heuristic, "_takes_hopper_glu_route", lambda a, s=route_says: s)
        chosen, rule = autotune.heuristic(spec, args(rows), everything)
        assert chosen == expected, (route_says, rows, rule)
    assert autotune.heuristic(spec, args(512), ["triton", "torch"])[0] == "torch"
    monkeypatch.undo()
    assert not heuristic._takes_hopper_glu_route(args(512))  # CPU tensors: never


def test_an_unknown_autotune_flag_warns_once_and_timing_stays_on(monkeypatch):
    monkeypatch.setattr(shared, "warned", set())
    monkeypatch.setenv("DUALK_AUTOTUNE", "maybe")
    with pytest.warns(UserWarning, match="DUALK_AUTOTUNE='maybe'") as record:
        blocked = autotune.timing_blocked()
    assert blocked is None or "DUALK_AUTOTUNE" not in blocked
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        autotune.timing_blocked()  # once per value
    monkeypatch.setenv("DUALK_AUTOTUNE", "off")
    assert autotune.timing_blocked() == "DUALK_AUTOTUNE=0"


def test_cache_file_name_matches_every_name_dualk_writes():
    """`dualk cache clear` removes what CACHE_FILE_NAME matches: every name the store writes, for
    GPU names as cache_file() spells them, and nothing else."""
    for label in ("nvidia-h100-80gb-hbm3-cc9.0-132sm", "nvidia-h200-cc9.0-132sm", "cpu"):
        name = f"{label}-0123456789ab.json"
        for written in (name, store._lock_name(name), store._aside_name(name),
                        store._write_name(name)):  # fmt: skip
            assert autotune.CACHE_FILE_NAME.fullmatch(written), written
    for other in ("other.json", "notes.txt", "x-0123456789ab.json.bak", "x-0123456789ab.jsonl"):
        assert not autotune.CACHE_FILE_NAME.fullmatch(other), other
