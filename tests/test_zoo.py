"""The model zoo (dualk/tools/zoo.py, dualk/tools/zoo_models.py, `dualk bench --models`) on the CPU: every
entry builds (at the CPU size, and at the GPU size on the meta device, so a bad config fails here
rather than in a GPU run), the MLP models' fused outputs and gradients match the originals',
a wrong fused model fails the check, missing packages give skipped rows with the reason, the
JSON carries the environment and every field, and the command line runs."""

import json
import math
import statistics
import sys

import pytest
import torch
from click.testing import CliRunner

from dualk import cli
from dualk.tools import zoo
from dualk.tools.zoo_models import MODELS, TorchLlama, unavailable

CPU = torch.device("cpu")
MLP_INFERENCE = ["seed_dnn", "seed_dnn_65536", "nerf_mlp"]
MLP_TRAIN = [n for n, s in MODELS.items() if s.modes == ("train",)]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_entry_builds_at_cpu_size(name):
    spec = MODELS[name]
    why = unavailable(spec)
    if why is not None:
        pytest.skip(why)
    torch.manual_seed(0)
    built = spec.build(CPU, spec.dtype, "cpu")
    assert not built.model.training
    assert all(p.dtype == spec.dtype for p in built.model.parameters())
    args, kwargs = built.make_inputs()
    with torch.no_grad():
        out = zoo._output_tensor(built.model(*args, **kwargs))
    assert out.dtype == spec.dtype and out.isfinite().all() and out.numel() > 0


@pytest.mark.parametrize("name", list(MODELS))
def test_gpu_sizes_build_on_meta(name):
    """The GPU configs (LLaMA's 268M parameters included) are built without memory: a config
    the package rejects fails here, not on the GPU."""
    spec = MODELS[name]
    why = unavailable(spec)
    if why is not None:
        pytest.skip(why)
    built = spec.build(torch.device("meta"), spec.dtype, "gpu")
    args, kwargs = built.make_inputs()
    first = next(iter([*args, *kwargs.values()]))
    assert first.device.type == "meta" and first.numel() >= 32 * 100
    assert all(p.device.type == "meta" for p in built.model.parameters())


def _check_ok(r: zoo.Result) -> None:
    assert r.status == "ok", r.reason
    assert r.ok, r.verdict
    assert r.err_budget is not None and r.fused_ref_err <= r.err_budget
    assert r.timed_on == "cpu" and r.orig_ms > 0 and r.fused_ms > 0 and r.ratio > 0
    assert r.orig_device_ms is None  # no GPU time on a CPU
    assert r.fuse is not None and r.fuse.linears_fused == r.fuse.linears > 0, r.fuse
    assert r.fuse.chains >= 1 and r.fuse.kinds.get("FusedMLP", 0) >= 1 and not r.fuse.unreported


def test_mlp_models_eager_and_train_match_the_originals():
    seen = []
    results = zoo.run(
        MLP_INFERENCE + MLP_TRAIN,
        modes=("eager", "train"),
        device="cpu",
        progress=lambda i, n, what: seen.append((i, n, what)),
    )
    assert [(r.model, r.mode) for r in results] == [(n, "eager") for n in MLP_INFERENCE] + [
        (n, "train") for n in MLP_TRAIN
    ]
    n = len(results)
    assert seen[0] == (0, n, "seed_dnn eager") and seen[-1] == (n, n, "done")
    for r in results:
        _check_ok(r)
        assert r.size == "cpu" and r.rounds == 1
    for r in results[len(MLP_INFERENCE) :]:
        assert r.grad_ok and r.grad_rel_err is not None and r.loss_rel_err is not None
        assert "gradients ok" in r.verdict


def test_compiled_mode_on_cpu():
    (r,) = zoo.run(["seed_dnn"], modes=("compiled",), device="cpu")
    _check_ok(r)
    assert r.fullgraph == {"original": True, "fused": True}
    assert "aot_eager" in r.note


