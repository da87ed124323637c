"""The device and dtype an engine runs on, from its config's names."""

from __future__ import annotations

import os

import torch

from hosttune_engine.config import activation_dtype
from hosttune_engine.errors import ConfigError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use device='cpu' or 'auto'")
    return torch.device(name)


def use_triton(backend: str, device: torch.device) -> bool:
    """Whether the Triton kernels run: `triton` asks for them anywhere, `auto` on CUDA. Triton has no CPU driver,
    so on the CPU only its interpreter runs them."""
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError("kernel_backend='triton' on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, slow); "
                          "use kernel_backend 'auto' or 'torch'")
    return backend == "triton" or (backend == "auto" and device.type == "cuda")


def resolve_dtype(name: str, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    return DTYPES[activation_dtype(name, checkpoint_dtype, device.type == "cuda")]
