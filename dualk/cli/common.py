"""What the `dualk` commands share: the option sets that pick operators, dtypes and shape cases
(bench, tune) or an older run to compare with (bench, report), the progress bar, and loading a
result file with a usage error instead of a traceback. No command lives here."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import click
import torch

from ..registry import OPS
from ..tools import report as results
from ..tools.bench import Report

DTYPE_NAMES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}

Progress = Callable[[int, int, str], None]
FILE_PATH = click.Path(dir_okay=False, path_type=Path)
EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def has_gpu() -> bool:
    """Whether a CUDA GPU is visible. Every command asks here: the one name tests replace
    (`dualk.cli.common.has_gpu`) to stand in for a GPU (or its absence)."""
    return torch.cuda.is_available()


def _apply(options: Sequence[Callable]) -> Callable:
    """A decorator applying `options` so that they appear in --help in the order given."""

    def decorate(f: Callable) -> Callable:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _repeatable(flag: str, dest: str, help: str, **kwargs) -> Callable:
    return click.option(flag, dest, multiple=True, help=help, **kwargs)


def case_options(suites: Sequence[str], verb: str) -> Callable:
    """--op, --dtype, --shape and --suite: which registry cases a command works on."""
    return _apply(
        [
            _repeatable(
                "--op", "ops", "Operator (repeatable; default: all).", type=click.Choice(list(OPS))
            ),
            _repeatable(
                "--dtype",
                "dtypes",
                "Dtype (repeatable; default: each shape's own).",
                type=click.Choice(list(DTYPE_NAMES)),
            ),
            _repeatable(
                "--shape",
                "shapes",
                "Registry shape case name (repeatable; see `dualk bench --list`).",
                metavar="CASE",
            ),
            click.option(
                "--suite",
                type=click.Choice(list(suites)),
                default="default",
                show_default=True,
                help=f"Which shape cases to {verb} when no --shape is given.",
            ),
        ]
    )


def compare_options(f: Callable) -> Callable:
    """--compare, --fail-if-slower and --allow-no-compare: an older run and the regression gate."""
    return _apply(
        [
            click.option(
                "--compare",
                "compare_path",
                type=EXISTING_FILE,
                help="An older `dualk bench --json` file: show old vs new times.",
            ),
            click.option(
                "--fail-if-slower",
                type=click.FloatRange(min=0),
                metavar="PCT",
                help="With --compare: exit 1 if a dualk row got more than PCT percent slower, "
                "or if no dualk row could be compared.",
            ),
            click.option(
                "--allow-no-compare",
                is_flag=True,
                help="With --fail-if-slower: pass when nothing could be compared (a run without "
                "timings, no rows in common) instead of failing.",
            ),
        ]
    )(f)


def check_compare_options(compare_path: Path | None, fail_if_slower: float | None) -> None:
    if fail_if_slower is not None and compare_path is None:
        raise click.UsageError("--fail-if-slower needs --compare OLD.json")


def dtype_list(dtypes: Sequence[str]) -> list[torch.dtype] | None:
    """The --dtype values as torch dtypes without repeats; None (each case's own) when empty."""
    return list(dict.fromkeys(DTYPE_NAMES[d] for d in dtypes)) or None


def check_shapes(ops: Sequence[str], shapes: Sequence[str]) -> None:
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


@contextlib.contextmanager
def progress_bar(label: str) -> Iterator[Progress]:
    """A progress bar on stderr (so the table on stdout stays clean), driven by (i, n, what)."""
    with click.progressbar(length=1, label=label, file=sys.stderr) as bar:

        def update(i: int, n: int, what: str) -> None:
            bar.length = max(n, 1)
            bar.label = what[:40]
            bar.update(i - bar.pos)

        yield update


def load(path: Path) -> Report:
    """A saved run, or a usage error naming what is wrong with the file."""
    try:
        return results.load_report(path)
    except (OSError, ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc)) from None