def test_a_wrong_fused_model_fails_the_check(monkeypatch):
    """A fused model off by a little more than the rule allows is a failed row, in inference
    and in training (where the gradients are judged too)."""
    real = zoo.fuse

    def off_by(scale):
        def fake(model):
            fused = real(model)
            forward = fused.forward
            fused.forward = lambda x: forward(x) * (1 + scale)
            return fused

        return fake

    monkeypatch.setattr(zoo, "fuse", off_by(1e-3))
    eager, train = zoo.run(["seed_dnn", "mlp_wide_train_fp32"], ("eager", "train"), device="cpu")
    for r in (eager, train):
        assert r.status == "ok" and r.ok is False, r.verdict
        assert r.rel_err == pytest.approx(1e-3, rel=1e-2)
        assert "FAIL" in r.verdict
    assert train.grad_ok is False


def test_rule_scales_with_the_originals_own_error():
    assert zoo._verdict(torch.bfloat16, 0.009, 0.004) == (True, pytest.approx(0.008 + 2**-7))
    assert not zoo._verdict(torch.float32, 1e-5, 1e-7)[0]
    assert not zoo._verdict(torch.float16, float("nan"), 1e-3)[0]


def test_missing_package_is_a_skipped_row(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "timm", None)
    results = zoo.run(["bert", "vit_small"], modes=("eager",), device="cpu")
    assert [r.status for r in results] == ["skipped", "skipped"]
    assert results[0].reason.startswith("transformers not installed")
    assert results[1].reason.startswith("timm not installed")
    assert results[0].ok is None and results[0].ratio is None


def test_llama_without_transformers_is_the_pure_pytorch_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    built = MODELS["llama"].build(CPU, torch.bfloat16, "cpu")
    assert isinstance(built.model, TorchLlama) and "pure-PyTorch" in built.note
    (r,) = zoo.run(["llama"], modes=("eager",), device="cpu")
    assert r.status == "ok" and r.ok, r.verdict
    assert "pure-PyTorch" in r.note
    assert r.fuse.linears == 7  # q, k, v, o, gate, up, down
    fused_or_named = r.fuse.linears_fused + len(r.fuse.unreported)
    assert fused_or_named + len({s["where"] for s in r.fuse.skipped}) >= r.fuse.linears


def test_an_exception_is_an_error_row_and_the_run_goes_on(monkeypatch):
    def broken(model):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(zoo, "fuse", broken)
    results = zoo.run(["seed_dnn", "nerf_mlp"], modes=("eager",), device="cpu")
    assert [(r.status, r.reason) for r in results] == [("error", "RuntimeError: boom")] * 2


def test_select():
    assert [(s.name, m) for s, m in zoo.select(["seed_dnn", "nerf_mlp_train"])] == [
        ("seed_dnn", "eager"),
        ("seed_dnn", "compiled"),
        ("nerf_mlp_train", "train"),
    ]
    assert len(zoo.select(None, ("train",))) == len(MLP_TRAIN)
    with pytest.raises(ValueError, match="unknown model"):
        zoo.select(["resnet"])
    with pytest.raises(ValueError, match="unknown mode"):
        zoo.select(None, ("infer",))


def test_json_has_the_environment_and_every_field():
    results = zoo.run(["seed_dnn"], modes=("eager",), device="cpu")
    data = json.loads(json.dumps(zoo.to_json(results)))
    env = data["env"]
    for key in ("device", "torch", "triton", "dualk", "date", "host", "gpu_count", "python"):
        assert key in env, key
    assert env["device"].startswith("CPU")
    assert {"ratio", "wall", "host", "device", "error"} <= set(data["method"])
    (row,) = data["results"]
    for key in ("model", "mode", "dtype", "rows", "orig_ms", "fused_ms", "orig_device_ms",
                "fused_device_ms", "orig_host_us", "fused_host_us", "ratio", "rel_err",
                "max_abs_err", "ok", "status", "reason", "timed_on", "rounds", "calls"):  # fmt: skip
        assert key in row, key
    assert row["fuse"]["chains"] == 1 and row["fuse"]["kinds"] == {"FusedMLP": 1}
    assert row["fuse"]["linears"] == row["fuse"]["linears_fused"] == 3


