"""Triton's compile and config search off the user's thread (issue 33, item 5; README
"Autotuning").

A Triton launcher's first call of a problem class compiles each candidate config and times them
(triton_src/common.py `tuned_config`): seconds for a GEMM, most of it in Triton's compiler, which
holds the GIL, so a thread would stall the user's thread as well. For backend="auto" on a GPU,
this module does that work in a separate process instead, as dualk/backends/cuda.py builds the
CUDA extension:

- the first timed decision of a class (no cache file entry) queues it here and is decided among
  the other candidates (provisional, dualk/dispatch/autotune.py); the queue runs in one
  background process at a time per dualk process (`python -m dualk.dispatch.triton_tune_worker
  JOBFILE`: torch's import and the CUDA context are paid once for every class it holds), with
  the user's environment, so TRITON_CACHE_DIR and DUALK_CACHE_DIR are the same;
- the tuner rebuilds the call's tensors on the same GPU (shapes, strides, dtypes, the 16-byte
  alignment of each data pointer: everything the launchers specialize and key on; random
  values) and runs dualk's Triton implementation once, under a per-class flock, so the launcher
  searches its configs exactly as the user's call would have: the compiled kernels land in
  Triton's cache, the winning config in the autotune cache file (section "triton.<launcher>");
- the user's process polls it on the class's later calls (a waitpid and a stat); when a class is
  done it re-reads the cache file; the class's next call loads Triton's kernel (one run of
  Triton on that call's arguments, output discarded: the config from the file, the kernel from
  Triton's cache, and Triton's own first-use costs in the process) and the call after it decides
  again with Triton among the candidates, timed with the others within auto's usual budget, so
  no call pays both. Triton's runs in a user's call while auto decides are made under
  `no_config_search()`: a launcher that would still search (a call of the class whose exact
  launch differs from the tuned one) raises ConfigSearchDeferred instead, and the class goes
  back to the queue with this call's arguments (at most MAX_REQUEUES times);
- after reporting a class ready, the tuner also compiles the class's other specialization
  (`variants`: a size of the bucket that is, or is not, a multiple of 16, for elementwise calls
  and 2-D GEMM inputs), so a later call of the class at such a size finds its kernel cached.
  Not covered: once Triton has won a class, a later call of it whose launch falls in another
  Triton class or specialization (another pointer alignment, say) compiles or searches in that
  call, as any Triton call does;
- a tuner that fails, raises or is killed marks its remaining classes failed with the reason and
  its log (dualk.explain shows it); those classes are decided without Triton. Two processes
  tuning one class: the second waits on the class's flock, then finds the config and the
  kernels cached (nothing compiled twice). A tuner whose dualk process exited finishes its
  queue (its results are cached for the next process), removes its files and exits.

Nothing is queued or started under CUDA-graph capture, torch.compile or jit tracing, or with
DUALK_AUTOTUNE=0 (autotune decides by its heuristic there before asking this module); an explicit
backend="triton" and `dualk tune` still tune in the call.

This module is the user's side (queue, state, polling, the no-search guard), below
dualk.dispatch.autotune, which asks it and registers its cache reload in READY_HOOKS; the tuner
process is dualk/dispatch/triton_tune_worker.py, which imports both. What they share with
autotune: the key's text (dualk/dispatch/keys.py), the timing gate and the file lock
(dualk/dispatch/shared.py).

The cost: the tuner is a second process on the same GPU (a CUDA context, ~0.5 GB, plus the
call's operands) while it runs, and its config timings share the GPU with the user's work.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backends import cuda
from ..backends import triton as triton_backend
from .keys import key_string
from .shared import timing_blocked

PREFIX = "dualk-triton-tune:"
TIMEOUT_S = 300.0  # per class: a tuner running longer than this times its classes is killed
# The worker's argv for a job file; tests put a stand-in here.
WORKER: Callable[[Path], list[str]] | None = None
DEFERRED = "ConfigSearchDeferred"
# Called with the device whose autotune cache file the tuner has written a class's config into
# (dualk.dispatch.autotune adds its reload_cache: autotune imports this module, not the reverse).
READY_HOOKS: list[Callable[[torch.device], None]] = []


# ---------------------------------------------------------------------------- call descriptions
def _describe_value(v):
    if isinstance(v, torch.Tensor):
        return {
            "tensor": [list(v.shape), list(v.stride()), str(v.dtype).removeprefix("torch."),
                       v.data_ptr() % 16 if v.numel() else 0],
        }  # fmt: skip
    if isinstance(v, (list, tuple)):
        return {"list": [_describe_value(x) for x in v], "tuple": isinstance(v, tuple)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"cannot describe an argument of type {type(v).__name__} for the tuner")


def describe_call(spec, args: tuple, key: tuple) -> dict:
    """What the tuner needs to repeat the call: the op, the device, PyTorch's TF32 switch (part
    of the key) and every argument's shape, strides, dtype and pointer alignment (values are not
    copied)."""
    device = args[0].device
    return {
        "op": spec.name, "key": key_string(key), "device": device.type,
        "index": device.index if device.index is not None else 0, "tf32": bool(key[3]),
        "args": [_describe_value(a) for a in args],
    }  # fmt: skip


def _rebuild_value(v, device: torch.device, gen: torch.Generator):
    if isinstance(v, dict) and "tensor" in v:
        shape, stride, dtype, misalign = v["tensor"]
        dtype = getattr(torch, dtype)
        size = 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0
        offset = misalign // torch.empty((), dtype=dtype).element_size()
        base = torch.randn(size + offset, generator=gen).mul_(0.5).to(device=device, dtype=dtype)
        return base.as_strided(shape, stride, offset)
    if isinstance(v, dict) and "list" in v:
        items = [_rebuild_value(x, device, gen) for x in v["list"]]
        return tuple(items) if v.get("tuple") else items
    return v


def rebuild_args(desc: dict) -> tuple:
    """The call's arguments on its device: fresh tensors with the described layout."""
    device = torch.device(desc["device"], desc["index"]) if desc["device"] == "cuda" else (
        torch.device(desc["device"]))  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    return tuple(_rebuild_value(v, device, gen) for v in desc["args"])


