"""`dualk` command line (also `python -m dualk`); the entry point `dualk.cli:main`.

- `dualk info`: GPU, toolchain and versions; each backend's availability per operator; caches.
- `dualk build`: build the CUDA extension ahead of time.
- `dualk bench` (dualk/cli/bench.py): time every backend against PyTorch on this GPU (on a machine
  without one: a CPU correctness smoke check, no timings); table, JSON, CSV, plot, comparison.
- `dualk report FILE.json` (dualk/cli/results.py): the same table, CSV, plot or BENCHMARKS.md from
  a saved run, or its comparison with an older one.
- `dualk tune`, `dualk cache` (dualk/cli/tune.py): the autotune cache.

Torch is imported with the package; Triton and matplotlib only when a command needs them, so
`dualk --help` stays quick.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click
import torch

from ..backends import cuda as cuda_backend
from ..backends import unavailable_reason
from ..backends.triton import interpreter_enabled
from ..core.errors import DualkError
from ..dispatch import auto_candidates, config, requested, store
from ..registry import OPS
from ..tools.bench import environment
from ..tools.render import align, describe_gpu
from . import common
from .bench import bench
from .results import report_command, results_group
from .tune import cache, tune


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
        # What a call without backend= runs: an override (environment, scope, config) first,
        # or the error every such call raises; else auto's first available candidate.
        try:
            name, source = requested(spec, "auto")
        except DualkError as exc:
            name, source = None, str(exc)
        if name is None:
            if source not in reasons:
                reasons.append(source)
            auto = f"error [{reasons.index(source) + 1}]"
        elif name != "auto":
            auto = f"{name} (from {source})"
        else:
            auto = next((b for b, why in auto_candidates(spec, device) if why is None), "-")
        body.append([*cells, auto])
    lines = align(("op", *backends, "a call runs"), body)
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
    env = environment()
    fields = [
        ("dualk", env["dualk"]),
        ("GPU", describe_gpu(env)),
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

    device = torch.device("cuda" if common.has_gpu() else "cpu")
    click.echo(f"\nbackends per operator on {device}:")
    for line in _availability_table(device):
        click.echo("  " + line)

    config_file = config.config_path()
    paths = [
        ("CUDA build cache", f"{cuda_backend.cache_root() / 'cuda'}"),
        *((f"  {family}", cuda_backend.describe_state(family)) for family in cuda_backend.FAMILIES),
        ("Triton cache", f"{_triton_cache_dir()}  (compiled kernels and autotune results)"),
        ("autotune cache", f"{store.cache_dir()}  (`dualk cache show`)"),
        ("config file", f"{config_file}" + ("" if config_file.is_file() else "  (absent)")),
    ]
    click.echo("\nlocations:")
    width = max(len(k) for k, _ in paths)
    for key, value in paths:
        click.echo(f"  {key:<{width}}  {value}")


# ---------------------------------------------------------------------------- build
@main.command()
@click.option("--verbose", is_flag=True, help="Show the compiler's output.")
@click.option(
    "--arch", default="", help="Architectures, e.g. sm_90a,sm_80 (default: the visible GPUs')."
)
@click.option(
    "--out", default=None, type=click.Path(file_okay=False),
    help="Build into this directory instead of the cache; point DUALK_PREBUILT_DIR at it.",
)  # fmt: skip
@click.option(
    "--family", "families", multiple=True,
    help="Only these families (elementwise, gemm, mlp; default: all).",
)  # fmt: skip
def build(verbose: bool, arch: str, out: str | None, families: tuple[str, ...]) -> None:
    """Build the CUDA extension families ahead of time, each in its own builder process, all at
    once: one line per family as it starts, and as it is done (seconds) or failed (its log)."""
    unknown = [f for f in families if f not in cuda_backend.FAMILIES]
    if unknown:
        click.echo(
            f"unknown family {', '.join(unknown)}; families: {', '.join(cuda_backend.FAMILIES)}",
            err=True,
        )
        sys.exit(2)
    try:
        archs = cuda_backend.parse_archs(arch) if arch else None
    except ValueError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    if archs is None:
        if not common.has_gpu():  # nothing was attempted: the default targets the GPU it finds
            click.echo(
                f"nothing built: {cuda_backend.NO_DEVICE} (name the architectures with --arch, "
                "e.g. --arch sm_90a, to build without a GPU)",
                err=True,
            )
            sys.exit(1)
        archs = cuda_backend.target_archs()
    root = None if out is None else Path(out).expanduser().resolve()
    env = cuda_backend.builder_env()
    running = {}
    for family in families or tuple(cuda_backend.FAMILIES):
        if root is None:  # into the cache: a matching build found at run time needs none
            found, _ = cuda_backend.locate(family, archs)
            if found is not None:
                click.echo(f"{family}: already built for {','.join(archs)} in {found}; not rebuilt")
                continue
        directory = cuda_backend.build_directory(family, archs, root)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            log = directory / cuda_backend.PROGRESS_LOG
            cmd = cuda_backend.builder_command(family, archs, root)
            output = None if verbose else open(log, "wb")  # noqa: SIM115 - closed below
        except OSError as exc:
            click.echo(f"{family}: failed: cannot write {directory} ({exc})")
            continue
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env
        )
        running[family] = (proc, time.perf_counter(), log, output)
        usual, measured = cuda_backend.usual_seconds(family)
        click.echo(
            f"{family}: started for {','.join(archs)} in {directory} (usually ~{usual:.0f} s"
            + ("" if measured else " on a 16-core host")
            + ")"
        )
    failed = 0
    while running:
        time.sleep(0.2)
        for family, (proc, t0, log, output) in list(running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del running[family]
            if output is not None:
                output.close()
            seconds = time.perf_counter() - t0
            if rc == 0:
                click.echo(f"{family}: done in {seconds:.1f} s")
                continue
            failed += 1
            job = cuda_backend.Job(proc, 0.0, log.parent, log)
            why = job.last_line() if output is not None else f"exit status {rc}"
            click.echo(f"{family}: failed after {seconds:.1f} s: {why} (log: {log})")
    if failed:
        sys.exit(1)
    if root is not None:
        click.echo(f"built into {root}; at run time: DUALK_PREBUILT_DIR={root}")


for command in (bench, report_command, results_group, tune, cache):
    main.add_command(command)
