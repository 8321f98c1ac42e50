"""`dualk` command line (also `python -m dualk`):

- `dualk info`: GPU, toolchain and versions; each backend's availability per operator; caches.
- `dualk build`: build the CUDA extension ahead of time.
- `dualk bench`: time every backend against PyTorch on this GPU (on a machine without one: a CPU
  correctness smoke check, no timings); table, JSON, CSV, plot, comparison with an older run.
- `dualk report FILE.json`: the same table, CSV, plot or BENCHMARKS.md from a saved run.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import click
import torch

from . import report as rep
from .bench import Report, Row
from .registry import OPS, OpSpec, ShapeCase

DTYPE_NAMES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
SMOKE_CASES_PER_OP = 2  # the first non-gpu_only cases of each operator

Progress = Callable[[int, int, str], None]
_FilePath = click.Path(dir_okay=False, path_type=Path)
_ExistingFile = click.Path(exists=True, dir_okay=False, path_type=Path)


def _has_gpu() -> bool:
    return torch.cuda.is_available()


@click.group()
@click.version_option(package_name="dualk")
def main() -> None:
    """dualk: PyTorch operators with CUDA and Triton backends behind one dispatcher."""


# ---------------------------------------------------------------------------- info
def _triton_cache_dir() -> str:
    try:
        import triton.knobs

        return str(triton.knobs.cache.dir)
    except Exception:  # older Triton, or none
        return os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")


def _availability_table(device: torch.device) -> list[str]:
    """Operator x backend: "yes", "interpreter" or "no [n]" with the reasons as numbered notes,
    plus the backend "auto" picks."""
    from .backends import unavailable_reason
    from .backends.triton import interpreter_enabled
    from .dispatch import auto_candidates

    backends = list(dict.fromkeys(b for spec in OPS.values() for b in spec.backends))
    reasons: list[str] = []
    body = []
    for name, spec in OPS.items():
        cells = [name]
        for backend in backends:
            reason = (
                unavailable_reason(backend, device)
                if backend in spec.backends
                else "not implemented"
            )
            if reason is None:
                interp = backend == "triton" and device.type == "cpu" and interpreter_enabled()
                cells.append("interpreter" if interp else "yes")
                continue
            if reason not in reasons:
                reasons.append(reason)
            cells.append(f"no [{reasons.index(reason) + 1}]")
        auto = next((b for b, why in auto_candidates(spec, device) if why is None), "-")
        body.append([*cells, auto])
    lines = rep.align(("op", *backends, "auto picks"), body)
    lines += [f"[{i}] {r}" for i, r in enumerate(reasons, 1)]
    if device.type == "cpu" and interpreter_enabled():
        lines.append(
            "interpreter = Triton's CPU interpreter: for correctness tests, never picked by auto"
        )
    return lines


@main.command()
def info() -> None:
    """GPU, toolchain and versions; each backend's availability per operator, with reasons;
    build, tune and config locations."""
    from . import autotune, config
    from .backends import cuda as cuda_backend
    from .bench import environment

    env = environment()
    fields = [
        ("dualk", env["dualk"]),
        ("GPU", rep.describe_gpu(env)),
        ("driver", env.get("driver") or "-"),
        ("CUDA (torch)", env.get("torch_cuda") or "none (CPU build)"),
        ("nvcc", env.get("nvcc") or "not found"),
        ("torch", env["torch"]),
        ("triton", env.get("triton")),
        ("python", env["python"]),
        ("platform", env["platform"]),
        ("TF32 matmul", env["allow_tf32"]),
    ]
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        click.echo(f"{key:<{width}}  {value}")

    device = torch.device("cuda" if _has_gpu() else "cpu")
    build_dir = cuda_backend.build_directory()
    built = "built" if build_dir.is_dir() and any(build_dir.glob("*.so")) else "not built yet"
    if device.type == "cuda" and built != "built":
        click.echo(
            "\n(checking the cuda backend builds the extension first: this can take minutes)"
        )
    click.echo(f"\nbackends per operator on {device}:")
    for line in _availability_table(device):
        click.echo("  " + line)

    config_file = config.config_path()
    paths = [
        (
            "CUDA build cache",
            f"{cuda_backend.cache_root() / 'cuda'}  (this build: {build_dir.name}, {built})",
        ),
        ("Triton cache", f"{_triton_cache_dir()}  (compiled kernels and autotune results)"),
        ("autotune cache", f"{autotune.cache_dir()}  (`dualk cache show`)"),
        ("config file", f"{config_file}" + ("" if config_file.is_file() else "  (absent)")),
    ]
    click.echo("\nlocations:")
    width = max(len(k) for k, _ in paths)
    for key, value in paths:
        click.echo(f"  {key:<{width}}  {value}")


# ---------------------------------------------------------------------------- build
@main.command()
@click.option("--verbose", is_flag=True, help="Show the compiler's output.")
def build(verbose: bool) -> None:
    """Build the CUDA extension ahead of time and print where it is cached."""
    import time

    from .backends import cuda as cuda_backend

    t0 = time.perf_counter()
    try:
        cuda_backend.extension(verbose=verbose)
    except Exception as exc:
        click.echo(f"build failed: {exc}", err=True)
        sys.exit(1)
    click.echo(f"built in {time.perf_counter() - t0:.1f} s: {cuda_backend.build_directory()}")


# ---------------------------------------------------------------------------- bench helpers
@contextlib.contextmanager
def _progress(label: str) -> Iterator[Progress]:
    """A progress bar on stderr (so the table on stdout stays clean), driven by (i, n, what)."""
    with click.progressbar(length=1, label=label, file=sys.stderr) as bar:

        def update(i: int, n: int, what: str) -> None:
            bar.length = max(n, 1)
            bar.label = what[:40]
            bar.update(i - bar.pos)

        yield update


def _check_shapes(ops: Sequence[str], shapes: Sequence[str]) -> None:
    """Every --shape must name a shape case of every selected operator."""
    for shape in shapes:
        for name in ops:
            known = [c.name for c in OPS[name].cases]
            if shape not in known:
                raise click.BadParameter(
                    f"operator {name!r} has no shape case {shape!r}; it has: {', '.join(known)} "
                    "(see `dualk bench --list`; pick operators with --op)",
                    param_hint="'--shape'",
                )


def _list_cases(ops: Sequence[str]) -> None:
    for name in ops:
        click.echo(f"{name}:")
        body = []
        for c in OPS[name].cases:
            suites = [
                s
                for s, inc in (
                    ("quick", c.quick),
                    ("default", c.bench),
                    ("full", c.bench or c.gpu_only),
                )
                if inc
            ]
            dtypes = ",".join(str(d)[6:] for d in c.bench_dtypes)
            body.append(
                [
                    c.name,
                    ",".join(suites) or "- (tests only)",
                    "gpu only" if c.gpu_only else "cpu ok",
                    dtypes,
                ]
            )
        for line in rep.align(("shape case", "suites", "device", "bench dtypes"), body):
            click.echo("  " + line)


def smoke_cases(spec: OpSpec, shapes: Sequence[str] = ()) -> list[ShapeCase]:
    """The named cases, or the first SMOKE_CASES_PER_OP cases small enough for the CPU."""
    if shapes:
        return [spec.case(s) for s in shapes]
    return [c for c in spec.cases if not c.gpu_only][:SMOKE_CASES_PER_OP]


def cpu_smoke_check(
    ops: Sequence[str],
    dtypes: Sequence[torch.dtype] | None,
    shapes: Sequence[str],
    backends: Sequence[str],
    with_peers: bool = True,
    progress: Progress | None = None,
) -> list[Row]:
    """Run each backend once on small registry cases on the CPU (Triton under its interpreter)
    and judge the outputs against the float64 reference. Rows carry rel_err and ok, never a
    time. With `with_peers`, eager PyTorch on the CPU is checked too (a check of the harness)."""
    import dualk

    from .backends import unavailable_reason
    from .testing import float64_reference, judge

    device = torch.device("cpu")
    items = [
        (OPS[n], c, d)
        for n in ops
        for c in smoke_cases(OPS[n], shapes)
        for d in (dtypes or c.bench_dtypes)
    ]
    impls = [(f"dualk:{b}", "dualk", b) for b in backends] + (
        [("torch eager (cpu)", "peer", None)] if with_peers else []
    )
    rows: list[Row] = []
    for i, (spec, case, dtype) in enumerate(items):
        if progress:
            progress(i, len(items), f"{spec.name} {case.name} {str(dtype)[6:]}")
        if case.gpu_only:
            rows += [
                Row(
                    spec.name,
                    case.name,
                    case.name,
                    str(dtype)[6:],
                    impl,
                    kind,
                    note="skipped: gpu_only case, too large for the CPU",
                )
                for impl, kind, _ in impls
            ]
            continue
        sample = case.make(dtype, device, torch.Generator().manual_seed(0))
        ref = float64_reference(spec, sample)
        for impl, kind, backend in impls:
            row = Row(spec.name, case.name, sample.label, str(dtype)[6:], impl, kind)
            rows.append(row)
            reason = unavailable_reason(backend, device) if backend else None
            if reason is not None:
                row.note = f"unavailable: {reason}"
                continue
            try:
                if backend:
                    out = getattr(dualk, spec.name)(*sample.args, **sample.kwargs, backend=backend)
                else:
                    out = spec.reference(*sample.args, **sample.kwargs)
                verdict = judge(spec, sample, out, ref)
            except Exception as exc:  # report it in its row; the other checks still run
                row.note = f"error: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            row.rel_err, row.ok = verdict.rel_err, verdict.ok
            if not verdict.ok:
                row.note = verdict.message[:200]
    if progress:
        progress(len(items), len(items), "done")
    return rows


def _write_outputs(
    report: Report, json_path: Path | None, csv_path: Path | None, plot_path: Path | None
) -> list[Path]:
    """Write the files asked for (creating folders); say what was written; return those paths."""
    written = []
    for path, write in (
        (json_path, rep.write_json),
        (csv_path, rep.write_csv),
        (plot_path, rep.plot),
    ):
        if path is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            write(report, path)
        except (rep.PlotUnavailableError, ValueError) as exc:
            click.echo(f"{path} not written: {exc}", err=True)
            continue
        click.echo(f"wrote {path}")
        written.append(path)
    return written


def _compare_and_gate(old_path: Path, new: Report, fail_if_slower: float | None) -> None:
    """Print old vs new; exit 1 when a dualk row regressed beyond `fail_if_slower` percent."""
    old = _load(old_path)
    cmp = rep.compare(old, new)
    click.echo("\n" + rep.render_compare(cmp, fail_if_slower))
    if fail_if_slower is None:
        return
    bad = cmp.regressions(fail_if_slower)
    if bad:
        limit = f"{fail_if_slower:g}%"
        click.echo(
            f"\n!! {len(bad)} dualk row(s) regressed against {old_path} (limit {limit}):", err=True
        )
        for change, why in bad:
            r = change.new
            click.echo(f"!!   {r.op} {r.shape} {r.dtype} {r.impl}: {why}", err=True)
        sys.exit(1)
    click.echo(f"no dualk row is more than {fail_if_slower:g}% slower than in {old_path}")


def _load(path: Path) -> Report:
    try:
        return rep.load_report(path)
    except (OSError, ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc)) from None


# ---------------------------------------------------------------------------- bench
@main.command()
@click.option(
    "--op",
    "ops",
    multiple=True,
    type=click.Choice(list(OPS)),
    help="Operator (repeatable; default: all).",
)
@click.option(
    "--dtype",
    "dtypes",
    multiple=True,
    type=click.Choice(list(DTYPE_NAMES)),
    help="Dtype (repeatable; default: each shape's own).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="CASE",
    help="Registry shape case name (repeatable; see --list).",
)
@click.option(
    "--suite",
    type=click.Choice(["quick", "default", "full"]),
    default="default",
    show_default=True,
    help="Which shape cases to time when no --shape is given.",
)
@click.option(
    "--all-backends",
    is_flag=True,
    help="Time every GPU backend (cuda, triton) and auto (the default).",
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(["cuda", "triton", "torch", "auto"]),
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
    "--json", "json_path", type=_FilePath, help="Write the results and environment as JSON."
)
@click.option(
    "--csv", "csv_path", type=_FilePath, help="Write one CSV line per result, environment included."
)
@click.option(
    "--plot",
    "plot_path",
    type=_FilePath,
    help="Write a PNG of speedup vs eager (needs dualk[plot]).",
)
@click.option(
    "--compare",
    "compare_path",
    type=_ExistingFile,
    help="An older --json file: show old vs new times.",
)
@click.option(
    "--fail-if-slower",
    type=click.FloatRange(min=0),
    metavar="PCT",
    help="With --compare: exit 1 if a dualk row got more than PCT percent slower.",
)
@click.option(
    "--list", "list_cases", is_flag=True, help="List operators and shape cases, then exit."
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
    list_cases: bool,
) -> None:
    """Time dualk's backends against PyTorch on this GPU. Without a GPU: a correctness smoke
    check on the CPU (Triton under its interpreter), no timings."""
    ops = ops or tuple(OPS)
    if list_cases:
        _list_cases(ops)
        return
    if all_backends and backends:
        raise click.UsageError("use either --all-backends or --backend, not both")
    if fail_if_slower is not None and compare_path is None:
        raise click.UsageError("--fail-if-slower needs --compare OLD.json")
    _check_shapes(ops, shapes)
    backends = backends or ("cuda", "triton", "auto")
    dtype_list = list(dict.fromkeys(DTYPE_NAMES[d] for d in dtypes)) or None
    if compare_path is not None:
        _load(compare_path)  # a bad file fails now, not after the run
    has_gpu = _has_gpu()
    if plot_path is not None and has_gpu:  # without a GPU nothing is plotted anyway (below)
        try:
            rep.require_matplotlib()
        except rep.PlotUnavailableError as exc:
            click.echo(f"--plot {plot_path} will be skipped: {exc}", err=True)
            plot_path = None

    if not has_gpu:
        _bench_without_gpu(
            ops, dtype_list, shapes, backends, peers, json_path, csv_path, plot_path, compare_path
        )
        return

    from . import bench as engine

    with _progress("benchmarking") as progress:
        report = engine.run(
            ops,
            suite,
            dtype_list,
            shapes,
            backends,
            with_peers=peers,
            with_compile=with_compile,
            cuda_graph=cuda_graph,
            progress=progress,
        )
    click.echo(rep.render_table(report))
    _write_outputs(report, json_path, csv_path, plot_path)
    if compare_path is not None:
        _compare_and_gate(compare_path, report, fail_if_slower)


def _bench_without_gpu(
    ops: Sequence[str],
    dtypes: Sequence[torch.dtype] | None,
    shapes: Sequence[str],
    backends: Sequence[str],
    peers: bool,
    json_path: Path | None,
    csv_path: Path | None,
    plot_path: Path | None,
    compare_path: Path | None,
) -> None:
    """No GPU: say so, run the CPU smoke check, exit 0. Nothing here is a GPU figure."""
    from .bench import environment

    click.echo(
        "No CUDA GPU found: nothing is timed. Running the CPU smoke check instead "
        "(correctness only; Triton under its CPU interpreter)."
    )
    if "triton" in backends:
        # The interpreter must be chosen before Triton compiles any dualk kernel (import time).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    with _progress("CPU smoke check") as progress:
        rows = cpu_smoke_check(ops, dtypes, shapes, backends, peers, progress)
    click.echo(rep.render_smoke(rows))
    report = Report({**environment(), "mode": rep.SMOKE_MODE}, {}, rows)
    if plot_path is not None:
        click.echo(f"--plot {plot_path} skipped: the CPU smoke check has no timings to plot")
    _write_outputs(report, json_path, csv_path, None)
    if compare_path is not None:
        click.echo(
            f"--compare {compare_path} skipped: the CPU smoke check has no timings to compare"
        )


# ---------------------------------------------------------------------------- report
@main.command("report")
@click.argument("json_file", type=_ExistingFile)
@click.option("--markdown", "markdown_path", type=_FilePath, help="Write a BENCHMARKS.md page.")
@click.option(
    "--plot",
    "plot_path",
    type=_FilePath,
    help="Write a PNG of speedup vs eager (needs dualk[plot]); linked from --markdown.",
)
@click.option(
    "--csv", "csv_path", type=_FilePath, help="Write the rows as CSV, environment included."
)
@click.option(
    "--compare",
    "compare_path",
    type=_ExistingFile,
    help="An older JSON file: show old vs new times.",
)
@click.option(
    "--fail-if-slower",
    type=click.FloatRange(min=0),
    metavar="PCT",
    help="With --compare: exit 1 if a dualk row got more than PCT percent slower.",
)
def report_command(
    json_file: Path,
    markdown_path: Path | None,
    plot_path: Path | None,
    csv_path: Path | None,
    compare_path: Path | None,
    fail_if_slower: float | None,
) -> None:
    """Present a saved `dualk bench --json` run: the table (when no file is asked for), CSV, a
    plot, a BENCHMARKS.md page, or a comparison with an older run."""
    if fail_if_slower is not None and compare_path is None:
        raise click.UsageError("--fail-if-slower needs --compare OLD.json")
    if plot_path is not None:
        try:
            rep.require_matplotlib()
        except rep.PlotUnavailableError as exc:
            raise click.UsageError(f"--plot: {exc}") from None
    report = _load(json_file)
    if not (markdown_path or plot_path or csv_path or compare_path):
        click.echo(rep.render_table(report))
    plotted = plot_path in _write_outputs(report, None, csv_path, plot_path)
    if markdown_path is not None:
        base = markdown_path.resolve().parent
        command = ["dualk", "report", str(json_file), "--markdown", str(markdown_path)]
        if plotted:
            command += ["--plot", str(plot_path)]
        text = rep.render_markdown(
            report,
            source=os.path.relpath(json_file.resolve(), base),
            plot=os.path.relpath(plot_path.resolve(), base) if plotted else None,
            command=shlex.join(command),
        )
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(text)
        click.echo(f"wrote {markdown_path}")
    if compare_path is not None:
        _compare_and_gate(compare_path, report, fail_if_slower)


# ---------------------------------------------------------------------------- tune / cache
def _tune_items(
    ops: Sequence[str], suite: str, shapes: Sequence[str], dtypes: Sequence[torch.dtype] | None
) -> list[tuple[OpSpec, ShapeCase, torch.dtype]]:
    items = []
    for name in ops:
        spec = OPS[name]
        if shapes:
            cases = [spec.case(s) for s in shapes]
        else:
            cases = [c for c in spec.cases if (c.quick if suite == "quick" else c.bench)]
        items += [(spec, c, d) for c in cases for d in (dtypes or c.bench_dtypes)]
    return items


def _times_text(times: dict) -> str:
    return ", ".join(f"{b} {t:.1f}" for b, t in sorted(times.items(), key=lambda kv: kv[1]))


@main.command()
@click.option(
    "--op",
    "ops",
    multiple=True,
    type=click.Choice(list(OPS)),
    help="Operator (repeatable; default: all).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="CASE",
    help="Registry shape case name (repeatable; see `dualk bench --list`).",
)
@click.option(
    "--dtype",
    "dtypes",
    multiple=True,
    type=click.Choice(list(DTYPE_NAMES)),
    help="Dtype (repeatable; default: each shape's own).",
)
@click.option(
    "--suite",
    type=click.Choice(["quick", "default"]),
    default="default",
    show_default=True,
    help="Which shape cases to tune when no --shape is given.",
)
@click.option("--force", is_flag=True, help="Time shape classes already in the cache again.")
def tune(
    ops: tuple[str, ...], shapes: tuple[str, ...], dtypes: tuple[str, ...], suite: str, force: bool
) -> None:
    """Fill the autotune cache ahead of time: time every backend on the registry's shape cases
    and record each shape class's winner (what backend="auto" would otherwise measure on first
    use), with the Triton kernels' tuned configs. Needs a CUDA GPU."""
    from . import autotune

    ops = ops or tuple(OPS)
    _check_shapes(ops, shapes)
    dtype_list = list(dict.fromkeys(DTYPE_NAMES[d] for d in dtypes)) or None
    items = _tune_items(ops, suite, shapes, dtype_list)
    if not items:
        click.echo("nothing to tune: no shape case matches")
        return
    if not _has_gpu():
        click.echo(
            f"No CUDA GPU found: cannot tune {len(items)} case(s). Autotuning times the backends "
            'on a GPU; on CPU tensors backend="auto" always runs torch, so there is nothing to '
            "record here.",
            err=True,
        )
        sys.exit(1)
    device = torch.device("cuda", torch.cuda.current_device())
    body = []
    with _progress("tuning") as progress:
        for i, (spec, case, dtype) in enumerate(items):
            progress(i, len(items), f"{spec.name} {case.name} {str(dtype)[6:]}")
            sample = case.make(dtype, device, torch.Generator().manual_seed(0))
            args = autotune.implementation_args(spec, sample.args, sample.kwargs)
            try:
                result = autotune.tune(spec, args, force=force)
            except Exception as exc:  # report it in its row; the other cases still run
                result = {"key": "-", "backend": "-", "source": f"error: {exc}"[:120]}
            del sample, args
            torch.cuda.empty_cache()
            rejected = "; ".join(f"{b}: {r}"[:80] for b, r in result.get("rejected", {}).items())
            body.append(
                [
                    f"{spec.name} {case.name} {str(dtype)[6:]}",
                    result["key"],
                    result["backend"],
                    result["source"],
                    _times_text(result.get("times_us", {})),
                    rejected,
                ]
            )
        progress(len(items), len(items), "done")
    header = ("case", "key", "winner", "source", "times (us)", "not candidates")
    for line in rep.align(header, body):
        click.echo(line)
    click.echo(f"\ncache file: {autotune.cache_file(device)}")


