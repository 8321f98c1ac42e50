"""auto's shape-class keys are persisted: the cache file stores each decision under the key's text,
and dualk looks the decisions of earlier runs (other processes, the background Triton tuner,
`dualk tune`) up by it. The keys must not change when the code that builds them moves, so the
text (and the in-memory tuple) of sample calls is pinned here:

- hand-made calls that reach every field and bucket of every built-in operator (literal below);
- every CPU shape case of the registry, in each dtype, with TF32 off and on
  (tests/autotune_keys.json, written by the code as it was before the keys moved onto the
  registry entries; regenerate it (`python tests/test_autotune_keys.py`) only for a deliberate
  change of a key).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dualk.dispatch import autotune
from dualk.registry import DTYPES, OPS

SNAPSHOT = Path(__file__).with_name("autotune_keys.json")
CPU = torch.device("cpu")


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _text(op: str, args: tuple) -> str:
    return autotune.key_string(autotune.make_key(OPS[op], args))


@pytest.fixture
def tf32(monkeypatch):
    """Set PyTorch's TF32 switch (the one the keys read) for the test, restored after it."""
    before = torch.backends.cuda.matmul.allow_tf32

    def set_(on: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = on

    set_(False)
    yield set_
    torch.backends.cuda.matmul.allow_tf32 = before


BF16 = torch.bfloat16
HALF = torch.float16
ROWS_2_20 = torch.empty(1, 8).expand(2**20, 8)  # 2^20 rows of a stride-0 view: nothing allocated


def _hand_made():
    """(call, expected text) pairs; a call is (op, args) built fresh."""
    r = _r
    mlp_w = [r(32, 16), r(8, 32)]
    return [
        # add: numel bucket, broadcast, dense or strided
        (("add", (r(1000), r(1000), 1.0)), "add|float32|n<=1024|same-shape|layout=c"),
        (("add", (r(0), r(0), 1.0)), "add|float32|n0|same-shape|layout=c"),
        (("add", (r(1), r(1), 1.0)), "add|float32|n<=1|same-shape|layout=c"),
        (("add", (r(16, 1, 33), r(9, 33), 1.0)), "add|float32|n<=1024|broadcast|layout=c"),
        (("add", (r(5, 7), r(()), 2.0)), "add|float32|n<=64|broadcast|layout=c"),
        (("add", (r(33, 64)[:, ::2], r(33, 32), 1.0)), "add|float32|n<=2048|same-shape|layout=s"),
        (("add", (r(2**17, dtype=HALF), r(2**17, dtype=HALF), 1.0)),
         "add|float16|n<=2^17|same-shape|layout=c"),
        # relu_scale
        (("relu_scale", (r(300), 1.5)), "relu_scale|float32|n<=512|layout=c"),
        (("relu_scale", (r(40, 24).t(), -0.5)), "relu_scale|float32|n<=1024|layout=s"),
        (("relu_scale", (r(0, 5, dtype=BF16), 1.0)), "relu_scale|bfloat16|n0|layout=c"),
        # matmul: dims, batch, m, k, n, both layouts
        (("matmul", (r(100, 64), r(64, 32))), "matmul|float32|2d@2d|batch<=1|m<=128|k=64|n=32|layout=cc"),
        (("matmul", (r(3, 20, 8), r(3, 8, 4))), "matmul|float32|3d@3d|batch<=4|m<=32|k=8|n=4|layout=cc"),
        (("matmul", (r(3, 20, 8), r(8, 4))), "matmul|float32|3d@2d|batch<=4|m<=32|k=8|n=4|layout=cc"),
        (("matmul", (r(20, 8), r(5, 8, 4))), "matmul|float32|2d@3d|batch<=8|m<=32|k=8|n=4|layout=cc"),
        (("matmul", (r(8, 20).t(), r(4, 8).t())), "matmul|float32|2d@2d|batch<=1|m<=32|k=8|n=4|layout=ss"),
        (("matmul", (r(20, 9)[:, 1:], r(8, 4, dtype=torch.float32))),
         "matmul|float32|2d@2d|batch<=1|m<=32|k=8|n=4|layout=rc"),
        (("matmul", (r(0, 8, dtype=BF16), r(8, 5, dtype=BF16))),
         "matmul|bfloat16|2d@2d|batch<=1|m0|k=8|n=5|layout=cc"),
        (("matmul", (r(0, 2, 8), r(0, 8, 5))), "matmul|float32|3d@3d|batch0|m<=2|k=8|n=5|layout=cc"),
        # linear_gelu: rows of x (any batch shape), k, n, bias, approximate, layouts
        (("linear_gelu", (r(32, 768), r(3072, 768), None, "tanh")),
         "linear_gelu|float32|m<=32|k=768|n=3072|no-bias|tanh|layout=cc"),
        (("linear_gelu", (r(2, 16, 24, dtype=BF16), r(17, 24, dtype=BF16), r(17, dtype=BF16), "none")),
         "linear_gelu|bfloat16|m<=32|k=24|n=17|bias|none|layout=cc"),
        (("linear_gelu", (r(12, 30), r(30, 20).t(), r(20), "tanh")),
         "linear_gelu|float32|m<=16|k=30|n=20|bias|tanh|layout=cs"),
        (("linear_gelu", (r(3, 0, 8), r(4, 8), None, "tanh")),
         "linear_gelu|float32|m0|k=8|n=4|no-bias|tanh|layout=cc"),
        (("linear_gelu", (r(5, 0), r(8, 0), None, "tanh")),
         "linear_gelu|float32|m<=8|k=0|n=8|no-bias|tanh|layout=cc"),
        (("linear_gelu", (ROWS_2_20, r(16, 8), None, "tanh")),
         "linear_gelu|float32|m<=2^20|k=8|n=16|no-bias|tanh|layout=rc"),
        # fused_mlp: rows, every width, which layers have a bias, activation, layout of x
        (("fused_mlp", (r(4096, 100), [r(128, 100), r(64, 128), r(10, 64)],
                        [r(128), r(64), r(10)], "relu")),
         "fused_mlp|float32|m<=4096|w=100-128-64-10|bias=111|relu|layout=c"),
        (("fused_mlp", (r(12, 32)[:, ::2], mlp_w, [None, r(8)], "gelu")),
         "fused_mlp|float32|m<=16|w=16-32-8|bias=01|gelu|layout=s"),
        (("fused_mlp", (r(0, 16, dtype=HALF), [w.half() for w in mlp_w], [None, None], "none")),
         "fused_mlp|float16|m0|w=16-32-8|bias=00|none|layout=c"),
        # linear_glu: rows, k, n (half a packed weight), biases, activation, layouts (p: packed)
        (("linear_glu", (r(9, 40), r(24, 40), r(24, 40), None, None, "silu", "tanh")),
         "linear_glu|float32|m<=16|k=40|n=24|bias=00|silu|layout=ccc"),
        (("linear_glu", (r(11, 24), r(36, 24), None, r(36), None, "gelu", "tanh")),
         "linear_glu|float32|m<=16|k=24|n=18|bias=10|gelu(tanh)|layout=ccp"),
        (("linear_glu", (r(9, 40), r(24, 40), r(24, 40), r(24), r(24), "gelu", "none")),
         "linear_glu|float32|m<=16|k=40|n=24|bias=11|gelu(none)|layout=ccc"),
        (("linear_glu", (r(12, 48, dtype=BF16)[:, ::2], r(30, 20, dtype=BF16).t(),
                         r(30, 20, dtype=BF16).t(), None, r(20, dtype=BF16), "relu", "tanh")),
         "linear_glu|bfloat16|m<=16|k=24|n=20|bias=01|relu|layout=sss"),
    ]  # fmt: skip


def test_hand_made_calls_keep_their_key_text(tf32):
    for (op, args), expected in _hand_made():
        assert _text(op, args) == expected, (op, [getattr(a, "shape", a) for a in args])


def test_tf32_is_its_own_class_for_the_matrix_ops_only(tf32):
    calls = {
        "add": (_r(64), _r(64), 1.0),
        "relu_scale": (_r(64), 1.0),
        "matmul": (_r(64, 64), _r(64, 64)),
        "linear_gelu": (_r(8, 16), _r(4, 16), None, "tanh"),
        "fused_mlp": (_r(8, 16), [_r(4, 16)], [None], "relu"),
        "linear_glu": (_r(8, 16), _r(4, 16), _r(4, 16), None, None, "silu", "tanh"),
    }
    off = {op: _text(op, args) for op, args in calls.items()}
    tf32(True)
    on = {op: _text(op, args) for op, args in calls.items()}
    for op in calls:
        matrix = op not in ("add", "relu_scale")
        assert on[op] == (off[op].replace("float32", "float32+tf32", 1) if matrix else off[op])
    assert (_text("matmul", (_r(64, 64, dtype=BF16), _r(64, 64, dtype=BF16)))
            == "matmul|bfloat16|2d@2d|batch<=1|m<=64|k=64|n=64|layout=cc")  # fmt: skip


def _registry_keys() -> dict[str, dict[str, str]]:
    """Every CPU shape case of the built-in operators, per dtype, TF32 off and on: the key's text
    and the in-memory tuple's repr."""
    out = {}
    for op in sorted(("add", "relu_scale", "matmul", "linear_gelu", "fused_mlp", "linear_glu")):
        spec = OPS[op]
        for case in spec.cases:
            if case.gpu_only:
                continue
            for dtype in DTYPES:
                sample = case.make(dtype, CPU, torch.Generator().manual_seed(0))
                args = autotune.implementation_args(spec, sample.args, sample.kwargs)
                for on in (False, True):
                    torch.backends.cuda.matmul.allow_tf32 = on
                    key = autotune.make_key(spec, args)
                    name = f"{op}/{case.name}/{str(dtype).removeprefix('torch.')}"
                    out[name + ("/tf32" if on else "")] = {
                        "text": autotune.key_string(key),
                        "tuple": repr(key),
                    }
    return out


def test_every_registry_case_keeps_its_key(tf32):
    expected = json.loads(SNAPSHOT.read_text())
    actual = _registry_keys()
    assert sorted(actual) == sorted(expected)
    changed = {name: (expected[name], actual[name]) for name in expected
               if expected[name] != actual[name]}  # fmt: skip
    assert changed == {}


if __name__ == "__main__":  # writes the snapshot: only for a deliberate change of the key
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        SNAPSHOT.write_text(json.dumps(_registry_keys(), indent=1, sort_keys=True) + "\n")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
