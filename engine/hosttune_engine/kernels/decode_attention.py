"""Paged decode attention (one query token per sequence), split-K over long contexts.

Stage 1: program (b, kv head, split) attends the GQA group's query heads to its
slice of the context and writes a partial output and its log-sum-exp. Stage 2
merges the splits. The grid depends on the batch size and `num_splits` only,
never on the context lengths, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.attention_checks import check_paged_attention_inputs
from hosttune_engine.kernels.checks import check, next_pow2
from hosttune_engine.kernels.paged import gather_pages, paged_token_offsets


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, mid_o_ptr, mid_lse_ptr,
    qk_scale,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt,
    n_q_heads,
    GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr, PAGE: tl.constexpr, HEAD_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    offs_h = tl.arange(0, BLOCK_H)
    h_valid = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_d = tl.arange(0, HEAD_D)
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_valid[:, None], other=0.0)  # [BH, D]
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < end
        kv_off = paged_token_offsets(bt_row, start_n, offs_n, end, stride_kb, stride_ks, PAGE, BLOCK_N)
        kv_off += kvh * stride_kh
        k = tl.load(k_ptr + kv_off[None, :] + offs_d[:, None], mask=n_valid[None, :], other=0.0)  # [D, BN]
        qk = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        qk = tl.where(n_valid[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)  # [BN, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    has = l_i > 0  # an empty split contributes nothing
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    row = (b.to(tl.int64) * n_q_heads + heads) * NUM_SPLITS + split  # [BH]
    tl.store(mid_lse_ptr + row, lse, mask=h_valid)
    tl.store(mid_o_ptr + row[:, None] * HEAD_D + offs_d[None, :], o, mask=h_valid[:, None])


@triton.jit
def _decode_merge_kernel(mid_o_ptr, mid_lse_ptr, o_ptr, stride_ob, stride_oh, n_q_heads,
                         NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_valid = s < NUM_SPLITS
    row = (b.to(tl.int64) * n_q_heads + h) * NUM_SPLITS + s
    lse = tl.load(mid_lse_ptr + row, mask=s_valid, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))  # [S]
    offs_d = tl.arange(0, HEAD_D)
    o = tl.load(mid_o_ptr + row[:, None] * HEAD_D + offs_d[None, :], mask=s_valid[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(o_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))


def decode_attention(q, k_cache, v_cache, block_tables, seq_lens, num_splits: int = 1,
                     scale: float | None = None, block_n: int = 64, out=None):
    """q [B, Hq, D]; paged caches; block_tables [B, max_blocks]; seq_lens [B] >= 1 -> [B, Hq, D]."""
    check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    check(q.shape[0] == seq_lens.shape[0], "q and seq_lens disagree on the batch size")
    check(num_splits >= 1, f"num_splits must be >= 1, got {num_splits}")
    bsz, hq, d = q.shape
    out = torch.empty_like(q) if out is None else out
    if bsz == 0:
        return out
    hkv = k_cache.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    mid_o = torch.empty((bsz, hq, num_splits, d), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((bsz, hq, num_splits), dtype=torch.float32, device=q.device)
    _decode_split_kernel[(bsz, hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, mid_o, mid_lse, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        hq, GROUP=group, NUM_SPLITS=num_splits, PAGE=k_cache.shape[1], HEAD_D=d,
        BLOCK_H=max(16, next_pow2(group)), BLOCK_N=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    _decode_merge_kernel[(bsz, hq)](
        mid_o, mid_lse, out, out.stride(0), out.stride(1), hq,
        NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits), HEAD_D=d,
    )
    return out


def decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, num_splits: int = 1,
                         scale: float | None = None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    for b, ctx in enumerate(seq_lens.tolist()):
        k = gather_pages(k_cache, block_tables[b], ctx).float().repeat_interleave(group, dim=1)
        v = gather_pages(v_cache, block_tables[b], ctx).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", q[b].float(), k) * scale
        out[b] = torch.einsum("hk,khd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def choose_num_splits(batch_size: int, num_kv_heads: int, max_context: int, num_sms: int = 132,
                      block_n: int = 64) -> int:
    """Enough splits to give every SM about two programs, no more than the context has tiles."""
    want = -(-2 * num_sms // max(1, batch_size * num_kv_heads))
    return max(1, min(want, -(-max_context // block_n), 64))
