"""Output allocation. With poisoning on (DUALK_POISON=1 at import, or set_poison(True); the test
suite turns it on), fresh outputs are filled with NaN so an element a kernel forgot to write
cannot pass a comparison."""

from __future__ import annotations

import os

import torch

from .layout import row_count

_poison = os.environ.get("DUALK_POISON", "") not in ("", "0")


def set_poison(enabled: bool) -> None:
    global _poison
    _poison = bool(enabled)


def poisoning() -> bool:
    """Whether fresh outputs are NaN-filled (paths that allocate in C++ step aside then)."""
    return _poison


def poisoning_guard() -> tuple:
    """The switch as it is now, as a guard (dualk/core/guards.py): (dict, key, value)."""
    return (globals(), "_poison", _poison)


def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    if _poison:
        out.fill_(float("nan"))
    return out


_CONTIGUOUS = torch.contiguous_format


def empty_like_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous tensor of t's shape, dtype and device (~1 us on the host where
    empty(shape, dtype, device) costs ~2; poisoned like empty())."""
    out = torch.empty_like(t, memory_format=_CONTIGUOUS)
    if _poison:
        out.fill_(float("nan"))
    return out


def rows_output(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The output (..., n) of an op on x (..., k), and the same memory as (rows, n) for the
    kernel to write. The output is made in its own shape, not as a view of a (rows, n) tensor:
    a view returned from dualk's autograd Function cannot be modified in place (`y.add_(1)`
    under autograd raises), where PyTorch's own ops return a plain tensor."""
    if x.dim() == 2:
        out = empty((x.shape[0], n), x.dtype, x.device)
        return out, out
    out = empty((*x.shape[:-1], n), x.dtype, x.device)
    return out, out.view(row_count(x), n)
