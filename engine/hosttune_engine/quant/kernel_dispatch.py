"""The quantized layers' GPU paths, each the kernel the plan chose for the step's row count (planner/build.py
says why): a GEMV for one to four rows (decode), a GEMM above. FP8 layers whose scheme quantizes activations
may take the FP8 tensor cores: torch._scaled_mm with unit or row-wise scales, or our FP8 GEMM (the plan's
`fp8_mm` path); the others keep activations in bf16/fp16 (W8A16, W4A16), what the CPU references compute.
Launch configs are the plan's; the kernels read their switches (FUSE, DEQUANT, NIBBLES, ...) from them.

A prologue (layers/prologue.py: the RMSNorm or SwiGLU before the projection, handed over by the fused module
that owns both) is computed in a GEMV's prologue, or with the per-token e4m3 quantization in one kernel; a
gate_up projection on the Triton FP8 GEMM may write its SwiGLU quantized for down_proj (`fp8_swiglu_rows`).
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
from hosttune_engine.layers.prologue import Fp8Rows, NormPrologue, Prologue, SwiGLUPrologue
from hosttune_engine.plan.kinds import Kernel

FP8_TENSOR_CORES = (Kernel.FP8_MM_UNIT, Kernel.FP8_MM_ROWWISE, Kernel.FP8_GEMM)


def computed(x: torch.Tensor, prologue: Prologue | None) -> torch.Tensor:
    """x with its prologue applied by the prologue's own kernels (a path without a fused form)."""
    assert not isinstance(prologue, Fp8Rows), "e4m3 rows go to the FP8 tensor cores only"
    return x if prologue is None else prologue.apply(x)


def gemv_one_row(fn, cfg: dict, weights: tuple, x: torch.Tensor, prologue: Prologue | None = None) -> torch.Tensor:
    """fn (a quantized GEMV) on x's rows, its RMSNorm / SwiGLU prologue computed in the GEMV's on one row, or
    first by its own kernels when the config says FUSE 0 (what the tuner found faster for that GEMV)."""
    if prologue is not None and (not cfg.get("FUSE", 1) or x.shape[0] > 1):  # the prologues take one row
        x, prologue = computed(x, prologue), None
    if isinstance(prologue, NormPrologue):
        p = prologue
        return fn(x, *weights, cfg, prologue=RMSNORM if p.residual is None else RMSNORM_RESIDUAL,
                  residual=p.residual, norm_weight=p.weight, residual_out=p.residual_out, eps=p.eps)
    if isinstance(prologue, SwiGLUPrologue):
        return fn(x, *weights, cfg, prologue=SWIGLU)
    return fn(x.contiguous(), *weights, cfg)


def fp8_linear(layer, x: torch.Tensor, choice, prologue: Prologue | None) -> torch.Tensor:
    """x [T, K] (with its prologue) on the planned kernel."""
    weights = (layer.weight, layer.weight_scale, layer.scale_row, layer.block_k, layer.bias)
    if choice.kernel is Kernel.FP8_GEMV:
        return gemv_one_row(fp8_gemv, choice.args, weights, x, prologue)
    if choice.kernel not in FP8_TENSOR_CORES or not takes_fp8_activations(layer):
        x = computed(x, prologue).contiguous()
        return w8a16_gemm(x, *weights, choice.args if choice.kernel is Kernel.W8A16_GEMM else GEMM_DEFAULT)
    dtype = prologue.dtype if isinstance(prologue, Fp8Rows) else x.dtype
    xq, sx = fp8_rows(x, prologue)
    if choice.kernel is Kernel.FP8_GEMM:
        return fp8_gemm(xq, sx, layer.weight, layer.row_scale, layer.bias, dtype, choice.args)
    return fp8_mm(xq, sx, layer.weight, layer.row_scale, layer.bias, layer.unit_scale,
                  choice.kernel is Kernel.FP8_MM_ROWWISE, dtype)


def fp8_swiglu_rows(layer, x: torch.Tensor, choice, prologue: NormPrologue | None):
    """A gate_up layer on the Triton FP8 GEMM: SwiGLU of its output on x, quantized per token in the GEMM's
    epilogue -> (e4m3 [T, N/2], scales [T, 1]); None where its choice is another kernel."""
    if choice.kernel is not Kernel.FP8_GEMM or not takes_fp8_activations(layer):
        return None
    xq, sx = fp8_rows(x, prologue)
    return fp8_gemm_swiglu(xq, sx, layer.weight, layer.row_scale, layer.bias, x.dtype, choice.args)


def fp8_rows(x: torch.Tensor, prologue: Prologue | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] with its RMSNorm / SwiGLU prologue -> (e4m3 [T, K], fp32 per-token scales [T, 1]), in one
    kernel; rows quantized already pass through."""
    if isinstance(prologue, NormPrologue):
        return rms_norm_fp8(x, prologue.weight, prologue.eps, prologue.residual, prologue.residual_out)
    if isinstance(prologue, SwiGLUPrologue):
        return swiglu_fp8(x)
    if isinstance(prologue, Fp8Rows):
        return x, prologue.scale
    return quantize_per_token(x.contiguous())


def takes_fp8_activations(layer) -> bool:
    """Whether a loaded FP8 layer may run on FP8 tensor cores: its scheme quantizes activations, it has one
    scale per output row, and its shape suits them (the plan checks the same from the spec; this guards a
    layer that loaded otherwise)."""
    return (layer.spec.fp8_activations and layer.row_scale is not None and layer.in_features % 16 == 0
            and layer.out_features % 16 == 0)


def int4_linear(layer, x: torch.Tensor, choice, prologue: Prologue | None) -> torch.Tensor:
    """x [T, K] on the planned kernel; its RMSNorm / SwiGLU prologue rides in the one-row GEMV's."""
    weights = (layer.qweight, layer.scales, layer.zeros, layer.kernel_perm, layer.group_size, layer.bias)
    if choice.kernel is Kernel.INT4_GEMV:
        return gemv_one_row(int4_gemv, choice.args, weights, x, prologue)
    x = computed(x, prologue).contiguous()
    return w4a16_gemm(x, *weights, choice.args)
