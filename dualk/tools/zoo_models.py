"""The model zoo's registry (dualk/tools/zoo.py runs it): models from configs with random weights, never
downloaded, each at two sizes, "gpu" (the sizes issue 32 measured) and "cpu" (a few rows, small
widths and 1-2 layers where the config allows, so the whole zoo runs on a CPU in a minute or two).

A builder takes (device, dtype, size) and returns a `Built`: the model (in eval mode, on `device`,
in `dtype`) and a function making its example inputs. Optional packages (timm, transformers,
torchvision: the `models` extra) are imported inside the builders; a missing one makes
`unavailable(spec)` return the reason, and the zoo reports the model as skipped.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Inputs = tuple[tuple, dict]  # positional and keyword arguments of one forward


@dataclass
class Built:
    model: nn.Module
    make_inputs: Callable[[], Inputs]
    note: str = ""  # how it was built, where it matters (e.g. which LLaMA implementation)


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry. `rows` says what one forward takes at each size ("32", "8x512 tokens");
    `modes` are the modes it runs in by default; `fullgraph` whether torch.compile is asked for
    one graph (False for the timm and transformers models, whose forwards break graphs)."""

    name: str
    family: str  # "mlp", "vision", "transformer"
    description: str
    build: Callable[[torch.device, torch.dtype, str], Built]
    dtype: torch.dtype
    rows: dict[str, str]
    modes: tuple[str, ...] = ("eager", "compiled")
    requires: tuple[str, ...] = ()
    fullgraph: bool = True


def unavailable(spec: ModelSpec) -> str | None:
    """Why `spec` cannot be built here (a required package missing or failing to import), or
    None. The import error's own message is kept: timm without torchvision fails on that."""
    for package in spec.requires:
        try:
            importlib.import_module(package)
        except Exception as exc:  # ImportError, or a package broken against this torch
            missing = isinstance(exc, ImportError) and exc.name in (package, None)
            what = "not installed" if missing else "does not import"
            return f"{package} {what} ({type(exc).__name__}: {exc}); pip install 'dualk[models]'"
    return None


def _gpu(size: str) -> bool:
    if size not in ("gpu", "cpu"):
        raise ValueError(f"size must be 'gpu' or 'cpu', got {size!r}")
    return size == "gpu"


def _randn(rows: int, features: int, device, dtype) -> Callable[[], Inputs]:
    def make() -> Inputs:
        return (torch.randn(rows, features, device=device, dtype=dtype),), {}

    return make


# ---------------------------------------------------------------------------- MLPs
class DNNModel(nn.Module):
    """The seed article's model (examples/seed_dnn.py): 100-128-64-10 with ReLU, its attribute
    names kept (layer1, relu1, layer2, relu2, layer3)."""

    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(100, 128)
        self.relu1 = nn.ReLU()
        self.layer2 = nn.Linear(128, 64)
        self.relu2 = nn.ReLU()
        self.layer3 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.relu1(self.layer1(x))
        x = self.relu2(self.layer2(x))
        return self.layer3(x)


