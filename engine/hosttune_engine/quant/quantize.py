"""Round-to-nearest quantization of one linear weight [N, K] into the tensors of a public layout.

The checkpoint writer (engine/scripts/quantize_checkpoint.py), dummy quantized weights and FP8 at
load all use these functions, so what the engine loads is what the writer writes.
"""

from __future__ import annotations

import torch

from hosttune_engine.quant.int4_packing import AWQ_ORDER, pack_int4
from hosttune_engine.quant.spec import Layout, QuantSpec

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
TINY = 1e-12


def fp8_scaled(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w / scale in e4m3, saturated (scale broadcasts against w)."""
    return (w.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def fp8_per_channel(w: torch.Tensor, scale_dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scale [N, 1]); the weight is divided by the stored (rounded) scale."""
    scale = (w.float().abs().amax(1, keepdim=True) / FP8_MAX).clamp_min(TINY).to(scale_dtype)
    return fp8_scaled(w, scale), scale


def fp8_per_tensor(w: torch.Tensor, scale_dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (w.float().abs().amax() / FP8_MAX).clamp_min(TINY).reshape(1).to(scale_dtype)
    return fp8_scaled(w, scale), scale


def fp8_per_block(w: torch.Tensor, block: tuple[int, int], scale_dtype=torch.float32):
    """w [N, K] -> (fp8 [N, K], scale [ceil(N/bn), ceil(K/bk)]); edge blocks cover what is left."""
    n, k = w.shape
    bn, bk = block
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    amax = padded.view(rows, bn, cols, bk).abs().amax((1, 3))
    scale = (amax / FP8_MAX).clamp_min(TINY).to(scale_dtype)
    return fp8_scaled(w, expand_block_scale(scale, block, n, k)), scale


def expand_block_scale(scale: torch.Tensor, block: tuple[int, int], n: int, k: int) -> torch.Tensor:
    """[ceil(N/bn), ceil(K/bk)] block scales -> one per element [N, K] (fp32)."""
    return scale.float().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]


def int4_group_params(w: torch.Tensor, group_size: int, zero_point: bool):
    """Per group of `group_size` input columns: (scales [G, N], zeros [G, N] ints 0-15), round to nearest.

    With zero points the group's [min, max] (widened to include 0) maps onto 0..15; without, the
    symmetric range [-max|w|, max|w|] uses zero 8 and scale 2 max|w| / 15, as GPTQ's. Scales are rounded
    to the fp16 the layouts store before the values are computed from them."""
    n, k = w.shape
    g = w.float().t().reshape(k // group_size, group_size, n)  # [G, gs, N]
    if zero_point:
        lo, hi = g.amin(1).clamp_max(0.0), g.amax(1).clamp_min(0.0)
        scales = ((hi - lo) / 15).clamp_min(TINY).half()
        zeros = (-lo / scales.float()).round().clamp(0, 15)
    else:
        scales = (g.abs().amax(1) * 2 / 15).clamp_min(TINY).half()
        zeros = torch.full_like(scales, 8, dtype=torch.float32)
    return scales, zeros.to(torch.uint8)


def int4_values(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """w [N, K] -> ints 0-15 [K, N] for the given group parameters (g_idx [K]: each column's group)."""
    q = w.float().t() / scales.float()[g_idx] + zeros.float()[g_idx]
    return q.round().clamp(0, 15).to(torch.uint8)


def quantize_awq(w: torch.Tensor, group_size: int, zero_point: bool = True, scales=None, zeros=None) -> dict:
    """AWQ gemm tensors: qweight [K, N/8], qzeros [G, N/8] int32 in AWQ's order, scales [G, N] fp16."""
    if scales is None:
        scales, zeros = int4_group_params(w, group_size, zero_point)
    g_idx = torch.arange(w.shape[1], device=w.device) // group_size
    q = int4_values(w, scales, zeros, g_idx)
    return {"qweight": pack_int4(q, 1, AWQ_ORDER), "qzeros": pack_int4(zeros, 1, AWQ_ORDER), "scales": scales}


def quantize_gptq(w: torch.Tensor, group_size: int, zero_point: bool, g_idx: torch.Tensor | None = None,
                  zero_offset: int = 1) -> dict:
    """GPTQ tensors: qweight [K/8, N], qzeros [G, N/8] (zero - zero_offset), scales [G, N] fp16, g_idx [K].

    `g_idx` assigns each input column to a group (desc_act order); the default is column // group_size."""
    n, k = w.shape
    if g_idx is None:
        g_idx = torch.arange(k, device=w.device) // group_size
    # A group's parameters come from the columns assigned to it, wherever they sit.
    order = torch.argsort(g_idx, stable=True)
    scales, zeros = int4_group_params(w[:, order], group_size, zero_point)
    zeros = zeros.clamp_min(zero_offset)  # v1 stores zero - 1, so a zero of 0 cannot be written
    q = int4_values(w, scales, zeros, g_idx)
    stored = (zeros - zero_offset).to(torch.uint8)
    return {"qweight": pack_int4(q, 0), "qzeros": pack_int4(stored, 1), "scales": scales,
            "g_idx": g_idx.to(torch.int32)}


def quantize_weight(w: torch.Tensor, spec: QuantSpec, scale_dtype=torch.float32, g_idx=None) -> dict:
    """The checkpoint tensors (suffix -> tensor) of one linear weight in `spec`'s layout."""
    layout = spec.layout
    if layout is Layout.FP8_BLOCK or layout is Layout.FP8_CT_BLOCK:
        q, s = fp8_per_block(w, spec.block, scale_dtype)
    elif layout is Layout.FP8_CHANNEL:
        q, s = fp8_per_channel(w, scale_dtype)
    elif layout is Layout.FP8_TENSOR:
        q, s = fp8_per_tensor(w, scale_dtype)
    elif layout is Layout.AWQ:
        return quantize_awq(w, spec.group_size, spec.zero_point)
    else:
        return quantize_gptq(w, spec.group_size, spec.zero_point, g_idx, spec.zero_offset)
    return {"weight": q, spec.scale_name: s}
