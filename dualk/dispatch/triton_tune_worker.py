"""The background Triton tuner's process (dualk/dispatch/triton_tune.py starts it): `python -m
dualk.dispatch.triton_tune_worker JOBFILE` runs dualk's Triton implementation once on each call
the job file describes, under the class's flock, so its launcher compiles and searches its
configs as the user's call would have; the winning config lands in the autotune cache file, the
kernels in Triton's cache. One line per class on stdout, which the user's process reads."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from ..registry import OPS
from . import store, triton_tune
from .shared import file_lock


def class_lock_path(desc: dict, device: torch.device) -> Path:
    digest = hashlib.sha256(f"{store.cache_file(device).name}\0{desc['key']}".encode()).hexdigest()
    return triton_tune.work_dir() / "locks" / f"{digest[:24]}.lock"


def tune_one(desc: dict) -> float:
    """Run dualk's Triton implementation once on the described call (searching its configs as
    the user's call would have), under the class's flock. Returns the seconds it took."""
    t0 = time.perf_counter()
    args = triton_tune.rebuild_args(desc)
    device = args[0].device
    lock = class_lock_path(desc, device)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # an unwritable cache: the lock in the temporary folder
        lock = Path(tempfile.gettempdir()) / f"dualk-triton-tune-{os.getuid()}" / lock.name
        lock.parent.mkdir(parents=True, exist_ok=True)
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    torch.backends.cuda.matmul.allow_tf32 = bool(desc.get("tf32", False))
    with file_lock(lock), guard:
        OPS[desc["op"]].implementation("triton")(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """python -m dualk.dispatch.triton_tune_worker JOBFILE: tune each described class in turn;
    one line per class, "dualk-triton-tune: ready TAG SECONDS" or "dualk-triton-tune: failed TAG
    WHY"."""
    argv = sys.argv[1:] if argv is None else argv
    jobfile = Path(argv[0])
    descs = json.loads(jobfile.read_text())
    status = 0
    for desc in descs:
        print(f"{triton_tune.PREFIX} start {desc['tag']} {desc['op']} {desc['key']}", flush=True)
        try:
            seconds = tune_one(desc)
        except Exception as exc:
            traceback.print_exc()
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
            print(f"{triton_tune.PREFIX} failed {desc['tag']} {why}", flush=True)
            status = 1
        else:
            print(f"{triton_tune.PREFIX} ready {desc['tag']} {seconds:.1f}", flush=True)
            # After "ready" (the user's process may take the class in meanwhile): the class's
            # other specializations, compiled for later calls at other sizes of the class.
            for variant in triton_tune.variants(desc):
                try:
                    seconds = tune_one(variant)
                except Exception as exc:
                    why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                    print(f"{triton_tune.PREFIX} warm-failed {desc['tag']} {why}", flush=True)
                else:
                    print(f"{triton_tune.PREFIX} warm {desc['tag']} {seconds:.1f}", flush=True)
    # A dualk process that exited meanwhile reads no log: leave no files behind for it (a failure
    # keeps its log).
    if str(os.getppid()) != os.environ.get(triton_tune.PARENT_ENV, str(os.getppid())):
        with contextlib.suppress(OSError):
            jobfile.unlink()
            if status == 0:
                jobfile.with_suffix(".log").unlink()
    return status


if __name__ == "__main__":
    sys.exit(main())
