"""Which implementation the kernel-backed layers run: Triton kernels or torch references."""

from __future__ import annotations

from torch import nn


class KernelLayer(nn.Module):
    """A layer with two implementations of its hot path; `use_triton` picks one."""

    use_triton: bool = False


def set_kernel_backend(model: nn.Module, use_triton: bool) -> None:
    """Switch every kernel-backed layer of a built model (same weights, same KV cache)."""
    for module in model.modules():
        if isinstance(module, KernelLayer) or "use_triton" in vars(module):  # kernel layers, GEMV transform
            module.use_triton = use_triton
