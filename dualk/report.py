"""Presentation of benchmark results (`dualk.bench.Report`): the terminal table, the CPU smoke-check
table, JSON and CSV files (with the full environment fingerprint), the speedup plot, the
old-vs-new comparison behind `--compare` and the BENCHMARKS.md page behind `dualk report`.

Nothing here measures anything: every function takes a Report (or rows) and renders it, so it all
works, and is tested, on a machine without a GPU.

JSON: ``Report.to_json()``, i.e. ``{"env": {...}, "ceilings": {...}, "rows": [{Row fields}]}``;
`load_report` reads it back. CSV: one line per Row with the Row fields in order, then one column
per environment key (``env.<key>``) and per ceiling (``ceiling.<key>``), repeated on every line so
each line stands alone.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .bench import Report, Row

ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Row))
_REQUIRED_ROW_FIELDS = ("op", "case", "shape", "dtype", "impl", "kind")
PLOT_INSTALL_HINT = "plotting needs matplotlib: pip install 'dualk[plot]'"
SMOKE_MODE = "cpu smoke check: correctness only, no timings"  # env["mode"] of such a run


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


# ---------------------------------------------------------------------------- small helpers
def fmt(v: float | None, spec: str = ".1f") -> str:
    """A number for a table cell; "-" for None or NaN."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def align(
    header: Sequence[str], body: Sequence[Sequence[str]], right: Iterable[int] = ()
) -> list[str]:
    """Lines of a plain-text table: columns padded to their widest cell (`right`: column indexes
    aligned right, for numbers), two spaces between columns, a dashed rule under the header."""
    right = set(right)
    widths = [max(len(str(r[i])) for r in (header, *body)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in body)]


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


def status(row: Row) -> str:
    """One word for a row's state: ok, FAIL (wrong result), ERROR, unavailable, or "-"."""
    if row.ok is False:
        return "FAIL"
    if row.note.startswith("error:"):
        return "ERROR"
    if row.note.startswith("unavailable:"):
        return "unavailable"
    return "ok" if row.ok else "-"


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def is_smoke(report: Report) -> bool:
    """Was this the CPU smoke check (correctness only, no timings)?"""
    return report.env.get("mode") == SMOKE_MODE


def _measured(report: Report) -> list[Row]:
    return [r for r in report.rows if r.kind != "overhead"]


def _overhead(report: Report) -> list[Row]:
    return [r for r in report.rows if r.kind == "overhead"]


def _failures(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if status(r) in ("FAIL", "ERROR")]


# ---------------------------------------------------------------------------- environment lines
def describe_gpu(env: dict) -> str:
    """ "NVIDIA H100 (sm 9.0, 132 SMs, 79.1 GiB)", or a plain "none (...)"."""
    gpu = env.get("gpu")
    if not gpu:
        return "none (no CUDA device visible to PyTorch)"
    extra = [
        f"sm {env['capability']}" if env.get("capability") else "",
        f"{env['sm_count']} SMs" if env.get("sm_count") else "",
        f"{env['gpu_memory_gib']} GiB" if env.get("gpu_memory_gib") else "",
        f"x{env['gpu_count']}" if (env.get("gpu_count") or 1) > 1 else "",
    ]
    extra = [e for e in extra if e]
    return f"{gpu} ({', '.join(extra)})" if extra else str(gpu)


def describe_env(env: dict) -> list[str]:
    """Two or three short lines: the GPU, the software versions, the date."""
    gpu_line = f"GPU: {describe_gpu(env)}"
    if env.get("driver"):
        gpu_line += f", driver {env['driver']}"
    versions = [f"{k} {env[k]}" for k in ("dualk", "torch", "triton", "python") if env.get(k)]
    if env.get("torch_cuda"):
        versions.insert(2, f"CUDA {env['torch_cuda']}")
    if env.get("nvcc"):
        versions.append(f"nvcc {env['nvcc']}")
    lines = [gpu_line, "versions: " + ", ".join(versions)]
    when = [f"date {env['date']}"] if env.get("date") else []
    if "allow_tf32" in env:
        when.append(f"allow_tf32={env['allow_tf32']}")
    if when:
        lines.append(", ".join(when))
    return lines


