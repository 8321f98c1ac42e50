"""`dualk bench --models`: the model zoo (dualk/tools/zoo.py) from the command line. Progress lines on
stderr, a table on stdout, `--json` the results with the environment. Exits 1 when a model's
fused output fails its check or a model raised; a model whose package is missing is a skipped
row, not a failure. Without a GPU it runs the zoo's CPU sizes: correctness and the fuse report
(times are CPU times, marked so)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

import click

from ..tools import zoo
from ..tools.render import align
from ..tools.zoo_models import MODELS, unavailable
from . import common

# What the zoo reads of bench's options; any other given with --models is a usage error.
ZOO_PARAMS = {"models", "modes", "quick", "rounds", "json_path", "list_cases"}


def parse_models(values: Sequence[str]) -> list[str]:
    """--models values, each one name, "all" or a comma-separated list."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n != "all" and n not in zoo.MODELS]
    if unknown:
        raise click.BadParameter(
            f"unknown model(s) {', '.join(unknown)}; the zoo has: all, {', '.join(MODELS)} "
            "(`dualk bench --models all --list`)",
            param_hint="'--models'",
        )
    return names


def parse_modes(value: str | None) -> tuple[str, ...]:
    if value is None:
        return zoo.MODES
    modes = tuple(dict.fromkeys(m.strip() for m in value.split(",") if m.strip()))
    bad = [m for m in modes if m not in zoo.MODES]
    if bad or not modes:
        raise click.BadParameter(
            f"{value!r}: the modes are {', '.join(zoo.MODES)} (comma-separated)",
            param_hint="'--modes'",
        )
    return modes


def run_zoo(ctx: click.Context) -> None:
    p = ctx.params
    if not p["models"]:
        given = [f"--{n}" for n in ("modes", "quick", "rounds") if p[n]]
        raise click.UsageError(f"{', '.join(given)}: for the model zoo only; add --models")
    others = [
        name
        for name in p
        if name not in ZOO_PARAMS
        and ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT
    ]
    if others:
        raise click.UsageError(
            f"--models runs the model zoo, which does not take "
            f"{', '.join(_flag(ctx, n) for n in others)} (operator benchmark options)"
        )
    names = parse_models(p["models"])
    modes = parse_modes(p["modes"])
    if p["list_cases"]:
        _list_models(names)
        return
    gpu = common.has_gpu()
    if not gpu:
        click.echo(
            "No CUDA GPU found: the zoo runs its CPU sizes (correctness and the fuse report; "
            "the times are CPU times, saying nothing about a GPU).",
            err=True,
        )

    start = time.perf_counter()
    done: list[zoo.Result] = []
    env = zoo.environment("cuda" if gpu else "cpu")

    def progress(i: int, n: int, what: str) -> None:
        if i < n:
            click.echo(f"[{i + 1}/{n}] {what} (at {time.perf_counter() - start:.0f} s)", err=True)

    def save(result: zoo.Result) -> None:  # after every row: a run cut short keeps its rows
        done.append(result)
        if p["json_path"] is not None:
            p["json_path"].write_text(json.dumps(zoo.to_json(done, env), indent=1) + "\n")

    results = zoo.run(
        names,
        modes,
        device="cuda" if gpu else "cpu",
        rounds=p["rounds"],
        quick=p["quick"],
        progress=progress,
        on_result=save,
    )
    for line in render(results):
        click.echo(line)
    click.echo(f"{len(results)} rows in {time.perf_counter() - start:.0f} s")
    if p["json_path"] is not None:
        click.echo(f"wrote {p['json_path']}")
    failed = [r for r in results if r.status == "error" or r.ok is False]
    if failed:
        click.echo(
            "\n!! " + ", ".join(f"{r.model} {r.mode}" for r in failed) + ": failed (see above)",
            err=True,
        )
        sys.exit(1)
    if not any(r.status == "ok" for r in results):
        click.echo("\n!! no model ran (all skipped)", err=True)
        sys.exit(1)


def _flag(ctx: click.Context, name: str) -> str:
    param = next(p for p in ctx.command.params if p.name == name)
    return param.opts[0]


