"""How dualk judges an output, shared by the tests and the benchmark's correctness column.

- elementwise ops: |out - ref| <= atol + rtol * |ref| elementwise against a float64 reference,
  with the per-dtype table in dualk.registry (the op rounds once, so this is tight);
- GEMM-family ops: max |out - ref| must stay within 2x PyTorch's own max error in the same dtype
  (plus one unit in the last place of the largest reference value, four in fp32), so the rule is
  tight on every dtype without a hand-tuned table;
- both: NaN, +inf and -inf must stand where the reference has them, and where it is finite an
  infinity (of its sign) only at the edge of the dtype's range, within the allowed error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .registry import ELEMENTWISE_TOLERANCE, OpSpec, Sample


@dataclass
class Verdict:
    ok: bool
    max_abs_err: float
    rel_err: float  # max |out - ref| / max |ref|
    message: str


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def float64_reference(spec: OpSpec, sample: Sample) -> torch.Tensor:
    args = _map_tensors(sample.args, lambda t: t.double())
    kwargs = _map_tensors(sample.kwargs, lambda t: t.double())
    return spec.reference(*args, **kwargs)


def _low_precision_reference(spec: OpSpec, sample: Sample) -> torch.Tensor:
    """PyTorch's own result in the sample's dtype, as float64. DUALK_YARDSTICK_DEVICE=cpu computes it
    on the CPU: compute-sanitizer's initcheck does not see what cuBLAS's Hopper GEMMs write and
    reports every later read of their output (bench/sanitize.sh sets it for initcheck)."""
    if os.environ.get("DUALK_YARDSTICK_DEVICE") == "cpu":
        args = _map_tensors(sample.args, lambda t: t.cpu())
        kwargs = _map_tensors(sample.kwargs, lambda t: t.cpu())
        return spec.reference(*args, **kwargs).double()
    return spec.reference(*sample.args, **sample.kwargs).double()


def clone_inputs(sample: Sample) -> Sample:
    return Sample(
        _map_tensors(sample.args, torch.clone),
        _map_tensors(sample.kwargs, torch.clone),
        sample.label,
    )


def inputs_unchanged(before: Sample, after: Sample) -> bool:
    flat_a, flat_b = [], []
    _map_tensors(before.args, flat_a.append)
    _map_tensors(after.args, flat_b.append)
    return all(torch.equal(x, y) for x, y in zip(flat_a, flat_b))


def _worst(out64: torch.Tensor, ref: torch.Tensor, excess: torch.Tensor, k: int = 5) -> str:
    flat = excess.flatten()
    idx = torch.topk(flat.nan_to_num(float("inf")), min(k, flat.numel())).indices
    rows = []
    for i in idx.tolist():
        pos = tuple(int(p) for p in torch.unravel_index(torch.tensor(i), ref.shape))
        rows.append(
            f"at {pos}: got {out64.flatten()[i].item():.6g}, expected {ref.flatten()[i].item():.6g}"
        )
    return "; ".join(rows)


def _non_finite_mismatch(out64, ref, allowed, dtype) -> torch.Tensor:
    """Where `out` is non-finite wrongly: a NaN or an infinity of the reference must stand where
    the reference has it (NaN or -inf for +inf is wrong), and where the reference is finite, out
    may be an infinity of its sign only if the reference lies within `allowed` of the dtype's
    largest value (a sum at the edge of the range rounds either way); NaN never."""
    ref_finite = ref.isfinite()
    same_class = (
        (out64.isnan() == ref.isnan())
        & (out64.isposinf() == ref.isposinf())
        & (out64.isneginf() == ref.isneginf())
    )
    may_overflow = (
        out64.isinf()
        & (out64.sign() == ref.sign())
        & (ref.abs() + allowed >= torch.finfo(dtype).max)
    )
    return torch.where(ref_finite, ~out64.isfinite() & ~may_overflow, ~same_class)


def _finite_error(out64: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|out - ref| where both are finite, else 0 (non-finite values are judged by class)."""
    return torch.where(out64.isfinite() & ref.isfinite(), (out64 - ref).abs(), 0.0)


