"""Paged decode attention (one query token per sequence), split-K over long contexts.

Stage 1: program (b, kv head, split) attends the GQA group's query heads to its
slice of the context and writes a partial output and its log-sum-exp. Stage 2
merges the splits (kernels/split_k.py). The grid depends on the batch size and
`num_splits` only, never on the context lengths, so a decode step can be
captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.attention_checks import check_paged_attention_inputs
from hosttune_engine.kernels.checks import check, next_pow2
from hosttune_engine.kernels.paged import gather_pages, paged_token_offsets
from hosttune_engine.kernels.split_k import merge_splits, split_scratch, store_split
from hosttune_engine.kernels.tuning import batch_bucket, launch_config


# Runtime values that vary from step to step are not specialized on (one compiled variant each).
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, mid_o_ptr, mid_lse_ptr, o_ptr,
    qk_scale, num_splits,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
    n_q_heads,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
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
        k = tl.load(k_ptr + kv_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)  # [BN, D]
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        qk = tl.where(n_valid[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)  # [BN, D]
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    if DIRECT:  # one split: this program has the whole context, so it writes the output
        o = acc / l_i[:, None]
        tl.store(o_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=h_valid[:, None])
    else:
        row = (b.to(tl.int64) * n_q_heads + heads) * num_splits + split  # [BH]
        store_split(mid_o_ptr, mid_lse_ptr, row, acc, m_i, l_i, h_valid, offs_d, HEAD_D)


def default_config(dtype: torch.dtype, device) -> dict:
    if dtype == torch.float32 or getattr(device, "type", "cpu") != "cuda":
        return {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    return {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def config_key(dtype, head_dim: int, group: int, page: int, batch: int) -> str:
    return f"{str(dtype).removeprefix('torch.')}-d{head_dim}-g{group}-paged{page}-{batch_bucket(batch)}"


def decode_attention(q, k_cache, v_cache, block_tables, seq_lens, num_splits: int = 1,
                     scale: float | None = None, block_n: int | None = None, out=None, config: dict | None = None):
    """q [B, Hq, D]; paged caches; block_tables [B, max_blocks]; seq_lens [B] >= 1 -> [B, Hq, D].

    The grid depends on B and `num_splits` only, never on the context lengths,
    so a captured CUDA graph replays it for any lengths up to the table width.
    """
    check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    check(q.shape[0] == seq_lens.shape[0], "q and seq_lens disagree on the batch size")
    check(num_splits >= 1, "num_splits must be >= 1, got {}", num_splits)
    bsz, hq, d = q.shape
    out = torch.empty((bsz, hq, d), dtype=q.dtype, device=q.device) if out is None else out
    if bsz == 0:
        return out
    hkv = k_cache.shape[2]
    group = hq // hkv
    cfg = config or launch_config("decode_attention", config_key(q.dtype, d, group, k_cache.shape[1], bsz),
                                  q.device, default_config(q.dtype, q.device))
    if block_n:
        cfg = {**cfg, "BLOCK_N": block_n}
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    direct = num_splits == 1
    mid_o, mid_lse = (out, out) if direct else split_scratch(bsz, hq, num_splits, d, q.device)
    _decode_split_kernel[(bsz, hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, mid_o, mid_lse, out, scale * 1.4426950408889634, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), hq, GROUP=group, PAGE=k_cache.shape[1], HEAD_D=d,
        BLOCK_H=max(16, next_pow2(group)), BLOCK_N=cfg["BLOCK_N"], DIRECT=direct,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if not direct:
        merge_splits(mid_o, mid_lse, out)
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
    """Splits so a small batch gives every SM about two programs; none once the batch alone fills
    the SMs (one split writes the output directly, with no merge); never more than the context has tiles."""
    programs = max(1, batch_size * num_kv_heads)
    if programs >= num_sms:
        return 1
    want = -(-2 * num_sms // programs)
    return max(1, min(want, -(-max_context // block_n), 64))
