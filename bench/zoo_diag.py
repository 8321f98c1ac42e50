"""Why a zoo row loses: host profile of a fused model's eager forward, and Dynamo's graph
breaks and recompiles for its compiled forward.

    python bench/zoo_diag.py vit_small mixer_b16
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch

from dualk import module_choice
from dualk.fuse import fuse
from dualk.tools.zoo_models import MODELS


def _wall(fn, n=20):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main(names):
    device = torch.device("cuda")
    for name in names:
        spec = MODELS[name]
        torch.manual_seed(0)
        built = spec.build(device, spec.dtype, "gpu")
        model = built.model.eval()
        args, kwargs = built.make_inputs()
        fused = fuse(model)
        with torch.no_grad():
            for _ in range(5):
                model(*args, **kwargs)
                fused(*args, **kwargs)
            print(
                f"== {name} eager: original {_wall(lambda: model(*args, **kwargs)):.3f} ms, "
                f"fused {_wall(lambda: fused(*args, **kwargs)):.3f} ms"
            )
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(10):
                fused(*args, **kwargs)
            prof.disable()
            torch.cuda.synchronize()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
            print(out.getvalue()[:6000])
        for k, v in module_choice.details().items():
            print("choice", k, v["path"], v.get("times_us"), v.get("source"))
        torch._dynamo.reset()
        with torch.no_grad():
            expl = torch._dynamo.explain(fused)(*args, **kwargs)
            print(f"== {name} compiled: graphs {expl.graph_count}, breaks {expl.graph_break_count}")
            for b in expl.break_reasons[:6]:
                print("  break:", str(b.reason)[:300])
                for f in b.user_stack[-3:]:
                    print("     at", f.filename, f.lineno, f.name)
        torch._dynamo.reset()
        from torch._dynamo.utils import counters

        counters.clear()
        compiled = torch.compile(fused)
        with torch.no_grad():
            for _ in range(6):
                compiled(*args, **kwargs)
            print(
                f"  compiled fused {_wall(lambda: compiled(*args, **kwargs)):.3f} ms; "
                f"counters: { {k: dict(v) for k, v in counters.items() if v} }"[:1500]
            )
        torch._dynamo.reset()


if __name__ == "__main__":
    main(sys.argv[1:] or ["vit_small", "mixer_b16"])
