"""Matrix-vector product for one-token decode: y [M, N] = x [M, K] @ w[N, K].T (+ bias), M <= 4.

At batch 1 a decode step is a stream of weight reads; each program owns BLOCK_N
rows of w and walks K in BLOCK_K tiles, accumulating in fp32 with no tensor
cores (the operand is a vector). The output is written in `out_dtype`, so the
LM head can produce fp32 logits from bf16 weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym,
                 M: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0)
                x = tl.load(x_ptr + m * stride_xm + offs_k)
            else:
                k_mask = offs_k < K
                w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
                x = tl.load(x_ptr + m * stride_xm + offs_k, mask=k_mask, other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        y = tl.sum(acc, 1)
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


DEFAULT = {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 4}


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
         config: dict | None = None) -> torch.Tensor:
    """x [M, K] (M <= 4), w [N, K], bias [N] -> [M, N] in out_dtype (default x's dtype)."""
    check_tensor("x", x, 2)
    check_tensor("w", w, 2, dtypes=(x.dtype,), device=x.device)
    m, k = x.shape
    n = w.shape[0]
    check(1 <= m <= 4, f"gemv takes 1 to 4 rows, got {m}")
    check(w.shape[1] == k and w.stride(1) == 1 and x.stride(1) == 1, "w must be [N, K] and both contiguous in K")
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == n and bias.is_contiguous(), f"bias must be [{n}] and contiguous")
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    cfg = config or DEFAULT
    _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, w, bias if bias is not None else w, y, n, k, x.stride(0), w.stride(0), y.stride(0),
        M=m, HAS_BIAS=bias is not None, EVEN_K=k % cfg["BLOCK_K"] == 0,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y


def gemv_ref(x, w, bias=None, out_dtype=None):
    y = x.float() @ w.float().t() + (bias.float() if bias is not None else 0.0)
    return y.to(out_dtype or x.dtype)
