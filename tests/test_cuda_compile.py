"""Every CUDA kernel file compiles with nvcc for sm_80 and sm_90a, with no register spills and no
stack frame from a spilled array (ptxas -v), and the files' wgmma kernels compile for sm_90a
without ptxas serializing their wgmma (tests/test_hopper_sass.py checks HGMMA in the built
library's SASS on a GPU). Runs on machines without a GPU; skips without nvcc."""

import os
import re
import shutil
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "cuda_src"
KERNEL_FILES = sorted(p for p in SRC.glob("*.cu"))
NVCC = shutil.which("nvcc") or (
    Path("/usr/local/cuda/bin/nvcc") if Path("/usr/local/cuda/bin/nvcc").exists() else None
)
ARCHS = ("arch=compute_80,code=sm_80", "arch=compute_90a,code=sm_90a")
# file -> its wgmma kernel (the file's other kernels are portable mma.sync / SIMT code)
HOPPER_KERNELS = {
    "matmul.cu": "gemm_sm90_kernel",
    "linear_gelu.cu": "gemm_sm90_kernel",
    "linear_glu.cu": "linear_glu_sm90_kernel",
    "fused_mlp_sm90.cu": "fused_mlp_wgmma_kernel",
    "fused_mlp_wide.cu": "fused_mlp_wide_kernel",
}
# ptxas's "Potential Performance Loss" warning: a kernel short of registers for wgmma's
# asynchronous accumulators waits for each wgmma before the next
SERIALIZED = "wgmma.mma_async instructions are serialized"


def compile_report(path: Path, arch: str) -> subprocess.CompletedProcess:
    """ptxas -v of one file's device code for one architecture (-cubin: no host compile)."""
    cmd = [
        str(NVCC), "-cubin", "-std=c++17", f"-I{SRC}", "-O3", "-Xptxas", "-v",
        f"-gencode={arch}", "-o", os.devnull, str(path),
    ]  # fmt: skip
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:  # this file's tests fail, not every file's
        return subprocess.CompletedProcess(cmd, -1, "", "nvcc timed out after 900 s")


_JOBS: dict[tuple[Path, str], Future] = {}  # (path, arch) -> its compile_report, once done
_PENDING: list[tuple[Path, str]] = []  # jobs no worker has taken yet, largest file first
_LOCK = threading.Lock()


def _work() -> None:
    while True:
        with _LOCK:
            if not _PENDING:
                return
            job = _PENDING.pop(0)
        try:
            _JOBS[job].set_result(compile_report(*job))
        except Exception as exc:  # (compile_report itself reports nvcc's failures)
            _JOBS[job].set_exception(exc)


def start_compiles(workers: int, files=KERNEL_FILES) -> None:
    """Queue the (file, architecture) compiles of `files` (once) and start `workers` more
    threads on the queue. conftest starts one at collection, with the files the chosen tests
    need, and runs this file's tests last: nvcc works beside the rest of the suite (on CI's 2
    cores it took ~5 of 18 minutes when it ran alone); the fixture adds one per core then."""
    if NVCC is None:
        return
    with _LOCK:
        if not _JOBS:
            jobs = sorted(
                ((p, a) for p in files for a in ARCHS), key=lambda j: -j[0].stat().st_size
            )
            for job in jobs:
                _JOBS[job] = Future()
                _PENDING.append(job)
    for _ in range(workers):
        threading.Thread(target=_work, daemon=True).start()


def merged(path: Path) -> subprocess.CompletedProcess:
    """One file's reports for every architecture, as one result: the first failure's code."""
    results = [_JOBS[(path, a)].result() for a in ARCHS]
    code = next((r.returncode for r in results if r.returncode != 0), 0)
    return subprocess.CompletedProcess(
        results[0].args, code, "", "".join(r.stderr for r in results)
    )


@pytest.fixture(scope="module")
def reports():
    """path -> its merged report, waited for on first use: one more nvcc per usable core on the
    queue (more only stretch each file's time toward its timeout)."""
    start_compiles(max(1, min(4, len(os.sched_getaffinity(0)))))
    return _Reports()  # (a file the started jobs lack: KeyError, a test fault to fix here)


class _Reports(dict):
    def __missing__(self, path: Path) -> subprocess.CompletedProcess:
        self[path] = merged(path)
        return self[path]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_compiles_without_spills(path, reports):
    result = reports[path]
    assert result.returncode == 0, f"nvcc failed on {path.name}:\n{result.stderr[-4000:]}"
    spills = [
        line for line in result.stderr.splitlines() if re.search(r"[1-9]\d* bytes spill", line)
    ]
    assert not spills, f"{path.name} spills registers:\n" + "\n".join(spills)
    functions = re.findall(r"Compiling entry function '(\w+)' for '(sm_\w+)'", result.stderr)
    assert functions, f"no kernels were compiled from {path.name}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("name", sorted(HOPPER_KERNELS))
def test_wgmma_kernels_build_for_sm90a_unserialized(name, reports):
    result = reports[SRC / name]
    assert result.returncode == 0, f"nvcc failed on {name}:\n{result.stderr[-4000:]}"
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", result.stderr)
    kernel = HOPPER_KERNELS[name]
    assert any(kernel in e for e in entries), f"{name}: no {kernel} compiled for sm_90a"
    warnings = [line for line in result.stderr.splitlines() if SERIALIZED in line]
    assert not warnings, f"{name}: ptxas serialized wgmma:\n" + "\n".join(warnings[:5])


def test_every_kernel_file_is_built_by_the_extension():
    from dualk.backends.cuda import KERNEL_SOURCES

    assert sorted(KERNEL_SOURCES) == sorted(p.name for p in KERNEL_FILES)
