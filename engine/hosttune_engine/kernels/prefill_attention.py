"""Prefill flash attention over a variable-length batch, causal, GQA, keys and values paged.

Each sequence b contributes query tokens cu_seqlens_q[b]:cu_seqlens_q[b+1], the
last q_len of its seq_lens[b] context tokens, whose keys and values are already
in the paged cache (written by kv_write this step). Query i attends to keys
0 .. seq_lens[b] - q_len + i. This covers a fresh prompt, a chunk of a long
prompt and a prompt whose prefix came from the prefix cache.

When no sequence has a prefix (every context is exactly this step's tokens),
`k`/`v` of this step can be passed instead of the caches (`contiguous=True`):
the same loop reads them with one stride, without the block-table gather.

Each program owns BLOCK_M queries of one head, as two halves whose work is
interleaved tile by tile (see `_attend_tiles`). Its key loop runs in two
phases: tiles every query may see, without masks, then the tiles on the
diagonal, masked. Programs take the heaviest (last) query tiles first, and the
grid runs heads fastest: all heads of a sequence's heaviest tile start before
any lighter tile, so the long programs never end up in the last wave (on the
H200 this ordering alone took 4K-token prefill from 0.71x to 0.86x torch SDPA).

A short chunk over a long cached prefix gives few programs (heads x query
tiles x sequences), each walking every cached key: split-K then cuts each
program's keys into parts run side by side and merged after (kernels/split_k.py).

In the contiguous case, q, k and v tiles move through tensor descriptors (TMA
on Hopper): about 8% faster again at 4K-8K tokens. Rows a tile reads past its
own sequence belong to the next sequence (or are zero past the end): their
scores are masked and their output rows are not stored.

An e4m3 cache (kernels/kv_quant.py) is read with its per-row scales: keys and
values go to q's dtype exactly, a key row's scale multiplies its scores and a
value row's scale its probabilities in the PV dot.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.attention_checks import check_paged_attention_inputs
from hosttune_engine.kernels.checks import check, check_last_dim_contiguous, check_tensor
from hosttune_engine.kernels.descriptors import descriptors_fit, use_torch_allocator
from hosttune_engine.kernels.kv_quant import scale_args
from hosttune_engine.kernels.paged import gather_pages, paged_token_offsets
from hosttune_engine.kernels.split_k import MAX_SPLITS, choose_splits, device_sms, merge_splits, split_scratch, \
    store_split
from hosttune_engine.kernels.tuning import launch_config, length_bucket


@triton.jit
def _load_kv(ptr, desc, bt_row, kv_row0, start_n, offs_n, offs_d, n_limit, stride_kb, stride_ks,
             PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, MASKED: tl.constexpr):
    """One [BLOCK_N, D] tile of keys or values: through the descriptor when contiguous, else gathered."""
    if not PAGED:
        x = desc.load([kv_row0 + start_n, 0])
    else:
        kv_off = _kv_offsets(bt_row, kv_row0, start_n, offs_n, n_limit, stride_kb, stride_ks, PAGE, BLOCK_N, PAGED)
        if MASKED:
            x = tl.load(ptr + kv_off[:, None] + offs_d[None, :], mask=(offs_n < n_limit)[:, None], other=0.0)
        else:
            x = tl.load(ptr + kv_off[:, None] + offs_d[None, :])
    return x


@triton.jit
def _kv_offsets(bt_row, kv_row0, start_n, offs_n, n_limit, stride_kb, stride_ks,
                PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr):
    if PAGED:
        return paged_token_offsets(bt_row, start_n, offs_n, n_limit, stride_kb, stride_ks, PAGE, BLOCK_N)
    else:
        return (kv_row0 + offs_n).to(tl.int64) * stride_ks


@triton.jit
def _row_scales(ks_ptr, vs_ptr, bt_row, start_n, offs_n, n_limit, stride_kb, stride_ks,
                PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, MASKED: tl.constexpr):
    """The k and v scales [BLOCK_N] of a paged e4m3 tile's rows; ks_ptr/vs_ptr point at this KV head's scales,
    and a row's scale sits at its element offset in the cache // HEAD_D (kernels/kv_quant.py)."""
    off = paged_token_offsets(bt_row, start_n, offs_n, n_limit, stride_kb, stride_ks, PAGE, BLOCK_N) // HEAD_D
    if MASKED:
        valid = offs_n < n_limit
        return tl.load(ks_ptr + off, mask=valid, other=0.0), tl.load(vs_ptr + off, mask=valid, other=0.0)
    else:
        return tl.load(ks_ptr + off), tl.load(vs_ptr + off)


