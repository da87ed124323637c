"""Tensor descriptors (TMA on Hopper): whether tensors can be read through them, and the scratch memory the
descriptors a kernel makes for itself need.

A descriptor moves a whole tile in one asynchronous copy, zero-filling what lies outside the tensor, instead
of every thread computing and loading its own addresses. It needs a 16-byte aligned base address and row
strides that are multiples of 16 bytes.
"""

from __future__ import annotations

import torch
import triton


def descriptors_fit(*tensors: torch.Tensor) -> bool:
    """Whether every 2-D or 3-D tensor's base address and leading strides are 16-byte aligned."""
    return all(x.data_ptr() % 16 == 0 and all(s * x.element_size() % 16 == 0 for s in x.stride()[:-1])
               for x in tensors)


def _alloc_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def use_torch_allocator() -> None:
    """Descriptors made inside a kernel need a little global scratch per launch, which Triton asks its
    allocator for. The setting is per thread (a context variable), so it is made where the kernel launches."""
    triton.set_allocator(_alloc_scratch)