def mlp(widths: list[int]) -> nn.Sequential:
    """nn.Sequential of nn.Linear with nn.ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _seed_dnn(batch_gpu: int, batch_cpu: int):
    def build(device, dtype, size) -> Built:
        rows = batch_gpu if _gpu(size) else batch_cpu
        with device:
            model = DNNModel()
        return Built(model.to(dtype).eval(), _randn(rows, 100, device, dtype))

    return build


def _mlp(widths: list[int], rows_gpu: int, rows_cpu: int):
    def build(device, dtype, size) -> Built:
        rows = rows_gpu if _gpu(size) else rows_cpu
        with device:
            model = mlp(widths)
        return Built(model.to(dtype).eval(), _randn(rows, widths[0], device, dtype))

    return build


def _torchvision_mlp(device, dtype, size) -> Built:
    from torchvision.ops import MLP

    if _gpu(size):
        dims, rows = (256, [512, 512, 256]), 65536
    else:
        dims, rows = (16, [32, 32, 16]), 8
    with device:
        model = MLP(dims[0], dims[1], dropout=0.0)
    return Built(model.to(dtype).eval(), _randn(rows, dims[0], device, dtype))


# ---------------------------------------------------------------------------- timm
def _timm(name: str, batch_gpu: int, cpu_class: str, cpu_args: dict):
    """timm.create_model(name) on a GPU; on the CPU the same class, built directly (the named
    models fix their depth and width: create_model refuses them as overrides) 32x32, 1 block.
    Without a classifier head (num_classes=0): timm zero-initialises Mixer's, and an output of
    zeros would make the error check compare nothing; the output is the pooled features."""

    def build(device, dtype, size) -> Built:
        import timm

        module, cls = cpu_class.rsplit(".", 1)
        with device:
            if _gpu(size):
                model = timm.create_model(name, pretrained=False, num_classes=0)
                batch, image = batch_gpu, 224
            else:
                small = getattr(importlib.import_module(module), cls)
                model = small(img_size=32, patch_size=16, num_classes=0, **cpu_args)
                batch, image = 2, 32

        def make() -> Inputs:
            return (torch.randn(batch, 3, image, image, device=device, dtype=dtype),), {}

        return Built(model.to(dtype).eval(), make)

    return build


# ---------------------------------------------------------------------------- transformers
def _tokens(batch: int, seq: int, vocab: int, device) -> Callable[[], Inputs]:
    def make() -> Inputs:
        return (), {"input_ids": torch.randint(0, vocab, (batch, seq), device=device)}

    return make


# (batch, sequence) of a forward: 8x512 tokens on a GPU, 2x16 on the CPU
def _batch_seq(size: str) -> tuple[int, int]:
    return (8, 512) if _gpu(size) else (2, 16)


def _token_model(model_cls, config, device, dtype, size: str) -> Built:
    """A transformers model built from `config` on `device` in eval() and `dtype`, called on
    token ids (_batch_seq of them) from its vocabulary."""
    with device:
        model = model_cls(config)
    return Built(model.to(dtype).eval(), _tokens(*_batch_seq(size), config.vocab_size, device))


def _bert(device, dtype, size) -> Built:
    from transformers import BertConfig, BertModel

    big = _gpu(size)
    config = BertConfig(
        num_hidden_layers=4 if big else 1,
        hidden_size=768 if big else 64,
        num_attention_heads=12 if big else 2,
        intermediate_size=3072 if big else 128,
        vocab_size=30522 if big else 128,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,  # train mode then computes what eval does: outputs comparable
        attention_probs_dropout_prob=0.0,
    )
    return _token_model(BertModel, config, device, dtype, size)


def _gpt2(device, dtype, size) -> Built:
    from transformers import GPT2Config, GPT2Model

    big = _gpu(size)
    vocab = 50257 if big else 128
    config = GPT2Config(
        n_layer=4 if big else 1,
        n_embd=768 if big else 64,
        n_head=12 if big else 2,
        vocab_size=vocab,
        n_positions=1024,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    return _token_model(GPT2Model, config, device, dtype, size)


def _starcoder2(device, dtype, size) -> Built:
    """transformers' Starcoder2Model: its MLP (c_fc, GELU tanh, c_proj) ends in
    F.dropout(..., training=self.training), which fuse takes for the mode it is fused in."""
    from transformers import Starcoder2Config, Starcoder2Model

    big = _gpu(size)
    vocab = 32000 if big else 128
    config = Starcoder2Config(
        num_hidden_layers=4 if big else 1,
        hidden_size=768 if big else 64,
        intermediate_size=3072 if big else 256,
        num_attention_heads=12 if big else 2,
        num_key_value_heads=4 if big else 2,
        vocab_size=vocab,
        max_position_embeddings=1024,
        residual_dropout=0.0,
        embedding_dropout=0.0,
        attention_dropout=0.0,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    return _token_model(Starcoder2Model, config, device, dtype, size)


def _llama_sizes(size: str) -> dict:
    if _gpu(size):  # intermediate 5504 = 2.6875 x 2048, a multiple of 64 (LLaMA's ~8/3)
        return dict(layers=4, hidden=2048, intermediate=5504, heads=16, vocab=32000)
    return dict(layers=1, hidden=64, intermediate=176, heads=2, vocab=128)


def _llama(device, dtype, size) -> Built:
    """transformers' LlamaModel where transformers imports; else the pure-PyTorch block below
    (the note says which was built)."""
    s = _llama_sizes(size)
    try:
        from transformers import LlamaConfig, LlamaModel
    except Exception as exc:
        with device:
            model = TorchLlama(s["vocab"], s["hidden"], s["intermediate"], s["layers"], s["heads"])
        note = f"pure-PyTorch LLaMA-style model (transformers unavailable: {type(exc).__name__})"
    else:
        config = LlamaConfig(
            num_hidden_layers=s["layers"],
            hidden_size=s["hidden"],
            intermediate_size=s["intermediate"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["heads"],
            vocab_size=s["vocab"],
            max_position_embeddings=2048,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=None,
        )
        with device:
            model = LlamaModel(config)
        note = "transformers LlamaModel"
    make = _tokens(*_batch_seq(size), s["vocab"], device)
    return Built(model.to(dtype).eval(), make, note)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaAttention(nn.Module):
    """Causal multi-head attention through F.scaled_dot_product_attention (no rotary embedding:
    what the zoo measures is the Linear layers around it)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape

        def split(t):
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h))


