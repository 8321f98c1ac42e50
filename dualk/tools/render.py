"""Plain-text rendering of benchmark results for the terminal: the environment lines, the table of a
timed run, the table of a CPU smoke check, and the cells and column layout that the BENCHMARKS.md
page (dualk/tools/markdown.py) shares with them.

Nothing here measures anything: every function takes a Report (or rows) and renders it, so it all
works, and is tested, on a machine without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .bench import Report, Row
from .report import (
    failed_rows,
    group_rows,
    is_smoke,
    measured_rows,
    overhead_rows,
    ran,
    status,
    winner,
)


# ---------------------------------------------------------------------------- cells
def fmt(v: float | None, spec: str = ".1f") -> str:
    """A number for a table cell; "-" for None or NaN."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


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


# The measured columns of a timed row, in order: (header, Row field, format). One list for the
# terminal table and the markdown page, so the two cannot drift apart.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("time (us)", "us", ".2f"),
    ("IQR (us)", "iqr_us", ".2f"),
    ("host (us)", "host_us", ".2f"),
    ("TFLOP/s", "tflops", ".1f"),
    ("GB/s", "gbs", ".0f"),
    ("roofline %", "roofline_pct", ".0f"),
    ("x eager", "speedup_vs_eager", ".2f"),
    ("rel err", "rel_err", ".1e"),
)


def metric_header(skip: Iterable[str] = ()) -> list[str]:
    return [h for h, attr, _ in METRICS if attr not in skip]


def metric_cells(r: Row, skip: Iterable[str] = ()) -> list[str]:
    return [fmt(getattr(r, attr), spec) for _, attr, spec in METRICS if attr not in skip]


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


# ---------------------------------------------------------------------------- timed run
TABLE_HEADER = ("", "shape", "dtype", "impl", *metric_header(), "check", "note")
_TABLE_RIGHT = range(4, 4 + len(METRICS))


def _table_cells(r: Row, mark: str) -> list[str]:
    note = short(r.note, 60) if status(r) != "ok" else ""
    return [mark, r.shape, r.dtype, r.impl, *metric_cells(r), status(r), note]


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
    for op, groups in group_rows(measured_rows(report)).items():
        body: list[list[str]] = []
        for rows in groups.values():
            best = winner(rows)
            if body:
                body.append([""] * len(TABLE_HEADER))
            for r in rows:
                mark = "!!" if status(r) == "FAIL" else "*" if r is best else ""
                body.append(_table_cells(r, mark))
        lines += ["", f"== {op} ==", *align(TABLE_HEADER, body, _TABLE_RIGHT)]
    overhead = overhead_rows(report)
    if overhead:
        lines += ["", "== dispatch overhead (host time per call, 16-element add) =="]
        lines += align(
            ("impl", "host (us)"), [[r.impl, fmt(r.host_us, ".2f")] for r in overhead], [1]
        )
    lines += failure_block(report.rows)
    return "\n".join(lines)


def failure_block(rows: Iterable[Row]) -> list[str]:
    bad = failed_rows(rows)
    if not bad:
        return []
    out = ["", f"!! {len(bad)} row(s) failed: a wrong or broken result is not a benchmark figure"]
    out += [f"!!   {r.op} {r.shape} {r.dtype} {r.impl}: {status(r)}: {r.note}" for r in bad]
    return out


# ---------------------------------------------------------------------------- CPU smoke check
def render_smoke(rows: Sequence[Row]) -> str:
    """The CPU smoke check: which implementation gave a correct result on which small case. No
    timing columns, since nothing measured on the CPU says anything about a GPU. Only dualk rows
    that ran count as checks; PyTorch's own rows are counted apart (they check the harness), and
    rows that did not run (unavailable backend, skipped case) are summarised once per reason."""
    done = [r for r in rows if ran(r)]
    header = ("op", "case", "dtype", "impl", "rel err", "check", "note")
    body = [
        [r.op, r.case if r.case == r.shape else f"{r.case} ({r.shape})", r.dtype, r.impl,
         fmt(r.rel_err, ".1e"), status(r), short(r.note, 70) if status(r) != "ok" else ""]
        for r in done
    ]  # fmt: skip
    lines = ["CPU smoke check: correctness only (no timings)"]
    lines += align(header, body, [4]) if body else ["(nothing ran)"]
    lines.append("")
    checks = [r for r in done if r.kind == "dualk"]
    if checks:
        lines.append(f"{sum(r.ok is True for r in checks)} of {len(checks)} dualk checks correct")
    else:
        lines.append("no dualk check ran")
    peers = [r for r in done if r.kind != "dualk"]
    if peers:
        lines.append(
            f"{sum(r.ok is True for r in peers)} of {len(peers)} PyTorch rows correct "
            "(a check of the harness, not of dualk)"
        )
    not_run: dict[tuple[str, str], int] = {}
    for r in rows:
        if not ran(r):
            not_run[(r.impl, r.note)] = not_run.get((r.impl, r.note), 0) + 1
    lines += [f"not run: {impl} ({n} checks): {note}" for (impl, note), n in not_run.items()]
    lines += failure_block(rows)
    return "\n".join(lines)