def _non_finite_note(class_bad: torch.Tensor) -> str:
    n = int(class_bad.sum())
    return (
        f" ({n} of them NaN or infinite where the reference is not, or the other way)" if n else ""
    )


def gemm_error_budget(dtype: torch.dtype, torch_err: float, scale: float) -> float:
    """The GEMM family's allowed max error against the float64 reference: twice PyTorch's own
    same-dtype error plus a floor of one ulp of the largest reference value `scale` (four in
    fp32; judge() says why)."""
    return 2.0 * torch_err + torch.finfo(dtype).eps * scale * (
        4.0 if dtype == torch.float32 else 1.0
    )


def judge(
    spec: OpSpec, sample: Sample, out: torch.Tensor, ref: torch.Tensor | None = None
) -> Verdict:
    """Is `out` (from some backend, on `sample`) right? `ref` is the float64 reference if known."""
    like = sample.first_tensor()
    if ref is None:
        ref = float64_reference(spec, sample)
    if out.shape != ref.shape or out.dtype != like.dtype:
        return Verdict(False, float("inf"), float("inf"),
                       f"shape/dtype {tuple(out.shape)}/{out.dtype}, expected {tuple(ref.shape)}/{like.dtype}")  # fmt: skip
    if ref.numel() == 0:
        return Verdict(True, 0.0, 0.0, "empty")
    out64 = out.double()
    ref_finite = ref.isfinite()
    err = _finite_error(out64, ref)
    max_err = err.max().item()
    ref_abs = ref.abs().masked_fill(~ref_finite, 0.0)
    scale = ref_abs.max().item()
    rel = max_err / scale if scale > 0 else max_err
    if spec.judged_by == "elementwise":
        atol, rtol = ELEMENTWISE_TOLERANCE[like.dtype]
        allowed = atol + rtol * ref_abs
        class_bad = _non_finite_mismatch(out64, ref, allowed, like.dtype)
        bad = (err > allowed) | class_bad
        if bad.any():
            excess = (err - allowed).masked_fill(class_bad, float("inf")).masked_fill(~bad, -1)
            return Verdict(False, max_err, rel,
                           f"{int(bad.sum())} of {ref.numel()} elements outside atol={atol}, rtol={rtol}"
                           f"{_non_finite_note(class_bad)}: " + _worst(out64, ref, excess))  # fmt: skip
        return Verdict(True, max_err, rel, "ok")
    # GEMM family: compare with PyTorch's own error in the same dtype.
    torch_out = _low_precision_reference(spec, sample).to(ref.device).double()
    torch_err = _finite_error(torch_out, ref).max().item()
    # The floor: one ulp of the largest reference value, four for fp32. In fp16/bf16 the final
    # rounding dominates everyone's error, so PyTorch's max error is a stable yardstick. In fp32
    # the summation order dominates, and over a handful of outputs (batch 1, 10 features)
    # PyTorch's max error can land far below its typical value: H200 and CPU runs put correct
    # kernels at 3-4x it (6.5e-8 vs 1.6e-8 on 0.13-sized outputs). Four fp32 ulps (5e-7
    # relative) still fail any real bug by orders of magnitude.
    budget = gemm_error_budget(like.dtype, torch_err, scale)
    class_bad = _non_finite_mismatch(out64, ref, budget, like.dtype)
    if class_bad.any():
        return Verdict(False, max_err, rel,
                       f"{int(class_bad.sum())} of {ref.numel()} elements NaN or infinite where the reference is not, or the other way: "
                       + _worst(out64, ref, class_bad.double()))  # fmt: skip
    if not max_err <= budget:
        return Verdict(False, max_err, rel,
                       f"max error {max_err:.3g} exceeds 2 x PyTorch's {torch_err:.3g} + {budget - 2.0 * torch_err:.3g}: "
                       + _worst(out64, ref, err))  # fmt: skip
    return Verdict(True, max_err, rel, f"ok (PyTorch's own error {torch_err:.3g})")