def test_cli_bench_models(tmp_path, no_gpu):
    path = tmp_path / "zoo.json"
    out = CliRunner().invoke(
        cli.main, ["bench", "--models", "seed_dnn", "--modes", "eager", "--json", str(path)]
    )
    assert out.exit_code == 0, out.output
    assert "[1/1] seed_dnn eager" in out.output
    table = out.output[out.output.index("model ") :]
    assert "seed_dnn" in table and "(cpu)" in table and "3/3" in table and " ok " in table
    assert "fuse(seed_dnn): 1 FusedMLP; 3 of 3 Linear / Conv1D fused" in out.output
    data = json.loads(path.read_text())
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0  # the machine's, as is
    assert [r["model"] for r in data["results"]] == ["seed_dnn"] and data["env"][
        "gpu_count"
    ] == gpus


def test_cli_skipped_models_and_failures(monkeypatch, no_gpu):
    monkeypatch.setitem(sys.modules, "timm", None)
    run = lambda *args: CliRunner().invoke(cli.main, ["bench", *args])
    out = run("--models", "vit_small,seed_dnn", "--modes", "eager")
    assert out.exit_code == 0, out.output
    assert "skipped: vit_small eager: timm not installed" in out.output
    out = run("--models", "vit_small", "--modes", "eager")
    assert out.exit_code == 1 and "no model ran" in out.output
    monkeypatch.setattr(zoo, "fuse", lambda m: (_ for _ in ()).throw(RuntimeError("boom")))
    out = run("--models", "seed_dnn", "--modes", "eager")
    assert out.exit_code == 1 and "error: seed_dnn eager: RuntimeError: boom" in out.output


def test_cli_usage_errors(no_gpu):
    run = lambda *args: CliRunner().invoke(cli.main, ["bench", *args])
    out = run("--models", "seed_dnn", "--op", "add")
    assert out.exit_code == 2 and "--op" in out.output
    out = run("--modes", "eager")
    assert out.exit_code == 2 and "add --models" in out.output
    out = run("--models", "resnet")
    assert out.exit_code == 2 and "unknown model(s) resnet" in out.output
    out = run("--models", "all", "--modes", "infer")
    assert out.exit_code == 2 and "the modes are eager, compiled, train" in out.output
    out = run("--models", "all", "--list")
    assert out.exit_code == 0 and "llama" in out.output and "mlp_wide_train_fp32" in out.output


def test_ratio_interval_tells_a_difference_from_noise():
    """The ratio's 95% interval (resampled burst pairs): identical samples give [1, 1]; a fused
    model 10% slower in every pair gives an interval below 1 that holds 1/1.1; pure scatter
    around one time holds 1.0; too few pairs give None."""
    import random

    same = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3]
    assert zoo.ratio_interval(same, same) == [1.0, 1.0]
    slower = [t * 1.1 for t in same]
    lo, hi = zoo.ratio_interval(same, slower)
    assert hi < 1.0 and lo <= 1 / 1.1 <= hi
    rng = random.Random(1)
    a = [1.0 + rng.gauss(0, 0.05) for _ in range(32)]
    b = [1.0 + rng.gauss(0, 0.05) for _ in range(32)]
    lo, hi = zoo.ratio_interval(a, b)
    assert lo < 1.0 < hi
    assert zoo.ratio_interval([1.0] * 3, [1.0] * 3) is None


