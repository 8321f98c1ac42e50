"""dualk/core/guards.py: the Python-side state a C++ plan checks on every call. Guards.hold is the
same test as cuda_src/binding_mlp.cpp's Guards::hold (the GPU tests in tests/test_nn.py run the
C++ one through FusedMLP's fast path); here each kind of guard, held and broken."""

from __future__ import annotations

import contextvars
import gc
import shutil
import weakref
from pathlib import Path

import pytest

from dualk.core.guards import Guards

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """tests/cpp/guards_probe.cpp built on the CPU (pybind11 and cuda_src/plan_guards.h only)."""
    if shutil.which("ninja") is None and not _has_ninja_module():
        pytest.skip("ninja is needed to build the probe extension")
    from torch.utils import cpp_extension

    build = tmp_path_factory.mktemp("guards_probe")
    try:
        return cpp_extension.load(
            name="dualk_guards_probe",
            sources=[str(ROOT / "tests" / "cpp" / "guards_probe.cpp")],
            extra_include_paths=[str(ROOT / "cuda_src")],
            build_directory=str(build),
            verbose=False,
        )
    except Exception as exc:  # no C++ compiler here: the GPU suite runs the real plan
        pytest.skip(f"the probe extension did not build: {type(exc).__name__}: {exc}"[:300])


def _has_ninja_module() -> bool:
    try:
        import ninja  # noqa: F401
    except ImportError:
        return False
    return True


def test_cpp_hold_agrees_with_python(probe):
    # The same guard lists, changed one piece at a time: the C++ test MlpPlan runs and
    # Guards.hold answer alike.
    d: dict = {"a": object(), "gone": None}
    hooks: dict = {}
    var: contextvars.ContextVar[str | None] = contextvars.ContextVar("scope2", default=None)
    g = Guards()
    g.identities.append((d, "a", d["a"]))
    g.absent += [(d, "missing"), (d, "gone")]
    g.empty.append(hooks)
    g.sizes.append((d, 2))
    g.calls.append((var.get, None))
    holder = probe.GuardedHolder(g.args(), [object()])

    def agree() -> bool:
        assert holder.hold() is g.hold()
        return g.hold()

    assert agree()
    for change, undo in [
        (lambda: d.__setitem__("a", object()), lambda: d.__setitem__("a", g.identities[0][2])),
        (lambda: d.__setitem__("missing", 1), lambda: d.pop("missing")),
        (lambda: d.__setitem__("gone", "x"), lambda: d.__setitem__("gone", None)),
        (lambda: hooks.__setitem__(1, print), hooks.clear),
    ]:
        change()
        assert not agree()
        undo()
        assert agree()
    token = var.set("torch")
    assert not agree()
    var.reset(token)
    assert agree()
    raising = Guards()
    raising.calls.append((lambda: 1 / 0, None))
    assert probe.GuardedHolder(raising.args(), [1]).hold() is False  # (no error left set)
    assert raising.hold() is False

    def interrupted():
        raise KeyboardInterrupt

    stop = Guards()
    stop.calls.append((interrupted, None))
    for hold in (stop.hold, probe.GuardedHolder(stop.args(), [1]).hold):
        with pytest.raises(KeyboardInterrupt):
            hold()


def test_a_cycle_through_the_plan_is_collected(probe):
    # A plan whose guards hold the __dict__ of the object that holds the plan (as a FusedMLP's
    # does): collected with the object once nothing else refers to them.
    class Module:
        pass

    m = Module()
    g = Guards()
    g.identities.append((m.__dict__, "backend", "auto"))
    m.backend = "auto"
    m.plan = probe.GuardedHolder(g.args(), [m])  # (the parameters: the module itself, worst case)
    assert m.plan.hold()
    alive = weakref.ref(m)
    del m, g  # (the Python guards would keep the __dict__, and so the plan, alive)
    gc.collect()
    assert alive() is None
