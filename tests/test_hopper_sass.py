"""The Hopper kernels are Hopper code on the GPU (issue 14: "SASS shows HGMMA for the Hopper
paths"): every instantiation of the wgmma kernels in the built extension holds HGMMA instructions
(cuobjdump on an sm_90 GPU). The nvcc side (each compiles for sm_90a, ptxas does not serialize its
wgmma) is tests/test_cuda_compile.py's, on any machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import HAS_CUDA
from test_cuda_compile import HOPPER_KERNELS


def _sass_functions(library: Path, names: set[str]) -> dict[str, list[bool]]:
    """{kernel name: [holds HGMMA, per instantiation]} from cuobjdump's SASS of `library`."""
    found: dict[str, list[bool]] = {n: [] for n in names}
    current = None
    with subprocess.Popen(["cuobjdump", "--dump-sass", str(library)], stdout=subprocess.PIPE,
                          text=True) as proc:  # fmt: skip
        for line in proc.stdout:
            if "Function : " in line:
                symbol = line.split("Function : ", 1)[1].strip()
                current = next((n for n in names if n in symbol), None)
                if current is not None:
                    found[current].append(False)
            elif current is not None and "HGMMA" in line:
                found[current][-1] = True
    return found


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump not found")
def test_built_hopper_kernels_hold_hgmma():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernels are built for sm_90a only")
    from dualk.backends import cuda as cuda_backend

    found: dict[str, list[bool]] = {}
    names = []
    for family in ("gemm", "mlp"):  # the families holding wgmma kernels
        cuda_backend.extension(family)
        directory = cuda_backend._loaded_from.get(family) or cuda_backend.build_directory(family)
        libraries = sorted(directory.glob("*.so"))
        assert libraries, f"no library in {directory}"
        names.append(libraries[0].name)
        kernels = {
            HOPPER_KERNELS[f] for f in HOPPER_KERNELS if f in cuda_backend.FAMILIES[family].kernels
        }
        found.update(_sass_functions(libraries[0], kernels))
    assert set(found) == set(HOPPER_KERNELS.values())
    for kernel, has_hgmma in found.items():
        assert has_hgmma, f"{kernel}: not in the SASS of {', '.join(names)}"
        missing = has_hgmma.count(False)
        assert not missing, f"{kernel}: {missing} of {len(has_hgmma)} instantiations without HGMMA"