def describe_ceilings(ceilings: dict) -> list[str]:
    """One item per measured ceiling, e.g. "copy 3010 GB/s (2^28 fp32)", "bf16 GEMM 712 TFLOP/s
    (8192^3)"; unknown keys are shown as they are."""
    out = []
    for key, value in ceilings.items():
        if key == "copy_gbs":
            shape = ceilings.get("copy_shape")
            out.append(f"copy {fmt(value, '.0f')} GB/s" + (f" ({shape})" if shape else ""))
        elif key.startswith("mm_tflops_"):
            dt = key.removeprefix("mm_tflops_")
            shape = ceilings.get(f"mm_shape_{dt}")
            out.append(f"{dt} GEMM {fmt(value, '.1f')} TFLOP/s" + (f" ({shape})" if shape else ""))
        elif key == "copy_shape" or key.startswith("mm_shape_"):
            continue
        else:
            out.append(f"{key} {fmt(value, '.3g') if isinstance(value, float) else value}")
    return out


# ---------------------------------------------------------------------------- terminal table
TABLE_HEADER = (
    "",
    "shape",
    "dtype",
    "impl",
    "time (us)",
    "IQR (us)",
    "host (us)",
    "TFLOP/s",
    "GB/s",
    "roofline %",
    "x eager",
    "rel err",
    "check",
    "note",
)
_TABLE_RIGHT = range(4, 12)


def _table_cells(r: Row, mark: str) -> list[str]:
    return [
        mark,
        r.shape,
        r.dtype,
        r.impl,
        fmt(r.us, ".2f"),
        fmt(r.iqr_us, ".2f"),
        fmt(r.host_us, ".2f"),
        fmt(r.tflops, ".1f"),
        fmt(r.gbs, ".0f"),
        fmt(r.roofline_pct, ".0f"),
        fmt(r.speedup_vs_eager, ".2f"),
        fmt(r.rel_err, ".1e"),
        status(r),
        _short(r.note, 60) if status(r) != "ok" else "",
    ]


def render_table(report: Report) -> str:
    """The run for a person: the environment and ceilings, then one table per operator with the
    fastest correct implementation of each (shape, dtype) marked `*`, rows that failed the
    correctness check marked `!!`, the dispatch overhead, and a list of failures at the end.
    A CPU smoke-check report is shown as such, without timing columns."""
    if is_smoke(report):
        return "\n".join([*describe_env(report.env), "", render_smoke(report.rows)])
    lines = [*describe_env(report.env)]
    if report.ceilings:
        lines.append("ceilings: " + "; ".join(describe_ceilings(report.ceilings)))
    lines.append(
        "legend: * fastest correct implementation of the shape, !! wrong result; "
        "x eager = eager PyTorch time / this time"
    )
    for op, groups in group_rows(_measured(report)).items():
        body: list[list[str]] = []
        for rows in groups.values():
            best = winner(rows)
            if body:
                body.append([""] * len(TABLE_HEADER))
            for r in rows:
                mark = "!!" if status(r) == "FAIL" else "*" if r is best else ""
                body.append(_table_cells(r, mark))
        lines += ["", f"== {op} ==", *align(TABLE_HEADER, body, _TABLE_RIGHT)]
    overhead = _overhead(report)
    if overhead:
        lines += ["", "== dispatch overhead (host time per call, 16-element add) =="]
        lines += align(
            ("impl", "host (us)"), [[r.impl, fmt(r.host_us, ".2f")] for r in overhead], [1]
        )
    lines += _failure_block(report.rows)
    return "\n".join(lines)


