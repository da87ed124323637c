"""FP8-weight matrix-vector product for one-token decode: y [M, N] = x [M, K] @ (w * scale).T (+ bias), M <= 4,
optionally with the layer before it computed in the prologue, as kernels/gemv.py does for bf16.

w [N, K] is float8 e4m3, dequantized in registers: row n, column k uses scale[scale_row[n], k // block_k]
(fp32 scale table [R, KB]), which covers block-wise, per-channel and per-tensor scales alike. Each
program owns BLOCK_N rows and walks K in BLOCK_K tiles accumulating in fp32, reading each weight byte
once: half the bytes of the bf16 GEMV. With one scale per row (block_k >= K) the scale is applied once
at the end; with block scales a tile holds BLOCK_K / block_k whole scale blocks, each summed apart and
scaled. Prologues (one row): RMSNorm (+ residual add, program 0 writing the new residual) or SwiGLU over
[gate | up], with the unfused kernels' roundings.

With DOT in the config the products run on the tensor cores instead (`_fp8_gemv_dot_kernel`): the rows
padded to 16, the e4m3 tile converted to x's dtype (exact) for the dot, the tile's scale on its fp32
result. Which is faster depends on the GPU's conversion and FMA rates; the tuner measures both.

Config keys beside the block shapes: XB 1 loads the input in the weight tile's layout (kernels/gemv.py
`_rows_input`); UNROLL n unrolls the K loop n times, so the loads of later tiles issue before the products of
the first; PIPE p software-pipelines it instead: every load of the loop goes through shared memory p - 1 tiles
ahead (the kernel's num_stages only does that for a dot's operands); SPLIT s gives each block of rows s programs,
each over 1/s of K (kernels/gemv_splits.py). PACKED 1 (CUDA only, inline PTX; K a multiple of 8) reads the
weights as 64-bit words and multiplies two an instruction: each e4m3 pair converted to fp16x2 (exact), the
activations entering as fp16 pairs scaled by 1/1024 (exact down to 1/64, so a half's four products stay inside
fp16 for activations up to about 37,000), the eight products' halves added in fp32: 1.5 instructions a weight
for the products, about 2.4 with the activations' loads and conversions at 128 weights a thread, against about
4 for the fp32 products. The tuner measures them.

BITS 1 in the config, and every launch on a GPU before compute capability 8.9 (whose Triton has no e4m3 type),
reads the weights as bytes and decodes them by integer operations (kernels/e4m3.py) in both kernels; PACKED,
whose PTX converts e4m3 natively, is then left out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor
from hosttune_engine.kernels.e4m3 import decodes_bits, e4m3_to, weight_operand
from hosttune_engine.kernels.gemv_splits import finish_rows, split_buffers, split_grid, split_range, store_row
from hosttune_engine.kernels.gemv import (PLAIN, SWIGLU, _half2, _input_tile, _rms_rstd, _rows_input,
                                          _weight_tile, check_prologue, prologue_ref)

DEFAULT = {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 4}


# PACKED: activations enter fp16 scaled by this (exact above 2^-14 / X_SCALE = 1/64); a half's sum of four products
# of e4m3 weights (at most 448) stays inside fp16's range for activations below about 37,000
X_SCALE: tl.constexpr = tl.constexpr(1.0 / 1024)

# eight e4m3 weights (one 64-bit element) against their fp16x2 activation pairs: four conversions of two weights,
# four fp16x2 multiply-adds, the two halves added in fp32
_DOT8: tl.constexpr = tl.constexpr("""{
.reg .b32 w0, w1, f0, f1, f2, f3, a;
.reg .b16 b0, b1, b2, b3, lo, hi;
.reg .f32 flo, fhi;
mov.b64 {w0, w1}, $1;
mov.b32 {b0, b1}, w0;
mov.b32 {b2, b3}, w1;
cvt.rn.f16x2.e4m3x2 f0, b0;
cvt.rn.f16x2.e4m3x2 f1, b1;
cvt.rn.f16x2.e4m3x2 f2, b2;
cvt.rn.f16x2.e4m3x2 f3, b3;
mul.rn.f16x2 a, f0, $2;
fma.rn.f16x2 a, f1, $3, a;
fma.rn.f16x2 a, f2, $4, a;
fma.rn.f16x2 a, f3, $5, a;
mov.b32 {lo, hi}, a;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 $0, flo, fhi;
}""")


@triton.jit
def _x_pair(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols, rstd, zero_rows, PROLOGUE: tl.constexpr,
            EVEN_K: tl.constexpr, XB: tl.constexpr):
    """PACKED: the inputs at columns `cols` and `cols` + 1 as fp16x2 words, scaled by X_SCALE (packed before any
    broadcast over the rows: one layout change for two inputs)."""
    lo = _rows_input(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols, cols < K, rstd, zero_rows, PROLOGUE, EVEN_K, XB)
    hi = _rows_input(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols + 1, cols + 1 < K, rstd, zero_rows, PROLOGUE,
                     EVEN_K, XB)
    return _half2(lo * X_SCALE, hi * X_SCALE)


@triton.jit
def _packed_products(w_rows, x_ptr, r_ptr, nw_ptr, m, stride_xm, K, k0, n_mask, rstd, zero_rows,
                     PROLOGUE: tl.constexpr, EVEN_K: tl.constexpr, XB: tl.constexpr, BLOCK_K: tl.constexpr):
    """PACKED: one tile's products summed by eights, [BLOCK_N, BLOCK_K // 8] fp32, times X_SCALE: the weights read
    as 64-bit words (K a multiple of 8; the wrapper sees to it)."""
    el = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    cols = el * 8
    words = w_rows.to(tl.pointer_type(tl.int64)) + el[None, :]  # the rows' starts are 8-byte aligned
    if EVEN_K:
        p = tl.load(words, mask=n_mask[:, None], other=0)
    else:
        p = tl.load(words, mask=n_mask[:, None] & (cols < K)[None, :], other=0)
    h0 = _x_pair(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols, rstd, zero_rows, PROLOGUE, EVEN_K, XB)
    h1 = _x_pair(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols + 2, rstd, zero_rows, PROLOGUE, EVEN_K, XB)
    h2 = _x_pair(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols + 4, rstd, zero_rows, PROLOGUE, EVEN_K, XB)
    h3 = _x_pair(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols + 6, rstd, zero_rows, PROLOGUE, EVEN_K, XB)
    return tl.inline_asm_elementwise(_DOT8, "=f,l,r,r,r,r", [p, h0, h1, h2, h3], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, srow_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, res_out_ptr, part_ptr, cnt_ptr, N, K,
                     stride_xm, stride_wn, stride_s, stride_ym, eps, M: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SCALE_K: tl.constexpr, SUB: tl.constexpr, EVEN_K: tl.constexpr, PROLOGUE: tl.constexpr,
                     XB: tl.constexpr, UNROLL: tl.constexpr, PIPE: tl.constexpr, SPLIT: tl.constexpr,
                     PACKED: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    k_lo, k_hi = split_range(K, split, SPLIT, BLOCK_K)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    s_rows = s_ptr + tl.load(srow_ptr + offs_n, mask=n_mask, other=0).to(tl.int64) * stride_s  # [BLOCK_N]
    zero_rows = tl.zeros([BLOCK_N, 1], tl.int32)
    rstd = _rms_rstd(x_ptr, r_ptr, res_out_ptr, K, eps, pid + split, PROLOGUE, EVEN_K, BLOCK_K)
    EL: tl.constexpr = 8 if PACKED else 1  # weights a product element holds
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K // EL], tl.float32)
        acc_blocks = tl.zeros([BLOCK_N, SUB], tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=PIPE, loop_unroll_factor=UNROLL):
            if PACKED:
                prod = _packed_products(w_rows, x_ptr, r_ptr, nw_ptr, m, stride_xm, K, k0, n_mask, rstd, zero_rows,
                                        PROLOGUE, EVEN_K, XB, BLOCK_K)
            else:
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_mask = offs_k < K
                w = _weight_tile(w_rows, offs_k, n_mask, k_mask, EVEN_K)
                x = _rows_input(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, offs_k, k_mask, rstd, zero_rows, PROLOGUE,
                                EVEN_K, XB)
                prod = e4m3_to(w, tl.float32, BITS) * x
            if SCALE_K == 0:
                acc += prod
            else:
                blocks = tl.sum(tl.reshape(prod, [BLOCK_N, SUB, SCALE_K // EL]), 2)  # [BLOCK_N, SUB]
                kb = k0 // SCALE_K + tl.arange(0, SUB)
                scale = tl.load(s_rows[:, None] + kb[None, :], mask=n_mask[:, None] & (kb * SCALE_K < K)[None, :],
                                other=0.0)
                acc_blocks += blocks * scale
        if SCALE_K == 0:
            y = tl.sum(acc, 1) * tl.load(s_rows, mask=n_mask, other=0.0)
        else:
            y = tl.sum(acc_blocks, 1)
        if PACKED:
            y = y * (1.0 / X_SCALE)
        store_row(y, y_ptr, b_ptr, part_ptr, m, N, offs_n, n_mask, stride_ym, HAS_BIAS, SPLIT)
    if SPLIT > 1:
        finish_rows(part_ptr, cnt_ptr, y_ptr, b_ptr, pid, offs_n, n_mask, N, stride_ym, M, HAS_BIAS, SPLIT)


@triton.jit
def _add_scaled(acc, part, s_rows, kb, n_mask, ROW_SCALE: tl.constexpr):
    """acc += a dot's fp32 result [., BLOCK_N], times its K block's scales unless the scale is one per row."""
    if ROW_SCALE:
        return acc + part
    else:
        return acc + part * tl.load(s_rows + kb, mask=n_mask, other=0.0)[None, :]


@triton.jit
def _row_scaled(acc, s_rows, n_mask, ROW_SCALE: tl.constexpr):
    """With one scale per row, applied once at the end."""
    if ROW_SCALE:
        return acc * tl.load(s_rows, mask=n_mask, other=0.0)[None, :]
    else:
        return acc


@triton.jit
def _fp8_gemv_dot_kernel(x_ptr, w_ptr, s_ptr, srow_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, res_out_ptr, N, K, block_k,
                         stride_xm, stride_wn, stride_s, stride_ym, eps, M: tl.constexpr, HAS_BIAS: tl.constexpr,
                         ROW_SCALE: tl.constexpr, EVEN_K: tl.constexpr, PROLOGUE: tl.constexpr, BITS: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """The same product on the tensor cores: the M rows padded to 16 with zeros, e4m3 weights converted to x's
    dtype (exactly) for the dot; no per-weight fp32 conversion or FMA. BLOCK_K lies inside one scale block."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    s_rows = s_ptr + tl.load(srow_ptr + offs_n, mask=n_mask, other=0).to(tl.int64) * stride_s  # [BLOCK_N]
    rows = tl.arange(0, 16)
    rstd = _rms_rstd(x_ptr, r_ptr, res_out_ptr, K, eps, pid, PROLOGUE, EVEN_K, BLOCK_K)
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        if PROLOGUE == 0:
            a = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :], mask=(rows < M)[:, None] & k_mask[None, :],
                        other=0.0)
        else:
            x = _input_tile(x_ptr, r_ptr, nw_ptr, 0, stride_xm, K, offs_k, k_mask, rstd, PROLOGUE, EVEN_K)
            a = tl.where((rows == 0)[:, None], x[None, :], 0.0).to(x_ptr.dtype.element_ty)
        w = _weight_tile(w_rows, offs_k, n_mask, k_mask, EVEN_K)  # [BLOCK_N, BLOCK_K]
        part = tl.dot(a, tl.trans(e4m3_to(w, a.dtype, BITS)), input_precision=PRECISION)  # [16, BLOCK_N]
        acc = _add_scaled(acc, part, s_rows, k0 // block_k, n_mask, ROW_SCALE)
    acc = _row_scaled(acc, s_rows, n_mask, ROW_SCALE)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rows < M)[:, None] & n_mask[None, :])