@triton.jit
def _softmax_tile(qk, m_i, offs_n, q_pos, qk_scale, MASKED: tl.constexpr):
    """One tile's raw scores [HALF, BN] -> probabilities (base 2), the rescale of older tiles, the new row max."""
    if MASKED:
        # Causality alone: a stored row's keys end at its position, inside the context. Rows past the
        # chunk (not stored) may see keys past ctx_len: zeros from masked loads, the next sequence's rows
        # or TMA's zero fill, all finite. (Also masking ctx_len cost 8% at 8K tokens on the H200.)
        keep = offs_n[None, :] <= q_pos[:, None]
        qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk -= m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    return tl.exp2(qk), tl.exp2(m_i - m_new), m_new


@triton.jit
def _attend_tiles(acc_a, l_a, m_a, acc_b, l_b, m_b, q_a, q_b, pos_a, pos_b,
                  k_ptr, v_ptr, k_desc, v_desc, ks_ptr, vs_ptr, bt_row, kv_row0, lo, hi, ctx_len, qk_scale,
                  stride_kb, stride_ks, offs_d,
                  PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, MASKED: tl.constexpr,
                  PRECISION: tl.constexpr, HEAD_D: tl.constexpr, FP8_KV: tl.constexpr):
    """Online softmax of both query halves over key tiles [lo, hi); k_ptr/v_ptr (or the descriptors) point at
    this KV head, ks_ptr/vs_ptr at its scales when FP8_KV (e4m3 caches, paged). Both halves' QK^T come first,
    then each half's softmax and PV in turn: the tensor cores work on one half while the other half's
    exponentials run (about 7% faster at 4K-8K tokens on the H200)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.trans(_load_kv(k_ptr, k_desc, bt_row, kv_row0, start_n, offs_n, offs_d, ctx_len, stride_kb, stride_ks,
                              PAGE, BLOCK_N, PAGED, MASKED))  # [D, BN]
        if FP8_KV:  # e4m3 -> the dots' dtype is exact; the scales go on the scores (k) and on p (v)
            k_sc, v_sc = _row_scales(ks_ptr, vs_ptr, bt_row, start_n, offs_n, ctx_len, stride_kb, stride_ks,
                                     PAGE, BLOCK_N, HEAD_D, MASKED)  # [BN] each
            k = k.to(q_a.dtype)
        s_a = tl.dot(q_a, k, input_precision=PRECISION)  # [HALF, BN]
        s_b = tl.dot(q_b, k, input_precision=PRECISION)
        if FP8_KV:
            s_a = s_a * k_sc[None, :]
            s_b = s_b * k_sc[None, :]
        p_a, alpha_a, m_a = _softmax_tile(s_a, m_a, offs_n, pos_a, qk_scale, MASKED)
        v = _load_kv(v_ptr, v_desc, bt_row, kv_row0, start_n, offs_n, offs_d, ctx_len, stride_kb, stride_ks,
                     PAGE, BLOCK_N, PAGED, MASKED)  # [BN, D]
        w_a = p_a  # the PV dot's weights; the row sums l take the unscaled p
        if FP8_KV:
            v = v.to(q_a.dtype)
            w_a = p_a * v_sc[None, :]
        acc_a = tl.dot(w_a.to(v.dtype), v, acc_a * alpha_a[:, None], input_precision=PRECISION)
        p_b, alpha_b, m_b = _softmax_tile(s_b, m_b, offs_n, pos_b, qk_scale, MASKED)
        w_b = p_b
        if FP8_KV:
            w_b = p_b * v_sc[None, :]
        acc_b = tl.dot(w_b.to(v.dtype), v, acc_b * alpha_b[:, None], input_precision=PRECISION)
        l_a = l_a * alpha_a + tl.sum(p_a, 1)  # after the dots: the row sums are not live across them
        l_b = l_b * alpha_b + tl.sum(p_b, 1)
    return acc_a, l_a, m_a, acc_b, l_b, m_b


@triton.jit
def _load_q(q_ptr, q_desc, q_start, row0, q_len, h, stride_qt, stride_qh, offs_d,
            HALF: tl.constexpr, PAGED: tl.constexpr):
    """Query rows row0 .. row0 + HALF of this sequence (rows past q_len: zeros, or the next sequence's)."""
    if PAGED:  # (if/else, not an early return: code after a constexpr-if return is still compiled)
        rows = row0 + tl.arange(0, HALF)
        q_rows = (q_start + rows).to(tl.int64)
        q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                    mask=(rows < q_len)[:, None], other=0.0)
    else:
        q = q_desc.load([q_start + row0, 0])
    return q


