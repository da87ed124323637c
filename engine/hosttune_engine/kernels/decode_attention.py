"""Paged decode attention (one query token per sequence), split-K over long contexts.

Stage 1: program (b, kv head, split) attends the GQA group's query heads to its
slice of the context and writes a partial output and its log-sum-exp. Stage 2
merges the splits (kernels/split_k.py). The grid depends on the batch size and
`num_splits` only, never on the context lengths, so a decode step can be
captured in a CUDA graph. `decode_attention_rope` is the same kernel for a step
of decodes alone that has not rotated q and k or written the cache yet: each
program rotates them itself, the first split writes the token's k and v, and the
token joins the attention from registers. e4m3 caches are read with their per-row
scales (kernels/kv_quant.py): scores take the key scales, probabilities the value
scales, and the fused variant writes this token quantized and attends it as the
cache now holds it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.attention_checks import check_paged_attention_inputs
from hosttune_engine.kernels.checks import check, next_pow2
from hosttune_engine.kernels.kv_quant import kv_e4m3, kv_round_trip, kv_row_scales, scale_args
from hosttune_engine.kernels.paged import gather_pages, paged_token_offsets
from hosttune_engine.kernels.rope_kv import check_rope_kv_inputs, rope_kv_write_ref
from hosttune_engine.kernels.split_k import merge_splits, split_scratch, store_split
from hosttune_engine.kernels.tuning import batch_bucket, launch_config


@triton.jit
def _rotated(row, offs_d, rows, row_stride, row_mask, cos, sin, HALF: tl.constexpr):
    """Rows [R, 2 HALF] at `row` + rows * row_stride rotated (neox layout, fp32 math, as `rope`), rounded to the
    row's dtype once. Each element reads its rotation partner directly, so the halves need no join."""
    partner = (offs_d + HALF) % (2 * HALF)
    base = row + rows[:, None] * row_stride
    x = tl.load(base + offs_d[None, :], mask=row_mask[:, None], other=0.0).to(tl.float32)
    xp = tl.load(base + partner[None, :], mask=row_mask[:, None], other=0.0).to(tl.float32)
    sign = tl.where(offs_d < HALF, -1.0, 1.0)[None, :]
    return (x * cos + sign * xp * sin).to(row.dtype.element_ty)


@triton.jit
def _store_fp8_row(c_ptr, s_ptr, dst, s_off, one_copy, offs_h, x):
    """This token's row x [BH, D] (every row the same) once to an e4m3 cache at `dst`, its scale at `s_off`."""
    x = x.to(tl.float32)
    scale = kv_row_scales(x)  # [BH]
    tl.store(c_ptr + dst, kv_e4m3(x, scale).to(c_ptr.dtype.element_ty), mask=one_copy)
    tl.store(s_ptr + s_off + offs_h * 0, scale, mask=offs_h == 0)


