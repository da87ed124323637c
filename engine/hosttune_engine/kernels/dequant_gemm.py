"""GEMMs with quantized weights dequantized tile by tile in registers, for prefill and batched decode:
y [M, N] = x [M, K] @ W (+ bias), x in bf16/fp16/fp32 and the tensor-core dot in x's dtype.

`w8a16_gemm`: W = (w [N, K] fp8 * scale).T, scales as in kernels/fp8_gemv.py: the tile's e4m3 values,
exact in x's dtype, go into the dot and the tile's scale multiplies its fp32 result (before compute
capability 8.9, or with BITS 1 in the config, the weights' bytes decoded by kernels/e4m3.py). `w4a16_gemm`: W in
the 4-bit layout of kernels/int4_layout.py: each [BLOCK_N, BLOCK_K] tile of packed words is unpacked,
has its row's zero subtracted and scale applied in registers (one group per tile) and goes into the dot.
Few output tiles (skinny batched decode) can split K over SPLIT_K programs, whose fp32 partials one
small kernel sums. NIBBLES 1 in the config takes the 4-bit tile another way (`_w4a16_nibble_kernel`): no
unpacking into column order, but one dot a nibble position, each over the tile's words as they are stored
(the activations are gathered to match), with the weights as the dot's first operand (y^T = W x^T), so the
dequantized values go to the tensor cores from registers; on the H200 it beats dequantize-then-cuBLAS up to
64 rows (Triton waits for each warpgroup MMA whose operand is in registers, so the eight dots of a tile run
one after another, which is what stops it there). `int4_dequantize` writes the whole 4-bit weight in x's
dtype with the same tile code, for w4a16_gemm's DEQUANT path (dequantize, then cuBLAS). Plain Triton (no FP8
tensor cores), so it runs on Ampere as well as Hopper.
"""

from __future__ import annotations

import importlib

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor
from hosttune_engine.kernels.e4m3 import decodes_bits, e4m3_to, weight_operand
from hosttune_engine.kernels.fp8_gemv import _add_scaled, _row_scaled, check_fp8_weight
from hosttune_engine.kernels.int4_gemv import _block_k, _group_params, _magic, _pow16, _per_word
from hosttune_engine.kernels.int4_layout import check_int4_weight, pack_block, tile_in_group

DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}


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
def _activation_tile(x_ptr, offs_m, cols, m_mask, k_mask, stride_xm):
    """x [BLOCK_M, BLOCK_K] at rows offs_m and columns `cols` (gathered for permuted 4-bit inputs)."""
    return tl.load(x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + cols[None, :],
                   mask=m_mask[:, None] & k_mask[None, :], other=0.0)


