"""SwiGLU: silu(gate) * up over a fused [gate | up] projection."""

from __future__ import annotations

import torch

from hosttune_engine.kernels.swiglu import swiglu, swiglu_ref
from hosttune_engine.layers.backend import KernelLayer
from hosttune_engine.layers.deferred import DeferredSwiGLU, materialized
from hosttune_engine.layers.norm import defers


class SiluAndMul(KernelLayer):
    feeds = None  # down_proj's choices, where that one may compute it (planner/prepare.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2I] -> [T, I]."""
        if defers(self, x):
            return DeferredSwiGLU(x)  # down_proj computes it
        x = materialized(x)
        return swiglu(x) if self.use_triton else swiglu_ref(x)
