"""SwiGLU: silu(gate) * up over a fused [gate | up] projection."""

from __future__ import annotations

import torch

from hosttune_engine.kernels.swiglu import swiglu, swiglu_ref
from hosttune_engine.layers.backend import KernelLayer
from hosttune_engine.layers.deferred import DeferredSwiGLU, materialized, runs_batched
from hosttune_engine.layers.one_row import runs_one_row


class SiluAndMul(KernelLayer):
    defer_one_row: bool = False  # set by the one-row GEMV transform (layers/one_row.py)
    defer_rows: bool = False  # any row count: set where the consumer quantizes to FP8 (quant/transform.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2I] -> [T, I]."""
        if (self.defer_one_row and runs_one_row(self, x)) or (self.defer_rows and runs_batched(self, x)):
            return DeferredSwiGLU(x)  # down_proj computes it
        x = materialized(x)
        return swiglu(x) if self.use_triton else swiglu_ref(x)
