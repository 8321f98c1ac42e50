"""`dualk bench` / `dualk report` never pretend (issue 16): on a machine without a GPU an option the
CPU smoke check cannot honour is a usage error or a note printed before the check runs, a backend
that cannot run is listed as not run and never counted, a run that checked nothing exits non-zero,
a regression gate that compared nothing fails unless --allow-no-compare, and the Triton
interpreter's numpy warnings stay inside the smoke check. GPU runs are stood in for by fake
Reports (tests/test_cli.py)."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import HAS_CUDA
from test_cli import fake_report, invoke, save

import dualk.tools.bench
from dualk import cli
from dualk.registry import OPS
from dualk.tools import render, smoke
from dualk.tools.bench import Report, Row

# On a GPU machine Triton compiles for the GPU, not the interpreter; these runs mean the CPU.
cpu_only = pytest.mark.skipif(HAS_CUDA, reason="the CPU smoke check runs Triton's interpreter")
FAST = ("--op", "add", "--dtype", "float32")  # the smallest smoke check: 2 cases, 1 dtype


@pytest.fixture
def runner(monkeypatch) -> CliRunner:
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)
    # The smoke check sets TRITON_INTERPRET; put it back afterwards, so that on a GPU machine later
    # tests' Triton kernels are not sent to the interpreter. (setenv records the value to restore.)
    was = os.environ.get("TRITON_INTERPRET")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if was is None:
        monkeypatch.delenv("TRITON_INTERPRET")
    return CliRunner()


def notes_before_the_check(output: str) -> list[str]:
    lines = output.splitlines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith("CPU smoke check:"))
    return [ln for ln in lines[:end] if ln.startswith("note:")]


def summary(output: str) -> str:
    return next(ln for ln in output.splitlines() if "dualk checks correct" in ln)


# ---------------------------------------------------------------------------- the main job
@cpu_only
def test_quick_suite_all_backends_runs_the_smoke_check_says_what_it_skips_and_exits_0(runner):
    """README's one-line set-up command, as CI-like checks run it."""
    result = invoke(runner, "bench", "--suite", "quick", "--all-backends")
    assert result.exit_code == 0, result.output
    notes = notes_before_the_check(result.output)
    assert any(n.startswith("note: --all-backends: checking dualk:triton") for n in notes), notes
    assert any(n.startswith("note: dualk:cuda cannot run here") for n in notes), notes
    assert any(n.startswith("note: --suite quick is not used") for n in notes), notes
    # Each operator's two smoke cases; cuda rows are not run and peers are counted apart.
    n = 2 * sum(len(c.bench_dtypes) for op in OPS.values() for c in smoke.smoke_cases(op))
    assert summary(result.output) == f"{n} of {n} dualk checks correct"  # triton and auto
    assert "not run: dualk:cuda" in result.output
    assert "PyTorch rows correct (a check of the harness" in result.output


# ---------------------------------------------------------------------------- backends
def test_a_backend_that_cannot_run_alone_is_a_usage_error(runner):
    result = invoke(runner, "bench", *FAST, "--backend", "cuda")
    assert result.exit_code == 2, result.output
    assert "no requested backend can run without a GPU" in result.output
    assert "cuda: the CUDA backend needs CUDA tensors" in result.output
    assert "triton" in result.output.split("can check")[1]  # says what would work
    assert "checks correct" not in result.output  # nothing ran, nothing counted


@cpu_only
def test_a_backend_that_cannot_run_is_listed_as_not_run_never_counted(runner, tmp_path):
    out = tmp_path / "smoke.json"
    args = (*FAST, "--backend", "cuda", "--backend", "triton", "--json", str(out))
    result = invoke(runner, "bench", *args)
    assert result.exit_code == 0, result.output
    assert summary(result.output) == "2 of 2 dualk checks correct"  # triton's two, not cuda's
    assert "not run: dualk:cuda (2 checks): unavailable: the CUDA backend" in result.output
    cuda = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "dualk:cuda"]
    assert len(cuda) == 2 and all(r["ok"] is None and r["rel_err"] is None for r in cuda)


