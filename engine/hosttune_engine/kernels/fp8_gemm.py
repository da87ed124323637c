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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_pow2, check_tensor
from hosttune_engine.kernels.fp8_scaled_mm import check_fp8_operands
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, sx_ptr, sw_ptr, b_ptr, y_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                     EVEN_K: tl.constexpr, FAST_ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    x_tile = x_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    w_tile = w_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_tile + k0, mask=m_mask[:, None], other=0.0)
            b = tl.load(w_tile + k0, mask=n_mask[None, :], other=0.0)
        else:
            k_mask = k0 + offs_k < K
            a = tl.load(x_tile + k0, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(w_tile + k0, mask=n_mask[None, :] & k_mask[:, None], other=0.0)
        if FAST_ACC:
            acc = tl.dot(a, b, acc)  # the tensor cores' own accumulation all along K
        else:
            acc += tl.dot(a, b)  # into fp32 every tile: Hopper's FP8 MMA accumulates with fewer bits
    y = acc * tl.load(sx_ptr + offs_m, mask=m_mask, other=0.0)[:, None]
    y = y * tl.load(sw_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def fp8_gemm(xq: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias,
             out_dtype: torch.dtype, config: dict | None = None) -> torch.Tensor:
    """(xq [M, K] e4m3 * sx [M, 1]) @ (w [N, K] e4m3 * w_scale [N]).T (+ bias [N]) -> [M, N] in out_dtype."""
    n, k = check_fp8_operands(xq, sx, w, w_scale)
    m = xq.shape[0]
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
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m:
        grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]))
        _fp8_gemm_kernel[grid](xq, w, sx, w_scale, bias if bias is not None else w_scale, y, m, n, k,
                               HAS_BIAS=bias is not None, EVEN_K=k % cfg["BLOCK_K"] == 0,
                               FAST_ACC=bool(cfg.get("FAST_ACC", 0)), BLOCK_M=cfg["BLOCK_M"],
                               BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
                               num_stages=cfg["num_stages"])
    return y


def fp8_gemm_ref(xq, sx, w, w_scale, bias, out_dtype) -> torch.Tensor:
    """The same product in fp32, rounded once."""
    y = (xq.float() * sx) @ (w.float() * w_scale[:, None]).t()
    return (y + (bias.float() if bias is not None else 0.0)).to(out_dtype)