def _siblings(n: int) -> list[int]:
    """Sizes in n's power-of-two bucket (autotune's key) that Triton specializes unlike n and
    unlike each other (a multiple of 16 or not: common.int_spec): of the bucket's top and the
    size below it."""
    top = 1 << (n - 1).bit_length() if n > 0 else 0
    seen = {_int_spec(n)}
    out = []
    for m in (top, top - 1):
        if m > top // 2 and _int_spec(m) not in seen:
            seen.add(_int_spec(m))
            out.append(m)
    return out


def _int_spec(v: int) -> int:
    return 1 if v == 1 else (2 if v % 16 == 0 else 0)  # as triton_src/common.int_spec


def _contiguous(t: dict, ndim: int | None = None) -> bool:
    shape, stride = t["tensor"][0], t["tensor"][1]
    expected, step = [], 1
    for size in reversed(shape):
        expected.insert(0, step)
        step *= max(size, 1)
    return (ndim is None or len(shape) == ndim) and all(
        st == ex for size, st, ex in zip(shape, stride, expected) if size != 1
    )


def variants(desc: dict) -> list[dict]:
    """The call at the other sizes of its class that compile to another Triton specialization
    (`_siblings` of the bucketed size: the element count of an elementwise call whose tensors are
    all contiguous and of one shape, the rows of a 2-D contiguous GEMM input), so that a later
    call of the class at such a size finds its kernel in Triton's cache instead of compiling in
    the user's call. Other layouts: none (fused_mlp does not specialize on its rows)."""
    args = desc["args"]
    tensors = [i for i, a in enumerate(args) if isinstance(a, dict) and "tensor" in a]
    if not tensors:
        return []
    first = args[0]["tensor"]
    out = []
    if desc["op"] in ("add", "relu_scale"):
        if not all(args[i]["tensor"][0] == first[0] and _contiguous(args[i]) for i in tensors):
            return []
        numel = 1
        for size in first[0]:
            numel *= size
        for m in _siblings(numel):
            new = list(args)
            for i in tensors:
                new[i] = {"tensor": [[m], [1], *args[i]["tensor"][2:]]}
            out.append({**desc, "args": new})
    elif desc["op"] in ("matmul", "linear_gelu", "linear_glu"):
        if not _contiguous(args[0], 2) or (
            desc["op"] == "matmul" and len(args[1]["tensor"][0]) != 2
        ):
            return []
        rows, k = first[0]
        for m in _siblings(rows):
            out.append({**desc, "args": [{"tensor": [[m, k], [k, 1], *first[2:]]}, *args[1:]]})
    return out


# ---------------------------------------------------------------------------- state
@dataclass
class _Job:
    proc: subprocess.Popen
    started: float  # time.time()
    log: Path
    jobfile: Path
    keys: dict[str, tuple]  # tag -> autotune key
    devices: dict[str, torch.device] = field(default_factory=dict)  # tag -> device
    size: int = 0  # bytes of the log read so far

    def since(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.started))


