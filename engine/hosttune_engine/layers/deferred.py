"""Inputs a layer hands its consumer uncomputed: RMSNorm (with the residual add) and SwiGLU.

The layer before a projection is small and streams its rows once; the projection that consumes it can
compute it on the way in (the one-row GEMV's prologue, the FP8 GEMM's activation quantization), saving a
launch and a round trip of its output through memory. A norm or activation returns a deferred input only
where the kernel plan fuses it into the projection it feeds, for the step's row count (planner/build.py). A
consumer without a fused form calls `materialize()`. A deferred input is made and consumed inside one model segment
(the norms before qkv_proj and gate_up_proj, the activation before down_proj, and gate_up_proj's output when
down_proj computes it with the activation), so it never crosses the piecewise graphs' boundaries
(core/mixed_graphs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from hosttune_engine.kernels.rmsnorm import rms_norm
from hosttune_engine.kernels.swiglu import swiglu


@dataclass
class DeferredRMSNorm:
    """RMSNorm(x (+ residual)) not computed yet; `residual_out` receives x + residual when it is."""

    x: torch.Tensor  # [T, H]
    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None = None
    residual_out: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def source(self) -> torch.Tensor:
        return self.x

    def materialize(self) -> torch.Tensor:
        if self.residual is None:
            return rms_norm(self.x, self.weight, self.eps)
        out, _ = rms_norm(self.x, self.weight, self.eps, residual=self.residual, residual_out=self.residual_out)
        return out


@dataclass
class DeferredProjection:
    """A projection's output not computed yet: `compute()` computes it. Made by the FP8 gate_up projection on the
    Triton GEMM, whose consumer, down_proj's input quantization, computes it with the SwiGLU in between in one
    kernel (quant/kernel_dispatch.py `fp8_rows`)."""

    layer: torch.nn.Module
    x: object  # the projection's input, possibly deferred itself
    compute: Callable[[], torch.Tensor]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.x.shape[0], self.layer.out_features))

    @property
    def source(self) -> torch.Tensor:
        return source_of(self.x)

    def materialize(self) -> torch.Tensor:
        return self.compute()


@dataclass
class DeferredSwiGLU:
    gate_up: torch.Tensor | DeferredProjection  # [T, 2I]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.gate_up.shape[0], self.gate_up.shape[1] // 2))

    @property
    def source(self) -> torch.Tensor:
        return source_of(self.gate_up)

    def materialize(self) -> torch.Tensor:
        return swiglu(materialized(self.gate_up))


DEFERRED = (DeferredRMSNorm, DeferredSwiGLU, DeferredProjection)


def source_of(x) -> torch.Tensor:
    """The tensor a (possibly deferred) input is computed from: its device, dtype and row count."""
    return x.source if isinstance(x, DEFERRED) else x


def materialized(x) -> torch.Tensor:
    return x.materialize() if isinstance(x, DEFERRED) else x


def defer_rms_norm(x, weight, eps, residual=None):
    """What RMSNorm returns when it defers: the deferred norm (and the new residual, filled when computed)."""
    if residual is None:
        return DeferredRMSNorm(x, weight, eps)
    deferred = DeferredRMSNorm(x, weight, eps, residual, torch.empty_like(x))
    return deferred, deferred.residual_out
