"""The backend precedence (README's table), errors for unknown or unavailable backends, `explain`
and the cost of dispatch."""

import dataclasses
import os
import time

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import dualk
from dualk import dispatch
from dualk.backends import unavailable_reason
from dualk.core.errors import BackendUnavailableError, UnknownBackendError
from dualk.registry import OPS

SPEC = OPS["relu_scale"]


def source(backend="auto"):
    return dispatch.requested(SPEC, backend)


def test_default_is_auto():
    assert source() == ("auto", "default")


def test_precedence_top_to_bottom(monkeypatch, tmp_path):
    cfg = tmp_path / "dualk.toml"
    cfg.write_text('[backend]\ndefault = "cuda"\nrelu_scale = "triton"\n')
    monkeypatch.setenv("DUALK_CONFIG", str(cfg))
    dualk.dispatch.config.reload()
    assert source() == ("triton", "config")  # the op's own key beats the config's default
    dualk.set_default_backend("cuda")
    assert source() == ("cuda", "set_default_backend()")
    with dualk.use_backend("torch"):
        assert source() == ("torch", "use_backend()")
        monkeypatch.setenv("DUALK_BACKEND", "cuda")
        assert source() == ("cuda", "DUALK_BACKEND")
        monkeypatch.setenv("DUALK_BACKEND_RELU_SCALE", "triton")
        assert source() == ("triton", "DUALK_BACKEND_RELU_SCALE")
        assert source("torch") == ("torch", "the backend= argument")
        # "auto" as the argument defers to the environment.
        assert source("auto") == ("triton", "DUALK_BACKEND_RELU_SCALE")


def test_config_default_key_applies_to_every_op(monkeypatch, tmp_path):
    cfg = tmp_path / "dualk.toml"
    cfg.write_text('[backend]\ndefault = "torch"\n')
    monkeypatch.setenv("DUALK_CONFIG", str(cfg))
    dualk.dispatch.config.reload()
    assert dispatch.requested(OPS["add"], "auto") == ("torch", "config")


def test_explain_names_the_config_file_and_each_named_backends_availability(monkeypatch, tmp_path):
    """A backend from the config file: explain names the file. A named backend: the others are
    listed by whether they could run if named, not by auto's rule against the CPU interpreter."""
    cfg = tmp_path / "dualk.toml"
    cfg.write_text('[backend]\ndefault = "torch"\n')
    monkeypatch.setenv("DUALK_CONFIG", str(cfg))
    dualk.dispatch.config.reload()
    x = torch.randn(4, 4, device=DEVICE)
    expl = dualk.explain("add", x, x)
    assert expl.source == "config" and any(str(cfg) in n for n in expl.notes), str(expl)
    named = dualk.explain("add", x, x, backend="torch")
    assert named.availability["torch"] is None
    assert named.availability["triton"] == unavailable_reason("triton", x.device)
    assert "auto does not use" not in str(named)


def test_env_is_read_at_call_time(monkeypatch):
    x = torch.randn(8)
    monkeypatch.setenv("DUALK_BACKEND_RELU_SCALE", "bogus")
    with pytest.raises(UnknownBackendError, match="DUALK_BACKEND_RELU_SCALE"):
        dualk.relu_scale(x, 2.0)
    monkeypatch.setenv("DUALK_BACKEND_RELU_SCALE", "torch")
    assert torch.equal(dualk.relu_scale(x, 2.0), torch.relu(x) * 2.0)


def test_env_for_one_op_leaves_others_alone(monkeypatch):
    monkeypatch.setenv("DUALK_BACKEND_ADD", "triton")
    assert source() == ("auto", "default")


def test_scopes_nest_and_restore():
    with dualk.use_backend("triton"):
        with dualk.use_backend("torch"):
            assert source()[0] == "torch"
        assert source()[0] == "triton"
    assert source()[0] == "auto"


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(UnknownBackendError, match="valid names: cuda, triton, torch, auto"):
        dualk.add(torch.randn(3), torch.randn(3), backend="cudnn")
    with pytest.raises(UnknownBackendError):
        dualk.use_backend("fast").__enter__()
    with pytest.raises(UnknownBackendError):
        dualk.set_default_backend("fast")


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only message")
def test_unavailable_backend_says_why():
    with pytest.raises(BackendUnavailableError, match="needs CUDA tensors; the input is on cpu"):
        dualk.add(torch.randn(3), torch.randn(3), backend="cuda")


