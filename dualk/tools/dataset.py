"""The benchmark dataset: one JSON-lines file per GPU model (`bench/results/h100.jsonl`,
`bench/results/h200.jsonl`) holding every recorded `dualk bench --json` run, keyed.

Two kinds of line, each a JSON object:
- a run: `{"type": "run", "run": NAME, "gpu": "h100", "date": ..., "commit": ..., "env": {...},
  "ceilings": {...}}`, once per run; NAME is the run's name (the stem of the file it was
  recorded as, e.g. "2026-11-26-h100-default-s19", which notes cite);
- a row: `{"type": "row", "run": NAME, "gpu": ..., "date": ..., "commit": ..., "op": ...,
  "case": ..., "dtype": ..., "backend": ..., <the row's measurements>}`, one per measured row;
  "backend" is the row's implementation (`dualk:cuda`, `torch eager`, `cuBLAS`, ...).

A model zoo run (`dualk bench --models --json`) is recorded the same way: its run line has
`"kind": "zoo"` and its `method`; each of its results is a row with op `model:<name>`, case the
mode (eager, compiled, train), backend "dualk.fuse" and the result's fields (ratio, wall, device
and host times of the original and the fused model, errors, what fuse replaced; the per-round
samples are left out).

A row is keyed by (op, case, dtype, backend, gpu, date, commit). `export` gives a run back in
`dualk bench --json`'s form, so `dualk report` renders any recorded run; `plot` draws one metric
of one operator across the recorded runs (`dualk results plot`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

KEY = ("op", "case", "dtype", "backend", "gpu", "date", "commit")
METRICS = ("us", "host_us", "tflops", "gbs", "roofline_pct", "speedup_vs_eager", "rel_err", "ratio",
           "device_ratio")  # fmt: skip
ZOO_BACKEND = "dualk.fuse"
_ZOO_LEFT_OUT = ("samples",)  # per-round timings: in the run's own JSON file, not the dataset


def gpu_slug(env: dict) -> str:
    """ "h100", "h200", ... from a run's environment ("NVIDIA H100 80GB HBM3" -> "h100")."""
    name = str(env.get("gpu") or env.get("device") or "cpu")  # (the zoo's env says "device")
    found = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", name)
    return found.group(1).lower() if found else re.sub(r"\W+", "-", name.lower()).strip("-")


def read(path: str | os.PathLike) -> tuple[dict[str, dict], list[dict]]:
    """(runs by name, rows in file order) of a dataset file."""
    runs: dict[str, dict] = {}
    rows: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            entry = json.loads(line)
            kind = entry.get("type")
            if kind == "run":
                runs[entry["run"]] = entry
            elif kind == "row":
                rows.append(entry)
            else:
                raise ValueError(f"{path}:{number}: a line of unknown type {kind!r}")
    return runs, rows


def is_zoo(report: dict) -> bool:
    """Whether `report` is a model zoo run (`dualk bench --models --json`)."""
    results = report.get("results")
    return isinstance(results, list) and "rows" not in report and all("model" in r for r in results)


def lines_of(report: dict, run: str, commit: str | None = None) -> list[dict]:
    """The dataset lines of one `dualk bench --json` report (operators or the model zoo) recorded
    as `run`."""
    env = report.get("env") or {}
    head = {"run": run, "gpu": gpu_slug(env), "date": env.get("date"), "commit": commit}
    if is_zoo(report):
        out = [{"type": "run", **head, "kind": "zoo", "env": env, "method": report.get("method")}]
        for result in report["results"]:
            fields = {k: v for k, v in result.items() if k not in _ZOO_LEFT_OUT}
            model, mode = fields.pop("model"), fields.pop("mode")
            out.append({"type": "row", **head, "op": f"model:{model}", "case": mode, **fields,
                        "backend": ZOO_BACKEND})  # fmt: skip
        return out
    out = [{"type": "run", **head, "env": env, "ceilings": report.get("ceilings") or {}}]
    for row in report.get("rows") or []:
        fields = dict(row)
        backend = fields.pop("impl", None)
        out.append({"type": "row", **head, **fields, "backend": backend})
    return out