@triton.jit
def _store_o(o_ptr, acc, l_i, q_start, rows, q_len, h, stride_ot, stride_oh, offs_d):
    q_rows = (q_start + rows).to(tl.int64)
    tl.store(o_ptr + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=(rows < q_len)[:, None])


@triton.jit(do_not_specialize=["stride_bt", "num_splits"])  # the table width changes per step
def _prefill_attention_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, o_ptr, cu_q_ptr, lens_ptr, bt_ptr, mid_o_ptr, mid_lse_ptr,
    qk_scale, num_tokens, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_bt,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr, FP8_KV: tl.constexpr, KV_DOT: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_M // 2
    h = tl.program_id(0)  # heads fastest: see the module docstring
    pid = tl.program_id(1)
    b = tl.program_id(2)
    split = 0
    if SPLIT:  # a tile's splits are neighbours on the grid
        split = pid % num_splits
        pid = pid // num_splits
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    num_m = tl.cdiv(q_len, BLOCK_M)
    if pid >= num_m:
        return
    pid_m = num_m - 1 - pid  # the longest rows first, so short ones fill the tail
    ctx_len = tl.load(lens_ptr + b)
    prefix = ctx_len - q_len  # keys already cached before this chunk
    kvh = h // GROUP
    rows_a = pid_m * BLOCK_M + tl.arange(0, HALF)
    rows_b = rows_a + HALF
    offs_d = tl.arange(0, HEAD_D)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    ks_head = ks_ptr
    vs_head = vs_ptr
    if FP8_KV:  # one scale a cached row: the row's element offset // HEAD_D
        ks_head = ks_ptr + kvh * (stride_kh // HEAD_D)
        vs_head = vs_ptr + kvh * (stride_kh // HEAD_D)
    q_desc = None
    k_desc = None
    v_desc = None
    if not PAGED:
        q_desc = tl.make_tensor_descriptor(q_ptr + h * stride_qh, shape=[num_tokens, HEAD_D], strides=[stride_qt, 1],
                                           block_shape=[HALF, HEAD_D])
        k_desc = tl.make_tensor_descriptor(k_head, shape=[num_tokens, HEAD_D], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
        v_desc = tl.make_tensor_descriptor(v_head, shape=[num_tokens, HEAD_D], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
    q_a = _load_q(q_ptr, q_desc, q_start, pid_m * BLOCK_M, q_len, h, stride_qt, stride_qh, offs_d,
                  HALF, PAGED)  # [HALF, D]
    q_b = _load_q(q_ptr, q_desc, q_start, pid_m * BLOCK_M + HALF, q_len, h, stride_qt, stride_qh, offs_d,
                  HALF, PAGED)
    if FP8_KV:  # e4m3 tiles convert to fp16 in one instruction a pair (bf16 takes several): the dots run in fp16
        q_a = q_a.to(KV_DOT)
        q_b = q_b.to(KV_DOT)
    m_a = tl.full([HALF], float("-inf"), tl.float32)
    m_b = tl.full([HALF], float("-inf"), tl.float32)
    l_a = tl.zeros([HALF], tl.float32)
    l_b = tl.zeros([HALF], tl.float32)
    acc_a = tl.zeros([HALF, HEAD_D], tl.float32)
    acc_b = tl.zeros([HALF, HEAD_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    # Phase 1: keys below `lo` are visible to every query of the tile.
    lo = (prefix + pid_m * BLOCK_M) // BLOCK_N * BLOCK_N
    hi = tl.minimum(ctx_len, prefix + (pid_m + 1) * BLOCK_M)
    start = 0
    if SPLIT:  # this split's share of the tile's keys [0, hi); the diagonal belongs to the last
        span = tl.cdiv(tl.cdiv(hi, BLOCK_N), num_splits) * BLOCK_N
        start = tl.minimum(split * span, lo)
        lo_end = tl.minimum(start + span, lo)
    else:
        lo_end = lo
    acc_a, l_a, m_a, acc_b, l_b, m_b = _attend_tiles(
        acc_a, l_a, m_a, acc_b, l_b, m_b, q_a, q_b, prefix + rows_a, prefix + rows_b,
        k_head, v_head, k_desc, v_desc, ks_head, vs_head, bt_row, q_start, start, lo_end, ctx_len, qk_scale,
        stride_kb, stride_ks, offs_d, PAGE, BLOCK_N, PAGED, False, PRECISION, HEAD_D, FP8_KV)
    # Phase 2: the diagonal tiles, masked.
    if SPLIT:
        hi = tl.where(split == num_splits - 1, hi, lo)
    acc_a, l_a, m_a, acc_b, l_b, m_b = _attend_tiles(
        acc_a, l_a, m_a, acc_b, l_b, m_b, q_a, q_b, prefix + rows_a, prefix + rows_b,
        k_head, v_head, k_desc, v_desc, ks_head, vs_head, bt_row, q_start, lo, hi, ctx_len, qk_scale,
        stride_kb, stride_ks, offs_d, PAGE, BLOCK_N, PAGED, True, PRECISION, HEAD_D, FP8_KV)
    if SPLIT:
        row_a = ((q_start + rows_a).to(tl.int64) * tl.num_programs(0) + h) * num_splits + split  # [HALF]
        store_split(mid_o_ptr, mid_lse_ptr, row_a, acc_a, m_a, l_a, rows_a < q_len, offs_d, HEAD_D)
        store_split(mid_o_ptr, mid_lse_ptr, row_a + HALF * tl.num_programs(0) * num_splits, acc_b, m_b, l_b,
                    rows_b < q_len, offs_d, HEAD_D)
    else:
        _store_o(o_ptr, acc_a, l_a, q_start, rows_a, q_len, h, stride_ot, stride_oh, offs_d)
        _store_o(o_ptr, acc_b, l_b, q_start, rows_b, q_len, h, stride_ot, stride_oh, offs_d)


def default_config(dtype: torch.dtype, device) -> dict:
    if dtype == torch.float32 or getattr(device, "type", "cpu") != "cuda":
        return {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}


def config_key(dtype, head_dim: int, group: int, page: int, contiguous: bool, max_query_len: int) -> str:
    mode = "contig" if contiguous else f"paged{page}"
    return f"{str(dtype).removeprefix('torch.')}-d{head_dim}-g{group}-{mode}-{length_bucket(max_query_len)}"


def prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_query_len: int,
                      scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
                      contiguous: bool = False, k=None, v=None, config: dict | None = None, out=None,
                      num_splits: int | None = None, max_context: int | None = None, kv_scales=None):
    """q [T, Hq, D] packed by cu_seqlens_q [B+1]; seq_lens [B] context lengths;
    block_tables [B, max_blocks] -> out [T, Hq, D].

    With `contiguous=True`, `k`/`v` [T, Hkv, D] (this step's keys and values,
    packed like q) are read instead of the caches; every seq_lens[b] must then
    equal its query length (no cached prefix).

    Split-K: each query tile's keys are cut into `num_splits` parts run side by
    side, then merged (kernels/split_k.py). Left None, the count is chosen on a
    GPU from `max_context` (the longest seq_lens entry, known on the host) when
    the grid alone would leave SMs idle: short chunks over a long cached prefix.
    Without `max_context` (or on the contiguous path) nothing is split.

    e4m3 caches (kernels/kv_quant.py) take `kv_scales` = (k_scale, v_scale), each
    [num_blocks, block_size, H_kv] fp32. With `contiguous=True` `k`/`v` must then
    hold what the cache holds (quantized and scaled back, as rope_kv_write leaves
    them in qkv): every attention path reads the cache's values, so the output does
    not depend on chunking or prefix caching.
    """
    check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, kv_scales)
    check_tensor("cu_seqlens_q", cu_seqlens_q, 1, dtypes=(torch.int32,), device=q.device)
    check(cu_seqlens_q.shape[0] == seq_lens.shape[0] + 1, "cu_seqlens_q needs batch + 1 entries")
    t, hq, d = q.shape
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device) if out is None else out
    if t == 0:
        return out
    hkv = k_cache.shape[2]
    if contiguous:
        _check_step_kv(q, k, v, hkv)
        contiguous = descriptors_fit(q, k, v)  # else the same keys and values, read from the cache
    if contiguous:
        use_torch_allocator()
        kk, vv, strides = k, v, (0, k.stride(0), k.stride(1))
    else:
        kk, vv, strides = k_cache, v_cache, (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    cfg = config or launch_config("prefill_attention", config_key(q.dtype, d, hq // hkv, k_cache.shape[1],
                                  contiguous, max_query_len), q.device, default_config(q.dtype, q.device))
    cfg = {**cfg, **({"BLOCK_M": block_m} if block_m else {}), **({"BLOCK_N": block_n} if block_n else {})}
    check(cfg["BLOCK_M"] >= 32 and cfg["BLOCK_M"] & (cfg["BLOCK_M"] - 1) == 0,
          "BLOCK_M must be a power of two >= 32 (two halves of >= 16 rows), got {}", cfg['BLOCK_M'])
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    tiles = triton.cdiv(max_query_len, cfg["BLOCK_M"])
    splits = _num_splits(num_splits, max_context, contiguous, hq * tiles * seq_lens.shape[0], cfg, q.device)
    mid_o, mid_lse = (out, out) if splits == 1 else split_scratch(t, hq, splits, d, q.device)
    k_scale, v_scale, fp8_kv = scale_args(k_cache, None if contiguous else kv_scales)
    _prefill_attention_kernel[(hq, tiles * splits, seq_lens.shape[0])](
        q, kk, vv, k_scale, v_scale, out, cu_seqlens_q, seq_lens, block_tables, mid_o, mid_lse,
        scale * 1.4426950408889634, t, splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *strides, block_tables.stride(0),
        GROUP=hq // hkv, PAGE=k_cache.shape[1], HEAD_D=d,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], PAGED=not contiguous, SPLIT=splits > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FP8_KV=fp8_kv,
        KV_DOT=tl.float32 if q.dtype == torch.float32 else tl.float16,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out if splits == 1 else merge_splits(mid_o, mid_lse, out)


def _num_splits(num_splits, max_context, contiguous: bool, programs: int, cfg: dict, device) -> int:
    """The split count asked for (checked), else the automatic choice (see the wrapper's docstring)."""
    if num_splits is not None:
        check(isinstance(num_splits, int) and not isinstance(num_splits, bool) and 1 <= num_splits <= MAX_SPLITS,
              "num_splits must be an int in 1..{}, got {!r}", MAX_SPLITS, num_splits)
        return num_splits
    return 1 if contiguous else auto_splits(programs, max_context, cfg["BLOCK_N"], device)


def auto_splits(programs: int, max_context: int | None, block_n: int, device) -> int:
    """The split count of a paged launch of `programs` (heads x query tiles x sequences) whose longest context
    is `max_context`: 1 off a GPU or when `max_context` is unknown."""
    if not max_context or device.type != "cuda":
        return 1
    return choose_splits(programs, triton.cdiv(max_context, block_n), device_sms(device))


def _check_step_kv(q, k, v, hkv: int) -> None:
    for name, x in (("k", k), ("v", v)):
        check_tensor(name, x, 3, dtypes=(q.dtype,), device=q.device)
        check_last_dim_contiguous(name, x)
        check(x.shape == (q.shape[0], hkv, q.shape[2]), "{} {} must be [T, H_kv, D] like q", name,
              tuple(x.shape))
    check(k.stride() == v.stride(), "k and v need the same strides")


def prefill_attention_ref(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_query_len: int = 0,
                          scale: float | None = None, kv_scales=None):
    """prefill_attention in torch (fp32 math); e4m3 caches are dequantized with `kv_scales`."""
    k_scale, v_scale = (None, None) if kv_scales is None else kv_scales
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, ctx in enumerate(lens):
        qs, qe = cu[b], cu[b + 1]
        qb = q[qs:qe].float()  # [Lq, Hq, D]
        k = gather_pages(k_cache, block_tables[b], ctx, k_scale).float().repeat_interleave(group, dim=1)
        v = gather_pages(v_cache, block_tables[b], ctx, v_scale).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale  # [Hq, Lq, L]
        qpos = torch.arange(ctx - (qe - qs), ctx, device=q.device)
        mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]
        scores = scores.masked_fill(~mask, float("-inf"))
        out[qs:qe] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)
    return out
