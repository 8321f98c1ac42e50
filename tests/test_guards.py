"""dualk/core/guards.py: the Python-side state a C++ plan checks on every call. Guards.hold is the
same test as cuda_src/binding_mlp.cpp's Guards::hold (the GPU tests in tests/test_nn.py run the
C++ one through FusedMLP's fast path); here each kind of guard, held and broken."""

from __future__ import annotations

import contextvars

from dualk.core.guards import Guards


def test_each_guard_kind_holds_then_breaks():
    d: dict = {"a": object(), "gone": None}
    hooks: dict = {}
    var: contextvars.ContextVar[str | None] = contextvars.ContextVar("scope", default=None)
    flag = [False]
    g = Guards()
    g.identities.append((d, "a", d["a"]))
    g.absent += [(d, "missing"), (d, "gone")]  # missing, or present as None
    g.empty.append(hooks)
    g.sizes.append((d, 2))
    g.calls += [(var.get, None), (lambda: flag[0], False)]
    assert g.hold()
    d["a"] = object()  # another object under the key (equal or not)
    assert not g.hold()
    d["a"] = g.identities[0][2]
    assert g.hold()
    d["missing"] = 1
    assert not g.hold()  # (and its size changed too)
    del d["missing"]
    d["gone"] = "set"
    assert not g.hold()
    d["gone"] = None
    hooks[1] = print
    assert not g.hold()
    hooks.clear()
    token = var.set("torch")
    assert not g.hold()
    var.reset(token)
    flag[0] = True
    assert not g.hold()
    flag[0] = False
    assert g.hold()
    del d["a"]  # an identity's key removed: broken (never read as None)
    d["b"] = 0
    assert not g.hold()


def test_a_raising_call_counts_as_changed_and_extend_joins():
    def boom():
        raise RuntimeError("no")

    g = Guards()
    g.calls.append((boom, None))
    assert not g.hold()
    other = Guards()
    other.identities.append(({"k": 1}, "k", 1))
    both = Guards().extend(other)
    assert both.hold() and both.args()[0] == other.identities
    assert not both.extend(g).hold()
