"""Prefill flash attention over a variable-length batch, causal, GQA, keys and values paged.

Each sequence b contributes query tokens cu_seqlens_q[b]:cu_seqlens_q[b+1], the
last q_len of its seq_lens[b] context tokens, whose keys and values are already
in the paged cache (written by kv_write this step). Query i attends to keys
0 .. seq_lens[b] - q_len + i. This covers a fresh prompt, a chunk of a long
prompt and a prompt whose prefix came from the prefix cache.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.attention_checks import check_paged_attention_inputs
from hosttune_engine.kernels.checks import check, check_tensor
from hosttune_engine.kernels.paged import gather_pages, paged_token_offsets


@triton.jit
def _prefill_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, lens_ptr, bt_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_bt,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if pid_m * BLOCK_M >= q_len:
        return
    ctx_len = tl.load(lens_ptr + b)
    prefix = ctx_len - q_len  # keys already cached before this chunk
    kvh = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    m_valid = offs_m < q_len
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_valid[:, None], other=0.0)  # [BM, D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    end_n = tl.minimum(ctx_len, prefix + (pid_m + 1) * BLOCK_M)
    for start_n in range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < ctx_len
        kv_off = paged_token_offsets(bt_row, start_n, offs_n, ctx_len, stride_kb, stride_ks, PAGE, BLOCK_N)
        kv_off += kvh * stride_kh
        k = tl.load(k_ptr + kv_off[None, :] + offs_d[:, None], mask=n_valid[None, :], other=0.0)  # [D, BN]
        qk = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # [BM, BN], log2 units
        causal = offs_n[None, :] <= prefix + offs_m[:, None]
        qk = tl.where(causal & n_valid[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)  # [BN, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             acc.to(o_ptr.dtype.element_ty), mask=m_valid[:, None])


def prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_query_len: int,
                      scale: float | None = None, block_m: int = 64, block_n: int = 64):
    """q [T, Hq, D] packed by cu_seqlens_q [B+1]; seq_lens [B] context lengths;
    block_tables [B, max_blocks] -> out [T, Hq, D]."""
    check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    check_tensor("cu_seqlens_q", cu_seqlens_q, 1, dtypes=(torch.int32,), device=q.device)
    check(cu_seqlens_q.shape[0] == seq_lens.shape[0] + 1, "cu_seqlens_q needs batch + 1 entries")
    t, hq, d = q.shape
    out = torch.empty_like(q)
    if t == 0:
        return out
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    grid = (triton.cdiv(max_query_len, block_m), hq, seq_lens.shape[0])
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables,
        scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=hq // k_cache.shape[2], PAGE=k_cache.shape[1], HEAD_D=d,
        BLOCK_M=block_m, BLOCK_N=block_n, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out


def prefill_attention_ref(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_query_len: int = 0,
                          scale: float | None = None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, ctx in enumerate(lens):
        qs, qe = cu[b], cu[b + 1]
        qb = q[qs:qe].float()  # [Lq, Hq, D]
        k = gather_pages(k_cache, block_tables[b], ctx).float().repeat_interleave(group, dim=1)
        v = gather_pages(v_cache, block_tables[b], ctx).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale  # [Hq, Lq, L]
        qpos = torch.arange(ctx - (qe - qs), ctx, device=q.device)
        mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]
        scores = scores.masked_fill(~mask, float("-inf"))
        out[qs:qe] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)
    return out