def test_a_run_in_which_no_dualk_check_ran_exits_1(runner, monkeypatch):
    unavailable = Row(
        "add", "n=1", "n=1", "float32", "dualk:triton", "dualk", note="unavailable: x"
    )
    peer = Row("add", "n=1", "n=1", "float32", smoke.PEER, "peer", rel_err=0.0, ok=True)
    monkeypatch.setattr(smoke, "cpu_smoke_check", lambda *a, **k: [unavailable, peer])
    result = invoke(runner, "bench", *FAST, "--backend", "torch")
    assert result.exit_code == 1, result.output
    assert "no dualk check ran" in result.output
    assert "checks correct" not in result.output  # the peer is not a dualk check


@cpu_only
def test_a_wrong_result_in_the_smoke_check_exits_1(runner, monkeypatch):
    import dualk.backends.torch_ref as torch_ref

    spec = OPS["relu_scale"]
    monkeypatch.setitem(spec._resolved, "torch", lambda x, s: torch_ref.relu_scale(x, s) + 1)
    result = invoke(runner, "bench", "--op", "relu_scale", "--backend", "torch", "--no-peers")
    assert result.exit_code == 1, result.output
    assert "0 of 4 dualk checks correct" in result.output and "FAIL" in result.output


# ---------------------------------------------------------------------------- shapes, suites
def test_a_gpu_only_shape_is_a_usage_error_not_zero_of_zero(runner):
    result = invoke(runner, "bench", "--op", "fused_mlp", "--shape", "seed_b4096")
    assert result.exit_code == 2, result.output
    assert "seed_b4096: gpu_only, too large for the CPU smoke check" in result.output
    assert "0 of 0" not in result.output


