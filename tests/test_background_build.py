"""First contact on a GPU (issue 33), on the CPU: "auto" never waits for a CUDA build.

The GPU is modelled through the CUDA backend's hooks (`torch.cuda.is_available`, `cuda._nvcc`,
`cuda.device_archs`), auto's candidates through `autotune.candidate_reason` and stand-in
implementations (the torch reference, recording which backend ran), and the CPU device counts as
one where builds and Triton's first-call deferral apply (`autotune.BACKGROUND_DEVICE_TYPES`).
The builder process is a stand-in too (`cuda.BUILDER`): a real subprocess that waits for a gate
file, then writes a real extension module (a tiny C module named as the family's) and its
manifest where the real builder would, or fails, or hangs until killed. Covered: pending, ready,
failed with its log, a builder killed mid-build, a lock left by a dead builder, two builders at
once (one builds), provisional decisions never stored and re-decided once the build is ready,
nothing started under capture, compile or jit tracing or with DUALK_AUTOTUNE=0, explain's
states, `dualk build` (progress, --arch, --out), prebuilt directories found, mismatched ones
ignored with a reason, a cache copied to another machine found.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_faults import FakeLoad, compile_tiny_module, needs_cc, reset_cuda
from torch.utils import cpp_extension

import dualk
from dualk.backends import cuda
from dualk.cli import main
from dualk.core.errors import BackendUnavailableError, BackendWarning, BuildNotice
from dualk.dispatch import autotune, triton_tune
from dualk.registry import OPS

REPO = Path(__file__).resolve().parents[1]
FAMILY = "elementwise"

STUB = textwrap.dedent(
    """
    import shutil, sys, time
    from pathlib import Path
    from dualk.backends import cuda
    family, mode, tiny, gate, archs, root = sys.argv[1:7]
    archs = archs.split(",")
    print("dualk-build: stub builder for", family, flush=True)
    if mode == "fail":
        print("dualk-build: failed: nvcc said boom", flush=True)
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
    while gate and not Path(gate).exists():
        time.sleep(0.02)
    d = cuda.build_directory(family, archs, Path(root) if root else None)
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny, d / (cuda.module_name(family) + ".so"))
    cuda._write_manifest(d, family, archs, 0.5)
    print("dualk-build: done in 0.5 s", flush=True)
    """
)


class Builders:
    """cuda.BUILDER's stand-in: the stub above per family, in `mode`; `release()` opens the
    gate; `started` lists the families whose builder was started."""

    def __init__(self, tmp_path: Path, mode: str = "ok", gated: bool = True):
        self.tmp_path = tmp_path
        self.mode = mode
        self.gate = tmp_path / "gate" if gated else None
        self.started: list[str] = []

    def tiny(self, family: str) -> Path:
        return compile_tiny_module(cuda.module_name(family), self.tmp_path / "modules")

    def __call__(self, family, archs, root):
        self.started.append(family)
        mode = self.mode if isinstance(self.mode, str) else self.mode[family]
        tiny = self.tiny(family) if mode == "ok" else ""
        gate = "" if self.gate is None else str(self.gate)
        return [sys.executable, "-c", STUB, family, mode, str(tiny), gate, ",".join(archs),
                "" if root is None else str(root)]  # fmt: skip

    def release(self) -> None:
        if self.gate is not None:
            self.gate.touch()


def wait_for_builder(family: str, timeout: float = 60.0) -> None:
    job = cuda._jobs[family]
    job.proc.wait(timeout=timeout)


TUNER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    jobfile, mode, gate = sys.argv[1:4]
    for d in json.loads(Path(jobfile).read_text()):
        print("dualk-triton-tune: start", d["tag"], d["op"], d["key"], flush=True)
        if mode == "hang":
            time.sleep(600)
        while gate and not Path(gate).exists():
            time.sleep(0.02)
        if mode == "crash":
            print("Segmentation fault in the compiler", flush=True)
            sys.exit(139)
        if mode == "fail":
            print("dualk-triton-tune: failed", d["tag"], "CompilationError: ptxas said boom",
                  flush=True)
            continue
        print("dualk-triton-tune: ready", d["tag"], "0.1", flush=True)
    """
)