def test_env_requested_unavailable_backend_names_the_variable(monkeypatch):
    monkeypatch.setenv("DUALK_BACKEND", "cuda")
    with pytest.raises(BackendUnavailableError, match="requested by DUALK_BACKEND"):
        dualk.relu_scale(torch.randn(3), 1.0)


def test_auto_on_cpu_is_torch():
    dispatch.clear_auto_cache()
    x = torch.randn(5)
    assert dispatch.choose(SPEC, "auto", (x, 1.0)) == "torch"


@pytest.mark.skipif(not HAS_CUDA, reason="auto times the GPU backends only on a GPU")
def test_auto_on_gpu_times_every_backend_and_runs_the_fastest():
    """On a GPU tensor auto times cuda, triton and torch, and runs one whose score is within the
    tie margin of the least."""
    from dualk.dispatch import autotune

    x = torch.randn(3000, device="cuda")
    try:
        details = autotune.tune(SPEC, (x, 1.0), force=True)  # timed now, whatever a cache holds
        dispatch.clear_auto_cache()
        chosen = dispatch.choose(SPEC, "auto", (x, 1.0))  # the recorded winner, read back
        assert details["source"] == "tuned" and details["backend"] == chosen, details
        times = details["times_us"]
        assert set(times) == {"cuda", "triton", "torch"}, details
        assert all(t > 0 for t in times.values())
        best = min(times.values())
        assert times[chosen] <= best + max(autotune.TIE_FRACTION * best, autotune.TIE_US) + 1e-3
    finally:
        autotune.clear_memory()


def test_explain_names_backend_source_and_reasons(monkeypatch):
    x = torch.randn(4, 4, device=DEVICE)
    text = str(dualk.explain("relu_scale", x, 2.0))
    assert "runs on" in text and "torch" in text and "available" in text
    monkeypatch.setenv("DUALK_BACKEND", "torch")
    expl = dualk.explain("add", x, x)
    assert expl.backend == "torch" and expl.source == "DUALK_BACKEND"


def test_explain_reports_mlp_fallback():
    x = torch.randn(3, 16, device=DEVICE)
    weights = [torch.randn(1024, 16, device=DEVICE), torch.randn(4, 1024, device=DEVICE)]
    expl = dualk.explain("fused_mlp", x, weights, [None, None], backend="triton")
    assert expl.availability["triton"] is None, str(expl)  # the interpreter on CPU, or the GPU
    assert any("per-layer chain" in n for n in expl.notes), str(expl)


def test_explain_takes_keyword_arguments():
    x = torch.randn(4, 8, device=DEVICE)
    by_name = dualk.explain("add", a=x, b=x, alpha=2.0)
    assert by_name.backend == dualk.explain("add", x, x).backend
    w = torch.nn.Linear(8, 3).to(DEVICE)
    expl = dualk.explain("linear_gelu", x=x, weight=w.weight, bias=w.bias, backend="torch")
    assert expl.backend == "torch" and expl.source == "the backend= argument"
    with pytest.raises(dualk.InvalidArgumentError, match="explain"):
        dualk.explain("add", x, x, gamma=1.0)


def test_missing_config_named_by_env_is_an_error_naming_it(monkeypatch, tmp_path):
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("DUALK_CONFIG", str(missing))
    with pytest.raises(dualk.ConfigError, match="nope.toml"):
        dualk.dispatch.config.reload()
    with pytest.raises(ValueError, match="nope.toml"):  # ConfigError is a ValueError too
        dualk.add(torch.randn(3), torch.randn(3))


@pytest.mark.parametrize(
    "text,match",
    [
        ("[backend\ndefault = 1", "cannot be read as TOML"),
        ('backend = "cuda"\n', "must map operator names"),
        ('[backend]\ndefault = "cudnn"\n', "'cudnn' is not a backend"),
    ],
)
def test_malformed_config_is_an_error_naming_the_file(monkeypatch, tmp_path, text, match):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    monkeypatch.setenv("DUALK_CONFIG", str(cfg))
    with pytest.raises(dualk.ConfigError, match=match) as info:
        dualk.dispatch.config.reload()
    assert str(cfg) in str(info.value)


def test_unknown_config_keys_warn_once_naming_file_and_key(monkeypatch, tmp_path):
    cfg = tmp_path / "extra.toml"
    cfg.write_text('[backend]\nconv2d = "cuda"\n[tuning]\nx = 1\n')
    monkeypatch.setenv("DUALK_CONFIG", str(cfg))
    with pytest.warns(dualk.dispatch.config.ConfigWarning) as record:
        assert dualk.dispatch.config.reload() == {"conv2d": "cuda"}
    texts = [str(w.message) for w in record]
    assert any("'conv2d'" in t and str(cfg) in t for t in texts)
    assert any("[tuning]" in t for t in texts)
    assert all(w.filename == __file__ for w in record), [w.filename for w in record]  # our line


