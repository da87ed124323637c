"""4-bit-weight matrix-vector product for one-token decode: y [M, N] = x [M, K] @ W (+ bias), M <= 4, in the
layout of kernels/int4_layout.py, optionally with the layer before it computed in the prologue (RMSNorm,
with the residual add, or SwiGLU), as kernels/gemv.py does for bf16.

Parallelism is the bf16 GEMV's: each program owns BLOCK_N rows of qweight [N, K/8] and walks K in
BLOCK_K tiles of contiguous words, so N / BLOCK_N programs (hundreds per projection) stream the weights
with wide loads, each word once. The columns are interleaved in blocks (kernels/int4_layout.py), so nibble
i of a run of words meets a run of consecutive activations, loaded (and put through the prologue) with
vector loads.

Unpacking costs one logic op and one subtract per weight, exact: nibble j (j < 4; nibbles 4-7 come from
the word shifted by 16 once) is masked in place and ORed into the mantissa of 2^23, which as a float is
2^23 + q 16^j; subtracting 2^23 + zero 16^j (once per row and group) leaves (q - zero) 16^j. The products
of the four nibble positions are summed with their 1 / 16^j and the group's scale once per tile.

On CUDA, PACKED 1 in the config unpacks and multiplies two weights an instruction instead (fp16x2, inline PTX,
`_word_dot`): the nibble pairs (i, i + 4) of a word ORed into two fp16 1024s and 1024 + zero taken off, exact;
the activations enter as fp16 pairs scaled by 1/256 (exact; the range stays far from fp16's limit), four
products a half summed in fp16, the word's two halves then added and scaled in fp32: about half the
instructions a weight of the fp32 path, whose roundings are the reference's. UNROLL and PIPE: as in
kernels/fp8_gemv.py (the K loop unrolled, or software-pipelined through shared memory), SPLIT
(kernels/gemv_splits.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor
from hosttune_engine.kernels.gemv import (PLAIN, SWIGLU, _half2, _input_tile, _rms_rstd, check_prologue,
                                          prologue_ref)
from hosttune_engine.kernels.gemv_splits import finish_rows, split_buffers, split_grid, split_range, store_row
from hosttune_engine.kernels.int4_layout import check_int4_weight, dequantize_ref, pack_block, tile_in_group

DEFAULT = {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4, "num_stages": 2}


@triton.jit
def _magic(src, c, J: tl.constexpr):
    """(q - zero) * 16^J of the nibble at bits 4J..4J+3 of src, in fp32 and exact: the nibble, masked in place,
    ORed into the mantissa of 2^23 is the float 2^23 + q 16^J; c = 2^23 + zero 16^J."""
    MASK: tl.constexpr = 15 << (4 * J)
    return ((src & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - c


@triton.jit
def _pow16(J: tl.constexpr):
    if J == 0:
        return 1.0
    elif J == 1:
        return 16.0
    elif J == 2:
        return 256.0
    else:
        return 4096.0


# PACKED: activations enter fp16 scaled by this (exact), so sums of four products stay far inside fp16's range
X_SCALE: tl.constexpr = tl.constexpr(1.0 / 256)

# one word's dot product, eight weights at two an instruction: the nibble pairs (i, i + 4) masked in place and ORed
# into fp16 1024 (nibbles 1, 3, 5, 7 land at 16 q: scaled by 1/16 and 64 taken instead), minus 1024 + zero, exact;
# four fp16x2 multiply-adds with the activation pairs, the two halves added in fp32
_WORD_DOT: tl.constexpr = tl.constexpr("""{
.reg .b32 t0, t1, t2, t3, w2, c16, a;
.reg .b16 lo, hi;
.reg .f32 flo, fhi;
shr.u32 w2, $1, 8;
lop3.b32 t0, $1, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t1, $1, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 t2, w2, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t3, w2, 0x00F000F0, 0x64006400, 0xEA;
mov.b32 c16, 0x2C002C00;
sub.f16x2 t0, t0, $6;
fma.rn.f16x2 t1, t1, c16, $7;
sub.f16x2 t2, t2, $6;
fma.rn.f16x2 t3, t3, c16, $7;
mul.f16x2 a, t0, $2;
fma.rn.f16x2 a, t1, $3, a;
fma.rn.f16x2 a, t2, $4, a;
fma.rn.f16x2 a, t3, $5, a;
mov.b32 {lo, hi}, a;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 flo, flo, fhi;
mov.b32 $0, flo;
}""")


@triton.jit
def _word_dot(p, x0, x1, x2, x3, zc, nzc):
    """sum over a word's eight nibbles of (q - zero) x, in fp32 (x0..x3: fp16x2 activations of nibbles (j, j + 4);
    zc: fp16x2 1024 + zero, nzc: fp16x2 -(64 + zero))."""
    d = tl.inline_asm_elementwise(_WORD_DOT, "=r,r,r,r,r,r,r,r", [p, x0, x1, x2, x3, zc, nzc], dtype=tl.int32,
                                  is_pure=True, pack=1)
    return d.to(tl.float32, bitcast=True)


@triton.jit
def _zero_halves(z):
    """Zero points (exact integers in fp32) -> the fp16x2 words 1024 + z and -(64 + z): fp16 1024 + z is 0x6400 | z,
    64 + z is 0x5400 | 16 z; 0x80008000 (as int32) sets both signs."""
    zi = z.to(tl.int32)
    zc = 0x64006400 | zi | (zi << 16)
    nzc = -2147450880 | 0x54005400 | (zi << 4) | (zi << 20)
    return zc, nzc


@triton.jit
def _group_params(z_ptr, s_ptr, g_rows, k0, n_mask, GROUP: tl.constexpr, SUB: tl.constexpr):
    """Zeros and scales of the tile's groups as fp32 [BLOCK_N, SUB] ([BLOCK_N, 1] for a tile inside a group)."""
    if SUB == 1:
        offs = g_rows + k0 // GROUP
        z = tl.load(z_ptr + offs, mask=n_mask, other=0).to(tl.float32)[:, None]
        s = tl.load(s_ptr + offs, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    else:
        offs = g_rows[:, None] + (k0 // GROUP + tl.arange(0, SUB))[None, :]
        z = tl.load(z_ptr + offs, mask=n_mask[:, None], other=0).to(tl.float32)
        s = tl.load(s_ptr + offs, mask=n_mask[:, None], other=0.0).to(tl.float32)
    return z, s


@triton.jit
def _per_word(v, BLOCK_N: tl.constexpr, SUB: tl.constexpr, GW: tl.constexpr):
    """[BLOCK_N, SUB] per group -> per word of the tile [BLOCK_N, SUB * GW] (as is for SUB == 1: it broadcasts)."""
    if SUB == 1:
        return v
    else:
        return tl.reshape(tl.broadcast_to(v[:, :, None], [BLOCK_N, SUB, GW]), [BLOCK_N, SUB * GW])


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, perm_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, res_out_ptr, part_ptr,
                      cnt_ptr, N, K, stride_xm, stride_ym, eps, M: tl.constexpr, HAS_BIAS: tl.constexpr,
                      PERMUTED: tl.constexpr, PROLOGUE: tl.constexpr, GROUP: tl.constexpr, R: tl.constexpr,
                      PART: tl.constexpr, UNROLL: tl.constexpr, PIPE: tl.constexpr, PACKED: tl.constexpr,
                      SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """PART = min(GROUP, BLOCK_K): the columns of one group inside a tile; R words a pack block. K is a
    multiple of BLOCK_K (which divides the group size or is a multiple of it; the wrapper sees to it)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    k_lo, k_hi = split_range(K, split, SPLIT, BLOCK_K)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    WORDS: tl.constexpr = BLOCK_K // 8
    SUB: tl.constexpr = BLOCK_K // PART
    GW: tl.constexpr = PART // 8  # words of one group inside a tile
    kw, groups = K // 8, K // GROUP
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * kw
    g_rows = offs_n * groups  # [BLOCK_N]
    words = tl.arange(0, WORDS)
    first_col = (words // R) * (8 * R) + words % R  # [WORDS]: the column of each word's nibble 0 in the tile
    rstd = _rms_rstd(x_ptr, r_ptr, res_out_ptr, K, eps, pid + split, PROLOGUE, True, BLOCK_K)
    for m in tl.static_range(M):  # M <= 4: the repeated weight reads of m > 0 come from cache
        acc = tl.zeros([BLOCK_N, WORDS], tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=PIPE, loop_unroll_factor=UNROLL):
            p = tl.load(q_rows + (k0 // 8 + words)[None, :], mask=n_mask[:, None], other=0)  # [BLOCK_N, WORDS]
            z, s = _group_params(z_ptr, s_ptr, g_rows, k0, n_mask, GROUP, SUB)
            if PACKED:
                zc, nzc = _zero_halves(z)
                pos = k0 + first_col
                x0 = _x_half2(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, R, PROLOGUE, PERMUTED, 0)
                x1 = _x_half2(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, R, PROLOGUE, PERMUTED, 1)
                x2 = _x_half2(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, R, PROLOGUE, PERMUTED, 2)
                x3 = _x_half2(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, R, PROLOGUE, PERMUTED, 3)
                parts = _word_dot(p, x0, x1, x2, x3, _per_word(zc, BLOCK_N, SUB, GW), _per_word(nzc, BLOCK_N, SUB, GW))
                acc += parts * _per_word(s * (1.0 / X_SCALE), BLOCK_N, SUB, GW)
            else:
                p_hi = p >> 16
                z = _per_word(z, BLOCK_N, SUB, GW)  # once a tile: each _per_word is a layout change
                parts = tl.zeros([BLOCK_N, WORDS], tl.float32)
                for j in tl.static_range(4):  # nibbles j (from p) and j + 4 (from p_hi) share 16^j
                    c = 8388608.0 + z * _pow16(j)
                    lo, hi = _x_pair(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, k0 + first_col, rstd, R, PROLOGUE,
                                     PERMUTED, j)
                    t = _magic(p, c, j) * lo[None, :] + _magic(p_hi, c, j) * hi[None, :]
                    parts += t * (1.0 / _pow16(j))
                acc += parts * _per_word(s, BLOCK_N, SUB, GW)
        y = tl.sum(acc, 1)
        store_row(y, y_ptr, b_ptr, part_ptr, m, N, offs_n, n_mask, stride_ym, HAS_BIAS, SPLIT)
    if SPLIT > 1:
        finish_rows(part_ptr, cnt_ptr, y_ptr, b_ptr, pid, offs_n, n_mask, N, stride_ym, M, HAS_BIAS, SPLIT)


@triton.jit
def _x_pair(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, R: tl.constexpr, PROLOGUE: tl.constexpr,
            PERMUTED: tl.constexpr, J: tl.constexpr):
    """The GEMV's inputs [WORDS] of nibbles J and J + 4 of the tile's words (words' nibble-0 columns `pos`: runs
    of R consecutive columns), after the prologue."""
    return (_tile_vector(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos + R * J, rstd, PROLOGUE, PERMUTED),
            _tile_vector(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos + R * (J + 4), rstd, PROLOGUE, PERMUTED))


@triton.jit
def _tile_vector(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, PROLOGUE: tl.constexpr,
                 PERMUTED: tl.constexpr):
    """The GEMV's input at tile positions `pos`, after the prologue."""
    cols = pos
    if PERMUTED:
        cols = tl.load(perm_ptr + pos)
    return _input_tile(x_ptr, r_ptr, nw_ptr, m, stride_xm, K, cols, pos < K, rstd, PROLOGUE, True)


@triton.jit
def _x_half2(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, R: tl.constexpr, PROLOGUE: tl.constexpr,
             PERMUTED: tl.constexpr, J: tl.constexpr):
    """PACKED: the fp16x2 activations of nibbles (J, J + 4) of the tile's words, scaled by X_SCALE."""
    lo, hi = _x_pair(x_ptr, r_ptr, nw_ptr, perm_ptr, m, stride_xm, K, pos, rstd, R, PROLOGUE, PERMUTED, J)
    return _half2(lo * X_SCALE, hi * X_SCALE)[None, :]  # packed before the broadcast: half the layout changes


def _block_k(block_k: int, group_size: int, k: int) -> int:
    """The K tile: a power of two of at least one pack block that divides K; a group or several (of a power of
    two width) or a part of one."""
    check(block_k >= 8 and block_k & (block_k - 1) == 0, "BLOCK_K {} must be a power of two", block_k)
    block_k = max(block_k, pack_block(group_size))
    while block_k > group_size and (group_size & (group_size - 1) or k % block_k):
        block_k //= 2
    return tile_in_group(block_k, group_size) if block_k <= group_size else block_k


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
    block_k = _block_k(cfg["BLOCK_K"], group_size, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    split = cfg.get("SPLIT", 1)
    part, cnt = split_buffers(x.device, n) if split > 1 else (y, y)
    _int4_gemv_kernel[split_grid(n, cfg["BLOCK_N"], split)](
        x, qweight, scales, zeros, perm if perm is not None else qweight, bias if bias is not None else x, y,
        residual if residual is not None else x, norm_weight if norm_weight is not None else x,
        residual_out if residual_out is not None else x, part, cnt, n, k, x.stride(0), y.stride(0), eps, M=m,
        HAS_BIAS=bias is not None, PERMUTED=perm is not None, PROLOGUE=prologue, GROUP=group_size,
        R=pack_block(group_size) // 8, PART=min(group_size, block_k), UNROLL=cfg.get("UNROLL", 1), PIPE=cfg.get("PIPE"),
        PACKED=bool(cfg.get("PACKED")) and x.is_cuda, SPLIT=split, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y


def int4_gemv_ref(x, qweight, scales, zeros, perm, group_size: int, bias=None, prologue: int = PLAIN,
                  residual=None, norm_weight=None, residual_out=None, eps: float = 0.0) -> torch.Tensor:
    x = prologue_ref(x, prologue, residual, norm_weight, residual_out, eps)
    y = x.float() @ dequantize_ref(qweight, scales, zeros, perm, group_size).t()
    return (y + (bias.float() if bias is not None else 0.0)).to(x.dtype)