class Tuners:
    """triton_tune.WORKER's stand-in (Triton's background tuner): the stub above, in `mode`
    ("ok", "fail", "crash", "hang"); `release()` opens the gate; `jobs` lists each started job's
    class descriptions."""

    def __init__(self, tmp_path: Path, mode: str = "ok", gated: bool = False):
        self.mode = mode
        self.gate = tmp_path / "tuner-gate" if gated else None
        self.jobs: list[list[dict]] = []

    def __call__(self, jobfile: Path) -> list[str]:
        self.jobs.append(json.loads(Path(jobfile).read_text()))
        gate = "" if self.gate is None else str(self.gate)
        return [sys.executable, "-c", TUNER, str(jobfile), self.mode, gate]

    def release(self) -> None:
        if self.gate is not None:
            self.gate.touch()


def wait_for_tuner(timeout: float = 60.0) -> None:
    for proc in triton_tune.running():
        proc.wait(timeout=timeout)


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A modelled GPU with nvcc, an empty cache, a process that built nothing; auto's candidates
    are cuda, triton and torch, each running the torch reference and recording its name; a fake
    timer makes cuda the fastest, then triton."""
    reset_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setenv("DUALK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DUALK_AUTOTUNE", raising=False)
    monkeypatch.setattr(autotune, "BACKGROUND_DEVICE_TYPES", ("cpu", "cuda"))
    monkeypatch.setattr(autotune, "candidate_reason", lambda backend, device: None)

    def must_not_compile(*a, **k):
        raise AssertionError("auto compiled in the user's call")

    monkeypatch.setattr(cpp_extension, "load", must_not_compile)
    ran: list[str] = []
    for spec in OPS.values():
        for name in ("cuda", "triton", "torch"):

            def impl(*args, _name=name, _ref=spec.reference):
                ran.append(_name)
                return _ref(*args)

            monkeypatch.setitem(spec._resolved, name, impl)
    autotune.clear_memory()
    autotune.set_timer(lambda run, backend, budget_ms: (run(), {"cuda": 1.0, "triton": 2.0,
                                                                "torch": 5.0}[backend])[1])  # fmt: skip
    monkeypatch.setattr(triton_tune, "WORKER", Tuners(tmp_path))
    yield ran
    for job in list(cuda._jobs.values()):
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()
    for proc in triton_tune.running():
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    autotune.set_timer(None)
    autotune.clear_memory()


def stored_winners() -> dict:
    """The autotune cache file's "backend" section (empty when nothing was stored)."""
    files = list(autotune.cache_dir().glob("*.json"))
    if not files:
        return {}
    return json.loads(files[0].read_text())["entries"].get(autotune.BACKEND_SECTION, {})


def notices(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, BuildNotice)]


