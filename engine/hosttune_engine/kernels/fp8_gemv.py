"""FP8-weight matrix-vector product for one-token decode: y [M, N] = x [M, K] @ (w * scale).T (+ bias), M <= 4.

w [N, K] is float8 e4m3, dequantized in registers: row n, column k uses scale[scale_row[n], k // block_k]
(fp32 scale table [R, KB]), which covers block-wise, per-channel and per-tensor scales alike. Each
program owns BLOCK_N rows and walks K in BLOCK_K tiles accumulating in fp32, reading each weight byte
once: half the bytes of the bf16 GEMV. With block scales a tile lies inside one scale block
(BLOCK_K divides block_k); with one scale per row (block_k >= K) the scale is applied once at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor

DEFAULT = {"BLOCK_N": 8, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, srow_ptr, b_ptr, y_ptr, N, K, block_k, stride_xm, stride_wn, stride_s,
                     stride_ym, M: tl.constexpr, HAS_BIAS: tl.constexpr, ROW_SCALE: tl.constexpr,
                     EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    s_rows = s_ptr + tl.load(srow_ptr + offs_n, mask=n_mask, other=0).to(tl.int64) * stride_s  # [BLOCK_N]
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            if EVEN_K:
                w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0)
                x = tl.load(x_ptr + m * stride_xm + offs_k).to(tl.float32)
            else:
                w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
                x = tl.load(x_ptr + m * stride_xm + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            prod = w.to(tl.float32) * x[None, :]
            if ROW_SCALE:
                acc += prod
            else:
                acc += prod * tl.load(s_rows + k0 // block_k, mask=n_mask, other=0.0)[:, None]
        y = tl.sum(acc, 1)
        if ROW_SCALE:
            y *= tl.load(s_rows, mask=n_mask, other=0.0)
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def check_fp8_weight(w, scale, scale_row, block_k: int, k: int, device) -> None:
    check_tensor("w", w, 2, dtypes=(torch.float8_e4m3fn,), device=device)
    check(w.shape[1] == k and w.stride(1) == 1, "w must be [N, {}] and contiguous in K, got {}", k, tuple(w.shape))
    check_tensor("scale", scale, 2, dtypes=(torch.float32,), device=device)
    check(scale.stride(1) == 1 and scale.shape[1] == -(-k // block_k),
          "scale must be [R, ceil(K / block_k)] = [R, {}] and contiguous, got {}", -(-k // block_k), tuple(scale.shape))
    check_tensor("scale_row", scale_row, 1, dtypes=(torch.int32,), device=device)
    check(scale_row.shape[0] == w.shape[0] and scale_row.is_contiguous(), "scale_row must be [N] and contiguous")


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, scale_row: torch.Tensor, block_k: int,
             bias: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """x [M, K] (M <= 4) @ dequant(w [N, K] fp8).T + bias -> [M, N] in x's dtype."""
    check_tensor("x", x, 2)
    m, k = x.shape
    check(1 <= m <= 4 and x.stride(1) == 1, "fp8_gemv takes 1 to 4 rows contiguous in K, got {}", tuple(x.shape))
    check_fp8_weight(w, scale, scale_row, block_k, k, x.device)
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == w.shape[0] and bias.is_contiguous(), "bias must be [{}] and contiguous", w.shape[0])
    cfg = dict(config or DEFAULT)
    row_scale = block_k >= k
    if not row_scale:
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], block_k)
        check(block_k % cfg["BLOCK_K"] == 0, "BLOCK_K {} must divide the scale block {}", cfg["BLOCK_K"], block_k)
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, w, scale, scale_row, bias if bias is not None else x, y, n, k, block_k, x.stride(0), w.stride(0),
        scale.stride(0), y.stride(0), M=m, HAS_BIAS=bias is not None, ROW_SCALE=row_scale,
        EVEN_K=k % cfg["BLOCK_K"] == 0, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y


def fp8_dequantize_ref(w, scale, scale_row, block_k: int) -> torch.Tensor:
    """w [N, K] fp8 -> fp32 [N, K] with its scales."""
    per_element = scale[scale_row.long()].repeat_interleave(block_k, 1)[:, :w.shape[1]]
    return w.float() * per_element


def fp8_gemv_ref(x, w, scale, scale_row, block_k: int, bias=None) -> torch.Tensor:
    y = x.float() @ fp8_dequantize_ref(w, scale, scale_row, block_k).t()
    return (y + (bias.float() if bias is not None else 0.0)).to(x.dtype)
