"""Which kernel runs a quantized layer on the GPU: the GEMV for one to four rows (decode), a GEMM for
more. FP8 layers whose scheme quantizes activations (FP8 at load, compressed-tensors with FP8 input
activations) and have one scale per row take the FP8 tensor cores where the GPU has them; the others
keep activations in bf16/fp16 (W8A16, W4A16): what the CPU references compute."""

from __future__ import annotations

import torch

from hosttune_engine.kernels.dequant_gemm import DEFAULT as GEMM_DEFAULT
from hosttune_engine.kernels.dequant_gemm import w4a16_gemm, w8a16_gemm
from hosttune_engine.kernels.fp8_gemv import DEFAULT as FP8_GEMV_DEFAULT
from hosttune_engine.kernels.fp8_gemv import fp8_gemv
from hosttune_engine.kernels.fp8_scaled_mm import fp8_scaled_mm, supports_fp8_mm
from hosttune_engine.kernels.gemv import RMSNORM, RMSNORM_RESIDUAL, SWIGLU
from hosttune_engine.kernels.int4_gemv import DEFAULT as INT4_GEMV_DEFAULT
from hosttune_engine.kernels.int4_gemv import int4_gemv
from hosttune_engine.kernels.tuning import batch_bucket, launch_config
from hosttune_engine.layers.one_row import DeferredRMSNorm, DeferredSwiGLU

GEMV_ROWS = 4


def _key(x: torch.Tensor) -> str:
    return f"{str(x.dtype).removeprefix('torch.')}-{batch_bucket(x.shape[0])}"


def fp8_linear(layer, x) -> torch.Tensor:
    """x [T, K], or a deferred RMSNorm / SwiGLU row, which the GEMV computes in its prologue."""
    weights = (layer.weight, layer.weight_scale, layer.scale_row, layer.block_k, layer.bias)
    if isinstance(x, DeferredRMSNorm):
        cfg = launch_config("fp8_gemv", _key(x.x), x.x.device, FP8_GEMV_DEFAULT)
        prologue = RMSNORM if x.residual is None else RMSNORM_RESIDUAL
        return fp8_gemv(x.x, *weights, cfg, prologue=prologue, residual=x.residual, norm_weight=x.weight,
                        residual_out=x.residual_out, eps=x.eps)
    if isinstance(x, DeferredSwiGLU):
        cfg = launch_config("fp8_gemv", _key(x.gate_up), x.gate_up.device, FP8_GEMV_DEFAULT)
        return fp8_gemv(x.gate_up, *weights, cfg, prologue=SWIGLU)
    x = x.contiguous()
    if x.shape[0] <= GEMV_ROWS:
        return fp8_gemv(x, *weights, launch_config("fp8_gemv", _key(x), x.device, FP8_GEMV_DEFAULT))
    if layer.spec.fp8_activations and layer.row_scale is not None and x.dtype != torch.float32 \
            and supports_fp8_mm(x.device) \
            and layer.in_features % 16 == 0 and layer.out_features % 16 == 0:
        return fp8_scaled_mm(x, layer.weight, layer.row_scale, layer.bias, layer.unit_scale)
    cfg = launch_config("w8a16_gemm", _key(x), x.device, GEMM_DEFAULT)
    return w8a16_gemm(x, layer.weight, layer.weight_scale, layer.scale_row, layer.block_k, layer.bias, cfg)


def int4_linear(layer, x) -> torch.Tensor:
    """x [T, K], or a deferred RMSNorm / SwiGLU row, which the GEMV computes in its prologue."""
    weights = (layer.qweight, layer.scales, layer.zeros, layer.kernel_perm, layer.group_size, layer.bias)
    if isinstance(x, DeferredRMSNorm):
        cfg = launch_config("int4_gemv", _key(x.x), x.x.device, INT4_GEMV_DEFAULT)
        prologue = RMSNORM if x.residual is None else RMSNORM_RESIDUAL
        return int4_gemv(x.x, *weights, cfg, prologue=prologue, residual=x.residual, norm_weight=x.weight,
                         residual_out=x.residual_out, eps=x.eps)
    if isinstance(x, DeferredSwiGLU):
        cfg = launch_config("int4_gemv", _key(x.gate_up), x.gate_up.device, INT4_GEMV_DEFAULT)
        return int4_gemv(x.gate_up, *weights, cfg, prologue=SWIGLU)
    x = x.contiguous()
    if x.shape[0] <= GEMV_ROWS:
        return int4_gemv(x, *weights, launch_config("int4_gemv", _key(x), x.device, INT4_GEMV_DEFAULT))
    return w4a16_gemm(x, *weights, launch_config("w4a16_gemm", _key(x), x.device, GEMM_DEFAULT))