@main.group()
def cache() -> None:
    """The autotune cache (and, with `clear --all`, the CUDA build cache)."""


@cache.command("show")
def cache_show() -> None:
    """Where the autotune cache is, this machine's fingerprint, and every file's entries."""
    from . import autotune

    directory = autotune.cache_dir()
    device = (
        torch.device("cuda", torch.cuda.current_device()) if _has_gpu() else torch.device("cpu")
    )
    current = autotune.cache_file(device)
    click.echo(f"autotune cache: {directory}")
    click.echo(f"this machine ({device}): {current.name}")
    fp = autotune.fingerprint(device)
    click.echo("  fingerprint: " + ", ".join(f"{k}={v}" for k, v in fp.items()))
    paths = sorted(directory.iterdir()) if directory.is_dir() else []
    files = [p for p in paths if p.suffix == ".json" and p.is_file()]
    set_aside = [p for p in paths if ".corrupt-" in p.name]
    if not files:
        click.echo("no cache files yet")
    for path in files:
        click.echo(f"\n{path.name}" + ("  (this machine)" if path == current else ""))
        try:
            data = autotune.read_cache_file(path)
        except (OSError, ValueError) as exc:
            click.echo(f"  unreadable: {exc}")
            continue
        fp = data.get("fingerprint") or {}
        click.echo("  fingerprint: " + ", ".join(f"{k}={v}" for k, v in fp.items()))
        entries = data["entries"]
        body = [
            [key, str(e.get("winner", "?")), _times_text(e.get("times_us", {}))]
            for key, e in sorted(entries.get(autotune.BACKEND_SECTION, {}).items())
            if isinstance(e, dict)
        ]
        if body:
            click.echo(f"  backend winners ({len(body)}):")
            for line in rep.align(("key", "winner", "times (us)"), body):
                click.echo("    " + line)
        for section, table in sorted(entries.items()):
            if section == autotune.BACKEND_SECTION:
                continue
            body = []
            for key, e in sorted(table.items()):
                best = (e.get("timings_ms") or [[None]])[0][0] if isinstance(e, dict) else None
                config = e.get("config") if isinstance(e, dict) else e
                body.append([key, str(config), "-" if best is None else f"{best * 1e3:.1f}"])
            click.echo(f"  {section} configs ({len(body)}):")
            for line in rep.align(("class", "config", "us"), body, right=[2]):
                click.echo("    " + line)
    for path in set_aside:
        click.echo(f"\nset aside (unusable): {path.name}")


@cache.command("clear")
@click.option("--all", "everything", is_flag=True, help="Also remove the CUDA build cache.")
def cache_clear(everything: bool) -> None:
    """Remove the autotune cache files (and with --all the CUDA builds); print what went."""
    import shutil

    from . import autotune
    from .backends.cuda import cache_root

    removed = []
    directory = autotune.cache_dir()
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.is_file() and (
                path.suffix in (".json", ".lock", ".tmp") or ".corrupt-" in path.name
            ):
                path.unlink()
                removed.append(path)
    if everything:
        builds = cache_root() / "cuda"
        if builds.exists():
            shutil.rmtree(builds)
            removed.append(builds)
    autotune.clear_memory()
    for path in removed:
        click.echo(f"removed {path}")
    if not removed:
        where = directory if not everything else f"{directory} or {cache_root() / 'cuda'}"
        click.echo(f"nothing to remove in {where}")
