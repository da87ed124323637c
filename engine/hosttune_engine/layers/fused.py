"""Fused modules: a layer and the projection it feeds, owned together, put into a model by its preparation
from the kernel plan (planner/prepare.py), after tensor parallelism and quantization have shaped it.

Per call, the projection's choice for the call's row count says whether it computes its input layer on the
way in (`Choice.fusion`: the one-row GEMV's prologue, the FP8 GEMM's activation quantization); the module then
hands the projection that layer as its prologue (layers/prologue.py), else runs the layer and then the
projection. The norm before qkv_proj and its projection sit in one model segment, and so do the MLP's norm,
gate_up, SwiGLU and down, so no fused pair spans the piecewise graphs' boundaries (core/mixed_graphs.py).
"""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.layers.linear import planned
from hosttune_engine.layers.prologue import SWIGLU, Fp8Rows, NormPrologue, norm_prologue
from hosttune_engine.plan.kinds import Fusion


def fusion(proj: nn.Module, x: torch.Tensor) -> Fusion:
    """What the projection's plan computes on its input on the way in, for x's row count."""
    choice = planned(proj.kernel_plan, proj.use_triton, x)
    return Fusion.NONE if choice is None else choice.fusion


class NormLinear(nn.Module):
    """RMSNorm (with the residual add) feeding a projection: (x [T, H], residual) -> (y [T, N], x + residual)."""

    def __init__(self, norm: nn.Module, proj: nn.Module):
        super().__init__()
        self.norm, self.proj = norm, proj

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        rows, prologue, residual = self.rows(x, residual)
        return self.proj(rows, prologue=prologue), residual

    def rows(self, x: torch.Tensor, residual: torch.Tensor | None):
        """(the projection's rows, the norm as their prologue or None where it ran, the new residual)."""
        if fusion(self.proj, x) is not Fusion.NONE:
            prologue = norm_prologue(self.norm.weight, self.norm.eps, x, residual)
            return x, prologue, x if residual is None else prologue.residual_out
        if residual is None:
            return self.norm(x), None, x
        hidden, residual = self.norm(x, residual)
        return hidden, None, residual


class SwiGLULinear(nn.Module):
    """SwiGLU feeding a projection (down_proj): gate_up [T, 2I] -> [T, N]."""

    def __init__(self, act: nn.Module, proj: nn.Module):
        super().__init__()
        self.act, self.proj = act, proj

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if fusion(self.proj, gate_up) is not Fusion.NONE:
            return self.proj(gate_up, prologue=SWIGLU)
        return self.proj(self.act(gate_up))


class NormMLP(nn.Module):
    """The MLP behind its norm: RMSNorm -> gate_up -> SwiGLU -> down, (x [T, H], residual) -> (y [T, H], x +
    residual). Where down_proj's plan takes its input from gate_up's FP8 GEMM (`Fusion.SWIGLU_IN_GATE_UP`), that
    GEMM writes the SwiGLU of its output quantized to e4m3 per token, and down_proj multiplies those rows."""

    def __init__(self, norm: nn.Module, mlp: nn.Module):
        super().__init__()
        self.gate_up = NormLinear(norm, mlp.gate_up_proj)
        self.down = SwiGLULinear(mlp.act, mlp.down_proj)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None):
        rows, prologue, residual = self.gate_up.rows(x, residual)
        quantized = self._swiglu_in_gate_up(rows, prologue)
        if quantized is not None:
            xq, scale = quantized
            return self.down.proj(xq, prologue=Fp8Rows(scale, x.dtype)), residual
        return self.down(self.gate_up.proj(rows, prologue=prologue)), residual

    def _swiglu_in_gate_up(self, rows: torch.Tensor, prologue: NormPrologue | None):
        """(e4m3 [T, I], scales [T, 1]) of SwiGLU(gate_up(rows)) from gate_up's GEMM, where the plan says so."""
        if fusion(self.down.proj, rows) is not Fusion.SWIGLU_IN_GATE_UP:
            return None
        return self.gate_up.proj.swiglu_rows(rows, prologue)  # the planner fuses so into FP8 gate_up layers only
