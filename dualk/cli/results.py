"""Saved runs on the command line: `dualk report FILE.json` (the table, CSV, plot, BENCHMARKS.md or
a comparison), and the file writing and old-vs-new regression gate that `dualk bench` shares."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from ..tools import report as results
from ..tools.bench import Report
from ..tools.compare import compare, render_compare
from ..tools.markdown import render_markdown
from ..tools.plot import PlotUnavailableError, plot, require_matplotlib
from ..tools.render import render_table
from .common import (
    EXISTING_FILE,
    FILE_PATH,
    check_compare_options,
    compare_options,
    load,
)


def write_outputs(
    report: Report, json_path: Path | None, csv_path: Path | None, plot_path: Path | None
) -> list[Path]:
    """Write the files asked for (creating folders); say what was written; return those paths."""
    written = []
    for path, write in (
        (json_path, results.write_json),
        (csv_path, results.write_csv),
        (plot_path, plot),
    ):
        if path is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            write(report, path)
        except (PlotUnavailableError, ValueError) as exc:
            click.echo(f"{path} not written: {exc}", err=True)
            continue
        click.echo(f"wrote {path}")
        written.append(path)
    return written


def compare_and_gate(
    old_path: Path,
    new: Report,
    fail_if_slower: float | None,
    allow_no_compare: bool,
    new_label: str = "this run",
) -> None:
    """Print old vs new. With `fail_if_slower`, exit 1 when a dualk row regressed beyond that
    many percent, and also when the gate could compare no dualk row at all (a run without
    timings, no rows in common): a gate that judged nothing must not pass silently, unless
    `allow_no_compare` says that is expected."""
    cmp = compare(load(old_path), new, str(old_path), new_label)
    click.echo("\n" + render_compare(cmp, fail_if_slower))
    if fail_if_slower is None:
        return
    limit = f"{fail_if_slower:g}%"
    bad = cmp.regressions(fail_if_slower)
    if bad:
        click.echo(
            f"\n!! {len(bad)} dualk row(s) regressed against {old_path} (limit {limit}):", err=True
        )
        for change, why in bad:
            r = change.new
            click.echo(f"!!   {r.op} {r.shape} {r.dtype} {r.impl}: {why}", err=True)
        sys.exit(1)
    why = cmp.why_gate_cannot_compare()
    if why is not None:
        if allow_no_compare:
            click.echo(f"regression gate not applied (--allow-no-compare): {why}")
            return
        click.echo(
            f"\n!! --fail-if-slower {fail_if_slower:g}: the regression gate compared nothing: "
            f"{why}. Pass --allow-no-compare if that is expected.",
            err=True,
        )
        sys.exit(1)
    click.echo(
        f"no dualk row is more than {limit} slower than in {old_path} "
        f"({len(cmp.gated())} dualk rows compared)"
    )


@click.command("report")
@click.argument("json_file", type=EXISTING_FILE)
@click.option("--markdown", "markdown_path", type=FILE_PATH, help="Write a BENCHMARKS.md page.")
@click.option(
    "--plot",
    "plot_path",
    type=FILE_PATH,
    help="Write a PNG of speedup vs eager (needs dualk[plot]); linked from --markdown.",
)
@click.option(
    "--csv", "csv_path", type=FILE_PATH, help="Write the rows as CSV, environment included."
)
@click.option(
    "--update",
    "update_paths",
    type=EXISTING_FILE,
    multiple=True,
    help="A later partial run on the same GPU model (repeatable, in order): its rows replace "
    "the same op/shape/dtype rows of JSON_FILE; the page names the rows it took from each.",
)
@compare_options
def report_command(
    json_file: Path,
    update_paths: tuple[Path, ...],
    markdown_path: Path | None,
    plot_path: Path | None,
    csv_path: Path | None,
    compare_path: Path | None,
    fail_if_slower: float | None,
    allow_no_compare: bool,
) -> None:
    """Present a saved `dualk bench --json` run: the table (when no file is asked for), CSV, a
    plot, a BENCHMARKS.md page, or a comparison with an older run."""
    check_compare_options(compare_path, fail_if_slower)
    report = load(json_file)
    updates = []  # (file, its date, the (op, shape, dtype) groups taken from it)
    for path in update_paths:
        newer = load(path)
        try:
            report, groups = results.merge_update(report, newer, str(path))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--update") from None
        updates.append((path, newer.env.get("date", "?"), groups))
    if results.is_smoke(report):
        for option, path, why in (("--markdown", markdown_path, "a benchmarks page needs a GPU run's timings"),
                                  ("--plot", plot_path, "no timings to plot")):  # fmt: skip
            if path is not None:
                raise click.UsageError(
                    f"{option}: {json_file} is a CPU smoke check (correctness only): {why}"
                )
    if plot_path is not None:
        try:
            require_matplotlib()
        except PlotUnavailableError as exc:
            raise click.UsageError(f"--plot: {exc}") from None
    if not (markdown_path or plot_path or csv_path or compare_path):
        click.echo(render_table(report))
    plotted = plot_path in write_outputs(report, None, csv_path, plot_path)
    if markdown_path is not None:
        base = markdown_path.resolve().parent
        command = ["dualk", "report", str(json_file), "--markdown", str(markdown_path)]
        for path, _, _ in updates:
            command += ["--update", str(path)]
        if plotted:
            command += ["--plot", str(plot_path)]
        text = render_markdown(
            report,
            source=os.path.relpath(json_file.resolve(), base),
            plot=os.path.relpath(plot_path.resolve(), base) if plotted else None,
            command=shlex.join(command),
            updates=[
                (os.path.relpath(p.resolve(), base), date, groups) for p, date, groups in updates
            ],
        )
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(text)
        click.echo(f"wrote {markdown_path}")
    if compare_path is not None:
        compare_and_gate(compare_path, report, fail_if_slower, allow_no_compare, str(json_file))
