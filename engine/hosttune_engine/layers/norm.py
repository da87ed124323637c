"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.kernels.rmsnorm import rms_norm, rms_norm_ref
from hosttune_engine.layers.backend import KernelLayer
from hosttune_engine.layers.deferred import defer_rms_norm
from hosttune_engine.layers.linear import planned
from hosttune_engine.plan.kinds import Fusion


class RMSNorm(KernelLayer):
    feeds = None  # the choices of the projection this norm feeds, where that one may compute it (planner/prepare.py)

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H] -> normed [T, H]; with a residual, (normed(x + residual), x + residual)."""
        if defers(self, x):
            return defer_rms_norm(x, self.weight, self.eps, residual)  # the next projection computes it
        fn = rms_norm if self.use_triton else rms_norm_ref
        return fn(x, self.weight, self.eps, residual=residual)


def defers(layer: KernelLayer, x) -> bool:
    """Whether the projection this layer feeds computes it, for x's row count (its plan fuses its input)."""
    choice = planned(layer.feeds, layer.use_triton, x)
    return choice is not None and choice.fusion is not Fusion.NONE
