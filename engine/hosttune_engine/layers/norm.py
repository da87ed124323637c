"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.kernels.rmsnorm import rms_norm, rms_norm_ref
from hosttune_engine.layers.backend import KernelLayer
from hosttune_engine.layers.deferred import defer_rms_norm, runs_batched
from hosttune_engine.layers.one_row import runs_one_row


class RMSNorm(KernelLayer):
    defer_one_row: bool = False  # set by the one-row GEMV transform (layers/one_row.py)
    defer_rows: bool = False  # any row count: set where the consumer quantizes to FP8 (quant/transform.py)

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H] -> normed [T, H]; with a residual, (normed(x + residual), x + residual)."""
        if (self.defer_one_row and runs_one_row(self, x)) or (self.defer_rows and runs_batched(self, x)):
            return defer_rms_norm(x, self.weight, self.eps, residual)  # the next projection computes it
        fn = rms_norm if self.use_triton else rms_norm_ref
        return fn(x, self.weight, self.eps, residual=residual)
