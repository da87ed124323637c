"""FP8 GEMM on FP8 tensor cores (Hopper, Ada) for prefill and batched decode, with per-token activation
scales and per-output-channel weight scales.

x is quantized per row to e4m3 (scale amax / 448, one Triton kernel). Two ways to multiply:
- unit scales (`fp8_scaled_mm`): torch._scaled_mm's fastest form at few rows (with row-wise scales cuBLAS
  is ~1.7x slower on an H200 at 16-64 rows), into bf16 (the unscaled products can pass fp16's range);
  one Triton epilogue then applies both scales and the bias: y[m, n] = acc[m, n] * sx[m] * sw[n] + bias[n].
  That epilogue reads and writes the output once more, which a long prefill feels.
- row-wise scales (`rowwise=True`): scales and bias in the GEMM's own epilogue, one launch, no extra pass.
The tuned table says which one each batch size takes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
EPILOGUE = {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 4}


def supports_fp8_mm(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_per_token_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, 1]) with x ~ q * scale."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp_min(1e-12) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@triton.jit
def row_scale(amax, s_ptr, row):
    """A row's e4m3 scale from its largest |value| (a scalar), stored at s_ptr[row]: quantize_per_token_ref's
    rule, for every kernel that writes FP8 GEMM inputs."""
    scale = tl.maximum(amax, 1e-12) / 448.0
    tl.store(s_ptr + row, scale)
    return scale


@triton.jit
def store_e4m3(q_ptr, offs, mask, y, scale):
    """y / scale in e4m3 (clamped to its range) at q_ptr + offs."""
    q = tl.minimum(tl.maximum(y / scale, -448.0), 448.0)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCK_K: tl.constexpr):
    """One row per program: its amax over K, then the row in e4m3 (one read for each pass, one write)."""
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        amax = tl.maximum(amax, tl.abs(tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)))
    scale = row_scale(tl.max(amax, 0), s_ptr, row)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        store_e4m3(q_ptr + row * K, offs, offs < K, x, scale)


def quantize_per_token(x: torch.Tensor, block_k: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton version of quantize_per_token_ref (x [M, K] contiguous in K)."""
    check_tensor("x", x, 2)
    check(x.stride(1) == 1, "x must be contiguous in K, got strides {}", x.stride())
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    _quantize_rows_kernel[(m,)](x, q, scale, k, x.stride(0), BLOCK_K=block_k, num_warps=4)
    return q, scale


@triton.jit
def _scale_epilogue_kernel(acc_ptr, sx_ptr, sw_ptr, b_ptr, y_ptr, M, N, HAS_BIAS: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    mask = m_mask[:, None] & n_mask[None, :]
    offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    acc = tl.load(acc_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = acc * tl.load(sx_ptr + offs_m, mask=m_mask, other=0.0)[:, None] * tl.load(sw_ptr + offs_n, mask=n_mask,
                                                                                   other=0.0)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def scale_epilogue(acc, sx, sw, bias, out_dtype) -> torch.Tensor:
    """acc [M, N] * sx [M] * sw [N] (+ bias [N]) -> [M, N] in out_dtype."""
    m, n = acc.shape
    check(acc.is_contiguous() and sx.numel() == m and sw.numel() == n, "scale_epilogue: acc [M, N] contiguous, "
          "sx [M], sw [N], got {} {} {}", tuple(acc.shape), tuple(sx.shape), tuple(sw.shape))
    y = torch.empty((m, n), dtype=out_dtype, device=acc.device)
    cfg = EPILOGUE
    _scale_epilogue_kernel[(triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))](
        acc, sx, sw, bias if bias is not None else sw, y, m, n, HAS_BIAS=bias is not None,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])
    return y


def fp8_scaled_mm(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias=None,
                  unit: torch.Tensor | None = None, rowwise: bool = False) -> torch.Tensor:
    """x [M, K] bf16/fp16 @ (w [N, K] e4m3 * w_scale [N]).T (+ bias) -> [M, N] in x's dtype (FP8 activations).
    `unit` is a fp32 scalar 1 on x's device (layers keep one, so a CUDA graph capture allocates none)."""
    check_tensor("x", x, 2, dtypes=(torch.bfloat16, torch.float16))
    check_tensor("w", w, 2, dtypes=(FP8,), device=x.device)
    check(x.is_contiguous() and x.shape[1] == w.shape[1], "x [M, {}] must be contiguous, got {} (strides {})",
          w.shape[1], tuple(x.shape), x.stride())
    xq, sx = quantize_per_token(x)
    return fp8_mm(xq, sx, w, w_scale, bias, unit, rowwise, x.dtype)


def check_fp8_operands(xq, sx, w, w_scale) -> tuple[int, int]:
    """Check an FP8 GEMM's operands (xq [M, K] e4m3 with sx [M, 1] fp32, w [N, K] e4m3 with w_scale [N] fp32,
    each contiguous, all on one device); returns (N, K)."""
    check_tensor("xq", xq, 2, dtypes=(FP8,))
    check_tensor("w", w, 2, dtypes=(FP8,), device=xq.device)
    n, k = w.shape
    check(xq.shape[1] == k and xq.is_contiguous() and w.is_contiguous(), "xq [M, {}] and w [N, {}] must be "
          "contiguous, got {} and {}", k, k, tuple(xq.shape), tuple(w.shape))
    check_tensor("sx", sx, 2, dtypes=(torch.float32,), device=xq.device)
    check(sx.shape == (xq.shape[0], 1) and sx.is_contiguous(), "sx must be [{}, 1] and contiguous, got {}",
          xq.shape[0], tuple(sx.shape))
    check_tensor("w_scale", w_scale, 1, dtypes=(torch.float32,), device=xq.device)
    check(w_scale.shape[0] == n, "w_scale must be [{}]", n)
    return n, k


def fp8_mm(xq: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias, unit, rowwise: bool,
           out_dtype: torch.dtype) -> torch.Tensor:
    """(xq [M, K] e4m3 * sx [M, 1]) @ (w [N, K] e4m3 * w_scale [N]).T (+ bias) -> [M, N] in out_dtype: the
    GEMM of fp8_scaled_mm on activations already quantized per token (quantize_per_token, kernels/fp8_inputs)."""
    n, k = check_fp8_operands(xq, sx, w, w_scale)
    check(k % 16 == 0 and n % 16 == 0, "FP8 tensor cores need K and N multiples of 16, got [{}, {}]", n, k)
    check(out_dtype in (torch.bfloat16, torch.float16), "out_dtype must be bf16 or fp16, got {}", out_dtype)
    if rowwise:
        return torch._scaled_mm(xq, w.t(), scale_a=sx, scale_b=w_scale[None, :], bias=bias, out_dtype=out_dtype)
    one = unit if unit is not None else torch.ones((), dtype=torch.float32, device=xq.device)
    acc = torch._scaled_mm(xq, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return scale_epilogue(acc, sx, w_scale, bias, out_dtype)


def fp8_scaled_mm_ref(x, w, w_scale, bias=None) -> torch.Tensor:
    """The same arithmetic in fp32: per-token e4m3 activations times the dequantized weight."""
    xq, sx = quantize_per_token_ref(x)
    y = (xq.float() * sx) @ (w.float() * w_scale[:, None]).t()
    return (y + (bias.float() if bias is not None else 0.0)).to(x.dtype)
