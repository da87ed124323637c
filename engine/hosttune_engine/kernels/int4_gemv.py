"""4-bit-weight matrix-vector product for one-token decode: y [M, N] = x [M, K] @ W (+ bias), M <= 4, in the
layout of kernels/int4_layout.py, optionally with the layer before it computed in the prologue (RMSNorm,
with the residual add, or SwiGLU), as kernels/gemv.py does for bf16.

Parallelism is the bf16 GEMV's: each program owns BLOCK_N rows of qweight [N, K/8] and walks K in
BLOCK_K tiles of contiguous words, so N / BLOCK_N programs (hundreds per projection) stream the weights
with wide loads, each word once. A tile's nibble i of every word is multiplied by the activations at
positions 8j + i; sums stay per group ([BLOCK_N, groups in the tile]) and take their scale and zero once:
sum((q - z) * x) * s = (sum(q * x) - z * sum(x)) * s.

Unpacking: with MAGIC the nibble is masked in place and ORed into the mantissa of 2^23, so one logic op
and one float subtract give q * 16^j exactly (the activation is pre-scaled by 16^-j, j = i % 4; the upper
four nibbles come from the word shifted by 16 once). Without it, shift, mask and an int-to-float
conversion (the GPU's slower conversion unit). Both are exact; the tuner picks per GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor
from hosttune_engine.kernels.gemv import PLAIN, SWIGLU, _input_tile, _rms_rstd, check_prologue, prologue_ref
from hosttune_engine.kernels.int4_layout import check_int4_weight, dequantize_ref, tile_in_group

DEFAULT = {"BLOCK_N": 8, "BLOCK_K": 512, "MAGIC": 1, "num_warps": 4, "num_stages": 3}


@triton.jit
def _nibble(p, p_hi, I: tl.constexpr, MAGIC: tl.constexpr):
    """Nibble I of each word as fp32: q * 16^(I % 4) with MAGIC, else q."""
    if MAGIC:
        MASK: tl.constexpr = 15 << (4 * (I % 4))
        if I < 4:
            bits = (p & MASK) | 0x4B000000
        else:
            bits = (p_hi & MASK) | 0x4B000000
        return bits.to(tl.float32, bitcast=True) - 8388608.0
    else:
        return ((p >> (4 * I)) & 0xF).to(tl.float32)


@triton.jit
def _unscale(x, I: tl.constexpr):
    """x / 16^(I % 4): the MAGIC nibble I carries that factor."""
    if I % 4 == 1:
        x = x * 0.0625
    elif I % 4 == 2:
        x = x * 0.00390625
    elif I % 4 == 3:
        x = x * 0.000244140625
    return x


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, perm_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, res_out_ptr, N, K, stride_xm,
                      stride_ym, eps, M: tl.constexpr, HAS_BIAS: tl.constexpr, PERMUTED: tl.constexpr,
                      PROLOGUE: tl.constexpr, MAGIC: tl.constexpr, EVEN_K: tl.constexpr, GROUP: tl.constexpr,
                      PART: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """PART = min(GROUP, BLOCK_K): the columns of one group inside a tile."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    WORDS: tl.constexpr = BLOCK_K // 8
    SUB: tl.constexpr = BLOCK_K // PART
    kw, groups = K // 8, K // GROUP
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * kw
    g_rows = offs_n * groups  # [BLOCK_N]
    rstd = _rms_rstd(x_ptr, r_ptr, res_out_ptr, K, eps, pid, PROLOGUE, EVEN_K, BLOCK_K)
    for m in tl.static_range(M):  # M <= 4: the repeated weight reads of m > 0 come from cache
        acc = tl.zeros([BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            words = k0 // 8 + tl.arange(0, WORDS)
            if EVEN_K:
                p = tl.load(q_rows + words[None, :], mask=n_mask[:, None], other=0)  # [BLOCK_N, WORDS]
            else:
                p = tl.load(q_rows + words[None, :], mask=n_mask[:, None] & (words < kw)[None, :], other=0)
            p_hi = p >> 16
            part = tl.zeros([BLOCK_N, WORDS], tl.float32)
            x_sum = tl.zeros([WORDS], tl.float32)
            for i in tl.static_range(8):
                offs_k = words * 8 + i
                k_mask = offs_k < K
                cols = offs_k
                if PERMUTED:
                    cols = tl.load(perm_ptr + offs_k, mask=k_mask, other=0)
                x = _input_tile(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols, k_mask, rstd, PROLOGUE, EVEN_K)
                x_sum += x
                if MAGIC:
                    x = _unscale(x, i)
                part += _nibble(p, p_hi, i, MAGIC) * x[None, :]
            if SUB == 1:  # the tile lies in one group
                g = k0 // GROUP
                s = tl.load(s_ptr + g_rows + g, mask=n_mask, other=0.0).to(tl.float32)
                z = tl.load(z_ptr + g_rows + g, mask=n_mask, other=0).to(tl.float32)
                acc += s * (tl.sum(part, 1) - z * tl.sum(x_sum, 0))
            else:
                qx = tl.sum(tl.reshape(part, [BLOCK_N, SUB, PART // 8]), 2)  # [BLOCK_N, SUB]
                xs = tl.sum(tl.reshape(x_sum, [SUB, PART // 8]), 1)  # [SUB]
                g = k0 // GROUP + tl.arange(0, SUB)
                g_mask = n_mask[:, None] & (g < groups)[None, :]
                s = tl.load(s_ptr + g_rows[:, None] + g[None, :], mask=g_mask, other=0.0).to(tl.float32)
                z = tl.load(z_ptr + g_rows[:, None] + g[None, :], mask=g_mask, other=0).to(tl.float32)
                acc += tl.sum(s * (qx - z * xs[None, :]), 1)
        y = acc
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def int4_gemv(x, qweight, scales, zeros, perm, group_size: int, bias=None, config: dict | None = None,
              prologue: int = PLAIN, residual=None, norm_weight=None, residual_out=None,
              eps: float = 0.0) -> torch.Tensor:
    """x [M, K] (M <= 4) @ W (+ bias) -> [M, N] in x's dtype. With `prologue` RMSNORM(_RESIDUAL) x is the raw
    hidden row [1, K]; with SWIGLU it is [1, 2K] [gate | up]."""
    check_tensor("x", x, 2)
    m = x.shape[0]
    k = x.shape[1] // 2 if prologue == SWIGLU else x.shape[1]
    check(1 <= m <= 4 and x.is_contiguous(), "int4_gemv takes 1 to 4 contiguous rows, got {}", tuple(x.shape))
    check_int4_weight(qweight, scales, zeros, perm, group_size, k, x.device)
    n = qweight.shape[0]
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == n and bias.is_contiguous(), "bias must be [{}] and contiguous", n)
    check_prologue(x, k, prologue, residual, norm_weight, residual_out)
    cfg = config or DEFAULT
    block_k = cfg["BLOCK_K"]
    if group_size & (group_size - 1):  # a tile holding several groups needs them a power of two wide
        block_k = tile_in_group(block_k, group_size)
    check(block_k >= 8 and block_k & (block_k - 1) == 0 and (block_k % group_size == 0 or group_size % block_k == 0),
          "BLOCK_K {} must be a power of two, a multiple or a divisor of group_size {}", block_k, group_size)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _int4_gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, qweight, scales, zeros, perm if perm is not None else qweight, bias if bias is not None else x, y,
        residual if residual is not None else x, norm_weight if norm_weight is not None else x,
        residual_out if residual_out is not None else x, n, k, x.stride(0), y.stride(0), eps, M=m,
        HAS_BIAS=bias is not None, PERMUTED=perm is not None, PROLOGUE=prologue, MAGIC=cfg.get("MAGIC", 1),
        EVEN_K=k % block_k == 0, GROUP=group_size, PART=min(group_size, block_k), BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y


def int4_gemv_ref(x, qweight, scales, zeros, perm, group_size: int, bias=None, prologue: int = PLAIN,
                  residual=None, norm_weight=None, residual_out=None, eps: float = 0.0) -> torch.Tensor:
    x = prologue_ref(x, prologue, residual, norm_weight, residual_out, eps)
    y = x.float() @ dequantize_ref(qweight, scales, zeros, perm, group_size).t()
    return (y + (bias.float() if bias is not None else 0.0)).to(x.dtype)