_state: dict[tuple, tuple[str, str]] = {}  # key -> (queued|tuning|ready|failed, text)
_queue: dict[tuple, dict] = {}  # key -> description, waiting for the tuner
_requeues: dict[tuple, int] = {}  # key -> times sent back to the tuner (requeue)
_loaded: set[tuple] = set()  # ready keys whose Triton kernel this process has loaded (loaded())
_job: list[_Job] = []  # the running tuner (at most one)
_jobs_started = [0]
_generation = 0
_lock = threading.RLock()


def generation() -> int:
    """Changes whenever a class becomes ready or fails."""
    return _generation


def _bump() -> None:
    global _generation
    _generation += 1


def work_dir() -> Path:
    return cuda.cache_root() / "triton-tune"


def worker_command(jobfile: Path) -> list[str]:
    if WORKER is not None:
        return list(WORKER(jobfile))
    return [sys.executable, "-m", "dualk.dispatch.triton_tune_worker", str(jobfile)]


def worker_env() -> dict[str, str]:
    """This environment (same caches, same visible GPUs), dualk importable from where this
    process imports it."""
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env[PARENT_ENV] = str(os.getpid())
    return env


PARENT_ENV = "DUALK_TRITON_TUNE_PARENT"  # the dualk process that started the tuner


def _start() -> None:
    """Start a tuner for every queued class (none while one runs, nor under capture, tracing or
    DUALK_AUTOTUNE=0: they wait for the next call that may)."""
    if _job or not _queue:
        return
    if timing_blocked() is not None:
        return
    _jobs_started[0] += 1
    # pid, count and a random tag: processes of other pid namespaces may share the cache
    stem = f"{os.getpid()}-{_jobs_started[0]}-{os.urandom(3).hex()}"
    keys, descs, devices = {}, [], {}
    for i, (key, desc) in enumerate(_queue.items()):
        tag = f"c{i}"
        keys[tag] = key
        devices[tag] = torch.device(desc["device"], desc["index"]) if desc["device"] == "cuda" \
            else torch.device(desc["device"])  # fmt: skip
        descs.append({**desc, "tag": tag})
    try:
        try:
            directory = work_dir()
            directory.mkdir(parents=True, exist_ok=True)
            jobfile = directory / f"{stem}.json"
            jobfile.write_text(json.dumps(descs))
        except OSError:  # an unwritable cache: the job file and log go to the temporary folder
            directory = Path(tempfile.gettempdir()) / f"dualk-triton-tune-{os.getuid()}"
            directory.mkdir(parents=True, exist_ok=True)
            jobfile = directory / f"{stem}.json"
            jobfile.write_text(json.dumps(descs))
        log = directory / f"{stem}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                worker_command(jobfile), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env=worker_env(), start_new_session=True,
            )  # fmt: skip
    except Exception as exc:  # OSError: an unwritable cache; a worker that cannot start
        why = f"the background Triton tuner could not start ({type(exc).__name__}: {exc})"
        for key in list(_queue):
            _state[key] = ("failed", why)
        _queue.clear()
        _bump()
        return
    job = _Job(proc, time.time(), log, jobfile, keys, devices)
    _job.append(job)
    for key in keys.values():
        _queue.pop(key, None)
        _state[key] = ("tuning", "")


def _read_lines(job: _Job) -> list[str]:
    try:
        size = job.log.stat().st_size
        if size == job.size:
            return []
        with open(job.log, "rb") as f:
            f.seek(job.size)
            data = f.read()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1  # whole lines only
    job.size += end
    return data[:end].decode(errors="replace").splitlines()


def _last_line(job: _Job) -> str:
    with contextlib.suppress(OSError):
        lines = [ln.strip() for ln in job.log.read_text(errors="replace").splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith(PREFIX)]
        if lines:
            return lines[-1][:300]
    return "no output"


