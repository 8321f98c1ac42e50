"""Every CUDA kernel file compiles with nvcc for sm_80 and sm_90a, with no register spills and no
stack frame from a spilled array (ptxas -v), and the files' wgmma kernels compile for sm_90a
without ptxas serializing their wgmma (tests/test_hopper_sass.py checks HGMMA in the built
library's SASS on a GPU). Runs on machines without a GPU; skips without nvcc."""

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "cuda_src"
KERNEL_FILES = sorted(p for p in SRC.glob("*.cu"))
NVCC = shutil.which("nvcc") or (
    Path("/usr/local/cuda/bin/nvcc") if Path("/usr/local/cuda/bin/nvcc").exists() else None
)
ARCHS = ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a")
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


def compile_report(path: Path) -> subprocess.CompletedProcess:
    cmd = [
        str(NVCC),
        "-c",
        "-std=c++17",
        f"-I{SRC}",
        "-O3",
        "-Xptxas",
        "-v",
        *ARCHS,
        "-o",
        "/dev/null",
        str(path),
    ]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:  # this file's tests fail, not every file's
        return subprocess.CompletedProcess(cmd, -1, "", "nvcc timed out after 900 s")


@pytest.fixture(scope="module")
def reports():
    # One nvcc per usable core: more only stretch each file's time toward its timeout on a small host.
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(os.sched_getaffinity(0))))) as pool:
        return dict(zip(KERNEL_FILES, pool.map(compile_report, KERNEL_FILES)))


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
