"""The layers contracts (pyproject.toml, [tool.importlinter]: the package's layers, and auto's
parts inside dualk.dispatch): they hold for the package, they fail on a reversed import, and the
package has no import cycles. `.ci/run` runs `lint-imports` itself;
these tests show that the check would catch a violation."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
grimp = pytest.importorskip("grimp", reason="import-linter is not installed (the test extra)")


def _lint(tree: Path) -> subprocess.CompletedProcess:
    """lint-imports on a copy of the package at `tree` (its dualk/ first on the path)."""
    return subprocess.run(
        [LINT, "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "dualk", tmp_path / "dualk", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_contract_holds(copy):
    result = _lint(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("core/timing.py", "from .. import ops"),  # the bottom layer reaching the top
        ("dispatch/autotune.py", "from ..runtime import operators"),  # one layer up
        ("dispatch/store.py", "from . import measure"),  # one of auto's parts using another
        ("dispatch/keys.py", "from . import autotune"),  # a part using the whole
        ("runtime/operators.py", "from ..tools import bench"),  # the library into tooling
    ],
)
def test_contract_fails_on_a_reversed_import(copy, module, line):
    path = copy / "dualk" / module
    path.write_text(path.read_text() + f"\n{line}  # reversed\n")
    result = _lint(copy)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout or "Broken contracts" in result.stdout


def test_no_import_cycles():
    """No two dualk modules import each other, directly or through others (function-level
    imports included)."""
    graph = grimp.build_graph("dualk")
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    assert cycles == []


def test_no_private_names_of_other_modules():
    """No `from X import _name` and no `module._name` of another dualk module (tests may)."""
    offenders = []
    for path in sorted((ROOT / "dualk").rglob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or "dualk" in (node.module or "")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offenders.append(f"{path.relative_to(ROOT)}: from ... import {alias.name}")
                    modules.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                offenders.append(
                    f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}"
                )
    assert offenders == []


# The layers a dualk module belongs to, top to bottom (pyproject.toml's contract, by folder).
_LAYER_ORDER = ("cli", "zoo", "tools", "fuse", "nn", "module_choice", "ops", "testing", "config",
                "autograd", "runtime", "dispatch", "registry", "backends", "core")  # fmt: skip
_RANK = {name: i for i, name in enumerate(_LAYER_ORDER)}


def _layer(filename: str) -> str | None:
    package = str(ROOT / "dualk") + "/"
    if not filename.startswith(package):
        return None
    head = filename[len(package) :].split("/")[0].removesuffix(".py")
    return head if head in _RANK else None


def _climbs(fn) -> tuple[list, list]:
    """(the calls inside dualk while fn() runs that go to a higher layer than their caller's,
    the layers entered in order)."""
    calls: list[tuple[str | None, str, str]] = []

    def profile(frame, event, arg):
        if event != "call" or (callee := _layer(frame.f_code.co_filename)) is None:
            return
        caller = frame.f_back
        while caller is not None and _layer(caller.f_code.co_filename) is None:
            caller = caller.f_back
        calls.append((caller and _layer(caller.f_code.co_filename), callee, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    entered = [
        callee for i, (_, callee, _) in enumerate(calls) if i == 0 or calls[i - 1][1] != callee
    ]
    return [c for c in calls if c[0] and _RANK[c[1]] < _RANK[c[0]]], entered


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_a_call_never_climbs_back_to_a_layer_it_left(backend):
    """dualk.linear_gelu, dualk.fused_mlp and dualk.linear_glu (its training route), forward
    and backward: every call inside dualk goes to the caller's layer or one below (the eager
    autograd route and the backward formulas reach operators through the runtime, not through
    dualk.ops)."""
    import torch

    import dualk

    x = torch.randn(8, 16, requires_grad=True)
    w, b = torch.randn(32, 16), torch.randn(32)
    ws, bs = [torch.randn(24, 16), torch.randn(4, 24)], [torch.randn(24), None]
    for fn in (
        lambda: dualk.linear_gelu(x.detach(), w, b, backend=backend),
        lambda: dualk.linear_gelu(x, w, b, backend=backend).sum().backward(),
        lambda: dualk.fused_mlp(x, ws, bs, backend=backend).sum().backward(),
        lambda: dualk.linear_glu(x, w, None, b, backend=backend).sum().backward(),
        lambda: dualk.add(x.detach(), x.detach(), backend=backend),
    ):
        fn()  # warm: auto's decision, lazy imports
        climbs, entered = _climbs(fn)
        assert climbs == [], (climbs, entered)
        assert entered[0] == "ops"
