"""Test set-up: on a machine without a CUDA GPU the Triton kernels run under Triton's CPU
interpreter (TRITON_INTERPRET must be set before Triton is imported); outputs are poisoned with
NaN so an unwritten element fails."""

import os
import sys
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:  # set, not defaulted: an inherited TRITON_INTERPRET=0 would skip every Triton test
    os.environ["TRITON_INTERPRET"] = "1"
os.environ["DUALK_POISON"] = "1"


def _private_autotune_cache() -> None:
    """Point DUALK_CACHE_DIR at a fresh directory for this test process whose cuda/ is the real
    build cache: the suite's "auto" calls tune under load (xdist workers share the GPU) and must
    not leave their winners in the user's autotune cache, where a later `dualk bench` or model
    on the same machine would read them as tuned (bench/gpu_check.sh runs the tests, then the
    benchmark). The CUDA extension is still built once and shared."""
    import atexit
    import shutil
    import tempfile

    from dualk.backends.cuda import cache_root

    real = cache_root() / "cuda"
    private = Path(tempfile.mkdtemp(prefix="dualk-test-cache-"))
    try:
        real.mkdir(parents=True, exist_ok=True)
        (private / "cuda").symlink_to(real, target_is_directory=True)
    except OSError:  # an unusable cache location: dualk warns when it builds, the suite still runs
        pass
    os.environ["DUALK_CACHE_DIR"] = str(private)
    atexit.register(shutil.rmtree, private, ignore_errors=True)  # unlinks cuda/, keeps its target


_private_autotune_cache()

import dualk  # noqa: E402
import dualk.core.alloc  # noqa: E402
from dualk.core import alloc  # noqa: E402
from dualk.core.guards import Guards  # noqa: E402

dualk.core.alloc.set_poison(True)

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")

# Hypothesis profiles (tests/test_fuzz.py): "ci" by default, "gpu" with
# DUALK_HYPOTHESIS_PROFILE=gpu (bench/gpu_check.sh's GPU run). No example database: the runs are
# derandomized in CI, and failures print a reproduction blob.
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is in the "test" extra; test_fuzz.py skips without it
    pass