def poll(start: bool = True) -> int:
    """Take in what the running tuner reported (a stat of its log, a waitpid); with `start`,
    start the queued classes once it has finished. Returns generation()."""
    if not _job and not _queue:
        return _generation
    reload: set[torch.device] = set()
    with _lock:
        if _job:
            job = _job[0]
            rc = job.proc.poll()
            if rc is None and time.time() - job.started > TIMEOUT_S * len(job.keys):
                job.proc.kill()
                rc = job.proc.wait()
            for line in _read_lines(job):
                parts = line.split(None, 3)
                if len(parts) < 3 or parts[0] != PREFIX or parts[2] not in job.keys:
                    continue
                key = job.keys[parts[2]]
                if _state.get(key, ("",))[0] != "tuning":
                    continue
                if parts[1] == "ready":
                    secs = parts[3] if len(parts) > 3 else "?"
                    _state[key] = ("ready", f"compiled and tuned in the background in {secs} s")
                    reload.add(job.devices[parts[2]])
                    _bump()
                elif parts[1] == "failed":
                    why = parts[3] if len(parts) > 3 else "no reason given"
                    _state[key] = ("failed", f"the background Triton tuner failed: {why}; "
                                             f"log: {job.log}")  # fmt: skip
                    _bump()
            if rc is not None:
                _job.clear()
                how = f"exited with status {rc}" if rc >= 0 else f"was killed by signal {-rc}"
                for key in job.keys.values():
                    if _state.get(key, ("",))[0] == "tuning":
                        _state[key] = ("failed", (
                            f"the background Triton tuner {how} after "
                            f"{time.time() - job.started:.0f} s before this class was done: "
                            f"{_last_line(job)}; log: {job.log}"))  # fmt: skip
                        _bump()
                with contextlib.suppress(OSError):
                    job.jobfile.unlink()
                if rc == 0 and all(_state.get(k, ("",))[0] == "ready" for k in job.keys.values()):
                    with contextlib.suppress(OSError):
                        job.log.unlink()
        if start:
            _start()
    if reload:  # the tuner wrote its configs into the cache file
        for device in reload:
            for hook in READY_HOOKS:
                hook(device)
    return _generation


def auto_state(spec, args: tuple, key: tuple, start: bool) -> tuple[str, str | None]:
    """("ready", None), ("pending", why) or ("failed", why) of Triton for auto's decision of
    `key`; with `start`, a class not seen yet is queued for the tuner (started at once when none
    runs). Never compiles or times anything here."""
    poll()
    with _lock:
        state, text = _state.get(key, ("", ""))
        if state == "ready":
            return "ready", None
        if state == "failed":
            return "failed", text
        if state in ("tuning", "queued"):
            return "pending", _pending_text(key)
        if not start:
            return "pending", NOT_TUNED
        _enqueue(spec, args, key)
        return "pending", _pending_text(key)


def _enqueue(spec, args: tuple, key: tuple) -> None:
    try:
        desc = describe_call(spec, args, key)
    except Exception as exc:
        _state[key] = ("failed", f"the call cannot be repeated by the tuner ({exc})")
        _bump()
        return
    _queue[key] = desc
    _state[key] = ("queued", "")
    _start()
    # The launcher's module is imported here (tens of ms for the GEMMs' jit functions), not in
    # the later call that loads the kernel; it compiles nothing and leaves Triton's driver alone.
    with contextlib.suppress(Exception):
        triton_backend.kernel_module(spec.name)


MAX_REQUEUES = 3


def requeue(spec, args: tuple, key: tuple) -> tuple[str, str]:
    """The class's Triton run in the user's call would have searched configs (ConfigSearchDeferred):
    tune it again in the background with this call's arguments, at most MAX_REQUEUES times per
    class. Returns ("pending", why) or, past that, ("failed", why)."""
    with _lock:
        state = _state.get(key, ("",))[0]
        if state in ("tuning", "queued"):
            return "pending", _pending_text(key)
        _requeues[key] = _requeues.get(key, 0) + 1
        if _requeues[key] > MAX_REQUEUES:
            _state[key] = ("failed", (
                f"its launch in the user's call still wanted a config search after "
                f"{MAX_REQUEUES} background tunings of this class (the tuner's launch differs "
                "from the call's)"))  # fmt: skip
            _bump()
            return "failed", _state[key][1]
        _state.pop(key, None)
        _enqueue(spec, args, key)
        return "pending", _pending_text(key)


def settled(key: tuple) -> bool:
    """Whether Triton's state for `key` has become ready or failed (polls the tuner)."""
    poll()
    return _state.get(key, ("",))[0] in ("ready", "failed")


def loaded(spec, args: tuple, key: tuple) -> bool:
    """Whether the class is ready to be decided again with Triton (autotune's provisional
    decision, after `settled`): True at once for a failed class or one whose kernel this process
    has loaded; otherwise this call loads it (one run of Triton's implementation on the call's
    arguments under no_config_search(), its output discarded; the call itself runs the
    provisional winner) and answers False, so the load and the timing of the next call's
    decision fall on different calls. Nothing runs, False, under capture, tracing or
    DUALK_AUTOTUNE=0; a launch that would still search sends the class back to the tuner."""
    if _state.get(key, ("",))[0] != "ready" or key in _loaded:
        return True
    if timing_blocked() is not None:
        return False
    _loaded.add(key)
    device = args[0].device
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    try:
        with guard, no_config_search():
            spec.implementation("triton")(*args)
    except Exception as exc:
        if not is_deferral(f"{type(exc).__name__}: {exc}"):
            return True  # the decision's own run of it will say why
        _loaded.discard(key)
        requeue(spec, args, key)
        return _state.get(key, ("",))[0] == "failed"
    return False


