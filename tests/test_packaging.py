"""A regular (non-editable) install carries cuda_src/ and triton_src/ inside the package, so JIT
builds and Triton imports work from site-packages."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _clean_copy(dest: Path) -> Path:
    """The project's files without build leftovers: a stale build/ or *.egg-info in the checkout
    would carry files into the wheel that package-data no longer names."""
    try:  # tracked files and new ones git does not ignore (a kernel not yet added counts)
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True,
        )  # fmt: skip
    except OSError:  # no git
        listed = None
    if listed is not None and listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            if name and (ROOT / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
    else:  # not a git checkout (an sdist): everything but build outputs and caches
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", ".venv", ".git", "__pycache__", ".hypothesis"))  # fmt: skip
    return dest


def test_wheel_carries_kernel_sources(tmp_path):
    source = _clean_copy(tmp_path / "src")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheels.glob("dualk-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for src in sorted((source / "cuda_src").glob("*")):
        if src.suffix in (".cu", ".cuh", ".h", ".cpp"):
            assert f"dualk/cuda_src/{src.name}" in names, f"{src.name} missing from the wheel"
    for src in sorted((source / "triton_src").glob("*.py")):
        assert f"dualk/triton_src/{src.name}" in names, f"{src.name} missing from the wheel"
    assert any(n.endswith("entry_points.txt") for n in names)
    assert "dualk/py.typed" in names, "the PEP 561 marker is missing from the wheel"


def test_triton_modules_import_from_outside_the_checkout(tmp_path):
    """The installed package imports its Triton modules as dualk.triton_src.* (a stray absolute
    `triton_src.` import only worked with the repository root on sys.path)."""
    code = (
        "import dualk.triton_src.matmul, dualk.triton_src.linear_gelu, dualk.triton_src.fused_mlp,"
        " dualk.triton_src.add, dualk.triton_src.relu_scale"
    )
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