def _list_models(names: Sequence[str]) -> None:
    specs = list(MODELS.values()) if "all" in names else [MODELS[n] for n in names]
    body = []
    for s in specs:
        why = unavailable(s)
        body.append([s.name, s.family, str(s.dtype)[6:], s.rows["gpu"], s.rows["cpu"],
                     ",".join(s.modes), "yes" if why is None else f"no: {why}"])  # fmt: skip
    for line in align(
        ("model", "family", "dtype", "rows (gpu)", "rows (cpu)", "modes", "available"), body
    ):
        click.echo(line)
    for s in specs:
        click.echo(f"  {s.name}: {s.description}")


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


HEADER = (
    "model", "mode", "dtype", "rows", "orig ms", "fused ms", "dev ms orig/fused",
    "host us orig/fused", "ratio", "95% interval", "rel err", "check", "fused/linears",
)  # fmt: skip


def render(results: Sequence[zoo.Result]) -> list[str]:
    """The table, then what was skipped or failed and, per model, what fuse left alone."""
    body, notes = [], []
    for r in results:
        if r.status != "ok":
            cells = [r.model, r.mode, r.dtype, r.rows, *["-"] * 4, r.status, "-", "-", "-", "-"]
            notes.append(f"{r.status}: {r.model} {r.mode}: {r.reason}")
            body.append(cells)
            continue
        cpu = " (cpu)" if r.timed_on == "cpu" else ""
        f = r.fuse
        body.append([
            r.model, r.mode, r.dtype, r.rows, _f(r.orig_ms, ".3f"), _f(r.fused_ms, ".3f"),
            f"{_f(r.orig_device_ms, '.3f')} / {_f(r.fused_device_ms, '.3f')}",
            f"{_f(r.orig_host_us, '.0f')} / {_f(r.fused_host_us, '.0f')}",
            _f(r.ratio, ".2f") + "x" + cpu,
            "-" if not r.ratio_ci else f"{r.ratio_ci[0]:.2f}-{r.ratio_ci[1]:.2f}",
            _f(r.rel_err, ".2e"),
            "ok" if r.ok else "FAIL", f"{f.linears_fused}/{f.linears}" if f else "-",
        ])  # fmt: skip
        if r.ok is False:
            notes.append(f"FAIL: {r.model} {r.mode}: {r.verdict}")
        if r.note:
            notes.append(f"note: {r.model} {r.mode}: {r.note}")
    lines = align(HEADER, body, right=range(4, 11))
    seen = set()
    for r in results:
        if r.fuse is None or r.model in seen:
            continue
        seen.add(r.model)
        f = r.fuse
        kinds = ", ".join(f"{n} {k}" for k, n in f.kinds.items()) or "no chain"
        what = f"fuse({r.model}): {kinds}; {f.linears_fused} of {f.linears} Linear / Conv1D fused"
        if not f.traced:
            what += " (not traceable: children fused)"
        notes.append(what)
        for s in f.skipped[:5]:
            notes.append(f"    not fused: {s['where']}: {s['reason']}")
        if len(f.skipped) > 5:
            notes.append(f"    ... {len(f.skipped) - 5} more in the JSON")
        if f.unreported:
            shown = ", ".join(f.unreported[:4]) + (" ..." if len(f.unreported) > 4 else "")
            notes.append(
                f"    {len(f.unreported)} Linear / Conv1D not fused and not in the report: {shown}"
            )
    for r in results:  # the fused modules' measured choices (dualk.module_choice)
        for key, c in r.choices.items():
            times = ", ".join(
                f"{p} {t[1]:.1f}/{t[2]:.1f}" for p, t in c.get("times_us", {}).items()
            )
            notes.append(f"choice {r.model} {r.mode}: {key}: {c['path']} (device/host us: {times})")
    if any(r.timed_on == "cpu" for r in results):
        notes.append("(cpu): CPU times of the CPU sizes, saying nothing about a GPU")
    notes.append(
        "ratio = original wall / fused wall per call (> 1: fused faster); host = enqueue time "
        "per call; rel err = ||fused - orig|| / ||orig||; check: dualk.zoo's error rule"
    )
    return lines + [""] + notes