# ---------------------------------------------------------------------------- pending -> ready
@needs_cc
def test_auto_serves_at_once_while_building_then_picks_up_cuda(gpu, monkeypatch, tmp_path):
    ran = gpu
    builders = Builders(tmp_path)
    monkeypatch.setattr(cuda, "BUILDER", builders)
    x = torch.randn(1000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        out = dualk.add(x, x)
        first_s = time.perf_counter() - t0
    torch.testing.assert_close(out, x + x, rtol=0, atol=0)
    assert first_s < 5.0, f"the first call waited {first_s:.1f} s"
    # Served by torch: CUDA is building, Triton is being tuned in the background.
    assert ran == ["torch"] and builders.started == [FAMILY]
    directory = cuda.build_directory(FAMILY)
    (line,) = notices(caught)
    assert "in the background" in line and str(directory) in line and "progress.log" in line
    assert [w for w in caught if issubclass(w.category, BackendWarning)] == []
    expl = dualk.explain("add", x, x)
    assert expl.backend == "torch"
    assert "being built in the background since" in expl.availability["cuda"]
    assert "progress.log" in expl.availability["cuda"]
    assert any("provisional" in n for n in expl.notes)
    assert any(n.startswith("cuda backend, elementwise family: being built") for n in expl.notes)
    assert stored_winners() == {}, "a decision made while cuda was missing was stored"
    assert autotune.decided(OPS["add"], (x, x, 1.0)) is None

    # Once the tuner is done: the next call loads Triton's kernel (and runs torch), the one
    # after decides again with Triton (timed now); CUDA is still building.
    wait_for_tuner()
    ran.clear()
    torch.testing.assert_close(dualk.add(x, x), x + x, rtol=0, atol=0)
    assert ran == ["triton", "torch"]
    ran.clear()
    torch.testing.assert_close(dualk.add(x, x), x + x, rtol=0, atol=0)
    assert "triton" in ran and "cuda" not in ran
    assert stored_winners() == {}
    # Calls meanwhile stay on the provisional decision (no re-timing while nothing changed).
    ran.clear()
    dualk.add(x, x)
    assert ran == ["triton"]

    builders.release()
    wait_for_builder(FAMILY)
    ran.clear()
    torch.testing.assert_close(dualk.add(x, x), x + x, rtol=0, atol=0)
    assert "cuda" in ran and ran[-1] == "cuda", ran  # timed, then won
    expl = dualk.explain("add", x, x)
    assert expl.backend == "cuda" and "not a candidate yet" not in expl.availability["cuda"]
    assert any(f"ready (loaded from {directory})" in n for n in expl.notes)
    assert not any("provisional" in n for n in expl.notes)
    (entry,) = stored_winners().values()
    assert entry["winner"] == "cuda" and set(entry["times_us"]) == {"cuda", "triton", "torch"}
    assert cuda.extension(FAMILY).__name__ == cuda.module_name(FAMILY)


@needs_cc
def test_builder_failure_names_the_log_and_auto_keeps_working(gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(cuda, "BUILDER", Builders(tmp_path, mode="fail"))
    x = torch.randn(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dualk.add(x, x)
        wait_for_builder(FAMILY)
        wait_for_tuner()
        for _ in range(3):
            torch.testing.assert_close(dualk.add(x, x), x + x, rtol=0, atol=0)
    log = cuda.build_directory(FAMILY) / "progress.log"
    failures = [str(w.message) for w in caught if issubclass(w.category, BackendWarning)]
    assert len(failures) == 1 and "exited with status 3" in failures[0]
    assert "nvcc said boom" in failures[0] and f"log: {log}" in failures[0]
    expl = dualk.explain("add", x, x)
    assert "exited with status 3" in expl.availability["cuda"]
    assert any("elementwise family: failed" in n for n in expl.notes)
    # Final now (cuda will not come): stored, among triton and torch.
    (entry,) = stored_winners().values()
    assert entry["winner"] == "triton"
    # An explicit request on a CUDA tensor gets the same reason (no second build).
    assert "exited with status 3" in cuda.unavailable_reason(torch.device("cuda", 0), "add")
    with pytest.raises(BackendUnavailableError, match="exited with status 3"):
        cuda.extension(FAMILY)


@needs_cc
def test_builder_killed_mid_build_is_a_failure(gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(cuda, "BUILDER", Builders(tmp_path, mode="hang"))
    x = torch.randn(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BuildNotice)
        dualk.add(x, x)
        assert cuda.auto_state(FAMILY)[0] == "building"
        cuda._jobs[FAMILY].proc.send_signal(signal.SIGKILL)
        wait_for_builder(FAMILY)
        with pytest.warns(BackendWarning, match="killed by signal 9"):
            state, why = cuda.auto_state(FAMILY)
    assert state == "failed" and "progress.log" in why
    assert not cuda._jobs


# ---------------------------------------------------------------------------- locks
HOLD_LOCK = textwrap.dedent(
    """
    import fcntl, sys, time
    f = open(sys.argv[1], "a")
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(600)
    """
)


@needs_cc
def test_lock_of_a_dead_builder_is_recovered(gpu, monkeypatch, tmp_path):
    """A builder killed while holding the build directory's flock (and leaving torch's FileBaton
    `lock`): the next build neither waits nor trips on the stale file."""
    directory = cuda.build_directory(FAMILY)
    directory.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(directory / cuda.LOCK_NAME)], stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "locked"
    (directory / "lock").write_text("")  # torch's baton, left by the killed build
    with open(directory / cuda.LOCK_NAME) as f, pytest.raises(BlockingIOError):
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # really held
    holder.kill()
    holder.wait()
    fake = FakeLoad(tmp_path / "modules")
    monkeypatch.setattr(cpp_extension, "load", fake)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BuildNotice)
        module = cuda.extension(FAMILY)
    assert time.perf_counter() - t0 < 30
    assert module.__name__ == cuda.module_name(FAMILY) and fake.builds == [str(directory)]
    assert not (directory / "lock").exists()


TWO_BUILDERS = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch
    from torch.utils import cpp_extension
    sys.path.insert(0, os.environ["TESTS_DIR"])
    from test_faults import import_library
    from dualk.backends import cuda, cuda_build
    cuda._nvcc = lambda: "/usr/local/cuda/bin/nvcc"
    record = Path(os.environ["RECORD"])

    def load(name, sources, build_directory, verbose=False, **kwargs):
        so = Path(build_directory) / f"{name}.so"
        with record.open("a") as f:
            f.write(f"build {os.getpid()}\\n")
        time.sleep(1.0)  # a slow compile: the other builder waits on the flock meanwhile
        so.write_bytes(Path(os.environ["TINY_SO"]).read_bytes())
        return import_library(name, build_directory)

    cpp_extension.load = load
    Path(os.environ["READY"] + str(os.getpid())).touch()
    deadline = time.time() + 60
    while len(list(Path(os.environ["READY"]).parent.glob("ready*"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    sys.exit(cuda_build.main(["elementwise", "--arch", "sm_90a", "--quiet"]))
    """
)


@needs_cc
def test_two_builder_processes_build_once(gpu, tmp_path):
    """Two builder processes (two dualk processes' background builds) on one cold cache: one
    compiles, the other waits on the flock, finds the manifest and builds nothing."""
    tiny = compile_tiny_module(cuda.module_name(FAMILY), tmp_path / "modules")
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {
        **cuda.builder_env(),
        "TESTS_DIR": str(Path(__file__).parent),
        "RECORD": str(tmp_path / "record.txt"),
        "TINY_SO": str(tiny),
        "READY": str(sync / "ready"),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_BUILDERS],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
        assert "dualk-build: done in" in out
    assert len((tmp_path / "record.txt").read_text().splitlines()) == 1, "built twice"
    directory = cuda.build_directory(FAMILY, ["sm_90a"])
    assert cuda.manifest_problem(directory, FAMILY, ["sm_90a"]) is None


# ---------------------------------------------------------------------------- nothing starts
@pytest.mark.parametrize("how", ["DUALK_AUTOTUNE=0", "compile", "capture", "jit"])
def test_nothing_starts_in_the_background_when_timing_is_blocked(gpu, monkeypatch, tmp_path, how):
    ran = gpu

    def no_builder(*a):
        raise AssertionError("a build was started")

    monkeypatch.setattr(cuda, "BUILDER", no_builder)
    autotune.set_timer(lambda *a: pytest.fail("timed"))
    if how == "DUALK_AUTOTUNE=0":
        monkeypatch.setenv("DUALK_AUTOTUNE", "0")
    elif how == "compile":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    elif how == "capture":
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    else:
        monkeypatch.setattr(torch.jit, "is_tracing", lambda: True)
    x = torch.randn(64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BuildNotice)
        for op, args in [("add", (x, x, 1.0)), ("matmul", (x.reshape(8, 8), x.reshape(8, 8)))]:
            backend = autotune.choose(OPS[op], args)
            assert backend in ("torch", "triton")
            assert OPS[op].implementation(backend)(*args) is not None
    assert cuda._jobs == {} and ran
    assert triton_tune.running() == [] and triton_tune.WORKER.jobs == []
    assert triton_tune.state_of(autotune.make_key(OPS["add"], (x, x, 1.0))) is None
    assert "not built yet" in cuda.describe_state(FAMILY)
    expl = dualk.explain("add", x, x)
    assert "not a candidate yet" in expl.availability["cuda"]


def test_explain_starts_nothing(gpu, monkeypatch):
    monkeypatch.setattr(cuda, "BUILDER", lambda *a: pytest.fail("explain started a build"))
    x = torch.randn(64)
    expl = dualk.explain("add", x, x)
    assert "not built yet" in expl.availability["cuda"] and cuda._jobs == {}


# ---------------------------------------------------------------------------- explicit cuda
@needs_cc
def test_explicit_cuda_builds_in_the_call_and_says_so(gpu, monkeypatch, tmp_path):
    fake = FakeLoad(tmp_path / "modules")
    monkeypatch.setattr(cpp_extension, "load", fake)
    like_cuda = type("T", (), {"device": torch.device("cuda", 0)})()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dualk.dispatch.choose(OPS["matmul"], "cuda", (like_cuda, like_cuda)) == "cuda"
    (line,) = notices(caught)
    directory = cuda.build_directory("gemm")
    assert "building the CUDA backend's gemm family (matmul, linear_gelu, linear_glu)" in line
    assert str(directory) in line and "usually takes ~100 s" in line and "DUALK_VERBOSE=1" in line
    assert fake.builds == [str(directory)]  # the gemm family only
    assert cuda.read_manifest(directory)["family"] == "gemm"
    # The next build of the family says how long this one took (measured, not the estimate).
    assert cuda.usual_seconds("gemm")[1] is True


# ---------------------------------------------------------------------------- prebuilt
def write_build(root: Path, tmp_path: Path, family: str, archs: list[str]) -> Path:
    """A finished build of `family` under root/cuda, as `dualk build --out root` leaves it."""
    directory = cuda.build_directory(family, archs, root)
    directory.mkdir(parents=True)
    tiny = compile_tiny_module(cuda.module_name(family), tmp_path / "modules")
    shutil.copyfile(tiny, directory / f"{cuda.module_name(family)}.so")
    cuda._write_manifest(directory, family, archs, 12.0)
    return directory


@needs_cc
def test_prebuilt_directory_is_loaded_without_compiling(gpu, monkeypatch, tmp_path):
    shipped = write_build(tmp_path / "shipped", tmp_path, FAMILY, ["sm_80", "sm_90a"])
    monkeypatch.setenv("DUALK_PREBUILT_DIR", os.pathsep.join([str(tmp_path / "none"),
                                                               str(tmp_path / "shipped")]))  # fmt: skip
    monkeypatch.setattr(cuda, "BUILDER", lambda *a: pytest.fail("built although prebuilt"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no notice: nothing is built
        t0 = time.perf_counter()
        module = cuda.extension(FAMILY)
        assert time.perf_counter() - t0 < 2.0
    assert module.__name__ == cuda.module_name(FAMILY)
    assert f"ready (loaded from {shipped})" in cuda.describe_state(FAMILY)
    # auto takes it at once: a candidate on the first call, nothing pending for cuda.
    x = torch.randn(64)
    gpu.clear()
    dualk.add(x, x)
    assert "cuda" in gpu and "triton" not in gpu  # Triton is tuned in the background first


@needs_cc
@pytest.mark.parametrize("mismatch", ["sources", "arch", "torch", "truncated"])
def test_mismatched_prebuilt_is_ignored_with_a_reason(gpu, monkeypatch, tmp_path, mismatch):
    archs = ["sm_80"] if mismatch == "arch" else ["sm_90a"]
    shipped = write_build(tmp_path / "shipped", tmp_path, FAMILY, archs)
    manifest = json.loads((shipped / cuda.MANIFEST_NAME).read_text())
    if mismatch == "sources":
        manifest["key"] = "0" * 16
        manifest["files"]["add.cu"] = "f" * 16
    elif mismatch == "torch":
        manifest["key"] = "1" * 16
        manifest["toolchain"]["torch"] = "1.0.0"
    elif mismatch == "truncated":
        lib = shipped / manifest["library"]
        lib.write_bytes(lib.read_bytes()[:200])
    (shipped / cuda.MANIFEST_NAME).write_text(json.dumps(manifest))
    monkeypatch.setenv("DUALK_PREBUILT_DIR", str(tmp_path / "shipped"))
    builders = Builders(tmp_path, gated=False)
    monkeypatch.setattr(cuda, "BUILDER", builders)
    x = torch.randn(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BuildNotice)
        dualk.add(x, x)
    assert builders.started == [FAMILY], "the mismatched build was loaded instead of building"
    expected = {
        "sources": "built from other sources or tools (key 0000000000000000; these sources give",
        "arch": "built for sm_80, not for this GPU's sm_90a",
        "torch": "built with torch 1.0.0",
        "truncated": "is truncated",
    }[mismatch]
    (why,) = [w for d, w in cuda.ignored(FAMILY) if d == str(shipped)]
    assert expected in why
    if mismatch == "sources":
        assert "sources differ: add.cu" in why
    expl = str(dualk.explain("add", x, x))
    assert f"ignored {shipped}: " in expl and expected in expl
    wait_for_builder(FAMILY)
    assert cuda.auto_state(FAMILY)[0] == "ready"
    assert cuda._loaded_from[FAMILY] == cuda.build_directory(FAMILY)  # its own build


@needs_cc
def test_a_cache_copied_to_another_machine_is_found(gpu, monkeypatch, tmp_path):
    """Keys and names hold no absolute path: a cache built under one root and copied to another
    (another machine's DUALK_CACHE_DIR) loads there without building."""
    first = tmp_path / "machine-a"
    write_build(first, tmp_path, "gemm", ["sm_90a"])
    second = tmp_path / "machine-b" / "somewhere" / "else"
    shutil.copytree(first, second)
    monkeypatch.setenv("DUALK_CACHE_DIR", str(second))
    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("compiled"))
    module = cuda.extension("gemm")
    assert module.__name__ == cuda.module_name("gemm")
    assert cuda._loaded_from["gemm"].is_relative_to(second)


# ---------------------------------------------------------------------------- dualk build
@needs_cc
def test_dualk_build_progress_arch_and_out(gpu, monkeypatch, tmp_path):
    builders = Builders(tmp_path, mode={"elementwise": "ok", "gemm": "ok", "mlp": "fail"},
                        gated=False)  # fmt: skip
    monkeypatch.setattr(cuda, "BUILDER", builders)
    for family in ("elementwise", "gemm"):
        builders.tiny(family)  # compiled before the builders race for it
    out = tmp_path / "ship"
    result = CliRunner().invoke(main, ["build", "--arch", "sm_90a,8.0", "--out", str(out)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    for family in cuda.FAMILIES:
        directory = cuda.build_directory(family, ["sm_80", "sm_90a"], out)
        assert f"{family}: started for sm_80,sm_90a in {directory}" in result.output
    assert any(ln.startswith("elementwise: done in ") for ln in lines)
    assert any(ln.startswith("gemm: done in ") for ln in lines)
    (failed,) = [ln for ln in lines if ln.startswith("mlp: failed after ")]
    assert "nvcc said boom" in failed and "progress.log" in failed
    for family in ("elementwise", "gemm"):
        directory = cuda.build_directory(family, ["sm_80", "sm_90a"], out)
        assert cuda.read_manifest(directory)["arch"] == ["sm_80", "sm_90a"]
    # What it built is found at run time through DUALK_PREBUILT_DIR, for either architecture.
    monkeypatch.setenv("DUALK_PREBUILT_DIR", str(out))
    for archs in (["sm_90a"], ["sm_80"]):
        directory, passed = cuda.locate("gemm", archs)
        assert directory == cuda.build_directory("gemm", ["sm_80", "sm_90a"], out)
    assert cuda.locate("gemm", ["sm_100a"])[0] is None
    ok = CliRunner().invoke(main, ["build", "--arch", "sm_90a", "--family", "elementwise",
                                   "--out", str(out)])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert f"DUALK_PREBUILT_DIR={out.resolve()}" in ok.output
    bad = CliRunner().invoke(main, ["build", "--arch", "sm_9x"])
    assert bad.exit_code == 2 and "not a CUDA architecture" in bad.output
    # Into the cache (no --out), a family found prebuilt is not built again.
    again = CliRunner().invoke(main, ["build", "--arch", "sm_90a", "--family", "gemm"])
    assert again.exit_code == 0, again.output
    assert "gemm: already built for sm_90a in" in again.output and "started" not in again.output