def check_fp8_weight(w, scale, scale_row, block_k: int, k: int, device) -> None:
    check_tensor("w", w, 2, dtypes=(torch.float8_e4m3fn,), device=device)
    check(w.shape[1] == k and w.stride(1) == 1, "w must be [N, {}] and contiguous in K, got {}", k, tuple(w.shape))
    check_tensor("scale", scale, 2, dtypes=(torch.float32,), device=device)
    check(scale.stride(1) == 1 and scale.shape[1] == -(-k // block_k),
          "scale must be [R, ceil(K / block_k)] = [R, {}] and contiguous, got {}", -(-k // block_k), tuple(scale.shape))
    check_tensor("scale_row", scale_row, 1, dtypes=(torch.int32,), device=device)
    check(scale_row.shape[0] == w.shape[0] and scale_row.is_contiguous(), "scale_row must be [N] and contiguous")


def _tile(cfg: dict, block_k: int, k: int) -> tuple[int, int]:
    """(BLOCK_K, SCALE_K): SCALE_K 0 for one scale per row, else the scale block, which the tile must hold whole."""
    if block_k >= k:
        return cfg["BLOCK_K"], 0
    check(block_k & (block_k - 1) == 0, "block scales of {} columns: the FP8 GEMV needs a power of two", block_k)
    return max(cfg["BLOCK_K"], block_k), block_k


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, scale_row: torch.Tensor, block_k: int,
             bias: torch.Tensor | None = None, config: dict | None = None, prologue: int = PLAIN,
             residual=None, norm_weight=None, residual_out=None, eps: float = 0.0) -> torch.Tensor:
    """x [M, K] (M <= 4) @ dequant(w [N, K] fp8).T + bias -> [M, N] in x's dtype. With `prologue` RMSNORM(_RESIDUAL)
    x is the raw hidden row [1, K]; with SWIGLU it is [1, 2K] [gate | up]."""
    check_tensor("x", x, 2)
    m = x.shape[0]
    k = x.shape[1] // 2 if prologue == SWIGLU else x.shape[1]
    check(1 <= m <= 4 and x.is_contiguous(), "fp8_gemv takes 1 to 4 contiguous rows, got {}", tuple(x.shape))
    check_fp8_weight(w, scale, scale_row, block_k, k, x.device)
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == w.shape[0] and bias.is_contiguous(), "bias must be [{}] and contiguous", w.shape[0])
    check_prologue(x, k, prologue, residual, norm_weight, residual_out)
    cfg = config or DEFAULT
    n, bits = w.shape[0], decodes_bits(cfg, x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    args = (x, weight_operand(w, bits), scale, scale_row, bias if bias is not None else x, y,
            residual if residual is not None else x, norm_weight if norm_weight is not None else x,
            residual_out if residual_out is not None else x)
    if cfg.get("DOT"):
        _launch_dot(args, n, k, block_k, x, w, scale, y, eps, bias is not None, prologue, bits, cfg)
        return y
    block, scale_k = _tile(cfg, block_k, k)
    split = cfg.get("SPLIT", 1)
    part, cnt = split_buffers(x.device, n) if split > 1 else (y, y)
    packed = bool(cfg.get("PACKED")) and not bits and _packs(w, block, scale_k)  # its PTX converts e4m3 natively
    _fp8_gemv_kernel[split_grid(n, cfg["BLOCK_N"], split)](
        *args, part, cnt, n, k, x.stride(0), w.stride(0), scale.stride(0), y.stride(0), eps, M=m,
        HAS_BIAS=bias is not None, SCALE_K=scale_k, SUB=block // scale_k if scale_k else 1, EVEN_K=k % block == 0,
        PROLOGUE=prologue, XB=bool(cfg.get("XB")), UNROLL=cfg.get("UNROLL", 1), PIPE=cfg.get("PIPE"), SPLIT=split,
        PACKED=packed, BITS=bits, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    return y


def _packs(w, block: int, scale_k: int) -> bool:
    """Whether the packed products can run: on CUDA (inline PTX), with the rows as whole 8-byte words and each
    word inside one scale block."""
    return (w.is_cuda and w.stride(0) % 8 == 0 and w.data_ptr() % 8 == 0 and block % 8 == 0
            and (scale_k == 0 or scale_k % 8 == 0))


def _launch_dot(args, n, k, block_k, x, w, scale, y, eps, has_bias, prologue, bits, cfg) -> None:
    row_scale = block_k >= k
    block = cfg["BLOCK_K"] if row_scale else min(cfg["BLOCK_K"], block_k)
    check(cfg["BLOCK_N"] >= 16 and (row_scale or block_k % block == 0), "the tensor-core FP8 GEMV needs BLOCK_N "
          ">= 16 and BLOCK_K dividing the scale block {}, got {}", block_k, cfg)
    _fp8_gemv_dot_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        *args, n, k, block_k, x.stride(0), w.stride(0), scale.stride(0), y.stride(0), eps, M=x.shape[0],
        HAS_BIAS=has_bias, ROW_SCALE=row_scale, EVEN_K=k % block == 0, PROLOGUE=prologue, BITS=bits,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def fp8_dequantize_ref(w, scale, scale_row, block_k: int) -> torch.Tensor:
    """w [N, K] fp8 -> fp32 [N, K] with its scales."""
    per_element = scale[scale_row.long()].repeat_interleave(block_k, 1)[:, :w.shape[1]]
    return w.float() * per_element


def fp8_gemv_ref(x, w, scale, scale_row, block_k: int, bias=None, prologue: int = PLAIN, residual=None,
                 norm_weight=None, residual_out=None, eps: float = 0.0) -> torch.Tensor:
    x = prologue_ref(x, prologue, residual, norm_weight, residual_out, eps)
    y = x.float() @ fp8_dequantize_ref(w, scale, scale_row, block_k).t()
    return (y + (bias.float() if bias is not None else 0.0)).to(x.dtype)
