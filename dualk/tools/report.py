"""Benchmark result files (`dualk.tools.bench.Report` on disk) and the questions every presentation asks
of their rows (which ran, which failed, which is the fastest correct one). No text layout here:
dualk/tools/render.py draws the terminal tables, dualk/tools/markdown.py the BENCHMARKS.md page,
dualk/tools/plot.py the speedup plot, dualk/tools/compare.py the old-vs-new comparison.

JSON: ``Report.to_json()``, i.e. ``{"env": {...}, "ceilings": {...}, "rows": [{Row fields}]}``;
`load_report` reads it back. CSV: one line per Row with the Row fields in order, then one column
per environment key (``env.<key>``) and per ceiling (``ceiling.<key>``), repeated on every line so
each line stands alone.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, fields
from pathlib import Path

from .bench import Report, Row

ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Row))
_REQUIRED_ROW_FIELDS = ("op", "case", "shape", "dtype", "impl", "kind")
SMOKE_MODE = "cpu smoke check: correctness only, no timings"  # env["mode"] of such a run
_NOT_RUN_PREFIXES = ("unavailable:", "skipped:")  # Row.note of a check that never ran


# ---------------------------------------------------------------------------- row questions
def status(row: Row) -> str:
    """One word for a row's state: ok, FAIL (wrong result), ERROR, unavailable, or "-"."""
    if row.ok is False:
        return "FAIL"
    if row.note.startswith("error:"):
        return "ERROR"
    if row.note.startswith("unavailable:"):
        return "unavailable"
    return "ok" if row.ok else "-"


def ran(row: Row) -> bool:
    """Did this row's implementation run at all (rather than being unavailable or skipped)?"""
    return not row.note.startswith(_NOT_RUN_PREFIXES)


def failed_rows(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if status(r) in ("FAIL", "ERROR")]


def group_rows(rows: Iterable[Row]) -> dict[str, dict[tuple[str, str], list[Row]]]:
    """op -> (shape, dtype) -> rows, in first-seen order (the order the run measured them)."""
    out: dict[str, dict[tuple[str, str], list[Row]]] = {}
    for r in rows:
        out.setdefault(r.op, {}).setdefault((r.shape, r.dtype), []).append(r)
    return out


def winner(rows: Iterable[Row]) -> Row | None:
    """The fastest timed row that passed the correctness check, or None."""
    timed = [r for r in rows if r.us is not None and r.us > 0 and r.ok is not False]
    return min(timed, key=lambda r: r.us) if timed else None


def measured_rows(report: Report) -> list[Row]:
    """The operator rows (everything but the dispatch-overhead rows)."""
    return [r for r in report.rows if r.kind != "overhead"]


def overhead_rows(report: Report) -> list[Row]:
    return [r for r in report.rows if r.kind == "overhead"]


def is_smoke(report: Report) -> bool:
    """Was this the CPU smoke check (correctness only, no timings)?"""
    return report.env.get("mode") == SMOKE_MODE


def merge_update(base: Report, newer: Report, source: str = "<update>") -> tuple[Report, list]:
    """`base` with every (op, shape, dtype) group that `newer` measured replaced by newer's rows
    (groups only newer has are appended; the dispatch-overhead rows stay base's): a partial rerun
    after a kernel change updates a full run without rerunning it all. Both runs must come from
    the same GPU model (a ValueError otherwise). Returns the merged report and the (op, shape,
    dtype) groups taken from `newer`, for the page to say so."""
    gpu, newer_gpu = base.env.get("gpu"), newer.env.get("gpu")
    if gpu != newer_gpu:
        raise ValueError(f"{source}: measured on {newer_gpu!r}, the base run on {gpu!r}")
    fresh = {
        (op, shape, dtype): group
        for op, by_case in group_rows(measured_rows(newer)).items()
        for (shape, dtype), group in by_case.items()
    }
    rows: list[Row] = []
    groups: list = []  # in the page's order: where base had them, then the new ones
    for r in base.rows:
        key = (r.op, r.shape, r.dtype)
        if r.kind == "overhead" or key not in fresh:
            rows.append(r)
        elif key not in groups:
            groups.append(key)
            rows += fresh[key]
    for key, group in fresh.items():
        if key not in groups:
            groups.append(key)
            rows += group
    return Report(dict(base.env), dict(base.ceilings), rows), groups


# ---------------------------------------------------------------------------- files
def report_from_json(data: dict, source: str = "<json>") -> Report:
    """A Report from `Report.to_json()` output; unknown row keys are ignored (newer files)."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(
            f"{source}: not a dualk benchmark file "
            "(expected an object with 'env', 'ceilings' and 'rows')"
        )
    rows = []
    for i, item in enumerate(data["rows"]):
        missing = [k for k in _REQUIRED_ROW_FIELDS if k not in item]
        if missing:
            raise ValueError(f"{source}: row {i} lacks {', '.join(missing)}")
        rows.append(Row(**{k: v for k, v in item.items() if k in ROW_FIELDS}))
    return Report(dict(data.get("env") or {}), dict(data.get("ceilings") or {}), rows)


def load_report(path: str | os.PathLike) -> Report:
    """Read a benchmark JSON file written by `write_json` (or `dualk bench --json`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return report_from_json(data, str(path))


def write_json(report: Report, path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(report.to_json(), indent=1) + "\n")


def csv_columns(report: Report) -> list[str]:
    return [
        *ROW_FIELDS,
        *(f"env.{k}" for k in report.env),
        *(f"ceiling.{k}" for k in report.ceilings),
    ]


def write_csv(report: Report, path: str | os.PathLike) -> None:
    """One line per row: the Row fields, then the environment and ceilings (see module doc)."""
    fixed = {
        **{f"env.{k}": v for k, v in report.env.items()},
        **{f"ceiling.{k}": v for k, v in report.ceilings.items()},
    }
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=csv_columns(report))
        writer.writeheader()
        for r in report.rows:
            writer.writerow({**asdict(r), **fixed})
