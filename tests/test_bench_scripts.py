"""The GPU benchmark scripts bench/small_batch_latency.py and bench/ddp_step.py run end to end
in their CPU smoke modes (tiny sizes; DDP over gloo with two processes), parse their arguments,
print their plans with --dry-run, and read tiny-cuda-nn's output lines (a stand-in tcnn_bench)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LATENCY = ROOT / "bench" / "small_batch_latency.py"
DDP = ROOT / "bench" / "ddp_step.py"
GLU = ROOT / "bench" / "linear_glu_llama.py"


def _env() -> dict:
    # As a user's CPU run: no Triton interpreter (conftest sets it for the test process).
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DUALK_POISON")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(*args, timeout=60) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
        env=_env(), cwd=ROOT,
    )  # fmt: skip
    return proc


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _fake_tcnn(tmp_path: Path) -> Path:
    """A stand-in tcnn_bench: tcnn's line format, one line for the smoke run's 112-128-128-10."""
    exe = tmp_path / "tcnn" / "tcnn_bench"
    exe.parent.mkdir()
    exe.write_text(
        "#!/bin/sh\n"
        "echo 'device: fake' >&2\n"
        "echo 'TCNN width=128 hidden_layers=2 in=112 out=10 batch=8 us_per_call=13.4'\n"
        "echo 'TCNN width=64 hidden_layers=4 in=64 out=16 batch=1048576 us_per_call=198.0'\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_parse_tcnn_lines():
    mod = _load(LATENCY)
    text = (
        "some banner\n"
        "TCNN width=128 hidden_layers=2 in=112 out=10 batch=256 us_per_call=13.41\n"
        "TCNN width=64 hidden_layers=3 in=32 out=16 batch=1048576 us_per_call=1.73e2\n"
    )
    lines = mod.parse_tcnn(text)
    assert lines == [
        {"width": 128, "hidden_layers": 2, "in": 112, "out": 10, "batch": 256,
         "us_per_call": 13.41},
        {"width": 64, "hidden_layers": 3, "in": 32, "out": 16, "batch": 1048576,
         "us_per_call": 173.0},
    ]  # fmt: skip
    # The configs' keys are tcnn's: 112-128-128-10 is width 128 x2 hidden, NeRF 64 x3.
    keys = {(c.name, c.rows): c.tcnn_key for c in mod.configs(smoke=False)}
    assert keys[("tcnn 112-128-128-10", 256)] == (128, 2, 112, 10, 256)
    assert keys[("nerf 32-64-64-64-16", 1 << 20)] == (64, 3, 32, 16, 1 << 20)
    assert keys[("64x4 64-in 16-out", 1 << 20)] == (64, 4, 64, 16, 1 << 20)
    assert keys[("seed 100-128-64-10", 32)] is None  # two hidden widths: no tcnn equivalent


def test_tcnn_missing_is_reported(tmp_path):
    mod = _load(LATENCY)
    assert mod.run_tcnn(None, 20, 200)["reason"] == "no --tcnn PATH given"
    info = mod.run_tcnn(str(tmp_path / "nowhere"), 20, 200)
    assert not info["ran"] and "does not exist" in info["reason"]


def test_dry_runs(capsys):
    """Argument parsing and the plans, in this process (no subprocess: each would import torch)."""
    assert _load(LATENCY).main(["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "112-128-128-10" in text and "rows=1048576" in text and "fp32 rows=32" in text
    ddp = _load(DDP)
    assert ddp.main(["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "256-512-512-512-128" in text and "65536 rows per rank" in text
    assert ddp.main(["--dry-run", "--smoke"]) == 0
    assert "2 x cpu (gloo)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        ddp.parse_args(["--dtypes", "fp8"])
    assert exc.value.code == 2 and "unknown" in capsys.readouterr().err


def test_small_batch_latency_smoke(tmp_path):
    out = tmp_path / "latency.json"
    proc = _run(LATENCY, "--smoke", "--tcnn", _fake_tcnn(tmp_path).parent, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    data = json.loads(out.read_text())
    assert data["tcnn"]["ran"] and len(data["tcnn"]["lines"]) == 2
    assert {"device_name", "torch", "triton", "date"} <= data.keys()
    rows = {r["config"]: r for r in data["rows"]}
    assert rows["tcnn 112-128-128-10"]["tcnn_us"] == 13.4
    assert rows["seed 100-128-64-10"]["tcnn_us"] is None
    for row in data["rows"]:
        paths = row["paths"]
        for name in ("auto", "module", "eager"):  # run on any machine, and checked
            assert paths[name]["us"] > 0 and paths[name]["host_us"] > 0, (name, paths[name])
            assert paths[name]["ok"], (name, paths[name])
        for name in ("cuda", "triton", "graph"):  # on the CPU: not run, with the reason
            assert paths[name]["us"] is None and paths[name]["reason"], (name, paths[name])
    # The table has a tcnn column with the stand-in's number.
    assert "13.4" in proc.stdout


def test_ddp_step_smoke(tmp_path):
    out = tmp_path / "ddp.json"
    proc = _run(DDP, "--smoke", "--json", out, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["backend"] == "gloo" and data["world"] == 2
    assert data["env"]["NCCL_NVLS_ENABLE"] == "0"
    for name in ("fp32", "bf16"):
        s = data["summary"][name]
        assert s["original"]["ms_per_step"] > 0 and s["fused"]["ms_per_step"] > 0
        assert s["ratio_original_over_fused"] > 0
        assert s["fused_modules"] == 1
        assert s["replica_max_abs_diff"] == 0.0
    assert data["failures"] == []
    assert "orig/fused" in proc.stdout


def test_linear_glu_llama_quick(tmp_path):
    """bench/linear_glu_llama.py --quick: tiny shapes end to end (forward, backward, goals, JSON);
    on the CPU eager and auto run and are checked against eager, the GPU paths say why not."""
    out = tmp_path / "glu.json"
    proc = _run(GLU, "--quick", "--json", out, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout and "[goals]" in proc.stdout
    data = json.loads(out.read_text())
    assert {"device_name", "torch", "triton", "cuda", "date", "rows"} <= data.keys()
    assert len(data["rows"]) == 4
    for row in data["rows"]:
        for kind in ("forward", "backward"):
            paths = row[kind]
            for name in ("eager", "auto"):
                assert paths[name]["us"] > 0 and paths[name]["ok"], (kind, name, paths[name])
            if not data["device"].startswith("cuda"):
                assert paths["cuda"]["us"] is None and paths["cuda"]["reason"], paths["cuda"]
        assert any(g["goal"].startswith("bwd") for g in row["goals"])


def test_linear_glu_llama_plan(capsys):
    mod = _load(GLU)
    assert mod.main(["--dry-run", "--sweep-triton"]) == 0
    text = capsys.readouterr().out
    assert "8192x4096->14336: forward + backward + triton sweep" in text
    assert [s.label for s in mod.shapes(quick=False)][:3] == [
        "16x4096->11008", "512x4096->11008", "8192x4096->11008",
    ]  # fmt: skip
