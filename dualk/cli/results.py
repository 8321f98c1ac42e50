"""Saved runs on the command line: `dualk results ...` (the keyed dataset), `dualk report FILE.json` (the table, CSV, plot, BENCHMARKS.md or
a comparison), and the file writing and old-vs-new regression gate that `dualk bench` shares."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from ..tools import dataset as dataset_store
from ..tools import report as results
from ..tools.bench import Report
from ..tools.compare import compare, render_compare
from ..tools.markdown import render_markdown
from ..tools.plot import PlotUnavailableError, plot, require_matplotlib
from ..tools.render import align, render_table
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


# ------------------------------------------------------------------------ the keyed dataset
@click.group("results")
def results_group() -> None:
    """The benchmark dataset: one JSON-lines file per GPU (bench/results/<gpu>.jsonl) holding
    every recorded run, keyed by op, case, dtype, backend, GPU, date and commit."""


@results_group.command("list")
@click.argument("dataset", type=EXISTING_FILE)
def results_list(dataset: Path) -> None:
    """The runs of DATASET: name, date, commit and rows."""
    runs, rows = dataset_store.read(dataset)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["run"]] = counts.get(row["run"], 0) + 1
    lines = [(name, meta.get("date") or "-", meta.get("commit") or "-", str(counts.get(name, 0)))
             for name, meta in runs.items()]  # fmt: skip
    click.echo("\n".join(align(("run", "date", "commit", "rows"), lines, right=(3,))))


@results_group.command("add")
@click.argument("dataset", type=FILE_PATH)
@click.argument("json_file", type=EXISTING_FILE)
@click.option("--run", "run_name", help="The run's name (default: JSON_FILE's stem).")
@click.option("--commit", help="The commit the run measured.")
def results_add(dataset: Path, json_file: Path, run_name: str | None, commit: str | None) -> None:
    """Append a `dualk bench --json` run (operators, or the model zoo's `--models`) to DATASET
    (created if missing)."""
    report = json.loads(json_file.read_text())
    try:
        added = dataset_store.add(dataset, report, run_name or json_file.stem, commit)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{dataset}: added {added} rows as {run_name or json_file.stem!r}")


@results_group.command("export")
@click.argument("dataset", type=EXISTING_FILE)
@click.argument("run")
@click.option("-o", "--out", "out", type=FILE_PATH, help="Write here (default: stdout).")
def results_export(dataset: Path, run: str, out: Path | None) -> None:
    """RUN of DATASET in `dualk bench --json`'s form (`dualk report` renders it)."""
    try:
        text = json.dumps(dataset_store.export(dataset, run), indent=1) + "\n"
    except KeyError as exc:
        raise click.ClickException(exc.args[0]) from None
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out}")


@results_group.command("plot")
@click.argument("dataset", type=EXISTING_FILE)
@click.option("-o", "--out", "out", type=FILE_PATH, required=True, help="The PNG to write.")
@click.option("--op", help="Operator (default: all).")
@click.option("--dtype", help="float32, float16 or bfloat16 (default: all).")
@click.option("--case", help="One shape case (default: all).")
@click.option("--backend", "backends", multiple=True, help="Backends to draw (repeatable).")
@click.option("--run", "runs", multiple=True, help="Runs to draw (repeatable; default: all).")
@click.option("--metric", default="us", show_default=True, type=click.Choice(dataset_store.METRICS))
def results_plot(dataset, out, op, dtype, case, backends, runs, metric) -> None:
    """One metric across the recorded runs: a panel per (op, case, dtype), a line per backend."""
    try:
        require_matplotlib()
    except PlotUnavailableError as exc:
        raise click.ClickException(str(exc)) from None
    _, rows = dataset_store.read(dataset)
    chosen = dataset_store.select(rows, op=op, dtype=dtype, case=case, backends=backends, runs=runs)
    try:
        panels = dataset_store.plot(chosen, out, metric)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {out} ({panels} panels)")