def _failure_block(rows: Iterable[Row]) -> list[str]:
    bad = _failures(rows)
    if not bad:
        return []
    out = ["", f"!! {len(bad)} row(s) failed: a wrong or broken result is not a benchmark figure"]
    out += [f"!!   {r.op} {r.shape} {r.dtype} {r.impl}: {status(r)}: {r.note}" for r in bad]
    return out


def render_smoke(rows: Sequence[Row]) -> str:
    """The CPU smoke check: which implementation gave a correct result on which small case. No
    timing columns, since nothing measured on the CPU says anything about a GPU. Rows that did not
    run (unavailable backend, skipped case) are summarised once per reason, not listed."""
    ran = [r for r in rows if not r.note.startswith(("unavailable:", "skipped:"))]
    header = ("op", "case", "dtype", "impl", "rel err", "check", "note")
    body = [
        [r.op, r.case if r.case == r.shape else f"{r.case} ({r.shape})", r.dtype, r.impl,
         fmt(r.rel_err, ".1e"), status(r), _short(r.note, 70) if status(r) != "ok" else ""]
        for r in ran
    ]  # fmt: skip
    lines = ["CPU smoke check: correctness only (no timings)"]
    lines += align(header, body, [4]) if body else ["(nothing ran)"]
    passed = sum(r.ok is True for r in ran)
    lines += ["", f"{passed} of {len(ran)} checks correct"]
    ran_ids = {id(r) for r in ran}
    not_run: dict[tuple[str, str], int] = {}
    for r in rows:
        if id(r) not in ran_ids:
            not_run[(r.impl, r.note)] = not_run.get((r.impl, r.note), 0) + 1
    lines += [f"not run: {impl} ({n} checks): {note}" for (impl, note), n in not_run.items()]
    lines += _failure_block(rows)
    return "\n".join(lines)


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


