"""Input checks shared by the kernel launch wrappers."""

from __future__ import annotations

import torch

from hosttune_engine.errors import KernelInputError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def check(condition: bool, message: str, *args) -> None:
    """Raise KernelInputError(message.format(*args)) unless `condition`. The checks run on every kernel
    launch of an eager step, so a message is formatted only on failure: formatting shapes, dtypes and
    devices up front cost ~100 us a prefill attention call on the H200 host."""
    if not condition:
        raise KernelInputError(message.format(*args) if args else message)


def check_tensor(name: str, t: torch.Tensor, ndim: int, dtypes=FLOAT_DTYPES, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise KernelInputError(f"{name} must be a tensor")
    if t.dim() != ndim:
        raise KernelInputError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise KernelInputError(f"{name} has dtype {t.dtype}; expected one of {dtypes}")
    if device is not None and t.device != device:
        raise KernelInputError(f"{name} is on {t.device}, expected {device}")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise KernelInputError(f"{name} must be contiguous in its last dim (strides {t.stride()})")


def check_pow2(name: str, value: int) -> None:
    check(value > 0 and value & (value - 1) == 0, "{} must be a power of two, got {}", name, value)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
