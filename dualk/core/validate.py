"""Input checks shared by every operator: one place, messages that name the argument, what was
expected and what was given. Every error is a dualk.DualkError that is also a TypeError or a
ValueError (dualk/core/errors.py). Any torch.Tensor is accepted (nn.Parameter, tensors that require
grad, subclasses); only its dtype, device and shape are judged."""

from __future__ import annotations

import numbers

import torch

from .errors import DeviceMismatchError, DtypeError, InvalidArgumentError, InvalidTypeError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FLOAT_DTYPES_TEXT = "float32, float16 or bfloat16"


def tensor(op: str, name: str, value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor) and value.dtype in FLOAT_DTYPES:  # fast path
        return value
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(
            f"dualk.{op}: '{name}' must be a torch.Tensor, got {type(value).__name__}"
        )
    raise DtypeError(f"dualk.{op}: '{name}' has dtype {value.dtype}; expected {FLOAT_DTYPES_TEXT}")


def same_dtype_and_device(op: str, named: dict[str, torch.Tensor | None]) -> None:
    """All given tensors (None entries skipped) share the first one's dtype and device."""
    same_pair(op, *named.items())


def same_pair(op: str, *named: tuple[str, torch.Tensor | None]) -> None:
    """Like same_dtype_and_device for (name, tensor) pairs, without building a dict."""
    first_name, first = None, None
    for name, t in named:
        if t is None:
            continue
        if first is None:
            first_name, first = name, t
            continue
        if t.dtype != first.dtype:
            raise DtypeError(
                f"dualk.{op}: '{name}' has dtype {t.dtype} but '{first_name}' has {first.dtype}; "
                "all operands must share one dtype (cast one of them first)"
            )
        if t.device != first.device:
            raise DeviceMismatchError(
                f"dualk.{op}: '{name}' is on {t.device} but '{first_name}' is on {first.device}; "
                "all operands must be on one device"
            )


def real_number(op: str, name: str, value: object) -> float:
    """value as a Python float (the kernels take it as fp32: beyond fp32's range it is inf)."""
    cls = type(value)
    if (
        cls is not float
        and cls is not int
        and (  # the common cases skip the ABC check
            isinstance(value, bool) or not isinstance(value, numbers.Real)
        )
    ):
        raise InvalidTypeError(
            f"dualk.{op}: '{name}' must be a real number, got {type(value).__name__}"
        )
    try:
        return float(value)
    except OverflowError:  # an int or Fraction beyond any float
        raise InvalidArgumentError(
            f"dualk.{op}: '{name}' must be a real number within float range, got one of "
            f"magnitude 2^{int(value).bit_length() - 1} or more"
        ) from None


def ndim_at_least(op: str, name: str, t: torch.Tensor, n: int) -> None:
    if t.dim() < n:
        raise InvalidArgumentError(
            f"dualk.{op}: '{name}' must have at least {n} dimension(s), got shape {tuple(t.shape)}"
        )


def choice(op: str, name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidArgumentError(f"dualk.{op}: '{name}' must be one of {allowed}, got {value!r}")
    return value  # type: ignore[return-value]