def test_no_timed_burst_follows_a_device_sample(monkeypatch):
    """The GPU rounds (a stand-in device and clocks): every timed burst of each model is kept, the
    two models alternate which one goes first, each model gets one device sample per round, and
    the burst right after a device sample is never a timed one (on the H200 such bursts ran
    slower, and they all fell on the fused model: its 256x4 training step read 0.89x)."""
    log, counter = [], iter(range(10**6))

    def burst(fn, calls, device, flush):
        value = float(next(counter))
        log.append(("burst", fn.__name__, value))
        return value, value

    def timed_calls(fn, reps, flush, cycles):
        log.append(("device", fn.__name__, None))
        return [1.0] * reps

    def original():
        pass

    def fused():
        pass

    class Flush:
        def zero_(self):
            pass

    monkeypatch.setattr(zoo, "_burst", burst)
    monkeypatch.setattr(zoo.timing, "timed_calls", timed_calls)
    samples = {w: {"wall": [], "host": [], "device": []} for w in ("original", "fused")}
    rounds = 3
    cuda = torch.device("cuda")  # (only its type is read)
    zoo._rounds(original, fused, cuda, rounds, 8, 8, Flush(), samples)
    n = rounds * zoo.SPLIT
    timed = {w: samples[w]["wall"] for w in samples}
    assert all(len(v) == n for v in timed.values())
    assert all(len(samples[w]["device"]) == rounds for w in samples)
    kept = set(timed["original"]) | set(timed["fused"])
    firsts = [name for kind, name, v in log if kind == "burst" and v in kept][::2]
    assert firsts.count("original") == firsts.count("fused") == n // 2
    after_samples = []
    for i, (before, after) in enumerate(zip(log, log[1:])):
        if before[0] == "device" and after[0] == "burst":
            assert after[2] not in kept, "a timed burst right after a device sample"
            first_timed = next((e for e in log[i + 1 :] if e[0] == "burst" and e[2] in kept), None)
            if first_timed is not None:
                after_samples.append(first_timed[1])
    # the first timed burst after each sample block: each model in turn
    assert after_samples == ["fused", "original", "fused"][: len(after_samples)]
    assert len(after_samples) == rounds
    assert sum(1 for kind, *_ in log if kind == "burst") == 2 * n + 2 * rounds


def test_paired_ratio_keeps_a_difference_through_a_host_drift():
    """A host that slows down mid-run moves both bursts of a pair: the paired ratio keeps the
    fused model's 5% gain, where median / median of unevenly split slow periods does not."""
    fast, slow = [1.0] * 9, [1.7] * 7  # the original saw 9 fast and 7 slow bursts
    orig = fast + slow
    fused = [t / 1.05 for t in orig]
    assert zoo.paired_ratio(orig, fused) == pytest.approx(1.05)
    skewed = fused[:7] + [1.7 / 1.05] * 2 + fused[9:]  # the fused one: 2 more slow bursts
    assert statistics.median(orig) / statistics.median(skewed) < 0.7
    assert zoo.paired_ratio(orig, skewed) == pytest.approx(1.05)
    assert zoo.paired_ratio([], []) is None


def test_short_rows_get_more_rounds_up_to_a_limit():
    # A training step of 1.4 ms in 8-call bursts: 8 rounds time 0.72 s of bursts, whose paired
    # ratios scattered too widely to tell 0.97 from 1.00 (H200); with the default rounds a row
    # gets rounds enough for MIN_TIMED_S seconds, at most MAX_ROUNDS, never fewer than asked.
    rounds_for, zoo_tools = zoo.rounds_for, zoo
    assert rounds_for(8, 8, 1.4, 0.0) == 8  # (rounds given, --quick, or a CPU: as asked)
    needed = math.ceil(zoo_tools.MIN_TIMED_S / (2 * zoo_tools.SPLIT * 8 * 1.4e-3))
    assert 8 < needed <= zoo_tools.MAX_ROUNDS
    assert rounds_for(8, 8, 1.4, zoo_tools.MIN_TIMED_S) == needed
    assert rounds_for(8, 25, 0.1, zoo_tools.MIN_TIMED_S) == zoo_tools.MAX_ROUNDS  # (capped)
    assert rounds_for(8, 8, 50.0, zoo_tools.MIN_TIMED_S) == 8  # (long calls: as asked)
