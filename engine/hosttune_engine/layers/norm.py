"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.kernels.rmsnorm import rms_norm, rms_norm_ref
from hosttune_engine.layers.backend import KernelLayer


class RMSNorm(KernelLayer):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H] -> normed [T, H]; with a residual, (normed(x + residual), x + residual)."""
        fn = rms_norm if self.use_triton else rms_norm_ref
        return fn(x, self.weight, self.eps, residual=residual)