@cpu_only
def test_gpu_only_shapes_beside_cpu_sized_ones_are_a_note(runner):
    args = (
        "--op",
        "fused_mlp",
        "--shape",
        "seed_b1",
        "--shape",
        "seed_b4096",
        "--backend",
        "torch",
    )
    result = invoke(runner, "bench", *args, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    assert "note: --shape seed_b4096: gpu_only, skipped on the CPU" in result.output
    assert summary(result.output) == "1 of 1 dualk checks correct"


@cpu_only
def test_options_that_only_mean_something_for_timings_are_named_up_front(runner, tmp_path):
    png = tmp_path / "p.png"
    result = invoke(runner, "bench", *FAST, "--compile", "--cuda-graph", "--plot", str(png))
    assert result.exit_code == 0, result.output
    notes = "\n".join(notes_before_the_check(result.output))
    assert "--compile and --cuda-graph not used: nothing is timed without a GPU" in notes
    assert f"--plot {png} skipped: the CPU smoke check has no timings to plot" in notes
    assert "--suite" not in notes and "--all-backends" not in notes  # not given, not mentioned
    assert not png.exists()


# ---------------------------------------------------------------------------- regression gate
def test_fail_if_slower_without_a_gpu_is_refused_unless_allowed(runner, tmp_path, monkeypatch):
    old = save(fake_report(), tmp_path / "old.json")
    result = invoke(runner, "bench", *FAST, "--compare", str(old), "--fail-if-slower", "5")
    assert result.exit_code == 2, result.output
    assert "regression gate could compare nothing" in result.output
    assert "--allow-no-compare" in result.output

    ok = Row("add", "n=1", "n=1", "float32", "dualk:torch", "dualk", rel_err=0.0, ok=True)
    monkeypatch.setattr(smoke, "cpu_smoke_check", lambda *a, **k: [ok])
    args = ("--compare", str(old), "--fail-if-slower", "5", "--allow-no-compare")
    result = invoke(runner, "bench", *FAST, "--backend", "torch", *args)
    assert result.exit_code == 0, result.output  # the smoke check ran and decided the exit
    assert summary(result.output) == "1 of 1 dualk checks correct"
    assert "note: --fail-if-slower 5 not applied (--allow-no-compare)" in result.output
    assert "note: --compare" in result.output and "nothing to compare" in result.output


def test_gpu_bench_refuses_a_gate_against_an_untimed_file_before_running(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.common, "has_gpu", lambda: True)
    monkeypatch.setattr(dualk.tools.bench, "run", lambda *a, **k: pytest.fail("must not run"))
    old = save(smoke_report(), tmp_path / "smoke.json")
    result = invoke(CliRunner(), "bench", "--compare", str(old), "--fail-if-slower", "5")
    assert result.exit_code == 2, result.output
    assert "has no timings (a CPU smoke check" in result.output


def test_gpu_bench_in_which_no_dualk_backend_gave_a_result_exits_1(tmp_path, monkeypatch):
    report = fake_report()
    for r in report.rows[:2]:  # both dualk rows
        r.us = r.ok = r.rel_err = None
        r.note = "unavailable: no extension"
    monkeypatch.setattr(cli.common, "has_gpu", lambda: True)
    monkeypatch.setattr(dualk.tools.bench, "run", lambda *a, **k: report)
    result = invoke(CliRunner(), "bench", "--op", "matmul")
    assert result.exit_code == 1, result.output
    assert "no dualk backend produced a checked result" in result.output


def smoke_report() -> Report:
    rows = [
        Row("matmul", "tiny", "1x1x1", "bfloat16", impl, kind, rel_err=1e-3, ok=True)
        for impl, kind in (("dualk:cuda", "dualk"), ("dualk:triton", "dualk"), (smoke.PEER, "peer"))
    ]
    return smoke.smoke_report(rows)


@pytest.mark.parametrize("smoke_side", ["old", "new", "both"])
def test_report_compare_of_an_untimed_run_says_so_and_the_gate_fails(tmp_path, smoke_side):
    timed, untimed = fake_report(), smoke_report()
    old = save(untimed if smoke_side in ("old", "both") else timed, tmp_path / "old.json")
    new = save(untimed if smoke_side in ("new", "both") else timed, tmp_path / "new.json")
    runner = CliRunner()
    result = invoke(runner, "report", str(new), "--compare", str(old))
    assert result.exit_code == 0, result.output
    assert "comparison: nothing to compare:" in result.output
    assert "has no timings (a CPU smoke check: correctness only)" in result.output
    assert "new/old" not in result.output and "  -  " not in result.output  # no rows of dashes

    gate = ("--compare", str(old), "--fail-if-slower", "5")
    result = invoke(runner, "report", str(new), *gate)
    assert result.exit_code == 1, result.output
    assert "the regression gate compared nothing" in result.output
    assert "regressed" not in result.output  # not blamed on rows that were never timed

    result = invoke(runner, "report", str(new), *gate, "--allow-no-compare")
    assert result.exit_code == 0, result.output
    assert "regression gate not applied (--allow-no-compare)" in result.output


def test_gate_with_no_rows_in_common_fails_unless_allowed(tmp_path):
    other = fake_report()
    for r in other.rows:
        r.shape = "2048x2048x2048"
    old, new = save(other, tmp_path / "old.json"), save(fake_report(), tmp_path / "new.json")
    gate = ("--compare", str(old), "--fail-if-slower", "5")
    result = invoke(CliRunner(), "report", str(new), *gate)
    assert result.exit_code == 1, result.output
    assert "no dualk row is timed in both runs (no rows in common)" in result.output
    result = invoke(CliRunner(), "report", str(new), *gate, "--allow-no-compare")
    assert result.exit_code == 0, result.output


def test_gate_that_compared_rows_says_how_many(tmp_path):
    old, new = save(fake_report(), tmp_path / "old.json"), save(fake_report(), tmp_path / "n.json")
    result = invoke(CliRunner(), "report", str(new), "--compare", str(old), "--fail-if-slower", "5")
    assert result.exit_code == 0, result.output
    assert "(2 dualk rows compared)" in result.output


def test_report_plot_of_a_smoke_check_is_a_usage_error(tmp_path):
    src = save(smoke_report(), tmp_path / "smoke.json")
    result = invoke(CliRunner(), "report", str(src), "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 2, result.output
    assert "is a CPU smoke check (correctness only): no timings to plot" in result.output
    md = tmp_path / "BENCHMARKS.md"
    result = invoke(CliRunner(), "report", str(src), "--markdown", str(md))
    assert result.exit_code == 2 and not md.exists(), result.output
    assert "a benchmarks page needs a GPU run's timings" in result.output


# ---------------------------------------------------------------------------- interpreter warnings
def _overflowing_kernel():
    """A Triton kernel whose interpreter run makes numpy warn (exp overflow, 0/0)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, tl.exp(v) * 0.0 + v / (v - v), mask=offs < n)

    x, y = torch.full((8,), 1000.0), torch.empty(8)
    return lambda: kernel[(1,)](x, y, 8, BLOCK=8)


def _interpreter_warnings(record: list) -> list:
    return [w for w in record if issubclass(w.category, RuntimeWarning) and "triton" in w.filename]


@cpu_only
def test_interpreter_numpy_warnings_are_silenced_in_the_smoke_check_only(runner, monkeypatch):
    import dualk.backends.torch_ref as torch_ref

    launch = _overflowing_kernel()

    def noisy_relu_scale(x, s):
        launch()
        return torch_ref.relu_scale(x, s)

    monkeypatch.setitem(OPS["relu_scale"]._resolved, "torch", noisy_relu_scale)
    args = ("--op", "relu_scale", "--backend", "torch", "--no-peers", "--shape", "n=1023")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = invoke(runner, "bench", *args)
    assert result.exit_code == 0, result.output
    assert _interpreter_warnings(record) == []
    assert "RuntimeWarning" not in result.output

    with warnings.catch_warnings(record=True) as record:  # outside the check they still show
        warnings.simplefilter("always")
        launch()
    assert {str(w.message).split(" encountered")[0] for w in _interpreter_warnings(record)} >= {
        "overflow",
        "invalid value",
    }


# ---------------------------------------------------------------------------- start-up
def test_the_cli_imports_neither_triton_nor_matplotlib_until_a_command_needs_them():
    code = (
        "import sys, dualk.cli; "
        "print(sorted(m for m in ('triton', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_render_smoke_counts_only_dualk_rows_that_ran():
    rows = smoke_report().rows + [
        Row("matmul", "tiny", "1x1x1", "bfloat16", "dualk:auto", "dualk", note="unavailable: y")
    ]
    text = render.render_smoke(rows)
    assert "2 of 2 dualk checks correct" in text
    assert "1 of 1 PyTorch rows correct" in text
    assert "not run: dualk:auto (1 checks): unavailable: y" in text


def test_an_override_of_auto_is_said_before_the_run(runner, monkeypatch):
    """With DUALK_BACKEND set, the dualk:auto rows time what it names: bench says so up front,
    naming the variable (and says nothing when no override is set)."""
    result = invoke(runner, "bench", *FAST, "--backend", "auto")
    assert "run what an override names" not in result.output
    monkeypatch.setenv("DUALK_BACKEND", "torch")
    result = invoke(runner, "bench", *FAST, "--backend", "auto")
    assert result.exit_code == 0, result.output
    assert (
        "note: the dualk:auto rows run what an override names, not auto's choice: add -> torch (DUALK_BACKEND)"
        in result.output
    )


def test_build_without_a_gpu_says_nothing_was_built(runner):
    """`dualk build` on a machine without a GPU attempts nothing and says so (not "build
    failed"), exit 1."""
    result = invoke(runner, "build")
    assert result.exit_code == 1
    assert "nothing built: no CUDA device is visible" in result.output
    assert "build failed" not in result.output


def test_the_interpreters_bfloat16_rounding_is_said_when_it_matters(runner):
    """Triton's interpreter truncates fp32 to bfloat16: a note says so when Triton's bf16 rows
    are checked, and not for a float32-only run."""
    note = "Triton's CPU interpreter rounds fp32 to bfloat16 by truncation"
    assert note not in invoke(runner, "bench", *FAST).output
    result = invoke(runner, "bench", "--op", "add", "--dtype", "bfloat16")
    assert any(note in n for n in notes_before_the_check(result.output)), result.output
