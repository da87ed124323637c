"""RMSNorm (with the residual add) and SwiGLU that write an FP8 GEMM's input: per-token e4m3 rows and their
fp32 scales, in one kernel instead of the layer's and quantize_per_token's (kernels/fp8_scaled_mm.py).

The arithmetic is the unfused kernels', roundings included: the norm's or activation's output is rounded to
the activations' dtype, then quantized (scale = amax / 448 over the row, q = x / scale in e4m3). So the rows
and scales equal what rms_norm or swiglu followed by quantize_per_token write.

One program per row. The norm holds its row in registers (as kernels/rmsnorm.py does); the SwiGLU's rows are
longer (18,944 for a 7B model), so it walks them twice, the amax and then the quantized values, the second
pass reading gate | up again (from L2 at decode batch sizes). With few rows (decode batches) that leaves most
of the GPU idle and each program walking a long serial loop, so up to SPLIT_ROWS rows run in two passes
instead, SPLIT_BLOCK columns a program: the first writes the activations (rounded, as above) to a scratch
row and each part's largest |value| into the row's amax with an atomic max; the second quantizes each part
with the row's scale, and the last program of a row (a per-row counter, as kernels/gemv_splits.py counts)
clears the amax and the counter, so they are zero again for the next call and a CUDA graph replays them
without a memset. On the H200 at 18,944 columns, one program a row against two passes: 1 row 8.0 -> 4.4 us,
64 rows 8.6 -> 6.4, 128 rows 8.9 -> 8.0, 256 rows 12.7 -> 13.5 (a single pass of the row in one program,
each row's last part quantizing it, was slower than both from 64 rows on).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_last_dim_contiguous, check_tensor, next_pow2
from hosttune_engine.kernels.fp8_scaled_mm import FP8, quantize_per_token_ref, row_scale, store_e4m3
from hosttune_engine.kernels.rmsnorm import normed_row, rms_norm_ref
from hosttune_engine.kernels.swiglu import silu_mul, swiglu_ref

SWIGLU_BLOCK = 2048
SPLIT_ROWS = 128  # the most rows the two-pass form takes
SPLIT_BLOCK = 2048  # columns a program of the two-pass form computes
_ROW_STATE: dict = {}  # device -> [(amax, counters)], the newest last


@triton.jit
def _rms_norm_fp8_kernel(x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, stride_x, stride_r, stride_ro,
                         n_cols, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y, cols, mask = normed_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, stride_x, stride_r, stride_ro, n_cols, eps,
                               HAS_RESIDUAL, BLOCK)
    y = y.to(x_ptr.dtype.element_ty).to(tl.float32)  # the unfused norm's output rounding
    store_e4m3(q_ptr + row * n_cols, cols, mask, y, row_scale(tl.max(tl.abs(y), 0), s_ptr, row))


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                 residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] (+ residual [T, H]) -> (e4m3 [T, H], fp32 scales [T, 1]) of RMSNorm(x (+ residual)) * weight;
    with a residual, x + residual goes into `residual_out` [T, H] (contiguous, x's dtype)."""
    check_tensor("x", x, 2, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    check_last_dim_contiguous("x", x)
    check_tensor("weight", weight, 1, device=x.device)
    check(weight.shape[0] == x.shape[1] and weight.is_contiguous(), "weight must be [{}] and contiguous, got {}",
          x.shape[1], tuple(weight.shape))
    check((residual is None) == (residual_out is None), "residual and residual_out go together")
    if residual is not None:
        for name, t in (("residual", residual), ("residual_out", residual_out)):
            check_tensor(name, t, 2, dtypes=(x.dtype,), device=x.device)
            check(t.shape == x.shape, "{} shape {} != x shape {}", name, tuple(t.shape), tuple(x.shape))
            check_last_dim_contiguous(name, t)
    t, h = x.shape
    q = torch.empty((t, h), dtype=FP8, device=x.device)
    scale = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    if t:
        r = residual if residual is not None else x
        ro = residual_out if residual_out is not None else x
        _rms_norm_fp8_kernel[(t,)](x, r, weight, q, scale, ro, x.stride(0), r.stride(0), ro.stride(0), h, eps,
                                   HAS_RESIDUAL=residual is not None, BLOCK=next_pow2(h),
                                   num_warps=min(16, max(4, next_pow2(h) // 512)))
    return q, scale


def rms_norm_fp8_ref(x, weight, eps, residual=None):
    """(e4m3, scales) and, with a residual, the new residual: rms_norm_ref then quantize_per_token_ref."""
    if residual is None:
        return quantize_per_token_ref(rms_norm_ref(x, weight, eps))
    out, new_residual = rms_norm_ref(x, weight, eps, residual)
    return (*quantize_per_token_ref(out), new_residual)


@triton.jit
def _silu_mul(x_ptr, row, stride_x, n_cols, offs, mask):
    g = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    return silu_mul(g, u).to(x_ptr.dtype.element_ty).to(tl.float32)  # swiglu's output rounding


@triton.jit
def _swiglu_fp8_kernel(x_ptr, q_ptr, s_ptr, stride_x, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros([BLOCK], tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(_silu_mul(x_ptr, row, stride_x, n_cols, offs, offs < n_cols)))
    scale = row_scale(tl.max(amax, 0), s_ptr, row)
    for c0 in range(0, n_cols, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        y = _silu_mul(x_ptr, row, stride_x, n_cols, offs, offs < n_cols)
        store_e4m3(q_ptr + row * n_cols, offs, offs < n_cols, y, scale)


@triton.jit
def _swiglu_amax_kernel(x_ptr, h_ptr, amax_ptr, stride_x, n_cols, BLOCK: tl.constexpr):
    """Two-pass form, first pass: a part of a row's activations to h, its largest |value| into the row's amax."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    y = _silu_mul(x_ptr, row, stride_x, n_cols, offs, mask)
    tl.store(h_ptr + row * n_cols + offs, y.to(h_ptr.dtype.element_ty), mask=mask)
    tl.atomic_max(amax_ptr + row, tl.max(tl.abs(y), 0), sem="relaxed")


@triton.jit
def _quantize_parts_kernel(h_ptr, q_ptr, s_ptr, amax_ptr, cnt_ptr, n_cols, BLOCK: tl.constexpr):
    """Two-pass form, second pass: a part of a row in e4m3 with the row's scale; the row's last program clears
    its amax and counter."""
    row = tl.program_id(0).to(tl.int64)
    scale = row_scale(tl.load(amax_ptr + row), s_ptr, row)  # every part stores the same scale
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    h = tl.load(h_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
    store_e4m3(q_ptr + row * n_cols, offs, offs < n_cols, h, scale)
    if tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel") == tl.num_programs(1) - 1:  # all have read the amax
        tl.store(amax_ptr + row, 0.0)
        tl.atomic_xchg(cnt_ptr + row, 0)


def row_amax_state(device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 amax [R], int32 counters [R]), R >= rows, zero between calls. Made at the first call that needs
    more rows than the last; made while a CUDA graph is captured, they come from its memory pool, and this
    cache keeps every one alive for the graphs that use it."""
    states = _ROW_STATE.setdefault(str(device), [])
    if not states or states[-1][0].shape[0] < rows:
        size = max(rows, 256)
        states.append((torch.zeros(size, dtype=torch.float32, device=device),
                       torch.zeros(size, dtype=torch.int32, device=device)))
    return states[-1]


def quantize_by_parts(h: torch.Tensor, amax: torch.Tensor, counts: torch.Tensor, q: torch.Tensor,
                      scale: torch.Tensor) -> None:
    """The two-pass form's second pass, for any kernel that wrote h [T, I] (contiguous) and its rows' largest
    |value| into `amax` (from row_amax_state, which this pass zeroes again): h in e4m3 into q [T, I], the
    rows' scales into scale [T, 1]."""
    t, n = h.shape
    chunk = min(SPLIT_BLOCK, next_pow2(n))
    _quantize_parts_kernel[(t, triton.cdiv(n, chunk))](h, q, scale, amax, counts, n, BLOCK=chunk, num_warps=4)


def split_rows(x: torch.Tensor) -> bool:
    """Whether swiglu_fp8 splits x's rows: on a GPU, up to SPLIT_ROWS of them."""
    return x.is_cuda and x.shape[0] <= SPLIT_ROWS


def swiglu_fp8(x: torch.Tensor, block: int = SWIGLU_BLOCK, split: bool | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, 2I] (gate then up) -> (e4m3 [T, I], fp32 scales [T, 1]) of silu(gate) * up. `split` picks the
    two-pass form (default: `split_rows`); `block` is the one-program-a-row form's tile."""
    check_tensor("x", x, 2, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    check(x.shape[1] % 2 == 0, "x's last dim must be even (gate | up), got {}", x.shape[1])
    check_last_dim_contiguous("x", x)
    check(block > 0 and block & (block - 1) == 0, "block must be a power of two, got {}", block)
    t, n = x.shape[0], x.shape[1] // 2
    q = torch.empty((t, n), dtype=FP8, device=x.device)
    scale = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    if not t:
        return q, scale
    if split_rows(x) if split is None else split:
        h = torch.empty((t, n), dtype=x.dtype, device=x.device)
        amax, counts = row_amax_state(x.device, t)
        chunk = min(SPLIT_BLOCK, next_pow2(n))
        grid = (t, triton.cdiv(n, chunk))
        _swiglu_amax_kernel[grid](x, h, amax, x.stride(0), n, BLOCK=chunk, num_warps=4)
        quantize_by_parts(h, amax, counts, q, scale)
    else:
        _swiglu_fp8_kernel[(t,)](x, q, scale, x.stride(0), n, BLOCK=min(block, next_pow2(n)), num_warps=8)
    return q, scale


def swiglu_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_per_token_ref(swiglu_ref(x))
