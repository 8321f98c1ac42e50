"""`dualk` command line: `dualk info`, `dualk build`, `dualk bench` (also `python -m dualk`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import torch

from .registry import OPS

DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # fmt: skip


@click.group()
@click.version_option(package_name="dualk")
def main() -> None:
    """dualk: PyTorch operators with CUDA and Triton backends behind one dispatcher."""


@main.command()
def info() -> None:
    """GPU, toolchain and versions; each backend's availability per operator, with reasons."""
    from . import config
    from .backends import cuda as cuda_backend
    from .bench import environment
    from .dispatch import auto_candidates

    env = environment()
    width = max(len(k) for k in env)
    for key, value in env.items():
        click.echo(f"{key:<{width}}  {value}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    click.echo(f"\nbackends on {device}:")
    for name, spec in OPS.items():
        for backend, reason in auto_candidates(spec, device):
            state = "available" if reason is None else f"unavailable: {reason}"
            click.echo(f"  {name:<12} {backend:<7} {state}")
    click.echo(f"\ncuda build cache: {cuda_backend.cache_root() / 'cuda'}")
    click.echo(f"config file:      {config.config_path()}")


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


@main.command()
@click.option("--op", "ops", multiple=True, type=click.Choice(sorted(OPS)), help="Operators (default: all).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(sorted(DTYPE_NAMES)), help="Dtypes (default: per shape).")
@click.option("--shape", "shapes", multiple=True, help="Registry shape case names (see `dualk bench --list`).")
@click.option("--suite", type=click.Choice(["quick", "default", "full"]), default="default", show_default=True)
@click.option("--all-backends", is_flag=True, help="Time every dualk backend (the default).")
@click.option("--backend", "backends", multiple=True, type=click.Choice(["cuda", "triton", "torch"]))
@click.option("--peers/--no-peers", default=True, show_default=True, help="Time PyTorch's own paths too.")
@click.option("--compile/--no-compile", "with_compile", default=False, show_default=True, help="Include torch.compile peers (slow to compile).")
@click.option("--cuda-graph", is_flag=True, help="Time dualk backends as CUDA-graph replays.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--list", "list_cases", is_flag=True, help="List operators and shape cases, then exit.")
def bench(ops, dtypes, shapes, suite, all_backends, backends, peers, with_compile, cuda_graph, json_path, list_cases):
    """Time dualk's backends against PyTorch on this GPU."""  # fmt: skip
    from . import bench as engine

    ops = ops or tuple(OPS)
    if list_cases:
        for name in ops:
            click.echo(f"{name}: " + ", ".join(c.name for c in OPS[name].cases))
        return
    if all_backends or not backends:
        backends = ("cuda", "triton")
    if not torch.cuda.is_available():
        click.echo("no CUDA GPU found: nothing is timed (run `pytest` for the CPU correctness checks).")
        return
    with click.progressbar(length=1, label="benchmarking") as bar:
        def progress(i, n, what):
            bar.length = n
            bar.label = what[:40]
            bar.update(i - bar.pos)

        report = engine.run(ops, suite, [DTYPE_NAMES[d] for d in dtypes] or None, shapes, backends,
                            with_peers=peers, with_compile=with_compile, cuda_graph=cuda_graph,
                            progress=progress)  # fmt: skip
    click.echo(engine.render_table(report))
    if json_path:
        json_path.write_text(json.dumps(report.to_json(), indent=1))
        click.echo(f"wrote {json_path}")
