"""4-bit-weight matrix-vector product for one-token decode: y [M, N] = x [M, K] @ W (+ bias), M <= 4, with
W[k, n] = (q[k, n] - zeros[g, n]) * scales[g, n], g = g_idx[k], dequantized in registers.

q is packed eight to an int32 along K ([K/8, N], value k at bits 4 (k % 8)), so a program owning
BLOCK_N output columns reads contiguous int32s along N, each once, and unpacks its eight nibbles in
registers; each weight costs half a byte of traffic, a quarter of bf16's. With plain groups
(g = k // group_size, BLOCK_K dividing group_size) a tile has one group: it sums (q - zero) * x and
scales once per column; act-order groups (g_idx) gather scale and zero per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor

DEFAULT = {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, g_ptr, b_ptr, y_ptr, N, K, group_size, stride_xm, stride_ym,
                      M: tl.constexpr, HAS_BIAS: tl.constexpr, SORTED: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    ROWS: tl.constexpr = BLOCK_K // 8  # packed rows per tile: each int32 is loaded once, its 8 nibbles unpacked
    for m in tl.static_range(M):  # M <= 4: the repeated weight reads of m > 0 come from cache
        acc = tl.zeros([BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rows = k0 // 8 + tl.arange(0, ROWS)
            r_mask = rows < K // 8
            mask = r_mask[:, None] & n_mask[None, :]
            packed = tl.load(q_ptr + rows.to(tl.int64)[:, None] * N + offs_n[None, :], mask=mask, other=0)
            if SORTED:  # the tile lies in one group: sum (q - zero) * x, then scale once
                g = k0 // group_size
                z = tl.load(z_ptr + g * N + offs_n, mask=n_mask, other=0).to(tl.float32)[None, :]
                tile = tl.zeros([ROWS, BLOCK_N], tl.float32)
                for i in tl.static_range(8):
                    x = tl.load(x_ptr + m * stride_xm + rows * 8 + i, mask=r_mask, other=0.0).to(tl.float32)
                    tile += (((packed >> (4 * i)) & 0xF).to(tl.float32) - z) * x[:, None]
                acc += tl.sum(tile, 0) * tl.load(s_ptr + g * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            else:  # act-order groups: scale and zero gathered per input row
                tile = tl.zeros([ROWS, BLOCK_N], tl.float32)
                for i in tl.static_range(8):
                    k = rows * 8 + i
                    x = tl.load(x_ptr + m * stride_xm + k, mask=r_mask, other=0.0).to(tl.float32)
                    gi = tl.load(g_ptr + k, mask=r_mask, other=0).to(tl.int64)[:, None] * N + offs_n[None, :]
                    s = tl.load(s_ptr + gi, mask=mask, other=0.0).to(tl.float32)
                    z = tl.load(z_ptr + gi, mask=mask, other=0).to(tl.float32)
                    tile += (((packed >> (4 * i)) & 0xF).to(tl.float32) - z) * s * x[:, None]
                acc += tl.sum(tile, 0)
        y = acc
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def check_int4_weight(qweight, scales, zeros, g_idx, group_size: int, k: int, device) -> None:
    check_tensor("qweight", qweight, 2, dtypes=(torch.int32,), device=device)
    n = qweight.shape[1]
    check(qweight.shape[0] * 8 == k and qweight.is_contiguous(), "qweight must be [K/8, N] = [{}, N] and "
          "contiguous, got {}", k // 8, tuple(qweight.shape))
    check(group_size > 0 and k % group_size == 0, "group_size {} must divide K {}", group_size, k)
    groups = k // group_size
    check_tensor("scales", scales, 2, dtypes=(torch.float16, torch.bfloat16, torch.float32), device=device)
    check_tensor("zeros", zeros, 2, dtypes=(torch.uint8,), device=device)
    for name, t in (("scales", scales), ("zeros", zeros)):
        check(tuple(t.shape) == (groups, n) and t.is_contiguous(), "{} must be [{}, {}] and contiguous, got {}",
              name, groups, n, tuple(t.shape))
    check_tensor("g_idx", g_idx, 1, dtypes=(torch.int32,), device=device)
    check(g_idx.shape[0] == k and g_idx.is_contiguous(), "g_idx must be [K] = [{}] and contiguous", k)


def int4_block_k(cfg: dict, group_size: int, sorted_groups: bool) -> int:
    """The K tile: with plain groups it must lie inside one group."""
    block_k = cfg["BLOCK_K"]
    if sorted_groups:
        while group_size % block_k:
            block_k //= 2
    return block_k


def int4_gemv(x, qweight, scales, zeros, g_idx, group_size: int, sorted_groups: bool, bias=None,
              config: dict | None = None) -> torch.Tensor:
    """x [M, K] (M <= 4) @ W [K, N] (+ bias) -> [M, N] in x's dtype."""
    check_tensor("x", x, 2)
    m, k = x.shape
    check(1 <= m <= 4 and x.stride(1) == 1, "int4_gemv takes 1 to 4 rows contiguous in K, got {}", tuple(x.shape))
    check_int4_weight(qweight, scales, zeros, g_idx, group_size, k, x.device)
    n = qweight.shape[1]
    if bias is not None:
        check_tensor("bias", bias, 1, dtypes=(x.dtype,), device=x.device)
        check(bias.shape[0] == n and bias.is_contiguous(), "bias must be [{}] and contiguous", n)
    cfg = config or DEFAULT
    block_k = int4_block_k(cfg, group_size, sorted_groups)
    check(block_k >= 8, "group_size {} leaves no K tile of at least 8", group_size)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _int4_gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, qweight, scales, zeros, g_idx, bias if bias is not None else x, y, n, k, group_size, x.stride(0),
        y.stride(0), M=m, HAS_BIAS=bias is not None, SORTED=sorted_groups, BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y


def int4_dequantize_ref(qweight, scales, zeros, g_idx) -> torch.Tensor:
    """qweight [K/8, N] -> fp32 W [K, N]."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)
    q = ((qweight[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(-1, qweight.shape[1]).float()
    g = g_idx.long()
    return (q - zeros[g].float()) * scales[g].float()


def int4_gemv_ref(x, qweight, scales, zeros, g_idx, bias=None) -> torch.Tensor:
    y = x.float() @ int4_dequantize_ref(qweight, scales, zeros, g_idx)
    return (y + (bias.float() if bias is not None else 0.0)).to(x.dtype)
