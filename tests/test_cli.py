"""`dualk` command line on the CPU: argument checks, `--list`, the no-GPU smoke check, `dualk
info`, the JSON/CSV writers and loader, `--compare`/`--fail-if-slower`, `dualk report` (table,
markdown, plot) and `python -m dualk`. GPU runs are stood in for by a small fake Report."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import HAS_CUDA

from dualk import cli
from dualk.registry import OPS
from dualk.tools import compare as cmp_mod
from dualk.tools import render, smoke
from dualk.tools import report as rep
from dualk.tools.bench import Report, Row

ENV = {
    "date": "2026-01-02T03:04:05+00:00",
    "dualk": "0.1.0",
    "python": "3.11.7",
    "torch": "2.13.0",
    "torch_cuda": "12.8",
    "platform": "Linux",
    "allow_tf32": False,
    "triton": "3.9.0",
    "gpu": "NVIDIA H100 80GB HBM3",
    "gpu_count": 1,
    "sm_count": 132,
    "capability": "9.0",
    "gpu_memory_gib": 79.1,
    "driver": "570.1",
    "nvcc": "Build cuda_12.8",
}
CEILINGS = {
    "copy_gbs": 3000.0,
    "copy_shape": "2^28 fp32",
    "mm_tflops_bfloat16": 700.0,
    "mm_shape_bfloat16": "8192^3",
}


def fake_report(cuda_us: float = 10.0, triton_us: float = 12.0, triton_ok: bool = True) -> Report:
    """One matmul shape with two dualk backends and two peers, plus a dispatch-overhead row."""

    def row(impl, kind, us, ok=True, note=""):
        return Row(
            "matmul",
            "1024^3",
            "1024x1024x1024",
            "bfloat16",
            impl,
            kind,
            us=us,
            iqr_us=0.1 * us,
            tflops=2 * 1024**3 / us / 1e6,
            gbs=6 * 2**20 / us / 1e3,
            roofline_pct=30.0,
            rel_err=1e-3,
            ok=ok,
            speedup_vs_eager=11.0 / us,
            note=note,
        )

    rows = [
        row("dualk:cuda", "dualk", cuda_us),
        row(
            "dualk:triton",
            "dualk",
            triton_us,
            triton_ok,
            "" if triton_ok else "3 of 9 elements outside tolerance",
        ),
        row("cuBLAS (torch.matmul)", "peer", 11.0),
        row("torch.compile", "peer", 10.5),
        Row("dispatch", "n=16", "n=16", "float32", "dualk.add auto", "overhead", host_us=4.2),
    ]
    return Report(dict(ENV), dict(CEILINGS), rows)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(cli.main, list(args), catch_exceptions=False)


def save(report: Report, path: Path) -> Path:
    rep.write_json(report, path)
    return path


# ---------------------------------------------------------------------------- argument checks
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--op", "convolution"], "Invalid value for '--op': 'convolution' is not one of"),
        (["--dtype", "int8"], "Invalid value for '--dtype': 'int8' is not one of"),
        (["--suite", "huge"], "Invalid value for '--suite': 'huge' is not one of"),
        (["--backend", "cutlass"], "Invalid value for '--backend'"),
        (["--op", "add", "--shape", "nope"], "operator 'add' has no shape case 'nope'"),
        (["--op", "add", "--shape", "tiny"], "operator 'add' has no shape case 'tiny'"),
        (["--all-backends", "--backend", "cuda"], "either --all-backends or --backend"),
        (["--fail-if-slower", "5"], "--fail-if-slower needs --compare"),
        (["--compare", "/nonexistent.json"], "does not exist"),
    ],
)
def test_bad_arguments_are_rejected_with_a_clear_message(runner, args, expected):
    result = invoke(runner, "bench", *args)
    assert result.exit_code == 2, result.output
    assert expected in result.output


def test_fail_if_slower_must_not_be_negative(runner, tmp_path):
    old = save(fake_report(), tmp_path / "old.json")
    result = invoke(runner, "bench", "--compare", str(old), "--fail-if-slower", "-1")
    assert result.exit_code == 2
    assert "--fail-if-slower" in result.output


def test_compare_file_that_is_not_a_benchmark_is_rejected_before_running(runner, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    result = invoke(runner, "bench", "--op", "add", "--compare", str(bad))
    assert result.exit_code == 2
    assert "not a dualk benchmark file" in result.output
    assert "smoke check" not in result.output  # nothing ran


def test_list_shows_every_case_of_the_chosen_operators(runner):
    result = invoke(runner, "bench", "--list", "--op", "matmul", "--op", "add")
    assert result.exit_code == 0
    for name in ("matmul", "add"):
        for case in OPS[name].cases:
            assert case.name in result.output
    assert "fused_mlp" not in result.output
    line = next(ln for ln in result.output.splitlines() if ln.split()[:1] == ["4096^3"])
    assert "default,full" in line and "gpu only" in line


# ---------------------------------------------------------------------------- no GPU
# On a GPU machine Triton's kernels are compiled for the GPU, not the interpreter, and the real
# benchmark runs instead; the smoke check's Triton rows are only meaningful without a GPU.
@pytest.mark.skipif(HAS_CUDA, reason="the CPU smoke check runs Triton under its interpreter")
def test_without_gpu_bench_runs_the_cpu_smoke_check_and_exits_0(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)
    out_json, out_csv = tmp_path / "smoke.json", tmp_path / "smoke.csv"
    result = invoke(
        runner,
        "bench",
        "--op",
        "add",
        "--op",
        "matmul",
        "--dtype",
        "float32",
        "--json",
        str(out_json),
        "--csv",
        str(out_csv),
        "--plot",
        str(tmp_path / "p.png"),
    )
    assert result.exit_code == 0, result.output
    assert "No CUDA GPU found" in result.output
    assert "CPU smoke check: correctness only" in result.output
    assert "time (us)" not in result.output and "TFLOP/s" not in result.output
    assert "skipped: the CPU smoke check has no timings to plot" in result.output
    assert not (tmp_path / "p.png").exists()

    data = json.loads(out_json.read_text())
    assert data["env"]["mode"] == rep.SMOKE_MODE and data["env"]["gpu"] is None
    rows = data["rows"]
    assert all(r["us"] is None and r["tflops"] is None for r in rows)
    triton = [r for r in rows if r["impl"] == "dualk:triton"]
    expected_cases = [c.name for op in ("add", "matmul") for c in smoke.smoke_cases(OPS[op])]
    assert [r["case"] for r in triton] == expected_cases
    assert all(r["ok"] is not None and r["rel_err"] is not None for r in triton), triton  # judged
    assert all(r["note"].startswith("unavailable:") for r in rows if r["impl"] == "dualk:cuda")
    assert "not run: dualk:cuda" in result.output
    with out_csv.open() as f:
        assert len(list(csv.DictReader(f))) == len(rows)

    shown = invoke(runner, "report", str(out_json))  # a saved smoke check stays a smoke check
    assert shown.exit_code == 0 and "CPU smoke check" in shown.output
    assert "time (us)" not in shown.output


@pytest.mark.skipif(HAS_CUDA, reason="the CPU smoke check runs Triton under its interpreter")
def test_without_gpu_the_default_run_checks_every_operator(runner, monkeypatch):
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)
    result = invoke(runner, "bench")
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if not ln.startswith("note:")]
    checked = {ln.split()[0] for ln in lines if "dualk:triton" in ln}
    assert checked == set(OPS)  # whether each is right is tests/test_parity.py's business


def test_smoke_check_skips_gpu_only_cases_and_flags_wrong_results(monkeypatch):
    rows = smoke.cpu_smoke_check(["add"], None, ["n=2^28"], ["triton"], with_peers=False)
    assert rows and all(r.note.startswith("skipped: gpu_only") and r.ok is None for r in rows)

    import dualk.backends.torch_ref as torch_ref

    spec = OPS["relu_scale"]
    monkeypatch.setitem(spec._resolved, "torch", lambda x, s: torch_ref.relu_scale(x, s) + 1)
    rows = smoke.cpu_smoke_check(["relu_scale"], None, ["n=1023"], ["torch"], with_peers=False)
    assert all(r.ok is False for r in rows)
    text = render.render_smoke(rows)
    assert "FAIL" in text and "!! 2 row(s) failed" in text


# ---------------------------------------------------------------------------- info
def test_info_lists_versions_backends_and_locations(runner):
    result = invoke(runner, "info")
    assert result.exit_code == 0, result.output
    out = result.output
    for key in ("dualk", "GPU", "driver", "CUDA (torch)", "nvcc", "torch", "triton"):
        assert any(line.startswith(key) for line in out.splitlines()), key
    for name in OPS:
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name
    assert "CUDA build cache" in out and "Triton cache" in out and "config file" in out
    if "none (no CUDA device" in out:
        assert "no [1]" in out and "[1] the CUDA backend needs CUDA tensors" in out


def test_info_shows_what_a_call_runs_under_overrides(runner, monkeypatch):
    """An environment override names its variable; a bad one is the error every call raises."""
    monkeypatch.setenv("DUALK_BACKEND_MATMUL", "torch")
    out = invoke(runner, "info").output
    assert any(line.split()[:1] == ["matmul"] and "torch (from DUALK_BACKEND_MATMUL)" in line
               for line in out.splitlines()), out  # fmt: skip
    monkeypatch.setenv("DUALK_BACKEND", "garbage")
    result = invoke(runner, "info")
    assert result.exit_code == 0, result.output
    assert "unknown backend 'garbage' (from DUALK_BACKEND)" in result.output
    assert any(
        line.split()[:1] == ["add"] and "error [" in line for line in result.output.splitlines()
    )


def test_python_m_dualk_help():
    result = subprocess.run(
        [sys.executable, "-m", "dualk", "--help"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for command in ("bench", "info", "build", "report"):
        assert command in result.stdout


# ---------------------------------------------------------------------------- writers / loader
def test_json_round_trip_keeps_every_field(tmp_path):
    report = fake_report(triton_ok=False)
    path = save(report, tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert set(data) == {"env", "ceilings", "rows"}
    assert list(data["rows"][0]) == list(rep.ROW_FIELDS)
    assert rep.load_report(path) == report


def test_loader_ignores_unknown_row_keys_and_names_missing_ones(tmp_path):
    data = fake_report().to_json()
    data["rows"][0]["added_later"] = 1
    assert rep.report_from_json(data).rows[0] == fake_report().rows[0]
    del data["rows"][1]["impl"]
    with pytest.raises(ValueError, match="row 1 lacks impl"):
        rep.report_from_json(data, "x.json")


def test_csv_has_row_fields_then_environment_and_ceilings(tmp_path):
    report = fake_report()
    rep.write_csv(report, tmp_path / "r.csv")
    with (tmp_path / "r.csv").open() as f:
        reader = csv.DictReader(f)
        lines = list(reader)
    assert reader.fieldnames == [
        *rep.ROW_FIELDS,
        *(f"env.{k}" for k in ENV),
        *(f"ceiling.{k}" for k in CEILINGS),
    ]
    assert len(lines) == len(report.rows)
    assert lines[0]["impl"] == "dualk:cuda" and float(lines[0]["us"]) == 10.0
    assert lines[0]["env.gpu"] == ENV["gpu"] and lines[-1]["ceiling.copy_gbs"] == "3000.0"
    assert lines[-1]["us"] == ""  # None is an empty cell


def test_table_marks_the_winner_and_flags_wrong_results():
    text = render.render_table(fake_report(cuda_us=12.0, triton_us=8.0, triton_ok=False))
    lines = text.splitlines()
    header = next(ln for ln in lines if "time (us)" in ln)
    for unit in ("IQR (us)", "host (us)", "TFLOP/s", "GB/s", "roofline %", "x eager", "rel err"):
        assert unit in header
    winner = [ln for ln in lines if ln.startswith("*")]
    assert len(winner) == 1 and "torch.compile" in winner[0]  # triton is faster but wrong
    assert next(ln for ln in lines if "dualk:triton" in ln).startswith("!!")
    assert "!! 1 row(s) failed" in text
    assert "H100" in text and "copy 3000 GB/s" in text and "bfloat16 GEMM 700.0 TFLOP/s" in text
    assert "dispatch overhead" in text


# ---------------------------------------------------------------------------- compare
def test_compare_matches_rows_and_gates_only_dualk_rows():
    old, new = fake_report(), fake_report(cuda_us=11.5, triton_us=12.0)
    new.rows[2].us = 30.0  # a slower peer never fails the gate
    new.rows.append(Row("add", "n=1", "n=1", "float32", "dualk:cuda", "dualk", us=1.0))
    cmp = cmp_mod.compare(old, new)
    assert len(cmp.changes) == 5 and len(cmp.only_new) == 1 and not cmp.only_old
    assert cmp.changes[0].ratio == pytest.approx(1.15)
    assert [c.new.impl for c, _ in cmp.regressions(10)] == ["dualk:cuda"]
    assert cmp.regressions(20) == []
    text = cmp_mod.render_compare(cmp, 10)
    assert "+15.0%" in text and "!! 15.0% slower (limit 10%)" in text
    assert "1 only in the new run" in text


def test_compare_gate_counts_wrong_or_missing_results():
    old, new = fake_report(), fake_report(triton_ok=False)
    new.rows[0].us, new.rows[0].note = None, "error: RuntimeError: boom"
    reasons = dict((c.new.impl, why) for c, why in cmp_mod.compare(old, new).regressions(50))
    assert reasons == {
        "dualk:cuda": "no longer timed (ERROR)",
        "dualk:triton": "now fails the correctness check",
    }


def test_bench_compare_on_a_gpu_run(runner, tmp_path, monkeypatch):
    """The GPU path with engine.run stood in for: table, files, comparison and the exit code."""
    import dualk.tools.bench

    monkeypatch.setattr(cli.common, "has_gpu", lambda: True)
    monkeypatch.setattr(dualk.tools.bench, "run", lambda *a, **k: fake_report(cuda_us=12.0))
    old = save(fake_report(), tmp_path / "old.json")
    out = tmp_path / "out" / "new.json"
    result = invoke(
        runner,
        "bench",
        "--op",
        "matmul",
        "--compare",
        str(old),
        "--fail-if-slower",
        "10",
        "--json",
        str(out),
        "--csv",
        str(tmp_path / "new.csv"),
    )
    assert result.exit_code == 1, result.output
    assert "time (us)" in result.output and "new/old" in result.output
    assert "dualk:cuda: 20.0% slower (limit 10%)" in result.output
    assert rep.load_report(out).rows[0].us == 12.0 and (tmp_path / "new.csv").exists()

    result = invoke(runner, "bench", "--compare", str(old), "--fail-if-slower", "25")
    assert result.exit_code == 0, result.output
    assert "no dualk row is more than 25% slower" in result.output


# ---------------------------------------------------------------------------- report command
def test_report_prints_the_table_and_gates(runner, tmp_path):
    new = save(fake_report(triton_us=15.0), tmp_path / "new.json")
    old = save(fake_report(), tmp_path / "old.json")
    result = invoke(runner, "report", str(new))
    assert result.exit_code == 0 and "== matmul ==" in result.output
    result = invoke(runner, "report", str(new), "--compare", str(old), "--fail-if-slower", "10")
    assert result.exit_code == 1 and "dualk:triton: 25.0% slower" in result.output


def test_report_writes_markdown_with_plot_link(runner, tmp_path):
    """The markdown report (always; CI has no matplotlib), then with --plot its image and link."""
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    src = save(fake_report(triton_ok=False), results / "h100.json")
    md, png = tmp_path / "BENCHMARKS.md", results / "h100.png"
    result = invoke(runner, "report", str(src), "--markdown", str(md))
    assert result.exit_code == 0, result.output
    text = md.read_text()
    assert (
        "do not edit by hand" in text
        and "[`bench/results/h100.json`](bench/results/h100.json)" in text
    )
    assert "NVIDIA H100" in text and "copy 3000 GB/s" in text and "### matmul" in text
    assert (
        "| time (us) | IQR (us) | TFLOP/s | GB/s | roofline % | x eager | rel err | check |" in text
    )
    assert "**dualk:cuda** \\*" in text  # the fastest correct row
    assert "**FAIL**" in text and "## Failures" in text
    assert "![speedup" not in text  # no plot asked for

    pytest.importorskip("matplotlib")
    result = invoke(runner, "report", str(src), "--markdown", str(md), "--plot", str(png))
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![speedup vs eager PyTorch](bench/results/h100.png)" in md.read_text()


def test_plot_without_matplotlib_says_how_to_install(runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    src = save(fake_report(), tmp_path / "r.json")
    result = invoke(runner, "report", str(src), "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 2 and "pip install 'dualk[plot]'" in result.output

    # Without a GPU there is nothing to plot, whether or not matplotlib is there.
    monkeypatch.setattr(cli.common, "has_gpu", lambda: False)
    result = invoke(
        runner, "bench", "--op", "add", "--backend", "torch", "--plot", str(tmp_path / "p.png")
    )
    assert result.exit_code == 0 and "the CPU smoke check has no timings to plot" in result.output


def test_report_update_replaces_the_rerun_groups_and_names_their_file(runner, tmp_path):
    base = fake_report()
    extra = Row("add", "n=4", "4", "float32", "dualk:cuda", "dualk", us=3.0, ok=True)
    base = Report(base.env, base.ceilings, [*base.rows[:-1], extra, base.rows[-1]])
    newer = fake_report(cuda_us=7.0, triton_us=9.0)  # the matmul group rerun
    newer.env["date"] = "2026-12-01T00:00:00+00:00"
    merged, groups = rep.merge_update(base, newer, "newer.json")
    assert groups == [("matmul", "1024x1024x1024", "bfloat16")]
    by_impl = {r.impl: r for r in merged.rows if r.op == "matmul"}
    assert by_impl["dualk:cuda"].us == 7.0 and by_impl["dualk:triton"].us == 9.0
    assert len(merged.rows) == len(base.rows)  # replaced, not appended twice
    assert [r.op for r in merged.rows if r.kind != "overhead"][-1] == "add"  # base order kept
    assert merged.rows[-1].kind == "overhead" and merged.env == base.env

    other_gpu = fake_report()
    other_gpu.env["gpu"] = "NVIDIA H200"
    with pytest.raises(ValueError, match="H200"):
        rep.merge_update(base, other_gpu, "h200.json")

    src, upd = save(base, tmp_path / "base.json"), save(newer, tmp_path / "newer.json")
    md = tmp_path / "BENCHMARKS.md"
    result = invoke(runner, "report", str(src), "--update", str(upd), "--markdown", str(md))
    assert result.exit_code == 0, result.output
    text = md.read_text()
    assert "Rows of matmul 1024x1024x1024 bfloat16 are from the later run [`newer.json`]" in text
    assert f"--update {upd}" in text and "| 7.00 |" in text
    bad = save(other_gpu, tmp_path / "h200.json")
    result = invoke(runner, "report", str(src), "--update", str(bad))
    assert result.exit_code == 2 and "H200" in result.output