@triton.jit
def _k_range(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """This program's share of K, whole tiles: [start, stop)."""
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    start = tl.program_id(1) * per
    return start, tl.minimum(start + per, K)


@triton.jit
def _finish(acc, b_ptr, y_ptr, ws_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS: tl.constexpr,
            SPLIT_K: tl.constexpr):
    """The output tile, or with split K this program's fp32 partial (summed by _split_sum_kernel)."""
    if SPLIT_K == 1:
        _epilogue(acc, b_ptr, y_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS)
    else:
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        base = ws_ptr + tl.program_id(1).to(tl.int64) * M * N
        tl.store(base + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _split_sum_kernel(ws_ptr, b_ptr, y_ptr, MN, N, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
                      BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _w8a16_kernel(x_ptr, w_ptr, s_ptr, srow_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, block_k, stride_xm, stride_wn,
                  stride_s, stride_ym, HAS_BIAS: tl.constexpr, ROW_SCALE: tl.constexpr, BITS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  SPLIT_K: tl.constexpr, PRECISION: tl.constexpr):
    offs_m, offs_n = _tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m_mask, n_mask = offs_m < M, offs_n < N
    s_rows = s_ptr + tl.load(srow_ptr + offs_n, mask=n_mask, other=0).to(tl.int64) * stride_s
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    start, stop = _k_range(K, BLOCK_K, SPLIT_K)
    for k0 in range(start, stop, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = _activation_tile(x_ptr, offs_m, offs_k, m_mask, k_mask, stride_xm)
        w = tl.load(w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None],
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = _add_scaled(acc, tl.dot(a, e4m3_to(w, a.dtype, BITS), input_precision=PRECISION), s_rows,
                          k0 // block_k, n_mask, ROW_SCALE)
    acc = _row_scaled(acc, s_rows, n_mask, ROW_SCALE)
    _finish(acc, b_ptr, y_ptr, ws_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, SPLIT_K)


@triton.jit
def _int4_tile(q_rows, z_ptr, s_ptr, g_rows, k0, n_mask, dtype: tl.constexpr, GROUP: tl.constexpr, R: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W [BLOCK_N, BLOCK_K] at columns k0.. in group order, dequantized to `dtype` (rounded as the reference
    rounds): the tile's words unpacked, the pack blocks' interleave undone, its row's zero and scale applied."""
    p = tl.load(q_rows + (k0 // 8 + tl.arange(0, BLOCK_K // 8))[None, :], mask=n_mask[:, None], other=0)
    q = (p[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF  # [BLOCK_N, words, nibble]
    q = tl.reshape(q, [BLOCK_N, BLOCK_K // (8 * R), R, 8])  # word = block * R + j
    q = tl.reshape(tl.permute(q, [0, 1, 3, 2]), [BLOCK_N, BLOCK_K])  # column = block * 8R + R * nibble + j
    g = k0 // GROUP
    s = tl.load(s_ptr + g_rows + g, mask=n_mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + g_rows + g, mask=n_mask, other=0).to(tl.float32)
    return ((q.to(tl.float32) - z[:, None]) * s[:, None]).to(dtype)


@triton.jit
def _w4a16_kernel(x_ptr, q_ptr, s_ptr, z_ptr, perm_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, stride_xm, stride_ym,
                  HAS_BIAS: tl.constexpr, PERMUTED: tl.constexpr, GROUP: tl.constexpr, R: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  SPLIT_K: tl.constexpr, PRECISION: tl.constexpr):
    """BLOCK_K divides GROUP and holds whole pack blocks: each tile has one scale and zero per row."""
    offs_m, offs_n = _tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m_mask, n_mask = offs_m < M, offs_n < N
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * (K // 8)
    g_rows = offs_n * (K // GROUP)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    start, stop = _k_range(K, BLOCK_K, SPLIT_K)
    for k0 in range(start, stop, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        cols = offs_k
        if PERMUTED:
            cols = tl.load(perm_ptr + offs_k)
        a = _activation_tile(x_ptr, offs_m, cols, m_mask, offs_k < K, stride_xm)
        w = _int4_tile(q_rows, z_ptr, s_ptr, g_rows, k0, n_mask, a.dtype, GROUP, R, BLOCK_N, BLOCK_K)
        acc += tl.dot(a, tl.trans(w), input_precision=PRECISION)
    _finish(acc, b_ptr, y_ptr, ws_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, SPLIT_K)


@triton.jit
def _w4a16_nibble_kernel(x_ptr, q_ptr, s_ptr, z_ptr, perm_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, stride_xm, stride_ym,
                         HAS_BIAS: tl.constexpr, PERMUTED: tl.constexpr, GROUP: tl.constexpr, R: tl.constexpr,
                         PART: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr, SWAP: tl.constexpr):
    """acc^T [BLOCK_N, BLOCK_M] = sum over the 8 nibble positions i of W_i [BLOCK_N, WORDS] @ x_i^T [WORDS, BLOCK_M]
    (SWAP; else acc = sum of x_i @ W_i^T, for many rows, where the MMA's first dimension is x's): W_i holds nibble i
    of the tile's words, x_i the activations of the columns those nibbles hold (word w, nibble i: column
    (w // R) 8R + R i + w % R of the tile). Nibbles dequantize as in kernels/int4_gemv.py (`_magic`:
    (q - zero) 16^j exact, times scale / 16^j), rounded once as the reference rounds. PART = min(GROUP, BLOCK_K);
    BLOCK_K is a whole number of pack blocks, inside a group or a whole number of groups."""
    offs_m, offs_n = _tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m_mask, n_mask = offs_m < M, offs_n < N
    WORDS: tl.constexpr = BLOCK_K // 8
    SUB: tl.constexpr = BLOCK_K // PART
    GW: tl.constexpr = PART // 8
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * (K // 8)
    g_rows = offs_n * (K // GROUP)
    words = tl.arange(0, WORDS)
    first_col = (words // R) * (8 * R) + words % R  # [WORDS]: the tile column of each word's nibble 0
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # SWAP: W x^T, the weights the dot's register operand
    acc_x = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # else x W^T, the weights stored to shared memory for it
    start, stop = _k_range(K, BLOCK_K, SPLIT_K)
    for k0 in range(start, stop, BLOCK_K):
        p = tl.load(q_rows + (k0 // 8 + words)[None, :], mask=n_mask[:, None], other=0)  # [BLOCK_N, WORDS]
        p_hi = p >> 16
        z, s = _group_params(z_ptr, s_ptr, g_rows, k0, n_mask, GROUP, SUB)
        z, s = _per_word(z, BLOCK_N, SUB, GW), _per_word(s, BLOCK_N, SUB, GW)
        for j in tl.static_range(4):  # nibbles j (from p) and j + 4 (from p_hi) share 16^j
            c = 8388608.0 + z * _pow16(j)
            sj = s * (1.0 / _pow16(j))
            for h in tl.static_range(2):
                w = _magic(p if h == 0 else p_hi, c, j) * sj
                cols = tl.max_contiguous(tl.multiple_of(k0 + first_col + R * (j + 4 * h), R), R)  # runs of R
                if PERMUTED:
                    cols = tl.load(perm_ptr + cols)
                a = tl.load(x_rows + cols[None, :], mask=m_mask[:, None], other=0.0)  # [BLOCK_M, WORDS]
                if SWAP:
                    acc += tl.dot(w.to(a.dtype), tl.trans(a), input_precision=PRECISION)
                else:
                    acc_x += tl.dot(a, tl.trans(w.to(a.dtype)), input_precision=PRECISION)
    if SWAP:
        acc_x = tl.trans(acc)
    _finish(acc_x, b_ptr, y_ptr, ws_ptr, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, SPLIT_K)


@triton.jit
def _int4_dequantize_kernel(q_ptr, s_ptr, z_ptr, w_ptr, N, K, GROUP: tl.constexpr, R: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W [N, K] (group order) in w's dtype, one [BLOCK_N, BLOCK_K] tile a program."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    n_mask = offs_n < N
    w = _int4_tile(q_ptr + offs_n.to(tl.int64)[:, None] * (K // 8), z_ptr, s_ptr, offs_n * (K // GROUP), k0, n_mask,
                   w_ptr.dtype.element_ty, GROUP, R, BLOCK_N, BLOCK_K)
    tl.store(w_ptr + offs_n.to(tl.int64)[:, None] * K + (k0 + tl.arange(0, BLOCK_K))[None, :], w,
             mask=n_mask[:, None])


def _check_x_bias(x, bias, n: int) -> None:
    check_tensor("x", x, 2)
    check(x.stride(1) == 1, "x must be contiguous in K, got strides {}", x.stride())
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == n and bias.is_contiguous(), "bias must be [{}] and contiguous", n)


def _precision(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 engines (tests, references) get fp32 products


def _grid(m: int, n: int, cfg: dict) -> tuple[int, int]:
    return (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), cfg.get("SPLIT_K", 1))


def _workspace(m: int, n: int, cfg: dict, y: torch.Tensor) -> torch.Tensor:
    """fp32 partials [SPLIT_K, M, N] with split K, else a placeholder (y)."""
    split = cfg.get("SPLIT_K", 1)
    return torch.empty((split, m, n), dtype=torch.float32, device=y.device) if split > 1 else y


def _split_sum(ws, bias, y, cfg: dict) -> torch.Tensor:
    split = cfg.get("SPLIT_K", 1)
    if split > 1:
        mn, block = y.numel(), 1024
        _split_sum_kernel[(triton.cdiv(mn, block),)](ws, bias if bias is not None else y, y, mn, y.shape[1],
                                                     HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK=block)
    return y


def w8a16_gemm(x, w, scale, scale_row, block_k: int, bias=None, config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(w [N, K] fp8).T (+ bias) -> [M, N] in x's dtype; BITS 1 in the config (or a GPU before
    8.9) decodes the e4m3 bytes by integer operations (kernels/e4m3.py)."""
    m, k = x.shape if x.dim() == 2 else (0, 0)
    _check_x_bias(x, bias, w.shape[0] if w.dim() == 2 else -1)
    check_fp8_weight(w, scale, scale_row, block_k, k, x.device)
    cfg = dict(config or DEFAULT)
    row_scale = block_k >= k
    if not row_scale:
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], block_k)
        check(block_k % cfg["BLOCK_K"] == 0, "BLOCK_K {} must divide the scale block {}", cfg["BLOCK_K"], block_k)
    n, bits = w.shape[0], decodes_bits(cfg, x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    ws = _workspace(m, n, cfg, y)
    _w8a16_kernel[_grid(m, n, cfg)](
        x, weight_operand(w, bits), scale, scale_row, bias if bias is not None else x, y, ws, m, n, k, block_k,
        x.stride(0), w.stride(0), scale.stride(0), y.stride(0), HAS_BIAS=bias is not None, ROW_SCALE=row_scale,
        BITS=bits, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
        SPLIT_K=cfg.get("SPLIT_K", 1), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        PRECISION=_precision(x))
    return _split_sum(ws, bias, y, cfg)


def int4_dequantize(qweight, scales, zeros, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in `dtype`, columns in group order (an act-order layer's inputs are then x[:, perm])."""
    n, k = qweight.shape[0], qweight.shape[1] * 8
    block_k = max(tile_in_group(128, group_size), pack_block(group_size))
    w = torch.empty((n, k), dtype=dtype, device=qweight.device)
    _int4_dequantize_kernel[(triton.cdiv(n, 32), k // block_k)](
        qweight, scales, zeros, w, n, k, GROUP=group_size, R=pack_block(group_size) // 8, BLOCK_N=32,
        BLOCK_K=block_k, num_warps=4)
    return w


def w4a16_gemm(x, qweight, scales, zeros, perm, group_size: int, bias=None, config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ W (4-bit, kernels/int4_layout.py) (+ bias) -> [M, N] in x's dtype. With DEQUANT in the config the
    weight is dequantized into a scratch [N, K] and multiplied by torch (cuBLAS on a GPU), which beats the fused
    kernel once the rows are many. WGMMA takes kernels/w4a16_hopper.py on an sm_90 GPU with a Gluon-capable Triton
    (an act-order layer's x gathered into group order first); where that kernel cannot run, DEQUANT instead."""
    m, k = x.shape if x.dim() == 2 else (0, 0)
    _check_x_bias(x, bias, qweight.shape[0] if qweight.dim() == 2 else -1)
    check_int4_weight(qweight, scales, zeros, perm, group_size, k, x.device)
    cfg = dict(config or DEFAULT)
    if cfg.get("WGMMA") and not _hopper_ready(x, group_size):
        cfg = {"DEQUANT": 1}  # a table tuned where the Hopper kernel ran, read where it cannot
    if cfg.get("WGMMA"):
        return _w4a16_by_wgmma(x if perm is None else x[:, perm], qweight, scales, zeros, group_size, bias, cfg)
    if cfg.get("DEQUANT"):
        w = int4_dequantize(qweight, scales, zeros, group_size, x.dtype)
        return torch.nn.functional.linear(x if perm is None else x[:, perm], w, bias)
    n = qweight.shape[0]
    if cfg.get("NIBBLES") and _nibble_block_k(cfg["BLOCK_K"], group_size, k) >= 128:  # else no 16-word tile fits
        return _w4a16_by_nibble(x, qweight, scales, zeros, perm, group_size, bias, cfg, m, n, k)
    # a tile inside one group, of whole pack blocks
    cfg["BLOCK_K"] = max(tile_in_group(cfg["BLOCK_K"], group_size), pack_block(group_size))
    check(cfg["BLOCK_K"] >= 16, "group_size {} leaves no K tile of at least 16 for the dot", group_size)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    ws = _workspace(m, n, cfg, y)
    _w4a16_kernel[_grid(m, n, cfg)](
        x, qweight, scales, zeros, perm if perm is not None else qweight, bias if bias is not None else x, y, ws,
        m, n, k, x.stride(0), y.stride(0), HAS_BIAS=bias is not None, PERMUTED=perm is not None, GROUP=group_size,
        R=pack_block(group_size) // 8, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        GROUP_M=cfg["GROUP_M"], SPLIT_K=cfg.get("SPLIT_K", 1), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], PRECISION=_precision(x))
    return _split_sum(ws, bias, y, cfg)


def wgmma_unfit(capability: tuple[int, int], dtype: torch.dtype, group_size: int) -> str:
    """Why the warpgroup 4-bit GEMM (kernels/w4a16_hopper.py) cannot take a layer of `group_size` groups with `dtype`
    activations on a GPU of `capability` ('' where it can): the rule the kernel plan states and the dispatch
    follows."""
    if capability != (9, 0):
        return "not an sm_90 GPU"
    if dtype not in (torch.bfloat16, torch.float16):
        return "activations not bf16 or fp16"
    if group_size % 64:
        return "groups not a multiple of 64"
    try:
        importlib.import_module("hosttune_engine.kernels.w4a16_hopper")
    except ImportError:
        return "this Triton has no Gluon"
    return ""


def hopper_gemm_runs(device: torch.device) -> bool:
    """Whether that kernel runs on `device` at all (bf16, groups of 128)."""
    return device.type == "cuda" and not wgmma_unfit(torch.cuda.get_device_capability(device), torch.bfloat16, 128)


def _hopper_ready(x: torch.Tensor, group_size: int) -> bool:
    return x.is_cuda and not wgmma_unfit(torch.cuda.get_device_capability(x.device), x.dtype, group_size)


def _w4a16_by_wgmma(x, qweight, scales, zeros, group_size: int, bias, cfg: dict):
    from hosttune_engine.kernels import w4a16_hopper

    m, k, n = x.shape[0], x.shape[1], qweight.shape[0]
    block_k = cfg["BLOCK_K"]
    while k % block_k or (block_k > group_size and block_k % group_size):  # whole tiles, whole groups in them
        block_k //= 2
    cfg = {**cfg, "BLOCK_K": block_k}
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    ws = _workspace(m, n, cfg, y)
    w4a16_hopper.launch(x.contiguous(), qweight, scales, zeros, group_size, bias, y, ws, cfg)  # splits summed in it
    return y


def _nibble_block_k(block_k: int, group_size: int, k: int) -> int:
    """The nibble kernel's K tile (kernels/int4_gemv.py's rule); its dots need at least 16 words, 128 columns."""
    return _block_k(max(block_k, 128), group_size, k)


def _w4a16_by_nibble(x, qweight, scales, zeros, perm, group_size: int, bias, cfg: dict, m: int, n: int, k: int):
    block_k = _nibble_block_k(cfg["BLOCK_K"], group_size, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    ws = _workspace(m, n, cfg, y)
    _w4a16_nibble_kernel[_grid(m, n, cfg)](
        x, qweight, scales, zeros, perm if perm is not None else qweight, bias if bias is not None else x, y, ws,
        m, n, k, x.stride(0), y.stride(0), HAS_BIAS=bias is not None, PERMUTED=perm is not None, GROUP=group_size,
        R=pack_block(group_size) // 8, PART=min(group_size, block_k), BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k, GROUP_M=cfg["GROUP_M"], SPLIT_K=cfg.get("SPLIT_K", 1), SWAP=cfg.get("SWAP", 1),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], PRECISION=_precision(x))
    return _split_sum(ws, bias, y, cfg)
