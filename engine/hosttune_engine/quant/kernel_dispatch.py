"""The quantized layers' GPU paths, each the kernel the plan chose for the step's row count (planner/build.py
says why): a GEMV for one to four rows (decode), a GEMM above. FP8 layers whose scheme quantizes activations
may take the FP8 tensor cores: torch._scaled_mm with unit or row-wise scales, or our FP8 GEMM (the plan's
`fp8_mm` path); the others keep activations in bf16/fp16 (W8A16, W4A16), what the CPU references compute.
Launch configs are the plan's; the kernels read their switches (FUSE, DEQUANT, NIBBLES, ...) from them.

A deferred RMSNorm / SwiGLU input (layers/deferred.py) is computed in a GEMV's prologue, or with the per-token
e4m3 quantization in one kernel; an FP8 gate_up projection on the Triton GEMM may leave its output to
down_proj's quantization, which then runs that GEMM with the SwiGLU in its epilogue.
"""

from __future__ import annotations

import torch

from hosttune_engine.kernels.dequant_gemm import DEFAULT as GEMM_DEFAULT
from hosttune_engine.kernels.dequant_gemm import w4a16_gemm, w8a16_gemm
from hosttune_engine.kernels.fp8_gemm import fp8_gemm, fp8_gemm_swiglu
from hosttune_engine.kernels.fp8_gemv import fp8_gemv
from hosttune_engine.kernels.fp8_inputs import rms_norm_fp8, swiglu_fp8
from hosttune_engine.kernels.fp8_scaled_mm import fp8_mm, quantize_per_token
from hosttune_engine.kernels.gemv import RMSNORM, RMSNORM_RESIDUAL, SWIGLU
from hosttune_engine.kernels.int4_gemv import int4_gemv
from hosttune_engine.layers.deferred import (DEFERRED, DeferredProjection, DeferredRMSNorm, DeferredSwiGLU,
                                            materialized, source_of)
from hosttune_engine.plan.kinds import Fusion, Kernel

FP8_TENSOR_CORES = (Kernel.FP8_MM_UNIT, Kernel.FP8_MM_ROWWISE, Kernel.FP8_GEMM)


def gemv_one_row(fn, cfg: dict, weights: tuple, x) -> torch.Tensor:
    """fn (a quantized GEMV) on x: rows, or a deferred RMSNorm / SwiGLU row computed in its prologue, or first by
    its own kernels when the config says FUSE 0 (what the tuner found faster for that GEMV)."""
    if isinstance(x, DEFERRED) and (not cfg.get("FUSE", 1) or x.shape[0] > 1):  # the prologues take one row
        x = x.materialize()
    if isinstance(x, DeferredRMSNorm):
        prologue = RMSNORM if x.residual is None else RMSNORM_RESIDUAL
        return fn(x.x, *weights, cfg, prologue=prologue, residual=x.residual, norm_weight=x.weight,
                  residual_out=x.residual_out, eps=x.eps)
    if isinstance(x, DeferredSwiGLU):
        return fn(x.gate_up, *weights, cfg, prologue=SWIGLU)
    return fn(x.contiguous(), *weights, cfg)


def fp8_linear(layer, x, choice) -> torch.Tensor:
    """x [T, K], or a deferred RMSNorm / SwiGLU, on the planned kernel."""
    weights = (layer.weight, layer.weight_scale, layer.scale_row, layer.block_k, layer.bias)
    if choice.kernel is Kernel.FP8_GEMV:
        return gemv_one_row(fp8_gemv, choice.args, weights, x)
    if choice.kernel not in FP8_TENSOR_CORES or not takes_fp8_activations(layer):
        x = materialized(x).contiguous()
        return w8a16_gemm(x, *weights, choice.args if choice.kernel is Kernel.W8A16_GEMM else GEMM_DEFAULT)
    if choice.kernel is Kernel.FP8_GEMM:
        if _down_computes_output(layer, x):
            return DeferredProjection(layer, x, lambda: _fp8_gemm(layer, x, choice.args))
        return _fp8_gemm(layer, x, choice.args)
    xq, sx = fp8_rows(x)
    return fp8_mm(xq, sx, layer.weight, layer.row_scale, layer.bias, layer.unit_scale,
                  choice.kernel is Kernel.FP8_MM_ROWWISE, source_of(x).dtype)


def _down_computes_output(layer, x) -> bool:
    """Whether down_proj's plan computes this gate_up projection's output with its SwiGLU (same rows)."""
    plan = layer.swiglu_plan
    return plan is not None and plan.at(x.shape[0]).fusion is Fusion.SWIGLU_IN_GATE_UP


def _fp8_gemm(layer, x, cfg: dict) -> torch.Tensor:
    xq, sx = fp8_rows(x)
    return fp8_gemm(xq, sx, layer.weight, layer.row_scale, layer.bias, source_of(x).dtype, cfg)


def fp8_rows(x) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] or a deferred RMSNorm / SwiGLU -> (e4m3 [T, K], fp32 per-token scales [T, 1]), in one kernel; a
    SwiGLU of a deferred FP8 gate_up projection in two, the projection's GEMM computing the SwiGLU."""
    if isinstance(x, DeferredRMSNorm):
        return rms_norm_fp8(x.x, x.weight, x.eps, x.residual, x.residual_out)
    if isinstance(x, DeferredSwiGLU) and isinstance(x.gate_up, DeferredProjection):
        layer, inputs = x.gate_up.layer, x.gate_up.x
        xq, sx = fp8_rows(inputs)
        cfg = layer.kernel_plan.at(inputs.shape[0]).args
        return fp8_gemm_swiglu(xq, sx, layer.weight, layer.row_scale, layer.bias, source_of(inputs).dtype, cfg)
    if isinstance(x, DeferredSwiGLU):
        return swiglu_fp8(x.gate_up)
    return quantize_per_token(x.contiguous())


def takes_fp8_activations(layer) -> bool:
    """Whether a loaded FP8 layer may run on FP8 tensor cores: its scheme quantizes activations, it has one
    scale per output row, and its shape suits them (the plan checks the same from the spec; this guards a
    layer that loaded otherwise)."""
    return (layer.spec.fp8_activations and layer.row_scale is not None and layer.in_features % 16 == 0
            and layer.out_features % 16 == 0)


def int4_linear(layer, x, choice) -> torch.Tensor:
    """x [T, K], or a deferred RMSNorm / SwiGLU row, which the GEMV computes in its prologue."""
    weights = (layer.qweight, layer.scales, layer.zeros, layer.kernel_perm, layer.group_size, layer.bias)
    if choice.kernel is Kernel.INT4_GEMV:
        return gemv_one_row(int4_gemv, choice.args, weights, x)
    x = materialized(x).contiguous()
    return w4a16_gemm(x, *weights, choice.args)