def add(path: str | os.PathLike, report: dict, run: str, commit: str | None = None) -> int:
    """Append a report to the dataset at `path` (created if missing) as run `run`; returns the
    rows added. A run already in the file is refused (runs are never rewritten)."""
    path = Path(path)
    if path.exists() and run in read(path)[0]:
        raise ValueError(f"{path} already holds a run named {run!r}")
    lines = lines_of(report, run, commit)
    with open(path, "a", encoding="utf-8") as f:
        for entry in lines:
            f.write(json.dumps(entry, sort_keys=False) + "\n")
    return len(lines) - 1


def export(path: str | os.PathLike, run: str) -> dict:
    """Run `run` of the dataset in `dualk bench --json`'s form (env, ceilings, rows; a zoo run:
    env, method, results)."""
    runs, rows = read(path)
    if run not in runs:
        raise KeyError(f"{path} holds no run named {run!r} (runs: {', '.join(runs)})")
    meta = runs[run]
    if meta.get("kind") == "zoo":
        results = []
        for row in rows:
            if row["run"] != run:
                continue
            fields = {k: v for k, v in row.items()
                      if k not in ("type", "run", "gpu", "date", "commit", "backend")}  # fmt: skip
            model, mode = fields.pop("op").removeprefix("model:"), fields.pop("case")
            results.append({"model": model, "mode": mode, **fields})
        return {"env": meta.get("env", {}), "method": meta.get("method"), "results": results}
    out_rows = []
    for row in rows:
        if row["run"] != run:
            continue
        fields = {k: v for k, v in row.items() if k not in ("type", "run", "gpu", "date", "commit")}
        backend = fields.pop("backend", None)
        out_rows.append({**{k: fields.pop(k) for k in ("op", "case") if k in fields},
                         **fields, "impl": backend})  # fmt: skip
    return {"env": meta.get("env", {}), "ceilings": meta.get("ceilings", {}), "rows": out_rows}


def select(
    rows: Iterable[dict],
    *,
    op: str | None = None,
    dtype: str | None = None,
    case: str | None = None,
    backends: Sequence[str] = (),
    runs: Sequence[str] = (),
) -> list[dict]:
    """The rows matching every given key (None / empty: any)."""
    return [
        r
        for r in rows
        if (op is None or r.get("op") == op)
        and (dtype is None or r.get("dtype") == dtype)
        and (case is None or r.get("case") == case)
        and (not backends or r.get("backend") in backends)
        and (not runs or r.get("run") in runs)
    ]


def plot(rows: Sequence[dict], out: str | os.PathLike, metric: str = "us") -> int:
    """One panel per (op, case, dtype), the runs in date order along x, one line per backend:
    `metric` of each row. Needs matplotlib (`dualk[plot]`); returns the panels drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple, dict[str, list[tuple[str, float]]]] = {}
    for r in sorted(rows, key=lambda r: (r.get("date") or "", r["run"])):
        value = r.get(metric)
        if value is None:
            continue
        key = (r.get("op"), r.get("case"), r.get("dtype"))
        panels.setdefault(key, {}).setdefault(r.get("backend"), []).append((r["run"], value))
    if not panels:
        raise ValueError(f"nothing to plot: no selected row has {metric!r}")
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for ax, ((op, case, dtype), series) in zip(axes[:, 0], panels.items(), strict=True):
        order = list(dict.fromkeys(run for points in series.values() for run, _ in points))
        for backend, points in series.items():
            ax.plot([order.index(run) for run, _ in points], [v for _, v in points], "o-",
                    label=backend)  # fmt: skip
        ax.set_xticks(range(len(order)), order, rotation=20, ha="right", fontsize=7)
        ax.set_title(f"{op} {case} {dtype}", fontsize=9)
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return len(panels)