NOT_TUNED = (
    "not compiled or tuned for this class in this process: auto's first timed call of the class "
    "starts a background tuner; backend='triton' tunes in the call"
)


def _pending_text(key: tuple) -> str:
    state = _state.get(key, ("",))[0]
    if state == "tuning" and _job:
        job = _job[0]
        return (
            f"being compiled and tuned in the background since {job.since()} "
            f"({time.time() - job.started:.0f} s; pid {job.proc.pid}; log: {job.log}); "
            "it joins auto's decision once ready"
        )
    if state == "queued":
        return "queued for the background Triton tuner (one runs at a time); it joins auto's " \
            "decision once ready"  # fmt: skip
    return NOT_TUNED


def pending_reason(key: tuple) -> str:
    """Why Triton is not (yet) among the candidates of a provisional decision, as of now (for
    dualk.explain: the reason recorded with the decision may be older); starts nothing."""
    poll(start=False)
    with _lock:
        state, text = _state.get(key, ("", ""))
        if state == "ready":
            return (f"{text}; it joins auto's decision of this class on one of its next calls "
                    "(the first loads its kernel, the next decides)")  # fmt: skip
        if state == "failed":
            return text
        return _pending_text(key)


def describe(key: tuple) -> str:
    """One line for dualk.explain: Triton's state for this class in this process (starts
    nothing; takes in a finished tuner's results)."""
    poll(start=False)
    with _lock:
        state, text = _state.get(key, ("", ""))
        if state == "ready":
            return f"ready ({text})"
        if state == "failed":
            return f"failed: {text}"
        if state == "tuning":
            return "tuning: " + _pending_text(key)
        if state == "queued":
            return "queued: " + _pending_text(key)
        return NOT_TUNED


def state_of(key: tuple) -> str | None:
    """The class's state: "queued", "tuning", "ready", "failed", or None (nothing asked)."""
    return _state.get(key, (None,))[0]


def running() -> list[subprocess.Popen]:
    """The running tuner's process, if any (tests, benchmarks)."""
    return [j.proc for j in _job]


def background_pending() -> bool:
    """Whether this process still has work in the background that auto's decisions wait for: a
    CUDA family building, or classes queued for or held by Triton's tuner (their decisions are
    provisional until then). Polls both. Benchmarks wait on it before timing auto."""
    cuda.poll_builds()
    poll(start=True)
    return bool(cuda.building()) or bool(_queue) or bool(_job)


def settle(call: Callable[[], object] | None = None, limit_s: float = 120.0) -> bool:
    """Wait until background_pending() is False, at most limit_s, calling `call` (a user's model,
    say: its calls are what let auto take in a finished build or tuning) between polls. Returns
    whether it settled; call `call` a few more times after it, so that auto decides again with
    every backend."""
    deadline = time.perf_counter() + limit_s
    while background_pending():
        if time.perf_counter() >= deadline:
            return False
        if call is not None:
            call()
        time.sleep(0.05)
    return True


def clear() -> None:
    """Forget every class's state (autotune.clear_memory); a running tuner is left to finish
    (its results are cached on disk) and no longer polled."""
    with _lock:
        _state.clear()
        _queue.clear()
        _requeues.clear()
        _loaded.clear()
        _job.clear()
        _bump()


# ---------------------------------------------------------------------------- the guard
@contextlib.contextmanager
def no_config_search() -> Iterator[None]:
    """Within the block (on this thread), a Triton launcher that would search its configs
    raises ConfigSearchDeferred instead (triton_src/common.py tuned_config); used around auto's
    timing in the user's call."""
    common = sys.modules.get("dualk.triton_src.common")
    if common is None and triton_backend.triton_importable() is None:
        # Triton not imported yet: load the flag's module only where it can be
        with contextlib.suppress(Exception):
            common = triton_backend.kernel_module("common")
    if common is None:
        yield
        return
    with common.no_config_search():
        yield


def is_deferral(error: str | None) -> bool:
    """Whether a candidate's recorded error is a deferred config search (not a failure)."""
    return bool(error) and DEFERRED in error
