"""Build and cache faults of the CUDA backend (dualk/backends/cuda.py), on the CPU where possible.

The CUDA toolchain is simulated: `torch.cuda.is_available` says True, `cuda._nvcc` finds a
compiler, and `torch.utils.cpp_extension.load` is a fake. The fake behaves like torch's JIT build
where it matters: it "compiles" only when the library is absent from the build directory (ninja
takes an existing library as up to date) by writing a REAL Python extension module (a tiny C
module built once per test session with the host C compiler, `PyInit_<name>` as torch's would
have), then imports it with the same importlib calls as torch, so a truncated or corrupt library
fails in dlopen exactly as a real one would. DUALK_CACHE_DIR points at the test's tmp_path and
the module's remembered extensions and failures (per family: `_extensions`, `_errors`) are reset
for each test; the elementwise family stands for every family here (tests/test_background_build.py
covers the background builds).

Faults: no GPU, no nvcc, a failing compile, an unwritable cache directory, a truncated or
corrupt library in the cache (rebuilt once; a second failure is an error naming the log), a
stale torch FileBaton `lock`, two processes building one cold cache at once (one builds, the
other waits and loads its result), new sources (a new key, a new directory: nothing stale is
loaded). An explicit backend="cuda" raises BackendUnavailableError naming the log; "auto" skips
the backend with ONE BackendWarning and keeps working.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import types
import warnings
from pathlib import Path

import pytest
import torch
from conftest import HAS_CUDA
from torch.utils import cpp_extension

import dualk
from dualk import dispatch
from dualk.backends import cuda
from dualk.core.errors import BackendUnavailableError, BackendWarning
from dualk.dispatch import autotune
from dualk.registry import OPS
from dualk.testing import judge

REPO = Path(__file__).resolve().parents[1]
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
PY_INCLUDE = sysconfig.get_paths()["include"]
needs_cc = pytest.mark.skipif(
    CC is None or not (Path(PY_INCLUDE) / "Python.h").is_file(),
    reason="needs a C compiler and Python.h to build a stand-in extension module",
)

TINY_C = """
#include <Python.h>
%(extern)s
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "%(name)s", "dualk fault-test stand-in", -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void) { %(call)s return PyModule_Create(&def); }
"""


def compile_tiny_module(name: str, directory: Path, unresolved: bool = False) -> Path:
    """A real CPython extension module `name` (imports as torch's JIT extension would). With
    `unresolved`, it needs a symbol nothing defines: a whole ELF library that dlopen rejects
    ("undefined symbol"), as a library built against another torch would be."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_unresolved" if unresolved else name
    so = directory / f"{stem}.so"
    if not so.exists():
        c = directory / f"{stem}.c"
        extern = "extern void dualk_no_such_symbol(void);" if unresolved else ""
        call = "dualk_no_such_symbol();" if unresolved else ""
        c.write_text(TINY_C % {"name": name, "extern": extern, "call": call})
        subprocess.run(
            [CC, "-shared", "-fPIC", "-O0", f"-I{PY_INCLUDE}", "-o", str(so), str(c)],
            check=True,
            capture_output=True,
        )
    return so


def import_library(name: str, directory: str) -> types.ModuleType:
    """What torch.utils.cpp_extension does after a build (_import_module_from_library)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(directory, f"{name}.so"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeLoad:
    """torch.utils.cpp_extension.load's stand-in: builds (copies the tiny module) only when the
    library is absent, counts builds, then imports for real. `fail` raises instead of building,
    as a failing compile does (torch: RuntimeError with the compiler's output)."""

    def __init__(self, modules_dir: Path, fail: BaseException | None = None):
        self.modules_dir = modules_dir
        self.fail = fail
        self.builds: list[str] = []
        self.calls: list[str] = []

    def __call__(self, name, sources, build_directory, verbose=False, **kwargs):
        self.calls.append(build_directory)
        assert all(Path(s).is_file() for s in sources), sources
        so = Path(build_directory) / f"{name}.so"
        if not so.exists():
            if self.fail is not None:
                raise self.fail
            self.builds.append(build_directory)
            (Path(build_directory) / f"{name}.o").write_bytes(b"object")
            shutil.copyfile(compile_tiny_module(name, self.modules_dir), so)
        return import_library(name, build_directory)


def reset_cuda(monkeypatch) -> None:
    """A process that has loaded, built, started or noticed nothing yet."""
    for name in ("_extensions", "_errors", "_ignored", "_jobs", "_loaded_from"):
        monkeypatch.setattr(cuda, name, {})
    monkeypatch.setattr(cuda, "_noticed", set())
    monkeypatch.setattr(cuda, "device_archs", lambda: ["sm_90a"])
    monkeypatch.delenv("DUALK_PREBUILT_DIR", raising=False)
    monkeypatch.delenv("DUALK_CUDA_ARCH", raising=False)


@pytest.fixture
def cold(monkeypatch, tmp_path):
    """A process that has not built the extension yet, a GPU and nvcc (simulated), an empty
    cache under tmp_path, and the temporary directory (where logs go when the cache cannot be
    written) under tmp_path too."""
    reset_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setenv("DUALK_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def fake_load(monkeypatch, tmp_path, fail=None) -> FakeLoad:
    fake = FakeLoad(tmp_path / "modules", fail)
    monkeypatch.setattr(cpp_extension, "load", fake)
    return fake


FAMILY = "elementwise"


def key_and_dir() -> tuple[str, Path]:
    """(the elementwise family's module name, its build directory in the cache)."""
    return cuda.module_name(
        FAMILY
    ), cuda.cache_root() / "cuda" / f"{FAMILY}-{cuda.build_key(FAMILY)}"


def _faults(caught: list) -> list:
    """The recorded warnings but the BuildNotices (a build saying that it builds)."""
    return [w for w in caught if not issubclass(w.category, dualk.BuildNotice)]


def library(directory: Path, name: str) -> Path:
    return directory / f"{name}.so"


COMPILE_ERROR = RuntimeError(
    "Error building extension 'dualk_cuda_x': [1/9] nvcc ... add.cu\n"
    'add.cu(12): error: identifier "oops" is undefined\nninja: build stopped'
)


# ---------------------------------------------------------------------------- toolchain
def test_no_gpu_is_unavailable_without_a_warning(monkeypatch, tmp_path):
    reset_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU machine is not a fault: no warning
        reason = cuda.unavailable_reason(torch.device("cuda"), "add")
    assert reason == "no CUDA device is visible to PyTorch"


def test_no_nvcc_explicit_error_and_one_warning(monkeypatch, tmp_path):
    """The real _nvcc finds nothing: no CUDA_HOME, nothing on PATH."""
    reset_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("DUALK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))

    def must_not_build(*a, **k):
        raise AssertionError("built without nvcc")

    monkeypatch.setattr(cpp_extension, "load", must_not_build)
    assert cuda._nvcc() is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = cuda.unavailable_reason(torch.device("cuda"), "add")
        second = cuda.unavailable_reason(torch.device("cuda"), "add")
        with pytest.raises(BackendUnavailableError, match="nvcc was not found"):
            cuda.extension()
    assert first == second and "nvcc was not found" in first and "CUDA_HOME" in first
    assert [w.category for w in _faults(caught)] == [BackendWarning]
    assert "nvcc was not found" in str(_faults(caught)[0].message)


# ---------------------------------------------------------------------------- failing build
def test_failing_build_names_the_log_and_warns_once(cold, monkeypatch):
    fake = fake_load(monkeypatch, cold, fail=COMPILE_ERROR)
    key, directory = key_and_dir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BackendUnavailableError) as info:
            cuda.extension()
        # Remembered: later calls neither rebuild nor warn again.
        with pytest.raises(BackendUnavailableError):
            cuda.extension()
        assert cuda.unavailable_reason(torch.device("cuda"), "add") == str(info.value)
    log = directory / "build.log"
    message = str(info.value)
    assert f"log: {log}" in message and "failed to build" in message
    assert "RuntimeError: Error building extension" in message
    assert 'identifier "oops" is undefined' in log.read_text()  # the compiler's output
    assert len(fake.calls) == 1, "a failed build is not retried in the same process"
    assert [w.category for w in _faults(caught)] == [BackendWarning]
    assert str(log) in str(_faults(caught)[0].message) and "backend='auto'" in str(
        _faults(caught)[0].message
    )


def test_explicit_cuda_request_raises_with_the_log_path(cold, monkeypatch):
    """dispatch.choose for backend="cuda" on a CUDA input (a stand-in object: only its device is
    read) raises, naming the source of the request and the log."""
    fake_load(monkeypatch, cold, fail=COMPILE_ERROR)
    _, directory = key_and_dir()
    like_cuda = types.SimpleNamespace(device=torch.device("cuda", 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendWarning)
        with pytest.raises(BackendUnavailableError) as info:
            dispatch.choose(OPS["add"], "cuda", (like_cuda, like_cuda, 1.0))
    message = str(info.value)
    assert "backend 'cuda' (requested by the backend= argument) cannot run" in message
    assert str(directory / "build.log") in message


def _stand_in_gpu(monkeypatch):
    """auto's candidates as on a GPU: cuda asks the real (failing) build, triton and torch run
    (triton stands in as the torch reference); a fake timer makes triton the fastest."""
    monkeypatch.setattr(
        autotune,
        "candidate_reason",
        lambda b, d: (
            cuda.unavailable_reason(torch.device("cuda", 0), "add") if b == "cuda" else None
        ),
    )
    for spec in OPS.values():
        monkeypatch.setitem(spec._resolved, "triton", spec.reference)
    autotune.clear_memory()
    timed: list[str] = []

    def timer(run, backend, budget_ms):
        timed.append(backend)
        run()
        return {"triton": 1.0, "torch": 2.0}[backend]

    autotune.set_timer(timer)
    return timed


def test_auto_falls_back_with_one_warning_and_keeps_working(cold, monkeypatch):
    fake_load(monkeypatch, cold, fail=COMPILE_ERROR)
    timed = _stand_in_gpu(monkeypatch)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for op, case in [("add", "n=1023"), ("relu_scale", "noncontig"),
                             ("matmul", "odd"), ("linear_gelu", "odd"),
                             ("fused_mlp", "seed_b1")]:  # fmt: skip
                spec = OPS[op]
                sample = spec.case(case).make(torch.float32, torch.device("cpu"),
                                              torch.Generator().manual_seed(0))  # fmt: skip
                out = getattr(dualk, op)(*sample.args, **sample.kwargs)
                verdict = judge(spec, sample, out)
                assert verdict.ok, f"{op}: {verdict.message}"
            expl = dualk.explain("add", torch.randn(5), torch.randn(5))
    finally:
        autotune.set_timer(None)
        autotune.clear_memory()
    assert [w.category for w in _faults(caught)] == [BackendWarning], [
        str(w.message) for w in caught
    ]
    assert "cuda" not in timed and "triton" in timed
    assert "build.log" in (expl.availability.get("cuda") or "")


@pytest.mark.skipif(not HAS_CUDA, reason="runs the other backends on CUDA tensors")
def test_auto_falls_back_on_the_gpu(cold, monkeypatch):
    """On a GPU: failing builds (in the call and in the background builder processes), then every
    op under "auto" on CUDA tensors gives the right answer, with one BackendWarning per family
    whose build failed; backend="cuda" raises with the builder's reason."""
    fake_load(monkeypatch, cold, fail=COMPILE_ERROR)
    started: list[str] = []

    def failing_builder(family, archs, root):  # the real one would build for real on a GPU host
        started.append(family)
        return [
            sys.executable,
            "-c",
            "print('dualk-build: failed: nvcc said boom'); raise SystemExit(3)",
        ]

    monkeypatch.setattr(cuda, "BUILDER", failing_builder)
    autotune.clear_memory()
    device = torch.device("cuda")
    cases = [("add", "n=1023"), ("relu_scale", "noncontig"), ("matmul", "odd"),
             ("linear_gelu", "odd"), ("fused_mlp", "seed_b32")]  # fmt: skip
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for round_ in range(2):  # the second round: after the builders have failed
                for op, case in cases:
                    spec = OPS[op]
                    sample = spec.case(case).make(
                        torch.float16, device, torch.Generator().manual_seed(0)
                    )
                    out = getattr(dualk, op)(*sample.args, **sample.kwargs, backend="auto")
                    torch.cuda.synchronize()
                    verdict = judge(spec, sample, out)
                    assert verdict.ok, f"{op} (round {round_}): {verdict.message}"
                for job in list(cuda._jobs.values()):
                    job.proc.wait(timeout=60)
                cuda.poll_builds()
            x = torch.randn(8, device=device)
            with pytest.raises(BackendUnavailableError, match="exited with status 3"):
                dualk.add(x, x, backend="cuda")
    finally:
        autotune.clear_memory()
    failures = [str(w.message) for w in caught if issubclass(w.category, BackendWarning)]
    assert started and len(failures) == len(set(started)), (started, failures)
    assert all("nvcc said boom" in f for f in failures), failures


# ---------------------------------------------------------------------------- cache directory
def test_unwritable_cache_directory(cold, monkeypatch):
    """A cache root under a regular file can never be created (chmod does not stop root)."""
    blocker = cold / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DUALK_CACHE_DIR", str(blocker / "cache"))
    fake = fake_load(monkeypatch, cold)
    key, directory = key_and_dir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reason = cuda.unavailable_reason(torch.device("cuda"), "add")
        with pytest.raises(BackendUnavailableError) as info:
            cuda.extension()
    assert reason == str(info.value)
    assert f"the CUDA build cache {directory} cannot be created or written" in reason
    assert "set DUALK_CACHE_DIR to a writable directory" in reason
    # the log goes to the temporary directory
    log = cold / "tmp" / f"dualk-cuda-build-{FAMILY}-{cuda.build_key(FAMILY)}.log"
    assert f"log: {log}" in reason and str(directory) in log.read_text()
    assert fake.calls == []
    assert [w.category for w in _faults(caught)] == [BackendWarning]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod")
def test_read_only_cache_directory(cold, monkeypatch):
    root = cold / "ro"
    root.mkdir()
    root.chmod(0o500)
    monkeypatch.setenv("DUALK_CACHE_DIR", str(root))
    fake_load(monkeypatch, cold)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackendWarning)
            with pytest.raises(BackendUnavailableError, match="cannot be created or written"):
                cuda.extension()
    finally:
        root.chmod(0o700)


# ---------------------------------------------------------------------------- corrupt library
@needs_cc
def test_cold_build_then_warm_load(cold, monkeypatch):
    fake = fake_load(monkeypatch, cold)
    key, directory = key_and_dir()
    module = cuda.extension()
    assert module.__name__ == key and fake.builds == [str(directory)]
    assert cuda.extension() is module  # remembered
    monkeypatch.setattr(cuda, "_extensions", {})  # a new process: loads, builds nothing
    assert cuda.extension().__name__ == module.__name__ and len(fake.builds) == 1
    assert (directory / ".lock").is_file() and not (directory / "build.log").exists()
    assert cuda.read_manifest(directory)["key"] == cuda.source_key(FAMILY)


@needs_cc
@pytest.mark.parametrize(
    "damage", ["truncated", "truncated_tail", "garbage", "empty", "unresolved"]
)
def test_corrupt_library_is_rebuilt_once(cold, monkeypatch, damage):
    """A library an earlier process built, damaged since (written by a killed build, a bad disk):
    this process cannot dlopen it, removes the directory's artefacts and builds once more. (The
    damaged file is written before this process loads anything from that path: dlopen and
    CPython remember a path they loaded, so damaging a loaded library in place is not the same
    experiment.)"""
    fake = fake_load(monkeypatch, cold)
    key, directory = key_and_dir()
    data = compile_tiny_module(key, cold / "modules").read_bytes()
    directory.mkdir(parents=True)
    so = library(directory, key)
    unresolved = compile_tiny_module(key, cold / "modules", True).read_bytes()
    so.write_bytes({
        "truncated": data[: len(data) // 3],  # dlopen of this one would die of SIGBUS
        "truncated_tail": data[:-1],
        "garbage": b"\x7fELF" + b"\0" * 64,
        "empty": b"",
        "unresolved": unresolved,  # a whole ELF library that dlopen rejects
    }[damage])  # fmt: skip
    (directory / "stale.o").write_bytes(b"old object")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a repaired cache is not worth a warning
        warnings.simplefilter("ignore", dualk.BuildNotice)  # but the build says it builds
        module = cuda.extension()
    assert module.__name__ == key
    assert len(fake.builds) == 1 and so.read_bytes() == data
    assert not (directory / "stale.o").exists()  # the artefacts went before the rebuild
    assert (
        "removed the build directory's artefacts and rebuilt"
        in (directory / "build.log").read_text()
    )


@needs_cc
def test_library_that_stays_corrupt_is_an_error_naming_the_log(cold, monkeypatch):
    """A library that does not load, and a rebuild that does not help (every build writes a
    library that does not load): one rebuild, then an error naming the log."""
    fake = fake_load(monkeypatch, cold)
    key, directory = key_and_dir()
    unresolved = compile_tiny_module(key, cold / "modules", unresolved=True)
    directory.mkdir(parents=True)
    shutil.copyfile(unresolved, library(directory, key))

    def build_unresolved(name, sources, build_directory, verbose=False, **kwargs):
        so = Path(build_directory) / f"{name}.so"
        if not so.exists():
            fake.builds.append(build_directory)
            shutil.copyfile(unresolved, so)
        return import_library(name, build_directory)

    monkeypatch.setattr(cpp_extension, "load", build_unresolved)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BackendUnavailableError) as info:
            cuda.extension()
    log = directory / "build.log"
    message = str(info.value)
    assert "could not be loaded, nor rebuilt" in message and f"log: {log}" in message
    assert "ImportError" in message and "undefined symbol" in message
    assert len(fake.builds) == 1, "rebuilt exactly once"
    text = log.read_text()
    assert "loading the cached library failed" in text and text.count("ImportError") == 2
    assert [w.category for w in _faults(caught)] == [BackendWarning]


@needs_cc
def test_truncated_library_rebuilt_then_failing_build_names_the_log(cold, monkeypatch):
    """A truncated library is removed before anything loads it; the rebuild's compile error is
    the error, and the log keeps both."""
    fake_load(monkeypatch, cold, fail=COMPILE_ERROR)
    key, directory = key_and_dir()
    data = compile_tiny_module(key, cold / "modules").read_bytes()
    directory.mkdir(parents=True)
    library(directory, key).write_bytes(data[:200])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendWarning)
        with pytest.raises(BackendUnavailableError, match="failed to build") as info:
            cuda.extension()
    text = (directory / "build.log").read_text()
    assert "is truncated" in text and 'identifier "oops"' in text
    assert f"log: {directory / 'build.log'}" in str(info.value)


@needs_cc
def test_stale_torch_lock_file_is_removed(cold, monkeypatch):
    """torch's FileBaton waits forever on a `lock` file left by a killed build; under our flock
    no dualk process is building, so the file is stale and goes."""
    fake = fake_load(monkeypatch, cold)
    _, directory = key_and_dir()
    directory.mkdir(parents=True)
    (directory / "lock").write_text("")

    def baton_then_build(name, sources, build_directory, **kwargs):
        if (Path(build_directory) / "lock").exists():
            raise AssertionError("torch's FileBaton would wait on this lock forever")
        return fake(name, sources, build_directory, **kwargs)

    monkeypatch.setattr(cpp_extension, "load", baton_then_build)
    assert cuda.extension() is not None and len(fake.builds) == 1


# ---------------------------------------------------------------------------- concurrency
CONCURRENT = textwrap.dedent(
    """
    import os, shutil, sys, time, warnings
    from pathlib import Path
    import torch
    torch.cuda.is_available = lambda: True
    from torch.utils import cpp_extension
    sys.path.insert(0, os.environ["TESTS_DIR"])
    from test_faults import import_library
    from dualk.backends import cuda
    cuda._nvcc = lambda: "/usr/local/cuda/bin/nvcc"
    cuda.device_archs = lambda: ["sm_90a"]
    record = Path(os.environ["RECORD"])

    def load(name, sources, build_directory, verbose=False, **kwargs):
        so = Path(build_directory) / f"{name}.so"
        if not so.exists():  # ninja: build only what is missing, writing the library in place
            with record.open("a") as f:
                f.write(f"build {os.getpid()}\\n")
            data = Path(os.environ["TINY_SO"]).read_bytes()
            with so.open("wb") as f:
                f.write(data[:100]); f.flush()
                time.sleep(1.5)  # a slow link: the library is incomplete for a while
                f.write(data[100:])
        return import_library(name, build_directory)

    cpp_extension.load = load
    # Both processes reach the build together.
    Path(os.environ["READY"] + str(os.getpid())).touch()
    deadline = time.time() + 60
    while len(list(Path(os.environ["READY"]).parent.glob("ready*"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    module = cuda.extension()
    print("loaded", module.__name__)
    """
)


@needs_cc
def test_two_processes_build_one_cold_cache(cold, monkeypatch):
    """Two processes start on the same cold cache at once: one builds, the other waits on the
    flock and loads the finished library (never a half-written one, never a second build)."""
    key, directory = key_and_dir()
    tiny = compile_tiny_module(key, cold / "modules")
    sync = cold / "sync"
    sync.mkdir()
    env = {
        **os.environ,
        "TESTS_DIR": str(Path(__file__).parent),
        "RECORD": str(cold / "record.txt"),
        "TINY_SO": str(tiny),
        "READY": str(sync / "ready"),
        "DUALK_CACHE_DIR": str(cold / "cache"),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert f"loaded {key}" in out
    assert len((cold / "record.txt").read_text().splitlines()) == 1, "built twice"
    assert library(directory, key).read_bytes() == tiny.read_bytes()


# ---------------------------------------------------------------------------- stale sources
def _copy_sources(tmp_path: Path) -> Path:
    src = tmp_path / "cuda_src"
    shutil.copytree(cuda.source_dir(), src)
    return src


@pytest.mark.parametrize(
    "name, families",
    [("add.cu", {"elementwise"}), ("gemm_sm90.cuh", {"gemm"}), ("fused_mlp_wide.cuh", {"mlp"}),
     ("binding_gemm.cpp", {"gemm"}), ("launchers.h", {"elementwise", "gemm", "mlp"}),
     ("binding.h", {"elementwise", "gemm", "mlp"})],
)  # fmt: skip
def test_changing_one_source_byte_changes_only_its_families_keys(
    monkeypatch, tmp_path, name, families
):
    """A family's key hashes the files it compiles (its sources and the headers they include),
    so an edit rebuilds only the families that compile the edited file."""
    src = _copy_sources(tmp_path)
    monkeypatch.setattr(cuda, "source_dir", lambda: src)
    monkeypatch.setenv("DUALK_CACHE_DIR", str(tmp_path / "cache"))
    arch = ["sm_90a"]
    before = {f: cuda.build_key(f, arch) for f in cuda.FAMILIES}
    assert {f: cuda.build_key(f, arch) for f in cuda.FAMILIES} == before  # deterministic
    path = src / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    changed = {f for f in cuda.FAMILIES if cuda.build_key(f, arch) != before[f]}
    assert changed == families
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert {f: cuda.build_key(f, arch) for f in cuda.FAMILIES} == before
    # The architectures are part of the directory's name, not of the source key.
    assert cuda.build_key("gemm", ["sm_80"]) != before["gemm"]
    assert cuda.build_key("gemm", ["sm_80"]).split("-")[0] == before["gemm"].split("-")[0]
    # No absolute path enters a key: the same sources elsewhere give the same keys.
    other = _copy_sources(tmp_path / "elsewhere")
    monkeypatch.setattr(cuda, "source_dir", lambda: other)
    assert {f: cuda.build_key(f, arch) for f in cuda.FAMILIES} == before


@needs_cc
def test_new_sources_never_load_the_old_library(cold, monkeypatch):
    src = _copy_sources(cold)
    monkeypatch.setattr(cuda, "source_dir", lambda: src)
    fake = fake_load(monkeypatch, cold)
    old_key, old_dir = key_and_dir()
    assert cuda.extension().__name__ == old_key
    with (src / "relu_scale.cu").open("a") as f:
        f.write("\n// edited\n")
    monkeypatch.setattr(cuda, "_extensions", {})  # a new process after the edit
    new_key, new_dir = key_and_dir()
    assert new_key != old_key and new_dir != old_dir
    assert cuda.extension().__name__ == new_key
    assert fake.builds == [str(old_dir), str(new_dir)]
    assert fake.calls[-1] == str(new_dir)
