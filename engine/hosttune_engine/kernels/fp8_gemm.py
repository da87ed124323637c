"""FP8 GEMM for batched decode on FP8 tensor cores, with the per-token and per-channel scales and the bias in
its epilogue: y [M, N] = (xq [M, K] * sx [M]) @ (w [N, K] * sw [N]).T (+ bias), xq and w e4m3.

At decode batch sizes torch._scaled_mm is fastest with unit scales, and then needs a second kernel that reads
and writes the output again to scale it (kernels/fp8_scaled_mm.py); cuBLAS's row-wise form is slower still
there. Here the fp32 accumulator is scaled in registers and rounded once. Each program owns BLOCK_M rows and
BLOCK_N output channels and walks K in BLOCK_K tiles, each tile's products added to the fp32 accumulator
apart (the tensor cores' own FP8 accumulation keeps fewer bits, as cuBLAS's fast mode does), or with
FAST_ACC 1 in the config accumulated by the tensor cores all along K (faster; on an H200 at K = 18,944 about
twice bf16's rounding error against the fp32 product, at K = 3,584 about the same as it). Where it
beats cuBLAS on a GPU, benchmarks/engine/fp8_gemm_sweep.py measures; the tuned table's `fp8_mm` METHOD
"triton" picks it per projection shape and batch bucket, and `fp8_gemm` its launch configs.

`fp8_gemm_swiglu` is the gate_up projection followed by SwiGLU and the per-token quantization of down_proj's
input: each program takes the same columns of gate and of up (two accumulators over one activation tile),
computes SwiGLU in its epilogue with the unfused kernels' roundings, writes it and maxes each row's largest
|value| into a per-row amax with an atomic; a second kernel quantizes the rows with it (kernels/fp8_inputs.py
`quantize_by_parts`). So the [M, 2I] product never reaches memory and the SwiGLU kernel's pass is gone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_pow2, check_tensor
from hosttune_engine.kernels.fp8_inputs import quantize_by_parts, row_amax_state, swiglu_fp8_ref
from hosttune_engine.kernels.fp8_scaled_mm import FP8, check_fp8_operands
from hosttune_engine.kernels.swiglu import silu_mul

DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}


@triton.jit
def _k_tile(ptrs, k0, offs_k, keep, K, K_ROWS: tl.constexpr, EVEN_K: tl.constexpr):
    """One K tile of an operand (keep: its M or N mask, broadcast; K along rows with K_ROWS), masked along K
    unless K is a multiple of the tile."""
    if EVEN_K:
        return tl.load(ptrs + k0, mask=keep, other=0.0)
    elif K_ROWS:
        return tl.load(ptrs + k0, mask=keep & (k0 + offs_k < K)[:, None], other=0.0)
    else:
        return tl.load(ptrs + k0, mask=keep & (k0 + offs_k < K)[None, :], other=0.0)


@triton.jit
def _mma(acc, a, b, FAST_ACC: tl.constexpr):
    if FAST_ACC:
        return tl.dot(a, b, acc)  # the tensor cores' own accumulation all along K
    else:
        return acc + tl.dot(a, b)  # into fp32 every tile: Hopper's FP8 MMA accumulates with fewer bits


@triton.jit
def _scaled(acc, sx, sw_ptr, b_ptr, offs_n, n_mask, HAS_BIAS: tl.constexpr):
    """The fp32 accumulator times the rows' and channels' scales (+ bias)."""
    y = acc * sx[:, None] * tl.load(sw_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, sx_ptr, sw_ptr, b_ptr, y_ptr, amax_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                     EVEN_K: tl.constexpr, FAST_ACC: tl.constexpr, SWIGLU: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y [M, N]; with SWIGLU, w holds 2N rows [gate | up], each program BLOCK_N // 2 of each, and y is SwiGLU of
    the product, its rows' largest |value| atomically maxed into amax [M]."""
    COLS: tl.constexpr = BLOCK_N // 2 if SWIGLU else BLOCK_N
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * COLS + tl.arange(0, COLS)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    x_tile = x_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    w_tile = w_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]  # [BLOCK_K, COLS]
    acc = tl.zeros([BLOCK_M, COLS], tl.float32)
    acc_up = tl.zeros([BLOCK_M, COLS], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = _k_tile(x_tile, k0, offs_k, m_mask[:, None], K, False, EVEN_K)
        acc = _mma(acc, a, _k_tile(w_tile, k0, offs_k, n_mask[None, :], K, True, EVEN_K), FAST_ACC)
        if SWIGLU:
            up = _k_tile(w_tile + N.to(tl.int64) * K, k0, offs_k, n_mask[None, :], K, True, EVEN_K)
            acc_up = _mma(acc_up, a, up, FAST_ACC)
    sx = tl.load(sx_ptr + offs_m, mask=m_mask, other=0.0)
    y = _scaled(acc, sx, sw_ptr, b_ptr, offs_n, n_mask, HAS_BIAS)
    mask = m_mask[:, None] & n_mask[None, :]
    if SWIGLU:  # the unfused path's roundings: the projection's output, then SwiGLU's (kernels/fp8_inputs.py)
        g = y.to(y_ptr.dtype.element_ty).to(tl.float32)
        u = _scaled(acc_up, sx, sw_ptr + N, b_ptr + N, offs_n, n_mask, HAS_BIAS).to(y_ptr.dtype.element_ty)
        y = silu_mul(g, u.to(tl.float32)).to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.atomic_max(amax_ptr + offs_m, tl.max(tl.where(mask, tl.abs(y), 0.0), 1), mask=m_mask, sem="relaxed")
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def fp8_gemm(xq: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias,
             out_dtype: torch.dtype, config: dict | None = None) -> torch.Tensor:
    """(xq [M, K] e4m3 * sx [M, 1]) @ (w [N, K] e4m3 * w_scale [N]).T (+ bias [N]) -> [M, N] in out_dtype."""
    n, _, cfg = _checked(xq, sx, w, w_scale, bias, out_dtype, config)
    y = torch.empty((xq.shape[0], n), dtype=out_dtype, device=xq.device)
    _launch(xq, sx, w, w_scale, bias, y, y, cfg, swiglu=False)
    return y


def fp8_gemm_swiglu(xq: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias,
                    out_dtype: torch.dtype, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU of the product with w [2I, K] = [gate | up], quantized per token for the next FP8 GEMM: (e4m3
    [M, I], fp32 scales [M, 1]), what fp8_gemm, then kernels/fp8_inputs.py's swiglu_fp8 write, in two kernels
    (this one, SwiGLU and each row's amax in the epilogue, then the quantizing pass) instead of three and without
    the [M, 2I] product in memory. BLOCK_N counts weight rows: a program takes BLOCK_N / 2 of gate and of up."""
    n2, _, cfg = _checked(xq, sx, w, w_scale, bias, out_dtype, config)
    check(n2 % 2 == 0 and cfg["BLOCK_N"] >= 32, "fp8_gemm_swiglu takes [gate | up] (an even row count, got {}) "
          "and BLOCK_N >= 32 (got {})", n2, cfg["BLOCK_N"])
    m, n = xq.shape[0], n2 // 2
    h = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    q = torch.empty((m, n), dtype=FP8, device=xq.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=xq.device)
    if m:
        amax, counts = row_amax_state(xq.device, m)
        _launch(xq, sx, w, w_scale, bias, h, amax, cfg, swiglu=True)
        quantize_by_parts(h, amax, counts, q, scale)
    return q, scale


def _checked(xq, sx, w, w_scale, bias, out_dtype, config) -> tuple[int, int, dict]:
    n, k = check_fp8_operands(xq, sx, w, w_scale)
    check(w_scale.is_contiguous(), "w_scale must be [{}] and contiguous", n)
    if bias is not None:
        check_tensor("bias", bias, 1, device=xq.device)
        check(bias.shape[0] == n and bias.is_contiguous(), "bias must be [{}] and contiguous", n)
    check(out_dtype in (torch.bfloat16, torch.float16, torch.float32), "out_dtype must be a float dtype, got {}",
          out_dtype)
    cfg = {**DEFAULT, **(config or {})}
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        check_pow2(name, cfg[name])
    check(min(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) >= 16, "FP8 dot tiles are at least 16 wide, got {}",
          cfg)
    return n, k, cfg


def _launch(xq, sx, w, w_scale, bias, y, amax, cfg: dict, swiglu: bool) -> None:
    m, k = xq.shape
    n = y.shape[1]
    if not m:
        return
    cols = cfg["BLOCK_N"] // 2 if swiglu else cfg["BLOCK_N"]
    grid = (triton.cdiv(n, cols), triton.cdiv(m, cfg["BLOCK_M"]))
    _fp8_gemm_kernel[grid](xq, w, sx, w_scale, bias if bias is not None else w_scale, y, amax, m, n, k,
                           HAS_BIAS=bias is not None, EVEN_K=k % cfg["BLOCK_K"] == 0,
                           FAST_ACC=bool(cfg.get("FAST_ACC", 0)), SWIGLU=swiglu, BLOCK_M=cfg["BLOCK_M"],
                           BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
                           num_stages=cfg["num_stages"])


def fp8_gemm_ref(xq, sx, w, w_scale, bias, out_dtype) -> torch.Tensor:
    """The same product in fp32, rounded once."""
    y = (xq.float() * sx) @ (w.float() * w_scale[:, None]).t()
    return (y + (bias.float() if bias is not None else 0.0)).to(out_dtype)


def fp8_gemm_swiglu_ref(xq, sx, w, w_scale, bias, out_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_gemm_ref's product rounded to out_dtype, then swiglu_fp8_ref."""
    return swiglu_fp8_ref(fp8_gemm_ref(xq, sx, w, w_scale, bias, out_dtype))