@triton.jit
def _rope_and_this_token(q_row, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, slot_ptr, cs_ptr, b, kvh, split, offs_h,
                         heads, h_valid, offs_d, qk_scale, stride_ks, stride_kh, stride_cs, n_q_heads,
                         HEAD_D: tl.constexpr, FP8_KV: tl.constexpr):
    """This token's q (the group's heads) and k rotated at its position; split 0 writes k and v to the token's
    cache slot (none when negative) and starts its online softmax with the token, every other split starts
    empty. -> (m_i, l_i, acc, rotated q). k and v are read into every row of the group's tile (the same row
    each time), so the token's score and its share of the output need no reduction over a second layout.
    An e4m3 cache gets k and v quantized with their scales, and the token joins as the cache holds it."""
    HALF: tl.constexpr = HEAD_D // 2
    pos = tl.load(pos_ptr + b).to(tl.int64)
    half_d = offs_d % HALF
    cos = tl.load(cs_ptr + pos * stride_cs + half_d)[None, :]
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + half_d)[None, :]
    q = _rotated(q_row, offs_d, heads, HEAD_D, h_valid, cos, sin, HALF)  # [BH, D]
    every = offs_h >= 0  # the group's rows all hold this token's k and v
    k_row = n_q_heads + kvh + offs_h * 0
    k = _rotated(q_row, offs_d, k_row, HEAD_D, every, cos, sin, HALF)  # [BH, D], every row the same
    v = tl.load(q_row + (k_row + tl.num_programs(1))[:, None] * HEAD_D + offs_d[None, :])
    first = split == 0
    slot = tl.load(slot_ptr + b).to(tl.int64)
    row_off = slot * stride_ks + kvh * stride_kh
    dst = row_off + offs_d[None, :] + offs_h[:, None] * 0
    one_copy = (offs_h[:, None] == 0) & (offs_d[None, :] < HEAD_D)
    if first:
        if slot >= 0:
            if FP8_KV:
                _store_fp8_row(k_ptr, ks_ptr, dst, row_off // HEAD_D, one_copy, offs_h, k)
                _store_fp8_row(v_ptr, vs_ptr, dst, row_off // HEAD_D, one_copy, offs_h, v)
            else:
                tl.store(k_ptr + dst, k, mask=one_copy)
                tl.store(v_ptr + dst, v, mask=one_copy)
    if FP8_KV:  # what a later step reads back from the cache
        k = kv_round_trip(k.to(tl.float32), tl.float32)
        v = kv_round_trip(v.to(tl.float32), tl.float32)
    qk = tl.sum(q.to(tl.float32) * k.to(tl.float32), 1) * qk_scale  # [BH]
    m_i = tl.where(first, qk, float("-inf"))
    l_i = tl.where(first, 1.0, 0.0) + tl.zeros_like(qk)
    acc = tl.where(first, v.to(tl.float32), 0.0)
    return m_i, l_i, acc, q


# Runtime values that vary from step to step are not specialized on (one compiled variant each).
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, mid_o_ptr, mid_lse_ptr, o_ptr, pos_ptr, slot_ptr, cs_ptr,
    qk_scale, num_splits,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh, stride_cs,
    n_q_heads,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
    ROPE: tl.constexpr, FP8_KV: tl.constexpr, KV_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    if ROPE:  # this token's k and v are not in the cache yet: they join from registers below
        ctx = seq_len - 1
    else:
        ctx = seq_len
    split_len = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, ctx)
    offs_h = tl.arange(0, BLOCK_H)
    h_valid = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_d = tl.arange(0, HEAD_D)
    q_row = q_ptr + b.to(tl.int64) * stride_qb
    if ROPE:
        m_i, l_i, acc, q = _rope_and_this_token(
            q_row, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, slot_ptr, cs_ptr, b, kvh, split, offs_h, heads, h_valid,
            offs_d, qk_scale, stride_ks, stride_kh, stride_cs, n_q_heads, HEAD_D, FP8_KV)
    else:
        q = tl.load(q_row + heads[:, None] * stride_qh + offs_d[None, :], mask=h_valid[:, None], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    if FP8_KV:  # e4m3 tiles convert to fp16 in one instruction a pair (bf16 takes several): the dots run in fp16
        q_dot = q.to(KV_DOT)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < end
        kv_off = paged_token_offsets(bt_row, start_n, offs_n, end, stride_kb, stride_ks, PAGE, BLOCK_N)
        kv_off += kvh * stride_kh
        k = tl.load(k_ptr + kv_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)  # [BN, D]
        if FP8_KV:  # e4m3 keys are exact in fp16; each key's scale goes on its score
            k_s = tl.load(ks_ptr + kv_off // HEAD_D, mask=n_valid, other=0.0)  # [BN]
            qk = tl.dot(q_dot, tl.trans(k.to(KV_DOT)), input_precision=PRECISION) * k_s[None, :] * qk_scale
        else:
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        qk = tl.where(n_valid[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)  # [BN, D]
        acc = acc * alpha[:, None]
        if FP8_KV:  # each value's scale goes on its probability; l_i sums the unscaled ones
            v_s = tl.load(vs_ptr + kv_off // HEAD_D, mask=n_valid, other=0.0)  # [BN]
            acc = tl.dot((p * v_s[None, :]).to(KV_DOT), v.to(KV_DOT), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    if DIRECT:  # one split: this program has the whole context, so it writes the output
        o = acc / l_i[:, None]
        tl.store(o_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=h_valid[:, None])
    else:
        row = (b.to(tl.int64) * n_q_heads + heads) * num_splits + split  # [BH]
        store_split(mid_o_ptr, mid_lse_ptr, row, acc, m_i, l_i, h_valid, offs_d, HEAD_D)


def default_config(dtype: torch.dtype, device, fp8_kv: bool = False) -> dict:
    if dtype == torch.float32 or getattr(device, "type", "cpu") != "cuda":
        return {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    if fp8_kv:  # e4m3 tiles converted before the dots: longer tiles amortize it (H200: up to 1.4x over 64)
        return {"BLOCK_N": 128, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def config_key(dtype, head_dim: int, group: int, page: int, batch: int, fp8_kv: bool = False) -> str:
    """Tuned-table key; e4m3 caches get their own entries, since their best tiles differ."""
    kv = "-kv8" if fp8_kv else ""
    return f"{str(dtype).removeprefix('torch.')}-d{head_dim}-g{group}-paged{page}{kv}-{batch_bucket(batch)}"


def decode_attention(q, k_cache, v_cache, block_tables, seq_lens, num_splits: int = 1,
                     scale: float | None = None, block_n: int | None = None, out=None, config: dict | None = None,
                     kv_scales=None):
    """q [B, Hq, D]; paged caches; block_tables [B, max_blocks]; seq_lens [B] >= 1 -> [B, Hq, D].

    The grid depends on B and `num_splits` only, never on the context lengths,
    so a captured CUDA graph replays it for any lengths up to the table width.
    e4m3 caches come with `kv_scales` (k_scale, v_scale), each [num_blocks, block_size, H_kv] fp32.
    """
    check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, kv_scales)
    check(q.shape[0] == seq_lens.shape[0], "q and seq_lens disagree on the batch size")
    return _launch(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale, block_n, out, config, None,
                   kv_scales)


def decode_attention_rope(qkv, positions, cos_sin, slot_mapping, k_cache, v_cache, block_tables, seq_lens,
                          num_q_heads: int, num_splits: int = 1, scale: float | None = None,
                          block_n: int | None = None, out=None, config: dict | None = None, kv_scales=None):
    """`rope_kv_write` then `decode_attention` in one kernel, for a step of decodes alone.

    qkv [B, (Hq + 2 Hkv) * D] holds this step's q, k, v unrotated; seq_lens count this token, which the
    cache does not hold yet: the kernel rotates q and k at `positions`, writes k and v to `slot_mapping`
    (skipped when negative) and attends the cached context and the token itself. qkv is only read.
    e4m3 caches come with `kv_scales` (k_scale, v_scale): the token is written quantized with its scales and
    attended as the cache holds it, so the output is that of `rope_kv_write` then `decode_attention`.
    """
    check_rope_kv_inputs(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, num_q_heads, k_cache.shape[2],
                         kv_scales)
    d = cos_sin.shape[1]
    q = qkv[:, :num_q_heads * d].view(qkv.shape[0], num_q_heads, d)
    check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, kv_scales)
    check(q.shape[0] == seq_lens.shape[0], "qkv and seq_lens disagree on the batch size")
    return _launch(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale, block_n, out, config,
                   (positions, slot_mapping, cos_sin), kv_scales)


def _launch(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale, block_n, out, config, rope, kv_scales):
    check(num_splits >= 1, "num_splits must be >= 1, got {}", num_splits)
    bsz, hq, d = q.shape
    out = torch.empty((bsz, hq, d), dtype=q.dtype, device=q.device) if out is None else out
    if bsz == 0:
        return out
    hkv = k_cache.shape[2]
    group = hq // hkv
    k_scale, v_scale, fp8_kv = scale_args(k_cache, kv_scales)
    key = config_key(q.dtype, d, group, k_cache.shape[1], bsz, fp8_kv)
    cfg = config or launch_config("decode_attention", key, q.device, default_config(q.dtype, q.device, fp8_kv))
    if block_n:
        cfg = {**cfg, "BLOCK_N": block_n}
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    direct = num_splits == 1
    mid_o, mid_lse = (out, out) if direct else split_scratch(bsz, hq, num_splits, d, q.device)
    positions, slots, cos_sin = rope if rope else (seq_lens, seq_lens, seq_lens)  # unread without RoPE
    _decode_split_kernel[(bsz, hkv, num_splits)](
        q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, mid_o, mid_lse, out, positions, slots, cos_sin,
        scale * 1.4426950408889634, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), cos_sin.stride(0), hq, GROUP=group, PAGE=k_cache.shape[1], HEAD_D=d,
        BLOCK_H=max(16, next_pow2(group)), BLOCK_N=cfg["BLOCK_N"], DIRECT=direct,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", ROPE=rope is not None,
        FP8_KV=fp8_kv, KV_DOT=tl.float32 if q.dtype == torch.float32 else tl.float16,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if not direct:
        merge_splits(mid_o, mid_lse, out)
    return out


def decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, num_splits: int = 1,
                         scale: float | None = None, kv_scales=None):
    """decode_attention in torch; e4m3 caches are read dequantized with `kv_scales` (kernels/kv_quant.py)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k_cache.shape[2]
    k_scale, v_scale = kv_scales or (None, None)
    out = torch.empty_like(q)
    for b, ctx in enumerate(seq_lens.tolist()):
        k = gather_pages(k_cache, block_tables[b], ctx, k_scale).float().repeat_interleave(group, dim=1)
        v = gather_pages(v_cache, block_tables[b], ctx, v_scale).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", q[b].float(), k) * scale
        out[b] = torch.einsum("hk,khd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def decode_attention_rope_ref(qkv, positions, cos_sin, slot_mapping, k_cache, v_cache, block_tables, seq_lens,
                              num_q_heads: int, num_splits: int = 1, scale: float | None = None,
                              kv_scales=None):
    """rope_kv_write_ref then decode_attention_ref, both with `kv_scales` for e4m3 caches."""
    qkv, d = qkv.clone(), cos_sin.shape[1]
    rope_kv_write_ref(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, num_q_heads, k_cache.shape[2],
                      kv_scales)
    q = qkv[:, :num_q_heads * d].view(qkv.shape[0], num_q_heads, d)
    return decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, num_splits, scale, kv_scales)


def choose_num_splits(batch_size: int, num_kv_heads: int, max_context: int, num_sms: int = 132,
                      block_n: int = 64) -> int:
    """Splits so a small batch gives every SM about two programs; none once the batch alone fills
    the SMs (one split writes the output directly, with no merge); never more than the context has tiles."""
    programs = max(1, batch_size * num_kv_heads)
    if programs >= num_sms:
        return 1
    want = -(-2 * num_sms // programs)
    return max(1, min(want, -(-max_context // block_n), 64))
