"""Which kernel runs a quantized layer on the GPU: the GEMV for one to four rows (decode), a GEMM for
more. FP8 layers whose scheme quantizes activations (FP8 at load, compressed-tensors with FP8 input
activations) and have one scale per row may take the FP8 tensor cores where the GPU has them; the others
keep activations in bf16/fp16 (W8A16, W4A16): what the CPU references compute.

Launch configs come from the tuned tables (kernels/tuning.py), per projection shape where the tuner measured
one ("bfloat16-le1-4608x3584": batch bucket, then N x K), else per batch bucket. For FP8 layers with FP8
activations the table's `fp8_mm` entry also picks the batched path (per shape, else per bucket): "unit"
(torch._scaled_mm with unit scales and our scale epilogue), "rowwise" (scales in cuBLAS's epilogue), "triton"
(our FP8 GEMM, scales in its epilogue: kernels/fp8_gemm.py) or "w8a16" (our GEMM, activations kept in bf16). A
gate_up projection on "triton" whose SwiGLU defers to an FP8 down_proj defers too where its `fp8_gemm` config
says SWIGLU 1, and down_proj's input quantization then runs the GEMM with the SwiGLU in its epilogue. Configs
may also say FUSE 0 (a GEMV's RMSNorm / SwiGLU prologue run by its own kernels first), DEQUANT 1 (W4A16
through a dequantized weight and cuBLAS), NIBBLES 1 (the W4A16 GEMM one dot a nibble position, SWAP 0 putting x
first in its MMA), PACKED 1 (a quantized GEMV's fp16x2 products, CUDA only), XB 1 (the
FP8 GEMV's activations in the weight tile's layout), UNROLL n (a GEMV's K loop unrolled), PIPE p (or
software-pipelined) and SPLIT s (a GEMV's K split across s programs a row block): whichever the tuner measured
faster."""

from __future__ import annotations

import torch

from hosttune_engine.kernels.dequant_gemm import DEFAULT as GEMM_DEFAULT
from hosttune_engine.kernels.dequant_gemm import w4a16_gemm, w8a16_gemm
from hosttune_engine.kernels.fp8_gemv import DEFAULT as FP8_GEMV_DEFAULT
from hosttune_engine.kernels.fp8_gemv import fp8_gemv
from hosttune_engine.kernels.fp8_gemm import DEFAULT as FP8_GEMM_DEFAULT
from hosttune_engine.kernels.fp8_gemm import fp8_gemm, fp8_gemm_swiglu
from hosttune_engine.kernels.fp8_inputs import rms_norm_fp8, swiglu_fp8
from hosttune_engine.kernels.fp8_scaled_mm import fp8_mm, quantize_per_token, supports_fp8_mm
from hosttune_engine.kernels.gemv import RMSNORM, RMSNORM_RESIDUAL, SWIGLU
from hosttune_engine.kernels.int4_gemv import DEFAULT as INT4_GEMV_DEFAULT
from hosttune_engine.kernels.int4_gemv import int4_gemv
from hosttune_engine.kernels.tuning import batch_bucket, launch_config
from hosttune_engine.layers.deferred import (DEFERRED, DeferredProjection, DeferredRMSNorm, DeferredSwiGLU,
                                            materialized, source_of)

GEMV_ROWS = 4
FP8_MM_DEFAULT = {"METHOD": "unit"}


def _key(x: torch.Tensor) -> str:
    return f"{str(x.dtype).removeprefix('torch.')}-{batch_bucket(x.shape[0])}"


def _config(kernel: str, x: torch.Tensor, n: int, k: int, default: dict) -> dict:
    """The tuned config for this projection's shape, else for the batch bucket, else `default`."""
    shaped = launch_config(kernel, f"{_key(x)}-{n}x{k}", x.device, {})
    return shaped or launch_config(kernel, _key(x), x.device, default)


def _one_row(kernel: str, fn, default: dict, weights: tuple, n: int, k: int, x):
    """Up to GEMV_ROWS rows through the GEMV, a deferred RMSNorm / SwiGLU row computed in its prologue (the
    prologues take one row: more deferred rows are computed first); None for more rows."""
    if x.shape[0] > GEMV_ROWS:
        return None
    if isinstance(x, DEFERRED) and x.shape[0] > 1:
        x = x.materialize()
    if not isinstance(x, DEFERRED):
        x = x.contiguous()
    return gemv_one_row(fn, _config(kernel, source_of(x), n, k, default), weights, x)


