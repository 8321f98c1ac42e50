"""Guards: the Python-side state a C++ plan was made under, checked in one crossing on every call.

A fused module's planned CUDA call (dualk/nn.py _FastPath, cuda_src/binding_mlp.cpp MlpPlan) is
valid while the state it was planned under holds: the module's backend and hooks, auto's
decisions and overrides, the poisoning and TF32 switches, no torch.func transform. Checking those
in Python cost 1-3 us per call (more than the C++ call itself on a slow host); as guards, the C++
plan checks them in its own crossing. Each guard reads live Python objects (a dict entry, a dict's
length, a callable's result), so a change made by any route is seen on the next call.
`Guards.hold` is the same test in Python (CPU tests, and the reference for the C++ one)."""

from __future__ import annotations

_MISSING = object()


class Guards:
    __slots__ = ("identities", "absent", "empty", "sizes", "calls")

    def __init__(self) -> None:
        self.identities: list[tuple] = []  # (dict, key, value): dict[key] is value (key present)
        self.absent: list[tuple] = []  # (dict, key): the key missing, or its value None
        self.empty: list[dict] = []  # dicts that must stay empty (hooks)
        self.sizes: list[tuple] = []  # (dict, length)
        self.calls: list[tuple] = []  # (callable, result): callable() is result

    def extend(self, other: Guards) -> Guards:
        for name in self.__slots__:
            getattr(self, name).extend(getattr(other, name))
        return self

    def hold(self) -> bool:
        """Whether every guard holds now (MlpPlan::Guards::hold's test; a callable that raises
        counts as changed)."""
        if any(len(d) for d in self.empty):
            return False
        for d, key, value in self.identities:
            if d.get(key, _MISSING) is not value:
                return False
        for d, key in self.absent:
            if d.get(key) is not None:
                return False
        for d, size in self.sizes:
            if len(d) != size:
                return False
        try:
            return all(fn() is result for fn, result in self.calls)
        except Exception:
            return False

    def args(self) -> tuple[list, list, list, list, list]:
        """The lists as MlpPlan's constructor takes them."""
        return self.identities, self.absent, self.empty, self.sizes, self.calls
