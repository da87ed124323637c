"""What a projection computes on its input rows on the way in, when the fused module that owns it and the
layer before it (layers/fused.py) hands it that layer's work: RMSNorm (with the residual add), SwiGLU, or the
per-token e4m3 scales of rows already quantized.

The small layer before a projection streams its rows once; the projection can compute it on the way in (the
one-row GEMV's prologue, the FP8 GEMM's activation quantization), saving a launch and a round trip of its
output through memory. A prologue is an argument of one call, made and consumed by the module that owns both
layers: nothing returns it. A path without a fused form computes it first with `apply`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.kernels.rmsnorm import rms_norm
from hosttune_engine.kernels.swiglu import swiglu


@dataclass(frozen=True)
class NormPrologue:
    """The rows are RMSNorm(x (+ residual)) of the x handed over; `residual_out` receives x + residual."""

    weight: torch.Tensor  # [K]
    eps: float
    residual: torch.Tensor | None = None  # [T, K]
    residual_out: torch.Tensor | None = None

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if self.residual is None:
            return rms_norm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps, residual=self.residual, residual_out=self.residual_out)[0]


@dataclass(frozen=True)
class SwiGLUPrologue:
    """The rows are silu(gate) * up of the [gate | up] rows handed over ([T, 2K] -> [T, K])."""

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x)


SWIGLU = SwiGLUPrologue()


@dataclass(frozen=True)
class Fp8Rows:
    """The rows handed over are e4m3 already, one fp32 scale per token ([T, 1]); the output takes `dtype`."""

    scale: torch.Tensor
    dtype: torch.dtype


Prologue = NormPrologue | SwiGLUPrologue | Fp8Rows


def norm_prologue(weight: torch.Tensor, eps: float, x: torch.Tensor, residual: torch.Tensor | None) -> NormPrologue:
    """The prologue of an RMSNorm with `weight` on x (and the residual, whose new value it writes out)."""
    if residual is None:
        return NormPrologue(weight, eps)
    return NormPrologue(weight, eps, residual, torch.empty_like(x))
