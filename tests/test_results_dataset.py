"""The keyed benchmark dataset (bench/results/<gpu>.jsonl) and `dualk results`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dualk.cli import main
from dualk.tools import dataset

ROOT = Path(__file__).resolve().parent.parent
DATASETS = sorted((ROOT / "bench" / "results").glob("*.jsonl"))

REPORT = {
    "env": {"date": "2026-11-27T10:00:00+00:00", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.13"},
    "ceilings": {"copy_gbs": 3000.0},
    "rows": [
        {"op": "add", "case": "n=16", "shape": "n=16", "dtype": "float32", "impl": "dualk:cuda",
         "kind": "dualk", "us": 2.5, "host_us": 9.0, "ok": True, "note": ""},
        {"op": "add", "case": "n=16", "shape": "n=16", "dtype": "float32", "impl": "torch eager",
         "kind": "torch", "us": 3.0, "host_us": 7.0, "ok": True, "note": ""},
    ],
}  # fmt: skip


def test_gpu_slug():
    assert dataset.gpu_slug({"gpu": "NVIDIA H100 80GB HBM3"}) == "h100"
    assert dataset.gpu_slug({"gpu": "NVIDIA H200"}) == "h200"
    assert dataset.gpu_slug({}) == "cpu"


def test_add_export_round_trip_and_keys(tmp_path):
    path = tmp_path / "h100.jsonl"
    assert dataset.add(path, REPORT, "run-a", "abc1234") == 2
    runs, rows = dataset.read(path)
    assert list(runs) == ["run-a"] and runs["run-a"]["commit"] == "abc1234"
    for row in rows:
        assert all(k in row for k in dataset.KEY)
        assert row["gpu"] == "h100" and row["date"] == REPORT["env"]["date"]
    assert {r["backend"] for r in rows} == {"dualk:cuda", "torch eager"}
    assert dataset.export(path, "run-a") == REPORT
    with pytest.raises(ValueError, match="already holds"):
        dataset.add(path, REPORT, "run-a")
    with pytest.raises(KeyError):
        dataset.export(path, "run-b")


ZOO = {
    "env": {"date": "2026-11-27T11:00:00+00:00", "device": "NVIDIA H200", "torch": "2.11"},
    "method": {"ratio": "original wall ms / fused wall ms per call"},
    "results": [
        {"model": "seed_dnn", "mode": "eager", "dtype": "float32", "ratio": 3.4, "orig_ms": 0.12,
         "fused_ms": 0.035, "samples": [[0.12, 0.035]], "fuse": "1 FusedMLP", "ok": True},
        {"model": "gpt2", "mode": "compiled", "dtype": "bfloat16", "ratio": 0.99, "orig_ms": 1.1,
         "fused_ms": 1.11, "samples": [], "fuse": "no chain", "ok": True},
    ],
}  # fmt: skip


def test_zoo_run_round_trip(tmp_path):
    """A model zoo run is recorded as rows op "model:<name>", case the mode, backend dualk.fuse,
    without its per-round samples, and exported back in the zoo's own form."""
    path = tmp_path / "h200.jsonl"
    assert dataset.gpu_slug(ZOO["env"]) == "h200"
    assert dataset.add(path, ZOO, "zoo-a", "abc1234") == 2
    runs, rows = dataset.read(path)
    assert runs["zoo-a"]["kind"] == "zoo" and runs["zoo-a"]["gpu"] == "h200"
    assert [(r["op"], r["case"], r["backend"]) for r in rows] == [
        ("model:seed_dnn", "eager", "dualk.fuse"), ("model:gpt2", "compiled", "dualk.fuse")]  # fmt: skip
    assert all("samples" not in r for r in rows) and rows[0]["ratio"] == 3.4
    back = dataset.export(path, "zoo-a")
    assert back["method"] == ZOO["method"]
    assert back["results"] == [
        {k: v for k, v in r.items() if k != "samples"} for r in ZOO["results"]
    ]
    assert dataset.select(rows, op="model:gpt2")[0]["ratio"] == 0.99


def test_cli_add_list_export(tmp_path):
    run_file = tmp_path / "2026-11-27-h100-x.json"
    run_file.write_text(json.dumps(REPORT))
    store = tmp_path / "h100.jsonl"
    runner = CliRunner()
    result = runner.invoke(main, ["results", "add", str(store), str(run_file), "--commit", "abc"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["results", "list", str(store)])
    assert result.exit_code == 0 and "2026-11-27-h100-x" in result.output and "abc" in result.output
    out = tmp_path / "back.json"
    result = runner.invoke(
        main, ["results", "export", str(store), "2026-11-27-h100-x", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == REPORT
    result = runner.invoke(main, ["report", str(out)])
    assert result.exit_code == 0, result.output


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    store = tmp_path / "h100.jsonl"
    dataset.add(store, REPORT, "run-a")
    dataset.add(store, REPORT, "run-b")
    out = tmp_path / "add.png"
    result = CliRunner().invoke(
        main, ["results", "plot", str(store), "--op", "add", "--metric", "host_us", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0


@pytest.mark.parametrize("path", DATASETS, ids=lambda p: p.name)
def test_recorded_datasets_read_and_export(path):
    runs, rows = dataset.read(path)
    assert runs and rows
    assert {r["run"] for r in rows} <= set(runs)
    assert {r["gpu"] for r in rows} == {path.stem}
    for name in runs:
        exported = dataset.export(path, name)
        if runs[name].get("kind") == "zoo":
            assert exported["env"]["device"] and exported["results"]
        else:
            assert exported["env"]["gpu"] and exported["rows"]