def gemv_one_row(fn, cfg: dict, weights: tuple, x) -> torch.Tensor:
    """fn (a quantized GEMV) on x: rows, or a deferred RMSNorm / SwiGLU row computed in its prologue, or first by
    its own kernels when the config says FUSE 0 (what the tuner found faster for that GEMV)."""
    if isinstance(x, DEFERRED) and not cfg.get("FUSE", 1):
        x = x.materialize()
    if isinstance(x, DeferredRMSNorm):
        prologue = RMSNORM if x.residual is None else RMSNORM_RESIDUAL
        return fn(x.x, *weights, cfg, prologue=prologue, residual=x.residual, norm_weight=x.weight,
                  residual_out=x.residual_out, eps=x.eps)
    if isinstance(x, DeferredSwiGLU):
        return fn(x.gate_up, *weights, cfg, prologue=SWIGLU)
    return fn(x, *weights, cfg)


def fp8_linear(layer, x) -> torch.Tensor:
    """x [T, K], or a deferred RMSNorm / SwiGLU: a row the GEMV computes in its prologue; more rows, where the
    layer takes FP8 activations, one kernel computes and quantizes per token (else they are computed first)."""
    weights = (layer.weight, layer.weight_scale, layer.scale_row, layer.block_k, layer.bias)
    n, k = layer.out_features, layer.in_features
    y = _one_row("fp8_gemv", fp8_gemv, FP8_GEMV_DEFAULT, weights, n, k, x)
    if y is not None:
        return y
    method = _fp8_mm_method(layer, source_of(x))
    if method == "w8a16":
        x = materialized(x).contiguous()
        return w8a16_gemm(x, *weights, _config("w8a16_gemm", x, n, k, GEMM_DEFAULT))
    if method == "triton":
        cfg = _gemm_config(layer, x)
        if layer.defer_swiglu and cfg.get("SWIGLU") and cfg["BLOCK_N"] >= 32:
            return DeferredProjection(layer, x, lambda: _fp8_gemm(layer, x, cfg))  # down_proj computes it and SwiGLU
        return _fp8_gemm(layer, x, cfg)
    xq, sx = fp8_rows(x)
    return fp8_mm(xq, sx, layer.weight, layer.row_scale, layer.bias, layer.unit_scale, method == "rowwise",
                  source_of(x).dtype)


def _gemm_config(layer, x) -> dict:
    return _config("fp8_gemm", source_of(x), layer.out_features, layer.in_features, FP8_GEMM_DEFAULT)


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
        return fp8_gemm_swiglu(xq, sx, layer.weight, layer.row_scale, layer.bias, source_of(inputs).dtype,
                               _gemm_config(layer, inputs))
    if isinstance(x, DeferredSwiGLU):
        return swiglu_fp8(x.gate_up)
    return quantize_per_token(x.contiguous())


def takes_fp8_activations(layer) -> bool:
    """Whether a loaded FP8 layer may run on FP8 tensor cores: its scheme quantizes activations, it has one
    scale per output row, and its shape suits them (the GPU and the activations' dtype decide per call)."""
    return (layer.spec.fp8_activations and layer.row_scale is not None and layer.in_features % 16 == 0
            and layer.out_features % 16 == 0)


def _fp8_mm_method(layer, x) -> str:
    """"unit", "rowwise", "triton" (FP8 tensor cores) or "w8a16" for a batched FP8 layer."""
    if not (takes_fp8_activations(layer) and x.dtype != torch.float32 and supports_fp8_mm(x.device)):
        return "w8a16"
    return _config("fp8_mm", x, layer.out_features, layer.in_features, FP8_MM_DEFAULT)["METHOD"]


def int4_linear(layer, x) -> torch.Tensor:
    """x [T, K], or a deferred RMSNorm / SwiGLU row, which the GEMV computes in its prologue."""
    weights = (layer.qweight, layer.scales, layer.zeros, layer.kernel_perm, layer.group_size, layer.bias)
    n, k = layer.out_features, layer.in_features
    y = _one_row("int4_gemv", int4_gemv, INT4_GEMV_DEFAULT, weights, n, k, x)
    if y is not None:
        return y
    x = materialized(x).contiguous()
    return w4a16_gemm(x, *weights, _config("w4a16_gemm", x, n, k, GEMM_DEFAULT))
