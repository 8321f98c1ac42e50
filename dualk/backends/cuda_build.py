"""The builder process of one CUDA extension family (dualk/backends/cuda.py):

    python -m dualk.backends.cuda_build FAMILY [--arch sm_90a,sm_80] [--out ROOT] [--quiet]

Builds FAMILY for the named architectures (default: the visible GPUs') into
<ROOT>/cuda/<family>-<key>-<arch> (default ROOT: the cache, $DUALK_CACHE_DIR) under the build
directory's flock, and writes its manifest. backend="auto" runs it in the background and
`dualk build` once per family; it needs nvcc, not a GPU, when the architectures are named.
Output: the compiler's (unless --quiet), then one last line, "dualk-build: done in N s" or
"dualk-build: failed: <why, with the log's path>"; exit status 0 or 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import cuda


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualk.backends.cuda_build")
    parser.add_argument("family")
    parser.add_argument("--arch", default="", help="e.g. sm_90a,sm_80 (default: the GPUs')")
    parser.add_argument("--out", default=None, help="root directory (default: the cache)")
    parser.add_argument("--quiet", action="store_true", help="no compiler output")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    try:
        if args.family not in cuda.FAMILIES:
            raise ValueError(
                f"unknown family {args.family!r}; families: {', '.join(cuda.FAMILIES)}"
            )
        archs = cuda.parse_archs(args.arch) if args.arch else cuda.target_archs()
        if not archs:
            raise ValueError("no architecture to build for (no GPU visible; name one with --arch)")
        if cuda.nvcc_path() is None:
            raise RuntimeError("nvcc was not found (set CUDA_HOME or put nvcc on PATH)")
        root = None if args.out is None else Path(args.out)
        print(
            f"dualk-build: {args.family} for {','.join(archs)} in "
            f"{cuda.build_directory(args.family, archs, root)}",
            flush=True,
        )
        cuda.build(args.family, archs, root=root, verbose=not args.quiet)
    except Exception as exc:
        print(f"dualk-build: failed: {exc}", flush=True)
        return 1
    print(f"dualk-build: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
