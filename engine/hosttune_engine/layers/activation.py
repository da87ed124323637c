"""SwiGLU: silu(gate) * up over a fused [gate | up] projection."""

from __future__ import annotations

import torch

from hosttune_engine.kernels.swiglu import swiglu, swiglu_ref
from hosttune_engine.layers.backend import KernelLayer


class SiluAndMul(KernelLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2I] -> [T, I]."""
        return swiglu(x) if self.use_triton else swiglu_ref(x)