else:
    _slow = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile(
        "ci", max_examples=200, deadline=None, derandomize=True, database=None,
        print_blob=True, suppress_health_check=_slow,
    )  # fmt: skip
    settings.register_profile(  # DUALK_HYPOTHESIS_EXAMPLES overrides the count
        "gpu", max_examples=int(os.environ.get("DUALK_HYPOTHESIS_EXAMPLES", "100")), deadline=None,
        database=None, print_blob=True, suppress_health_check=_slow,
    )  # fmt: skip
    settings.load_profile(os.environ.get("DUALK_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture(autouse=True)
def _clean_dispatch_state(monkeypatch, tmp_path_factory):
    """Each test starts without backend overrides from the environment or earlier tests, and
    leaves TRITON_INTERPRET as it found it: the CLI's CPU smoke check (run by tests that model a
    machine without a GPU) sets it for good, and on a GPU machine it would send every later
    test's Triton kernels to the interpreter's code paths (bf16 upcasts that do not fit on chip)."""
    was = os.environ.get("TRITON_INTERPRET")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (records the value to restore)
    if was is None:
        monkeypatch.delenv("TRITON_INTERPRET")
    else:
        monkeypatch.setenv("TRITON_INTERPRET", was)
    for key in list(os.environ):
        if key.startswith("DUALK_BACKEND"):
            monkeypatch.delenv(key)
    # No config file: DUALK_CONFIG unset and the default path under an empty directory.
    monkeypatch.delenv("DUALK_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    import dualk.dispatch
    import dualk.dispatch.config

    dualk.dispatch.config.reload()
    dualk.dispatch.set_default_backend(None)
    # fuse's in-model checks run one at a time in the process: an earlier test's model, not yet
    # collected (its forward objects and owners form cycles), must not hold the next one's
    sys.modules["dualk.fuse"]._CHECKS_UNDER_WAY.clear()
    yield
    dualk.dispatch.set_default_backend(None)
    dualk.dispatch.config.invalidate()  # the environment is restored after this fixture ends
    # dualk's launchers read TRITON_INTERPRET once (cached): a test that launched a kernel with
    # it set must not leave the next test's launches on the interpreter's configs.
    _forget_interpreting()


def _forget_interpreting() -> None:
    # dualk's kernels import it as dualk.triton_src.common (the package's own copy of the
    # top-level triton_src module: another module object, another cache); both where loaded.
    for name in ("dualk.triton_src.common", "triton_src.common"):
        module = sys.modules.get(name)
        if module is not None:
            module.interpreting.cache_clear()


@pytest.hookimpl(trylast=True)  # after -k / --deselect have chosen the items
def pytest_collection_modifyitems(session, config, items):
    """nvcc's static check (tests/test_cuda_compile.py) runs last, its compiles started now in
    the background with one worker: they overlap the rest of the suite (xdist workers start
    their own in the module's fixture instead)."""
    compile_items = [i for i in items if i.nodeid.startswith("tests/test_cuda_compile.py")]
    if not compile_items or hasattr(config, "workerinput"):
        return
    items[:] = [i for i in items if i not in compile_items] + compile_items
    module = compile_items[0].module
    files = [
        p for p in module.KERNEL_FILES if any(f"[{p.name}]" in i.nodeid for i in compile_items)
    ]
    module.start_compiles(workers=1, files=files)


class StandInPlan:
    """A stand-in for the C++ MlpPlan (cuda_src/binding_mlp.cpp) on the CPU: the same guards,
    checked by Guards.hold (dualk/core/guards.py, MlpPlan's test in Python), and the same
    declines (not a plain tensor, gradients on); where they pass it answers `planned`, appending
    to `served` whether the argument was `x`."""

    def __init__(self, state, call, x, planned, served):
        self.state, self.call, self.x, self.planned, self.served = state, call, x, planned, served

    def run(self, arg):
        return self._launch(arg, whole_call=True)

    def run_in_forward(self, arg):
        return self._launch(arg, whole_call=False)

    def with_call_guards(self, args):
        extra = Guards()
        for name, items in zip(Guards.__slots__, args):
            getattr(extra, name).extend(items)
        call = Guards().extend(self.call).extend(extra)
        return StandInPlan(self.state, call, self.x, self.planned, self.served)

    def guards_hold(self):
        return self.state.hold() and self.call.hold()

    def _launch(self, arg, whole_call):
        if type(arg) is not torch.Tensor or torch.is_grad_enabled():
            return None
        if (whole_call and not self.call.hold()) or not self.state.hold():
            return None
        self.served.append(arg is self.x)
        return self.planned


class StandInOwner:
    """The Python inference plan a stand-in fast path belongs to (its backend and auto's
    generation as planned); it serves nothing itself."""

    ptrs = None

    def __init__(self, backend):
        self.backend, self.generation = backend, dualk.dispatch.autotune.generation()

    def run(self, *args):
        return None


def stand_in_fast_path(
    module, x: torch.Tensor, planned: torch.Tensor, served: list, tf32=None
) -> bool:
    """Gives a FusedMLP a stand-in for its C++ fast path (dualk/nn.py _FastPath) with the guards
    _FastPath.add would give the real one, for CPU tests: it answers `planned` where the C++
    plan would serve (appending to `served` whether the argument was `x`), None elsewhere.
    False where the module would get no fast path now."""
    owner = StandInOwner(module.backend)
    module.__dict__["_plan"] = owner
    module.__dict__.pop("_fast", None)
    layers = module.layers
    guards = dualk.nn.plan_guards(
        module, owner, tf32, [lin.weight for lin in layers], [lin.bias for lin in layers]
    )
    if guards is None:
        return False
    plan = StandInPlan(*guards, x, planned, served)
    module.__dict__["_fast"] = dualk.nn._FastPath(plan, owner, tf32, 1, alloc.poisoning())
    return True


def graph_targets(gm) -> set:
    """The call_function targets of an fx graph (what a torch.compile backend was handed)."""
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def recording_backend(seen: list):
    """A torch.compile backend that appends each graph's graph_targets to `seen`, then runs the
    graph as traced."""

    def backend(gm, example_inputs):
        seen.append(graph_targets(gm))
        return gm.forward

    return backend
