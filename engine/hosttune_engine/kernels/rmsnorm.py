"""RMSNorm with an optional fused residual add.

With a residual: s = x + residual (rounded to the input dtype, returned as the new
residual), out = s / rms(s) * weight. Statistics are computed in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_last_dim_contiguous, check_tensor, next_pow2


@triton.jit
def normed_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, stride_x, stride_r, stride_ro, n_cols, eps,
               HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """One row's RMSNorm in fp32 (after storing x + residual, rounded, as the new residual), with its column
    offsets and mask: what a kernel that writes the norm in some form starts from."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, s, mask=mask)
        x = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return x * rstd * w, cols, mask


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    y, cols, mask = normed_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, stride_x, stride_r, stride_ro, n_cols, eps,
                               HAS_RESIDUAL, BLOCK)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             residual_out: torch.Tensor | None = None):
    """x [T, N], weight [N] -> out [T, N] (and the new residual [T, N] if given one, written into
    `residual_out` when that is given: a contiguous tensor like x)."""
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 1, device=x.device)
    check(weight.shape[0] == x.shape[1], "weight has {} elements, x rows have {}", weight.shape[0], x.shape[1])
    check_last_dim_contiguous("x", x)
    check(weight.is_contiguous(), "weight must be contiguous")
    out = torch.empty_like(x)
    res_out = None
    if residual is not None:
        check_tensor("residual", residual, 2, dtypes=(x.dtype,), device=x.device)
        check(residual.shape == x.shape, "residual shape {} != x shape {}", tuple(residual.shape), tuple(x.shape))
        check_last_dim_contiguous("residual", residual)
        res_out = torch.empty_like(x) if residual_out is None else residual_out
        check(res_out.shape == x.shape and res_out.dtype == x.dtype and res_out.device == x.device,
              "residual_out must be like x, got {} {}", tuple(res_out.shape), res_out.dtype)
        check_last_dim_contiguous("residual_out", res_out)
    if x.shape[0]:
        r = residual if residual is not None else x
        ro = res_out if res_out is not None else out
        _rms_norm_kernel[(x.shape[0],)](
            x, r, weight, out, ro, x.stride(0), r.stride(0), out.stride(0), ro.stride(0),
            x.shape[1], eps, HAS_RESIDUAL=residual is not None, BLOCK=next_pow2(x.shape[1]),
            num_warps=min(16, max(4, next_pow2(x.shape[1]) // 512)),  # one row per program: more warps, less latency
        )
    return out if residual is None else (out, res_out)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    if residual is not None:
        residual = (x.float() + residual.float()).to(x.dtype)
        x = residual
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return out.to(x.dtype) if residual is None else (out.to(x.dtype), residual)
