"""Host cost of fused_mlp inside a compiled graph, on a CPU-only machine: where a compiled call's
Python goes, and what each way of calling the op costs.

    python3 experiments/host_compiled_mlp_cpu.py [--cpp] [--calls 1000] [--repeats 21]

The kernel is replaced by a stand-in that allocates the output (the torch backend's
implementation, spec._resolved["torch"]), so every row is host work only. Thread CPU time
(time.thread_time: this thread's, not the other processes' on a shared host), one intra-op
thread (a matmul's OpenMP workers spin otherwise), min / q25 / median of `repeats` runs of
`calls` calls each, rows interleaved.

Rows:
  op calls        the stand-in alone; dualk::fused_mlp (custom_op: Python autograd_impl, its
                  redispatch, backend_impl, then dualk's full route); a custom_op with a trivial
                  body (custom_op's wrappers alone); dualk::fused_mlp_infer (a Library op: its
                  Python kernel, the full route); with --cpp, fused_mlp_infer with a CPU C++
                  kernel doing the CUDA kernel's host work (the Python usable() callback,
                  operand reads, at::empty), built here with torch.utils.cpp_extension (~1 min)
  compiled NeRF   torch.compile (Inductor) of dualk.fuse(32-64-64-64-16 MLP) and of a function
                  calling dualk.fused_mlp, under no_grad at 32 rows: the whole call, the guards
                  alone (the cache entry's guard manager), the AOT + Inductor callable alone
  the autograd op a compiled function calling torch.ops.dualk.fused_mlp itself: the graph every
                  compiled inference call ran before fused_mlp_infer

Measured (2-core CPU-only host, torch 2.13, thread time, min of 21): the custom_op wrappers
~43 us per call above the body, a Library op's Python kernel ~7, a C++ kernel ~3 (+1 for the
usable() callback); the full route ~17 above the stand-in. Compiled fuse'd NeRF: 176-190 us per
call with dualk::fused_mlp in the graph, 136 with fused_mlp_infer's Python kernel, 90-93 with a
C++ kernel (the GPU's case); a compiled function calling dualk.fused_mlp: 140-148 -> 106 -> 60.
What is left is torch's: Dynamo's module call layers (~45 us), guards (~6 us: 131 of them, 45 of
them hasattr checks on the 9 tensor inputs), the AOT runtime wrapper and Inductor's call with
its assert_size_stride per input (~21 us with 9 inputs, ~9 with 2).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

torch.set_num_threads(1)

import dualk  # noqa: E402
from dualk.autograd import library  # noqa: E402
from dualk.registry import OPS  # noqa: E402
from dualk.runtime import operators  # noqa: E402

CPP = r"""
#include <torch/extension.h>
#include <torch/library.h>
#include <torch/csrc/Exceptions.h>
namespace {
PyObject* g_usable = nullptr;
at::Tensor kernel(const at::Tensor& x, at::TensorList weights,
                  const c10::List<std::optional<at::Tensor>>& biases, c10::string_view activation,
                  c10::string_view backend) {
  py::gil_scoped_acquire gil;
  const bool is_auto = std::string_view(backend.data(), backend.size()) == "auto";
  PyObject* ok = PyObject_CallOneArg(g_usable, is_auto ? Py_True : Py_False);
  if (ok == nullptr) { python_error e; e.persist(); throw e; }
  Py_DECREF(ok);
  std::array<std::optional<at::Tensor>, 8> held;
  for (size_t i = 0; i < biases.size(); ++i) held[i] = biases.get(i);
  int64_t width = x.size(-1);
  for (const auto& w : weights) {
    TORCH_CHECK(w.size(1) == width && w.is_contiguous());
    width = w.size(0);
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = width;
  return at::empty(shape, x.options());
}
void register_kernel(py::object usable) {
  g_usable = usable.inc_ref().ptr();
  auto* lib = new torch::Library(torch::Library::IMPL, "dualk",
                                 std::optional<c10::DispatchKey>(c10::DispatchKey::CPU),
                                 __FILE__, __LINE__);
  lib->impl("fused_mlp_infer", TORCH_FN(kernel));
}
}  // namespace
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("register_kernel", &register_kernel); }
"""


def stand_in(x, weights, biases, activation="relu"):
    return torch.empty((*x.shape[:-1], weights[-1].shape[0]), dtype=x.dtype)


def table(rows: dict, calls: int, repeats: int) -> None:
    samples: dict = {k: [] for k in rows}
    for fn in rows.values():
        for _ in range(100):
            fn()
    gc.collect()
    gc.disable()
    for _ in range(repeats):
        for name, fn in rows.items():
            t0 = time.thread_time()
            for _ in range(calls):
                fn()
            samples[name].append((time.thread_time() - t0) / calls * 1e6)
    gc.enable()
    for name, v in samples.items():
        v.sort()
        print(f"  {name:46s} min {v[0]:8.2f}  q25 {v[len(v) // 4]:8.2f}  "
              f"med {statistics.median(v):8.2f} us")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpp", action="store_true", help="build the C++ stand-in kernel")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    OPS["fused_mlp"]._resolved["torch"] = stand_in
    torch.manual_seed(0)
    widths = [32, 64, 64, 64, 16]
    layers: list = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(widths) - 2 else [])
    model = nn.Sequential(*layers).eval()
    linears = [m for m in model if isinstance(m, nn.Linear)]
    ws, bs = [m.weight for m in linears], [m.bias for m in linears]
    x = torch.randn(32, 32)

    @torch.library.custom_op("dualk_experiment::trivial", mutates_args=())
    def trivial(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor],
                mask: int, activation: str, backend: str) -> torch.Tensor:  # fmt: skip
        return stand_in(x, weights, biases)

    trivial.register_autograd(lambda ctx, g: None, setup_context=lambda ctx, inputs, output: None)

    fused = dualk.fuse(model)
    c_fused = torch.compile(fused)
    c_fn = torch.compile(lambda x: dualk.fused_mlp(x, ws, bs))
    c_op = torch.compile(lambda x: torch.ops.dualk.fused_mlp(x, ws, bs, 0b1111, "relu", "auto"))
    ops = torch.ops
    with torch.no_grad():
        for f in (c_fused, c_fn, c_op):
            f(x)
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        guards = _debug_get_cache_entry_list(fused.forward.__code__)[0].guard_manager

        def compiled_rows() -> dict:
            return {
                "compiled fuse'd NeRF": lambda: c_fused(x),
                "  its guards alone": lambda: guards.check({"self": fused, "input": x}),
                "compiled fn dualk.fused_mlp": lambda: c_fn(x),
                "compiled fn calling dualk::fused_mlp": lambda: c_op(x),
            }

        rows = {
            "stand-in kernel": lambda: stand_in(x, ws, bs),
            "dualk full route (library.run_fused_mlp)": lambda: library.run_fused_mlp(
                x, ws, bs, 0b1111, "relu", "auto"
            ),
            "dualk::fused_mlp (custom_op)": lambda: ops.dualk.fused_mlp.default(
                x, ws, bs, 0b1111, "relu", "auto"
            ),
            "custom_op, trivial body": lambda: ops.dualk_experiment.trivial.default(
                x, ws, bs, 0b1111, "relu", "auto"
            ),
            "dualk::fused_mlp_infer (Python kernel)": lambda: ops.dualk.fused_mlp_infer.default(
                x, ws, bs, "relu", "auto"
            ),
        }
        print("op calls and compiled graphs, fused_mlp_infer's Python kernel:")
        table({**rows, **compiled_rows()}, args.calls, args.repeats)
        if args.cpp:
            from torch.utils import cpp_extension

            build = Path("/tmp/dualk-host-compiled-mlp-cpu")
            build.mkdir(exist_ok=True)
            ext = cpp_extension.load(
                name="dualk_host_compiled_mlp_cpu",
                sources=[str(_write(build / "kernel.cpp", CPP))],
                build_directory=str(build),
                extra_cflags=["-O2"],
            )
            ext.register_kernel(operators.planned_usable)
            print("fused_mlp_infer with a C++ kernel (the CUDA kernel's host work):")
            table(
                {
                    "dualk::fused_mlp_infer (C++ kernel)": lambda: (
                        ops.dualk.fused_mlp_infer.default(x, ws, bs, "relu", "auto")
                    ),
                    **compiled_rows(),
                },
                args.calls,
                args.repeats,
            )
    return 0


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


if __name__ == "__main__":
    sys.exit(main())