class LlamaBlock(nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = LlamaAttention(hidden, heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = LlamaMLP(hidden, intermediate)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TorchLlama(nn.Module):
    """A LLaMA-style decoder in plain PyTorch (embedding, pre-norm blocks, final RMSNorm):
    the zoo's "llama" entry where transformers is missing."""

    def __init__(self, vocab: int, hidden: int, intermediate: int, layers: int, heads: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(LlamaBlock(hidden, intermediate, heads) for _ in range(layers))
        self.norm = RMSNorm(hidden)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


# ---------------------------------------------------------------------------- the registry
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
NERF = [32, 64, 64, 64, 16]
WIDE = [256, 512, 512, 512, 128]
_TRANSFORMER_ROWS = {"gpu": "8x512 tokens", "cpu": "2x16 tokens"}
_TRAIN = ("train",)

_SPECS = [
    ModelSpec("seed_dnn", "mlp", "the seed's DNNModel 100-128-64-10 ReLU", _seed_dnn(32, 4), FP32,
              {"gpu": "32", "cpu": "4"}),
    ModelSpec("seed_dnn_65536", "mlp", "the seed's DNNModel, batch 65536", _seed_dnn(65536, 64),
              FP32, {"gpu": "65536", "cpu": "64"}),
    ModelSpec("nerf_mlp", "mlp", "NeRF-style MLP 32-64-64-64-16 ReLU", _mlp(NERF, 2**20, 64),
              FP16, {"gpu": "2^20", "cpu": "64"}),
    ModelSpec("torchvision_mlp", "mlp", "torchvision.ops.MLP(256, [512, 512, 256], dropout=0.0)",
              _torchvision_mlp, BF16, {"gpu": "65536", "cpu": "8"}, requires=("torchvision",)),
    ModelSpec("vit_small", "vision", "timm vit_small_patch16_224, random init",
              _timm("vit_small_patch16_224", 64, "timm.models.vision_transformer.VisionTransformer",
                    dict(depth=1, embed_dim=64, num_heads=2)), BF16,
              {"gpu": "64 images", "cpu": "2 images 32x32"}, requires=("timm",), fullgraph=False),
    ModelSpec("mixer_b16", "vision", "timm mixer_b16_224, random init",
              _timm("mixer_b16_224", 32, "timm.models.mlp_mixer.MlpMixer",
                    dict(num_blocks=1, embed_dim=64)), BF16,
              {"gpu": "32 images", "cpu": "2 images 32x32"}, requires=("timm",), fullgraph=False),
    ModelSpec("bert", "transformer", "transformers BertModel, 4 layers, hidden 768", _bert, BF16,
              _TRANSFORMER_ROWS, requires=("transformers",), fullgraph=False),
    ModelSpec("gpt2", "transformer", "transformers GPT2Model, 4 layers, hidden 768", _gpt2, BF16,
              _TRANSFORMER_ROWS, requires=("transformers",), fullgraph=False),
    ModelSpec("starcoder2", "transformer", "transformers Starcoder2Model, 4 layers, hidden 768 "
              "(its MLP reads self.training)", _starcoder2, BF16, _TRANSFORMER_ROWS,
              requires=("transformers",), fullgraph=False),
    ModelSpec("llama", "transformer", "LLaMA-style decoder, 4 layers, hidden 2048, intermediate "
              "5504 (transformers LlamaModel; pure PyTorch without transformers)", _llama, BF16,
              _TRANSFORMER_ROWS, fullgraph=False),
    ModelSpec("nerf_mlp_train", "mlp", "training step, NeRF-style MLP 32-64-64-64-16",
              _mlp(NERF, 2**18, 64), FP16, {"gpu": "2^18", "cpu": "64"}, _TRAIN),
    ModelSpec("mlp128x4_train", "mlp", "training step, 128-128-128-128-128 ReLU",
              _mlp([128] * 5, 2**18, 64), BF16, {"gpu": "2^18", "cpu": "64"}, _TRAIN),
    ModelSpec("mlp256x4_train", "mlp", "training step, 256-256-256-256-256 ReLU",
              _mlp([256] * 5, 2**16, 64), BF16, {"gpu": "2^16", "cpu": "64"}, _TRAIN),
    ModelSpec("mlp_wide_train_bf16", "mlp", "training step, 256-512-512-512-128 ReLU",
              _mlp(WIDE, 65536, 64), BF16, {"gpu": "65536", "cpu": "64"}, _TRAIN),
    ModelSpec("mlp_wide_train_fp32", "mlp", "training step, 256-512-512-512-128 ReLU",
              _mlp(WIDE, 65536, 64), FP32, {"gpu": "65536", "cpu": "64"}, _TRAIN),
]  # fmt: skip

MODELS: dict[str, ModelSpec] = {s.name: s for s in _SPECS}