def test_explain_validates_its_arguments():
    with pytest.raises(TypeError, match="dtype"):
        dualk.explain("add", torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32))
    with pytest.raises(dualk.InvalidArgumentError, match="unknown operator 'conv'"):
        dualk.explain("conv", torch.randn(3))
    with pytest.raises(ValueError, match="unknown operator"):  # not a KeyError or TypeError
        dualk.explain(["add"], torch.randn(3))


def test_dispatch_overhead_is_small():
    """Host cost of choosing a backend with a cached decision (the full number is in the bench)."""
    x = torch.randn(16)
    dualk.relu_scale(x, 1.0)
    n = 2000
    rounds_us = []
    for _ in range(3):  # the least of three: a busy CI host only adds time
        t0 = time.perf_counter()
        for _ in range(n):
            dispatch.choose(SPEC, "auto", (x, 1.0))
        rounds_us.append((time.perf_counter() - t0) / n * 1e6)
    per_call_us = min(rounds_us)
    assert per_call_us < 20, f"dispatch took {per_call_us:.1f} us per call"
    assert "DUALK_BACKEND" not in os.environ


def test_auto_order_can_differ_by_dtype():
    spec = dataclasses.replace(
        OPS["fused_mlp"],
        auto_order=("triton", "cuda", "torch"),
        auto_order_by_dtype={torch.float32: ("cuda", "triton", "torch")},
    )
    cpu = torch.device("cpu")
    assert [b for b, _ in dispatch.auto_candidates(spec, cpu, torch.float32)][0] == "cuda"
    assert [b for b, _ in dispatch.auto_candidates(spec, cpu, torch.float16)][0] == "triton"
    assert [b for b, _ in dispatch.auto_candidates(spec, cpu, torch.float16)][-1] == "torch"


def test_every_per_operator_table_covers_exactly_the_registry():
    """The registry is the one list of operators; the few tables keyed by operator elsewhere
    (hot-path code that cannot afford a registry lookup) must name exactly its operators, or a
    new operator would fail far from where it was added. auto's key and its field names come
    from each entry itself."""
    from dualk import ops
    from dualk.autograd import eager as eager_autograd
    from dualk.autograd import library
    from dualk.dispatch import autotune
    from dualk.registry import OPS

    names = set(OPS)
    tables = {
        "autotune.KEY_FUNCTIONS": autotune.KEY_FUNCTIONS,  # views of the entries' key, key_fields
        "autotune.FIELDS": autotune.FIELDS,
        "eager_autograd._OPS": eager_autograd._OPS,
        "ops._PUBLIC": ops._PUBLIC,
    }
    for where, table in tables.items():
        assert set(table) == names, f"{where} has {sorted(table)}, the registry {sorted(names)}"
    for name, spec in OPS.items():
        assert callable(spec.key) and spec.key_fields, f"{name}: no key or key_fields"
    for name in names:  # a public function, a registered op, a custom-op wrapper each
        assert callable(getattr(ops, name)) and hasattr(torch.ops.dualk, name)
        assert callable(getattr(library, f"run_{name}"))


def test_default_config_and_cache_locations(monkeypatch, tmp_path):
    """Without DUALK_CONFIG / DUALK_CACHE_DIR: $XDG_CONFIG_HOME/dualk/config.toml, else
    ~/.config/dualk/config.toml, is read, and the caches live under $XDG_CACHE_HOME/dualk, else
    ~/.cache/dualk (README, "Config file" and "Cache files")."""
    from dualk.backends.cuda import cache_root

    monkeypatch.delenv("DUALK_CONFIG", raising=False)
    xdg, home = tmp_path / "xdg", tmp_path / "home"
    for cfg, value in ((xdg / "dualk" / "config.toml", "torch"),
                       (home / ".config" / "dualk" / "config.toml", "triton")):  # fmt: skip
        cfg.parent.mkdir(parents=True)
        cfg.write_text(f'[backend]\nrelu_scale = "{value}"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.setenv("HOME", str(home))
    dualk.dispatch.config.reload()
    assert source() == ("torch", "config")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    dualk.dispatch.config.reload()
    assert source() == ("triton", "config")

    monkeypatch.delenv("DUALK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    assert cache_root() == tmp_path / "xdg-cache" / "dualk"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == home / ".cache" / "dualk"
