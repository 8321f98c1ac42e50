"""auto's shape-class keys: made by the operator's registry entry (`OpSpec.key`, its fields named
by `OpSpec.key_fields`; the built-in operators' are in dualk/registry.py beside their shape
cases), and their text as the cache file stores them (`key_string`).

A key is (op, device index, dtype, TF32 allowed, *fields). Its text leaves the device out (the
cache file is per device) and spells each field by its name, e.g.
"linear_gelu|bfloat16|m<=32|k=768|n=3072|bias|tanh|layout=cc"; earlier runs' decisions are found
by that text (tests/test_autotune_keys.py pins it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..registry import OPS, OpSpec


class FromRegistry(Mapping):
    """Operator name -> one attribute of its registry entry, for the entries that have it."""

    def __init__(self, attribute: str):
        self.attribute = attribute

    def __getitem__(self, op: str) -> Any:
        value = getattr(OPS[op], self.attribute) if op in OPS else None
        if not value:
            raise KeyError(op)
        return value

    def __iter__(self) -> Iterator[str]:
        return (op for op, spec in OPS.items() if getattr(spec, self.attribute))

    def __len__(self) -> int:
        return sum(1 for _ in self)


KEY_FUNCTIONS: Mapping[str, Callable[[tuple], tuple]] = FromRegistry("key")
# Each key's fields after (op, device index, dtype, tf32), named for the key's text.
FIELDS: Mapping[str, tuple[str, ...]] = FromRegistry("key_fields")


def make_key(spec: OpSpec, args: tuple) -> tuple:
    """The shape class of `spec.implementation(name)(*args)`."""
    return spec.key(args)


def _bucket(e: int) -> str:
    if e < 0:
        return "0"
    return f"<={1 << e}" if e <= 16 else f"<=2^{e}"


def _field_text(field: str, value: Any) -> str:
    if field in ("n", "m", "batch"):
        return f"{field}{_bucket(value)}"
    if field == "broadcast":
        return "broadcast" if value else "same-shape"
    if field == "dims":
        return f"{value // 10}d@{value % 10}d"
    if field in ("k", "n_exact"):
        return f"{field[0]}={value}"
    if field == "bias":
        return "bias" if value else "no-bias"
    if field == "widths":
        return "w=" + "-".join(str(v) for v in [value[0][1], *(s[0] for s in value)])
    if field == "biases":
        return "bias=" + "".join("1" if v else "0" for v in value)
    if field == "layout":
        return f"layout={value}"
    return str(value)


def key_string(key: tuple) -> str:
    """The device-independent text of a key, as the cache file stores it, e.g.
    "linear_gelu|bfloat16|m<=32|k=768|n=3072|bias|tanh|layout=cc"."""
    op, _, dtype, tf32, *fields = key
    parts = [op, str(dtype).removeprefix("torch.") + ("+tf32" if tf32 else "")]
    parts += [_field_text(f, v) for f, v in zip(FIELDS[op], fields)]
    return "|".join(parts)
