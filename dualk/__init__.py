"""dualk: PyTorch operators with two hand-written GPU backends (CUDA C++ and Triton) behind one
dispatcher. Start with `dualk.ops`, `dualk.explain` and `dualk.use_backend`."""

from . import nn, ops
from .autograd import library  # library registers torch.ops.dualk.<op>
from .core.errors import (
    BackendUnavailableError,
    BackendWarning,
    BuildNotice,
    ConfigError,
    DeviceMismatchError,
    DtypeError,
    DualkError,
    InvalidArgumentError,
    InvalidTypeError,
    ShapeError,
    UnknownBackendError,
)
from .dispatch import set_default_backend, use_backend
from .fuse import FuseReport, fuse
from .ops import add, explain, fused_mlp, linear_gelu, linear_glu, matmul, relu_scale
from .registry import OPS

__version__ = "0.1.0"

__all__ = [
    "OPS",
    "BackendUnavailableError",
    "BackendWarning",
    "BuildNotice",
    "ConfigError",
    "DeviceMismatchError",
    "DtypeError",
    "DualkError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "ShapeError",
    "UnknownBackendError",
    "add",
    "explain",
    "fuse",
    "FuseReport",
    "fused_mlp",
    "linear_gelu",
    "linear_glu",
    "matmul",
    "library",
    "nn",
    "ops",
    "relu_scale",
    "set_default_backend",
    "use_backend",
]
