"""The CPU smoke check that `dualk bench` runs on a machine without a GPU: each dualk backend (and
eager PyTorch, as a check of the harness) once on small registry cases, outputs judged against the
float64 reference. Correctness only: nothing measured on a CPU says anything about a GPU, so rows
carry rel_err and ok, never a time. Triton runs under its CPU interpreter."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence

import torch

import dualk

from ..backends import unavailable_reason
from ..registry import OPS, OpSpec, ShapeCase
from ..testing import float64_reference, judge
from .bench import Report, Row, environment
from .report import SMOKE_MODE

SMOKE_CASES_PER_OP = 2  # the first non-gpu_only cases of each operator
PEER = "torch eager (cpu)"
_CPU = torch.device("cpu")
# Triton's interpreter runs kernels in numpy, which warns about overflow or NaN in lanes a kernel
# masks off or clamps afterwards. The outputs are judged against float64 anyway, so inside the
# smoke check these warnings are noise; elsewhere (a user's own interpreter run) they stay.
_INTERPRETER_NOISE = r"(overflow|invalid value|divide by zero|underflow) encountered"


def enable_interpreter() -> None:
    """Run Triton kernels on CPU tensors through the interpreter (unless TRITON_INTERPRET says
    otherwise). Must happen before Triton compiles any dualk kernel (at their import), so the CLI
    calls it just before the check; not at import, which would leave a GPU process interpreting."""
    os.environ.setdefault("TRITON_INTERPRET", "1")


def smoke_cases(spec: OpSpec, shapes: Sequence[str] = ()) -> list[ShapeCase]:
    """The named cases, or the first SMOKE_CASES_PER_OP cases small enough for the CPU."""
    if shapes:
        return [spec.case(s) for s in shapes]
    return [c for c in spec.cases if not c.gpu_only][:SMOKE_CASES_PER_OP]


def cannot_run(backends: Sequence[str]) -> dict[str, str]:
    """backend -> why it cannot run in the smoke check, for those of `backends` that cannot: asked
    as the check will run them, i.e. with the interpreter enabled, without enabling it for good
    (so the CLI can refuse or explain before anything changes)."""
    unset = "TRITON_INTERPRET" not in os.environ
    enable_interpreter()
    try:
        reasons = {b: unavailable_reason(b, _CPU) for b in backends}
    finally:
        if unset:
            del os.environ["TRITON_INTERPRET"]
    return {b: why for b, why in reasons.items() if why is not None}


def cpu_smoke_check(
    ops: Sequence[str],
    dtypes: Sequence[torch.dtype] | None,
    shapes: Sequence[str],
    backends: Sequence[str],
    with_peers: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Row]:
    """Run each backend once on small registry cases on the CPU (Triton under its interpreter)
    and judge the outputs against the float64 reference. Rows carry rel_err and ok, never a
    time; a backend that cannot run gets a row noted "unavailable: <why>" and a gpu_only case
    rows noted "skipped: ...", neither of which is a check. With `with_peers`, eager PyTorch on
    the CPU is checked too (a check of the harness)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _INTERPRETER_NOISE, RuntimeWarning, r"triton\.")
        return _check(ops, dtypes, shapes, backends, with_peers, progress)


def _check(ops, dtypes, shapes, backends, with_peers, progress) -> list[Row]:
    items = [
        (OPS[n], c, d)
        for n in ops
        for c in smoke_cases(OPS[n], shapes)
        for d in (dtypes or c.bench_dtypes)
    ]
    impls = [(f"dualk:{b}", "dualk", b) for b in backends] + (
        [(PEER, "peer", None)] if with_peers else []
    )
    # As things are now (cannot_run answers as they will be once the CLI enables the interpreter).
    unavailable = {b: why for b in backends if (why := unavailable_reason(b, _CPU)) is not None}
    rows: list[Row] = []
    for i, (spec, case, dtype) in enumerate(items):
        if progress:
            progress(i, len(items), f"{spec.name} {case.name} {str(dtype)[6:]}")
        dname = str(dtype)[6:]
        if case.gpu_only:
            note = "skipped: gpu_only case, too large for the CPU"
            rows += [Row(spec.name, case.name, case.name, dname, impl, kind, note=note)
                     for impl, kind, _ in impls]  # fmt: skip
            continue
        sample = case.make(dtype, _CPU, torch.Generator().manual_seed(0))
        ref = float64_reference(spec, sample)
        for impl, kind, backend in impls:
            row = Row(spec.name, case.name, sample.label, dname, impl, kind)
            rows.append(row)
            if backend in unavailable:
                row.note = f"unavailable: {unavailable[backend]}"
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


def smoke_report(rows: list[Row]) -> Report:
    """The rows as a Report marked as a smoke check, so a saved file is never read as timings."""
    return Report({**environment(), "mode": SMOKE_MODE}, {}, rows)
