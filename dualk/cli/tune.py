"""`dualk tune` (fill the autotune cache ahead of time on a GPU) and `dualk cache` (show or clear
the autotune cache and, with `clear --all`, the CUDA build cache)."""

from __future__ import annotations

import re
import shutil
import sys

import click
import torch

from ..backends.cuda import cache_root
from ..dispatch import autotune, store
from ..registry import OPS
from ..tools.bench import plan
from ..tools.render import align
from . import common
from .common import case_options


def _by_key(item: tuple[str, object]) -> list:
    """A cache entry's key in natural order: m<=8 before m<=64 before m<=128."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", item[0])]


def _times_text(times: dict) -> str:
    return ", ".join(f"{b} {t:.1f}" for b, t in sorted(times.items(), key=lambda kv: kv[1]))


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if common.has_gpu()
        else torch.device("cpu")
    )


@click.command()
@case_options(("quick", "default"), "tune")
@click.option("--force", is_flag=True, help="Time shape classes already in the cache again.")
def tune(
    ops: tuple[str, ...], dtypes: tuple[str, ...], shapes: tuple[str, ...], suite: str, force: bool
) -> None:
    """Fill the autotune cache ahead of time: time every backend on the registry's shape cases
    and record each shape class's winner (what backend="auto" would otherwise measure on first
    use), with the Triton kernels' tuned configs. Needs a CUDA GPU."""
    ops = ops or tuple(OPS)
    common.check_shapes(ops, shapes)
    items = plan(ops, suite, common.dtype_list(dtypes), shapes)
    if not items:
        click.echo("nothing to tune: no shape case matches")
        return
    if not common.has_gpu():
        click.echo(
            f"No CUDA GPU found: cannot tune {len(items)} case(s). Autotuning times the backends "
            'on a GPU; on CPU tensors backend="auto" always runs torch, so there is nothing to '
            "record here.",
            err=True,
        )
        sys.exit(1)
    device = _device()
    body = []
    with common.progress_bar("tuning") as progress:
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
    for line in align(header, body):
        click.echo(line)
    click.echo(f"\ncache file: {store.cache_file(device)}")


@click.group()
def cache() -> None:
    """The autotune cache (and, with `clear --all`, the CUDA build cache)."""


@cache.command("show")
def cache_show() -> None:
    """Where the autotune cache is, this machine's fingerprint, and every file's entries."""
    directory = store.cache_dir()
    device = _device()
    current = store.cache_file(device)
    click.echo(f"autotune cache: {directory}")
    click.echo(f"this machine ({device}): {current.name}")
    fp = store.fingerprint(device)
    click.echo("  fingerprint: " + ", ".join(f"{k}={v}" for k, v in fp.items()))
    paths = sorted(directory.iterdir()) if directory.is_dir() else []
    ours = [p for p in paths if p.is_file() and store.CACHE_FILE_NAME.fullmatch(p.name)]
    files = [p for p in ours if p.suffix == ".json"]
    set_aside = [p for p in ours if ".corrupt-" in p.name]
    others = [p for p in paths if p not in ours]
    if not files:
        click.echo("no cache files yet")
    for path in files:
        click.echo(f"\n{path.name}" + ("  (this machine)" if path == current else ""))
        try:
            data = store.read_cache_file(path)
        except (OSError, ValueError) as exc:
            click.echo(f"  unreadable: {exc}")
            continue
        fp = data.get("fingerprint") or {}
        click.echo("  fingerprint: " + ", ".join(f"{k}={v}" for k, v in fp.items()))
        entries = data["entries"]
        body = [
            [key, str(e.get("winner", "?")), _times_text(e.get("times_us", {}))]
            for key, e in sorted(entries.get(store.BACKEND_SECTION, {}).items(), key=_by_key)
            if isinstance(e, dict)
        ]
        if body:
            click.echo(f"  backend winners ({len(body)}):")
            for line in align(("key", "winner", "times (us)"), body):
                click.echo("    " + line)
        for section, table in sorted(entries.items()):
            if section == store.BACKEND_SECTION:
                continue
            body = []
            for key, e in sorted(table.items(), key=_by_key):
                best = (e.get("timings_ms") or [[None]])[0][0] if isinstance(e, dict) else None
                config = e.get("config") if isinstance(e, dict) else e
                body.append([key, str(config), "-" if best is None else f"{best * 1e3:.1f}"])
            click.echo(f"  {section} configs ({len(body)}):")
            for line in align(("class", "config", "us"), body, right=[2]):
                click.echo("    " + line)
    for path in set_aside:
        click.echo(f"\nset aside (unusable): {path.name}")
    for path in others:  # `cache clear` leaves these too
        click.echo(f"\nnot a dualk cache file: {path.name}")


@cache.command("clear")
@click.option(
    "--all", "everything", is_flag=True,
    help="Also remove the CUDA build cache and Triton's background tuning logs.",
)  # fmt: skip
def cache_clear(everything: bool) -> None:
    """Remove the autotune cache files (and with --all the CUDA builds); print what went."""
    removed, kept = [], []
    directory = store.cache_dir()
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.is_file() and store.CACHE_FILE_NAME.fullmatch(path.name):
                path.unlink()
                removed.append(path)
            else:  # not a name dualk gives its files: someone else's
                kept.append(path)
    if everything:
        tune_dir = cache_root() / "triton-tune"  # Triton's background tuner: logs, class locks
        if tune_dir.is_dir() and not tune_dir.is_symlink():
            shutil.rmtree(tune_dir, ignore_errors=True)
            removed.append(tune_dir)
        builds = cache_root() / "cuda"
        if builds.is_symlink():  # a link to a shared build cache: the link goes, the builds stay
            builds.unlink()
            removed.append(builds)
        elif builds.exists():
            shutil.rmtree(builds)
            removed.append(builds)
    autotune.clear_memory()
    for path in removed:
        click.echo(f"removed {path}")
    for path in kept:
        click.echo(f"left {path}: not a dualk cache file")
    if not removed:
        where = directory if not everything else f"{directory} or {cache_root() / 'cuda'}"
        click.echo(f"nothing to remove in {where}")