# ---------------------------------------------------------------------------- plot
def require_matplotlib() -> None:
    """Raise PlotUnavailableError (with the install hint) when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailableError(PLOT_INSTALL_HINT) from None


def plot(report: Report, path: str | os.PathLike) -> None:
    """Speedup vs eager PyTorch: one panel per operator, one group of bars per (shape, dtype), one
    bar per dualk backend or PyTorch peer; failed rows hatched red and labelled FAIL."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ops = group_rows(
        r for r in _measured(report) if r.speedup_vs_eager is not None or r.ok is False
    )
    if not ops:
        raise ValueError("nothing to plot: no row has a speedup vs eager")
    # One colour per implementation across all panels, so dualk:cuda looks the same everywhere.
    palette = plt.get_cmap("tab20")
    every_impl = list(
        dict.fromkeys(r.impl for groups in ops.values() for rs in groups.values() for r in rs)
    )
    colour = {impl: palette(i % 20) for i, impl in enumerate(every_impl)}
    fig, axes = plt.subplots(len(ops), 1, figsize=(11, 3.6 * len(ops)), squeeze=False)
    for ax, (op, groups) in zip(axes[:, 0], ops.items(), strict=True):
        impls = list(dict.fromkeys(r.impl for rows in groups.values() for r in rows))
        width = 0.8 / len(impls)
        for g, rows in enumerate(groups.values()):
            for r in rows:
                j = impls.index(r.impl)
                x = g + (j - (len(impls) - 1) / 2) * width
                failed = r.ok is False
                bar = ax.bar(
                    x,
                    r.speedup_vs_eager or 0.0,
                    width,
                    color=colour[r.impl],
                    hatch="xx" if failed else None,
                    edgecolor="red" if failed else None,
                )
                if failed:
                    ax.annotate(
                        "FAIL",
                        (x, bar[0].get_height()),
                        ha="center",
                        va="bottom",
                        color="red",
                        fontsize=7,
                    )
        handles = [Patch(color=colour[impl], label=impl) for impl in impls]
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(groups)), [f"{s}\n{d}" for s, d in groups], fontsize=8)
        ax.set_ylabel("speedup vs eager (x)")
        ax.set_title(op)
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    gpu = report.env.get("gpu") or "no GPU"
    fig.suptitle(f"dualk: speedup vs eager PyTorch, {gpu}, {report.env.get('date', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- compare
def row_key(r: Row) -> tuple[str, str, str, str]:
    return (r.op, r.shape, r.dtype, r.impl)


def row_time(r: Row) -> float | None:
    """The time compared: device time, or host time for dispatch-overhead rows."""
    return r.host_us if r.kind == "overhead" else r.us


@dataclass
class Change:
    old: Row
    new: Row

    @property
    def ratio(self) -> float | None:
        """new time / old time (above 1: slower)."""
        a, b = row_time(self.old), row_time(self.new)
        return b / a if a and b is not None else None

    def regressed(self, pct: float) -> str | None:
        """Why this dualk row fails a `--fail-if-slower pct` gate, or None."""
        if self.new.kind != "dualk" or row_time(self.old) is None:
            return None
        if self.new.ok is False:
            return "now fails the correctness check"
        if row_time(self.new) is None:
            return f"no longer timed ({status(self.new)})"
        if self.ratio is not None and self.ratio > 1.0 + pct / 100.0:
            return f"{(self.ratio - 1) * 100:.1f}% slower (limit {pct:g}%)"
        return None


@dataclass
class Comparison:
    changes: list[Change] = field(default_factory=list)
    only_old: list[Row] = field(default_factory=list)
    only_new: list[Row] = field(default_factory=list)

    def regressions(self, pct: float) -> list[tuple[Change, str]]:
        return [(c, why) for c in self.changes if (why := c.regressed(pct)) is not None]


def compare(old: Report, new: Report) -> Comparison:
    """Match rows by (op, shape, dtype, impl)."""
    old_rows = {row_key(r): r for r in old.rows}
    new_keys = {row_key(r) for r in new.rows}
    out = Comparison()
    for r in new.rows:
        match = old_rows.get(row_key(r))
        if match is None:
            out.only_new.append(r)
        else:
            out.changes.append(Change(match, r))
    out.only_old = [r for r in old.rows if row_key(r) not in new_keys]
    return out


def render_compare(cmp: Comparison, pct: float | None = None) -> str:
    """Old vs new time per matched row; with `pct`, dualk rows over the limit marked SLOWER."""
    header = ("op", "shape", "dtype", "impl", "old (us)", "new (us)", "new/old", "change", "")
    body = []
    reasons = dict((id(c), why) for c, why in cmp.regressions(pct)) if pct is not None else {}
    for c in cmp.changes:
        ratio = c.ratio
        change = f"{(ratio - 1) * 100:+.1f}%" if ratio is not None else "-"
        flag = "!! " + reasons[id(c)] if id(c) in reasons else ""
        body.append(
            [
                c.new.op,
                c.new.shape,
                c.new.dtype,
                c.new.impl,
                fmt(row_time(c.old), ".2f"),
                fmt(row_time(c.new), ".2f"),
                fmt(ratio, ".3f"),
                change,
                flag,
            ]
        )
    lines = ["comparison: rows matched by (op, shape, dtype, impl); new/old above 1 is slower"]
    lines += align(header, body, [4, 5, 6, 7]) if body else ["(no rows in common)"]
    if cmp.only_old or cmp.only_new:
        lines.append(
            f"unmatched: {len(cmp.only_old)} row(s) only in the old file, "
            f"{len(cmp.only_new)} only in the new run"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- markdown
def _md_table(
    header: Sequence[str], body: Sequence[Sequence[str]], right: Iterable[int] = ()
) -> list[str]:
    right = set(right)
    rule = ["---:" if i in right else "---" for i in range(len(header))]
    return ["| " + " | ".join(cells) + " |" for cells in (header, rule, *body)]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


def render_markdown(
    report: Report, *, source: str, plot: str | None = None, command: str = ""
) -> str:
    """BENCHMARKS.md: environment, ceilings, one table per operator (winner bold and `*`, speedup
    vs eager, % of roofline, relative error), dispatch overhead, and the plot if given. `source`
    (the JSON file) and `plot` are links relative to the markdown file; `command` is the command
    that regenerates the page."""
    env = report.env
    by = f" by `{command}`" if command else " by `dualk report`"
    lines = [
        "# dualk benchmarks",
        "",
        "<!-- generated by `dualk report`; do not edit by hand -->",
        "",
        f"Generated from [`{source}`]({source}){by}; do not edit by hand, regenerate it.",
        "",
        "## Environment",
        "",
    ]
    keys = (
        "gpu",
        "capability",
        "sm_count",
        "gpu_memory_gib",
        "driver",
        "torch_cuda",
        "nvcc",
        "torch",
        "triton",
        "python",
        "dualk",
        "allow_tf32",
        "platform",
        "date",
    )
    env_rows = [[k, _md_escape(str(env[k]))] for k in keys if k in env]
    env_rows += [[k, _md_escape(str(v))] for k, v in env.items() if k not in keys]
    lines += _md_table(("", "value"), env_rows)
    if report.ceilings:
        lines += ["", "## Ceilings (measured at the start of the run)", ""]
        lines += [f"- {c}" for c in describe_ceilings(report.ceilings)]
    if plot:
        lines += [
            "",
            "## Speedup vs eager PyTorch",
            "",
            f"![speedup vs eager PyTorch]({plot})",
        ]
    if is_smoke(report):
        lines += ["", "> **This run is a CPU smoke check: correctness only, no timings.**"]
    lines += [
        "",
        "## Results",
        "",
        "Times are medians of CUDA-event timings with L2 flushed; **\\*** marks the fastest "
        "implementation that passed the correctness check; x eager = eager PyTorch time / this "
        "time; roofline % = the time the ceilings allow / this time; rel err = max |out - ref| / "
        "max |ref| against a float64 reference.",
    ]
    header = (
        "shape",
        "dtype",
        "impl",
        "time (us)",
        "IQR (us)",
        "TFLOP/s",
        "GB/s",
        "roofline %",
        "x eager",
        "rel err",
        "check",
    )
    for op, groups in group_rows(_measured(report)).items():
        body = []
        for rows in groups.values():
            best = winner(rows)
            for r in rows:
                impl = _md_escape(r.impl)
                check = status(r)
                cells = [
                    _md_escape(r.shape),
                    r.dtype,
                    f"**{impl}** \\*" if r is best else impl,
                    fmt(r.us, ".2f"),
                    fmt(r.iqr_us, ".2f"),
                    fmt(r.tflops, ".1f"),
                    fmt(r.gbs, ".0f"),
                    fmt(r.roofline_pct, ".0f"),
                    fmt(r.speedup_vs_eager, ".2f"),
                    fmt(r.rel_err, ".1e"),
                    f"**{check}**" if check in ("FAIL", "ERROR") else check,
                ]
                body.append(cells)
        lines += ["", f"### {op}", "", *_md_table(header, body, range(3, 10))]
    overhead = _overhead(report)
    if overhead:
        lines += ["", "### dispatch overhead (host time per call, 16-element add)", ""]
        lines += _md_table(
            ("impl", "host (us)"),
            [[_md_escape(r.impl), fmt(r.host_us, ".2f")] for r in overhead],
            [1],
        )
    bad = _failures(report.rows)
    if bad:
        lines += ["", "## Failures", ""]
        lines += [
            f"- {r.op} {_md_escape(r.shape)} {r.dtype} {_md_escape(r.impl)}: **{status(r)}** "
            f"{_md_escape(r.note)}"
            for r in bad
        ]
    return "\n".join(lines) + "\n"
