"""`dualk bench`: time dualk's backends against PyTorch on this GPU; on a machine without one, the
CPU smoke check (dualk/tools/smoke.py). Either way it says what it did not do: an option it cannot honour
is a usage error or a note printed before anything runs, a backend that cannot run is listed as
not run (never as a check), and a run in which no dualk check ran exits non-zero."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click
import torch

from .. import dispatch
from ..core.errors import DualkError
from ..registry import OPS
from ..tools import bench as engine
from ..tools import smoke
from ..tools.bench import SUITES
from ..tools.compare import timings_missing
from ..tools.plot import PlotUnavailableError, require_matplotlib
from ..tools.render import align, render_smoke, render_table
from ..tools.report import failed_rows, ran
from . import common
from .common import FILE_PATH, case_options, check_compare_options, compare_options, load
from .results import compare_and_gate, write_outputs
from .zoo import run_zoo

BACKEND_CHOICES = ("cuda", "triton", "torch", "auto")
ALL_BACKENDS = ("cuda", "triton", "auto")  # --all-backends, and the default


def _list_cases(ops: Sequence[str]) -> None:
    for name in ops:
        click.echo(f"{name}:")
        body = []
        for c in OPS[name].cases:
            included = (("quick", c.quick), ("default", c.bench), ("full", c.bench or c.gpu_only))
            suites = [s for s, inc in included if inc]
            dtypes = ",".join(str(d)[6:] for d in c.bench_dtypes)
            device = "gpu only" if c.gpu_only else "cpu ok"
            body.append([c.name, ",".join(suites) or "- (tests only)", device, dtypes])
        for line in align(("shape case", "suites", "device", "bench dtypes"), body):
            click.echo("  " + line)


@click.command()
@case_options(SUITES, "time")
@click.option(
    "--all-backends",
    is_flag=True,
    help="Time every GPU backend (cuda, triton) and auto; also the default.",
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(BACKEND_CHOICES),
    help="Time only these dualk backends (repeatable).",
)
@click.option(
    "--peers/--no-peers", default=True, show_default=True, help="Time PyTorch's own paths too."
)
@click.option(
    "--compile/--no-compile",
    "with_compile",
    default=False,
    show_default=True,
    help="Include torch.compile peers (slow to compile).",
)
@click.option("--cuda-graph", is_flag=True, help="Time dualk backends as CUDA-graph replays.")
@click.option(
    "--json", "json_path", type=FILE_PATH, help="Write the results and environment as JSON."
)
@click.option(
    "--csv", "csv_path", type=FILE_PATH, help="Write one CSV line per result, environment included."
)
@click.option(
    "--plot",
    "plot_path",
    type=FILE_PATH,
    help="Write a PNG of speedup vs eager (needs dualk[plot]).",
)
@compare_options
@click.option(
    "--list", "list_cases", is_flag=True, help="List operators and shape cases, then exit."
)
@click.option(
    "--models",
    multiple=True,
    metavar="NAMES",
    help="Run the model zoo instead: model names, comma-separated or repeated, or 'all' "
    "(`--models all --list` lists them; dualk/cli/zoo.py).",
)
@click.option(
    "--modes", metavar="MODES", help="With --models: eager,compiled,train (default: all three)."
)
@click.option("--quick", is_flag=True, help="With --models: fewer rounds and shorter bursts.")
@click.option(
    "--rounds", type=click.IntRange(min=1), help="With --models: timing rounds (default 5)."
)
def bench(
    ops: tuple[str, ...],
    dtypes: tuple[str, ...],
    shapes: tuple[str, ...],
    suite: str,
    all_backends: bool,
    backends: tuple[str, ...],
    peers: bool,
    with_compile: bool,
    cuda_graph: bool,
    json_path: Path | None,
    csv_path: Path | None,
    plot_path: Path | None,
    compare_path: Path | None,
    fail_if_slower: float | None,
    allow_no_compare: bool,
    list_cases: bool,
    models: tuple[str, ...],
    modes: str | None,
    quick: bool,
    rounds: int | None,
) -> None:
    """Time dualk's backends against PyTorch on this GPU. Without a GPU: a correctness smoke
    check on the CPU (Triton under its interpreter), no timings; options that only mean something
    for timings are named in a note, or refused where the run could not do what they ask."""
    if models or modes or quick or rounds:
        run_zoo(click.get_current_context())
        return
    ops = ops or tuple(OPS)
    if list_cases:
        _list_cases(ops)
        return
    if all_backends and backends:
        raise click.UsageError("use either --all-backends or --backend, not both")
    check_compare_options(compare_path, fail_if_slower)
    common.check_shapes(ops, shapes)
    backends = backends or ALL_BACKENDS
    old = load(compare_path) if compare_path is not None else None  # a bad file fails now
    override = _auto_override_note(ops, backends)
    if override:
        click.echo(f"note: {override}", err=True)
    if not common.has_gpu():
        _bench_without_gpu(click.get_current_context(), backends)
        return
    if old is not None and fail_if_slower is not None and not allow_no_compare:
        why = timings_missing(old, str(compare_path))
        if why:  # refuse now rather than after a long GPU run
            raise click.UsageError(
                f"--fail-if-slower: {why}, so the regression gate could compare nothing "
                "(--allow-no-compare to run anyway)"
            )
    if plot_path is not None:
        try:
            require_matplotlib()
        except PlotUnavailableError as exc:
            click.echo(f"--plot {plot_path} will be skipped: {exc}", err=True)
            plot_path = None

    with common.progress_bar("benchmarking") as progress:
        report = engine.run(
            ops,
            suite,
            common.dtype_list(dtypes),
            shapes,
            backends,
            with_peers=peers,
            with_compile=with_compile,
            cuda_graph=cuda_graph,
            progress=progress,
        )
    click.echo(render_table(report))
    write_outputs(report, json_path, csv_path, plot_path)
    if compare_path is not None:
        compare_and_gate(compare_path, report, fail_if_slower, allow_no_compare)
    if not any(r.kind == "dualk" and r.ok is not None for r in report.rows):
        click.echo("\n!! no dualk backend produced a checked result in this run", err=True)
        sys.exit(1)


def _auto_override_note(ops: Sequence[str], backends: Sequence[str]) -> str | None:
    """What overrides "auto" for the dualk:auto rows (an environment variable, a scope, a
    default or the config file), said before the run: those rows then time what it names."""
    if "auto" not in backends:
        return None
    forced = []
    for op in ops:
        try:
            name, source = dispatch.requested(OPS[op], "auto")
        except DualkError as exc:
            return f"the dualk:auto rows will fail: {exc}"
        if name != "auto":
            forced.append(f"{op} -> {name} ({source})")
    if not forced:
        return None
    return "the dualk:auto rows run what an override names, not auto's choice: " + ", ".join(forced)


def _bench_without_gpu(ctx: click.Context, backends: Sequence[str]) -> None:
    """No GPU: refuse what cannot be done, say up front what will not be, run the CPU smoke
    check, exit 1 when no dualk check ran or a check failed. Nothing here is a GPU figure."""
    p = ctx.params
    notes = _cpu_notes(ctx, backends)  # refuses what cannot be done before anything changes
    click.echo(
        "No CUDA GPU found: nothing is timed. Running the CPU smoke check instead "
        "(correctness only; Triton under its CPU interpreter)."
    )
    for note in notes:
        click.echo(f"note: {note}")
    if "triton" in backends:
        smoke.enable_interpreter()  # before Triton compiles any dualk kernel
    with common.progress_bar("CPU smoke check") as progress:
        rows = smoke.cpu_smoke_check(
            p["ops"] or tuple(OPS),
            common.dtype_list(p["dtypes"]),
            p["shapes"],
            backends,
            p["peers"],
            progress,
        )
    click.echo(render_smoke(rows))
    write_outputs(smoke.smoke_report(rows), p["json_path"], p["csv_path"], None)
    if not any(r.kind == "dualk" and ran(r) for r in rows):
        click.echo("\n!! no dualk check ran, so nothing was checked", err=True)
        sys.exit(1)
    if failed_rows(rows):
        sys.exit(1)


def _cpu_notes(ctx: click.Context, backends: Sequence[str]) -> list[str]:
    """What the smoke check will not do of what was asked, as notes; a usage error where it could
    do none of it (no named backend able to run, every named shape too large, a regression gate
    that would compare nothing)."""
    p = ctx.params
    ops, shapes = p["ops"] or tuple(OPS), p["shapes"]
    unable = smoke.cannot_run(backends)
    if len(unable) == len(backends):
        can = [b for b in BACKEND_CHOICES if b not in smoke.cannot_run(BACKEND_CHOICES)]
        raise click.UsageError(
            "no requested backend can run without a GPU ("
            + "; ".join(f"{b}: {why}" for b, why in unable.items())
            + f"); the CPU smoke check can check {', '.join(can)}"
        )
    too_big = [s for s in shapes if all(OPS[n].case(s).gpu_only for n in ops)]
    if shapes and len(too_big) == len(shapes):
        raise click.UsageError(
            f"--shape {', '.join(too_big)}: gpu_only, too large for the CPU smoke check; pick a "
            "CPU-sized case (`dualk bench --list` marks them 'cpu ok')"
        )
    if p["fail_if_slower"] is not None and not p["allow_no_compare"]:
        raise click.UsageError(
            f"--fail-if-slower {p['fail_if_slower']:g}: nothing is timed without a GPU, so the "
            "regression gate could compare nothing (--allow-no-compare to run the CPU smoke "
            "check anyway)"
        )
    what = {"triton": "Triton's CPU interpreter", "auto": "runs the torch backend on CPU tensors"}
    checking = [f"dualk:{b}" + (f" ({what[b]})" if b in what else "") for b in backends]
    checking = [c for b, c in zip(backends, checking, strict=True) if b not in unable]
    flag = "--all-backends: " if p["all_backends"] else ""
    notes = [f"{flag}checking {', '.join(checking)}"]
    notes += [
        f"dualk:{b} cannot run here: {why}; listed as not run, never counted as a check"
        for b, why in unable.items()
    ]
    dtypes = common.dtype_list(p["dtypes"])
    if (
        "triton" in backends
        and "triton" not in unable
        and (dtypes is None or torch.bfloat16 in dtypes)
    ):
        # Seen with Triton 3.9's interpreter: 1953 of 4096 random values rounded differently.
        notes.append(
            "Triton's CPU interpreter rounds fp32 to bfloat16 by truncation (GPUs round to "
            "nearest), so dualk:triton's bfloat16 errors read larger here than on a GPU"
        )
    if too_big:
        notes.append(f"--shape {', '.join(too_big)}: gpu_only, skipped on the CPU")
    if ctx.get_parameter_source("suite") != click.core.ParameterSource.DEFAULT and not shapes:
        notes.append(
            f"--suite {p['suite']} is not used: its cases are sized for a GPU; the smoke check runs "
            f"the first {smoke.SMOKE_CASES_PER_OP} CPU-sized cases of each operator (--shape picks "
            "others)"
        )
    timing_only = {"--compile": p["with_compile"], "--cuda-graph": p["cuda_graph"]}
    untimed = [opt for opt, given in timing_only.items() if given]
    if untimed:
        notes.append(f"{' and '.join(untimed)} not used: nothing is timed without a GPU")
    if p["plot_path"] is not None:
        notes.append(f"--plot {p['plot_path']} skipped: the CPU smoke check has no timings to plot")
    if p["compare_path"] is not None:
        notes.append(
            f"--compare {p['compare_path']}: nothing to compare, the CPU smoke check has no timings"
        )
    if p["fail_if_slower"] is not None:
        notes.append(
            f"--fail-if-slower {p['fail_if_slower']:g} not applied (--allow-no-compare): nothing "
            "is timed without a GPU"
        )
    return notes
