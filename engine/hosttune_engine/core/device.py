"""The device and dtype an engine runs on, from its config's names."""

from __future__ import annotations

import torch

from hosttune_engine.config import activation_dtype, runs_triton
from hosttune_engine.errors import ConfigError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use device='cpu' or 'auto'")
    return torch.device(name)


def use_triton(backend: str, device: torch.device) -> bool:
    """Whether the Triton kernels run on `device` (config.runs_triton)."""
    return runs_triton(backend, device.type == "cuda")


def resolve_dtype(name: str, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    return DTYPES[activation_dtype(name, checkpoint_dtype, device.type == "cuda")]
