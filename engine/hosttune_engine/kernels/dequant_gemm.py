"""GEMMs with quantized weights dequantized tile by tile in registers, for prefill and batched decode:
y [M, N] = x [M, K] @ W (+ bias), x in bf16/fp16/fp32 and the tensor-core dot in x's dtype.

`w8a16_gemm`: W = (w [N, K] fp8 * scale).T, scales as in kernels/fp8_gemv.py. `w4a16_gemm`: W [K, N]
4-bit, as in kernels/int4_gemv.py. Where a K tile shares one scale per column (FP8 blocks, per-channel
FP8, plain 4-bit groups) the tile's integers or e4m3 values, exact in x's dtype, go into the dot and the
scale multiplies its fp32 result; act-order 4-bit groups are dequantized per element first. Plain
Triton (no FP8 tensor cores), so it runs on Ampere as well as Hopper.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor
from hosttune_engine.kernels.fp8_gemv import check_fp8_weight
from hosttune_engine.kernels.int4_gemv import check_int4_weight, int4_block_k

DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}


@triton.jit
def _tile_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program -> (row offsets, column offsets) of its output tile, GROUP_M row tiles at a time so their
    weight tiles stay in L2."""
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m, pid_n = first_m + (pid % size), (pid % (GROUP_M * num_n)) // size
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def _epilogue(acc, b_ptr, y_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _w8a16_kernel(x_ptr, w_ptr, s_ptr, srow_ptr, b_ptr, y_ptr, M, N, K, block_k, stride_xm, stride_wn, stride_s,
                  stride_ym, HAS_BIAS: tl.constexpr, ROW_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    offs_m, offs_n = _tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    n_mask = offs_n < N
    s_rows = s_ptr + tl.load(srow_ptr + offs_n, mask=n_mask, other=0).to(tl.int64) * stride_s
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m < M)[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None],
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        part = tl.dot(a, w.to(a.dtype), input_precision=PRECISION)
        if ROW_SCALE:
            acc += part
        else:
            acc += part * tl.load(s_rows + k0 // block_k, mask=n_mask, other=0.0)[None, :]
    if ROW_SCALE:
        acc *= tl.load(s_rows, mask=n_mask, other=0.0)[None, :]
    _epilogue(acc, b_ptr, y_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS)


@triton.jit
def _w4a16_kernel(x_ptr, q_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr, M, N, K, group_size, stride_xm, stride_ym,
                  HAS_BIAS: tl.constexpr, SORTED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    offs_m, offs_n = _tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m < M)[:, None] & k_mask[None, :], other=0.0)
        mask = k_mask[:, None] & n_mask[None, :]
        packed = tl.load(q_ptr + (offs_k // 8).to(tl.int64)[:, None] * N + offs_n[None, :], mask=mask, other=0)
        q = (packed >> ((offs_k % 8) * 4)[:, None]) & 0xF
        if SORTED:  # one group per tile: integers into the dot, the scale on its result
            g = k0 // group_size
            s = tl.load(s_ptr + g * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + g * N + offs_n, mask=n_mask, other=0).to(tl.int32)
            acc += tl.dot(a, (q - z[None, :]).to(a.dtype), input_precision=PRECISION) * s[None, :]
        else:
            gi = tl.load(g_ptr + offs_k, mask=k_mask, other=0).to(tl.int64)[:, None] * N + offs_n[None, :]
            s = tl.load(s_ptr + gi, mask=mask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + gi, mask=mask, other=0).to(tl.float32)
            acc += tl.dot(a, ((q.to(tl.float32) - z) * s).to(a.dtype), input_precision=PRECISION)
    _epilogue(acc, b_ptr, y_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS)


def _check_x_bias(x, bias, n: int) -> None:
    check_tensor("x", x, 2)
    check(x.stride(1) == 1, "x must be contiguous in K, got strides {}", x.stride())
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == n and bias.is_contiguous(), "bias must be [{}] and contiguous", n)


def _precision(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 engines (tests, references) get fp32 products


def _grid(m: int, n: int, cfg: dict) -> tuple[int]:
    return (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)


def w8a16_gemm(x, w, scale, scale_row, block_k: int, bias=None, config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(w [N, K] fp8).T (+ bias) -> [M, N] in x's dtype."""
    m, k = x.shape if x.dim() == 2 else (0, 0)
    _check_x_bias(x, bias, w.shape[0] if w.dim() == 2 else -1)
    check_fp8_weight(w, scale, scale_row, block_k, k, x.device)
    cfg = dict(config or DEFAULT)
    row_scale = block_k >= k
    if not row_scale:
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], block_k)
        check(block_k % cfg["BLOCK_K"] == 0, "BLOCK_K {} must divide the scale block {}", cfg["BLOCK_K"], block_k)
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _w8a16_kernel[_grid(m, n, cfg)](
        x, w, scale, scale_row, bias if bias is not None else x, y, m, n, k, block_k, x.stride(0), w.stride(0),
        scale.stride(0), y.stride(0), HAS_BIAS=bias is not None, ROW_SCALE=row_scale, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], PRECISION=_precision(x))
    return y


def w4a16_gemm(x, qweight, scales, zeros, g_idx, group_size: int, sorted_groups: bool, bias=None,
               config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ W [K, N] 4-bit (+ bias) -> [M, N] in x's dtype."""
    m, k = x.shape if x.dim() == 2 else (0, 0)
    _check_x_bias(x, bias, qweight.shape[1] if qweight.dim() == 2 else -1)
    check_int4_weight(qweight, scales, zeros, g_idx, group_size, k, x.device)
    cfg = dict(config or DEFAULT)
    cfg["BLOCK_K"] = int4_block_k(cfg, group_size, sorted_groups)
    check(cfg["BLOCK_K"] >= 16, "group_size {} leaves no K tile of at least 16 for the dot", group_size)
    n = qweight.shape[1]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _w4a16_kernel[_grid(m, n, cfg)](
        x, qweight, scales, zeros, g_idx, bias if bias is not None else x, y, m, n, k, group_size, x.stride(0),
        y.stride(0), HAS_BIAS=bias is not None, SORTED=sorted_groups, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], PRECISION=_precision(x))
    return y
