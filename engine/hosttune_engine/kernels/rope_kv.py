"""RoPE on q and k and the KV-cache write, fused: one pass over the qkv projection's output.

qkv is [T, (Hq + 2 Hkv) * D]: q heads, then k heads, then v heads. q and k are
rotated in place (neox layout, fp32 math, rounded once, as `rope`), and the
rotated k and the v of token t go to cache slot slot_mapping[t] (skipped when
negative, as `write_kv`). Attention then reads q (and this step's k, v) as
strided views of qkv. An e4m3 cache takes each row quantized with its scale
(kernels/kv_quant.py), and the written tokens' k and v in qkv are left as the
cache now holds them (quantized and scaled back), so attention that reads this
step's keys and values from qkv reads what the cache holds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import INDEX_DTYPES, check, check_tensor, next_pow2
from hosttune_engine.kernels.kv_quant import (KV_FP8, check_kv_scales, kv_e4m3, kv_round_trip_ref, kv_row_scales,
                                              scale_args)
from hosttune_engine.kernels.kv_write import write_kv_ref
from hosttune_engine.kernels.rope import rope_ref


@triton.jit
def _rotate_heads(base, cos, sin, n_heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rotate heads [n_heads, 2 * HALF] at `base` in place; return the rotated halves (fp32)."""
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < n_heads) & (d[None, :] < HALF)
    ptr = base + heads[:, None] * (2 * HALF) + d[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    y1 = (x1 * cos - x2 * sin).to(base.dtype.element_ty)
    y2 = (x2 * cos + x1 * sin).to(base.dtype.element_ty)
    tl.store(ptr, y1, mask=mask)
    tl.store(ptr + HALF, y2, mask=mask)
    return y1, y2


@triton.jit
def _store_halves(c_ptr, s_ptr, dst, back, rows, mask, x1, x2, HALF: tl.constexpr, FP8_KV: tl.constexpr):
    """Rows [H, 2 HALF] (those of `rows` [H] that exist) as two halves to a cache at `dst`; e4m3 with one scale a
    row (at the row's offset // (2 HALF)) when FP8_KV, the rows as the cache now holds them written back over
    their source at `back` (in qkv)."""
    if FP8_KV:
        a, b = tl.where(mask, x1.to(tl.float32), 0.0), tl.where(mask, x2.to(tl.float32), 0.0)
        scale = tl.maximum(kv_row_scales(a), kv_row_scales(b))  # the row's: max|row| / 448
        tl.store(s_ptr + tl.min(dst, 1) // (2 * HALF), scale, mask=rows)
        qa = kv_e4m3(a, scale).to(c_ptr.dtype.element_ty)
        qb = kv_e4m3(b, scale).to(c_ptr.dtype.element_ty)
        tl.store(c_ptr + dst, qa, mask=mask)
        tl.store(c_ptr + dst + HALF, qb, mask=mask)
        tl.store(back, (qa.to(tl.float32) * scale[:, None]).to(back.dtype.element_ty), mask=mask)
        tl.store(back + HALF, (qb.to(tl.float32) * scale[:, None]).to(back.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptr + dst, x1, mask=mask)
        tl.store(c_ptr + dst + HALF, x2, mask=mask)


@triton.jit
def _rope_kv_write_kernel(
    qkv_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pos_ptr, slot_ptr, cs_ptr,
    stride_t, stride_slot, stride_ch, stride_cs,
    N_Q: tl.constexpr, N_KV: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_D: tl.constexpr, FP8_KV: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + d, mask=dmask, other=0.0)[None, :]
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + d, mask=dmask, other=0.0)[None, :]
    row = qkv_ptr + t * stride_t
    _rotate_heads(row, cos, sin, N_Q, HALF, BLOCK_HQ, BLOCK_D)
    k1, k2 = _rotate_heads(row + N_Q * 2 * HALF, cos, sin, N_KV, HALF, BLOCK_HKV, BLOCK_D)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        heads = tl.arange(0, BLOCK_HKV)
        mask = (heads[:, None] < N_KV) & dmask[None, :]
        dst = slot * stride_slot + heads[:, None] * stride_ch + d[None, :]
        k_src = row + N_Q * 2 * HALF + heads[:, None] * (2 * HALF) + d[None, :]
        _store_halves(kc_ptr, ks_ptr, dst, k_src, heads < N_KV, mask, k1, k2, HALF, FP8_KV)
        src = k_src + N_KV * 2 * HALF
        v1, v2 = tl.load(src, mask=mask), tl.load(src + HALF, mask=mask)
        _store_halves(vc_ptr, vs_ptr, dst, src, heads < N_KV, mask, v1, v2, HALF, FP8_KV)


def check_rope_kv_inputs(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, num_q_heads, num_kv_heads,
                         kv_scales=None):
    check_tensor("qkv", qkv, 2)
    t = qkv.shape[0]
    check(qkv.stride(1) == 1, "qkv must be contiguous in its last dim (strides {})", qkv.stride())
    check_tensor("positions", positions, 1, dtypes=INDEX_DTYPES, device=qkv.device)
    check_tensor("slot_mapping", slot_mapping, 1, dtypes=INDEX_DTYPES, device=qkv.device)
    check(positions.shape[0] == t and slot_mapping.shape[0] == t, "positions and slot_mapping need one entry per token")
    check_tensor("cos_sin", cos_sin, 2, dtypes=(torch.float32,), device=qkv.device)
    check(cos_sin.is_contiguous(), "cos_sin must be contiguous")
    d = cos_sin.shape[1]
    check(d % 2 == 0 and qkv.shape[1] == (num_q_heads + 2 * num_kv_heads) * d,
          "qkv width {} != ({} + 2 * {}) heads * head dim {}", qkv.shape[1], num_q_heads, num_kv_heads, d)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, 4, dtypes=(qkv.dtype, KV_FP8), device=qkv.device)
        check(c.is_contiguous(), "{} must be contiguous", name)
        check(c.shape[2:] == (num_kv_heads, d), "{} {} does not hold {} heads of {}", name, tuple(c.shape),
              num_kv_heads, d)
    check_kv_scales(k_cache, v_cache, kv_scales, qkv.dtype)


def rope_kv_write(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, num_q_heads: int, num_kv_heads: int,
                  kv_scales=None) -> None:
    """Rotate q and k of qkv [T, (Hq + 2 Hkv) * D] in place; write k, v to their cache slots (e4m3 caches:
    with `kv_scales` (k_scale, v_scale), kernels/kv_quant.py)."""
    check_rope_kv_inputs(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, num_q_heads, num_kv_heads,
                         kv_scales)
    t, half = qkv.shape[0], cos_sin.shape[1] // 2
    if t:
        _rope_kv_write_kernel[(t,)](
            qkv, k_cache, v_cache, *scale_args(k_cache, kv_scales)[:2], positions, slot_mapping, cos_sin,
            qkv.stride(0), k_cache.stride(1), k_cache.stride(2), cos_sin.stride(0),
            N_Q=num_q_heads, N_KV=num_kv_heads, HALF=half,
            BLOCK_HQ=next_pow2(num_q_heads), BLOCK_HKV=next_pow2(num_kv_heads), BLOCK_D=next_pow2(half),
            FP8_KV=kv_scales is not None,
        )


def rope_kv_write_ref(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, num_q_heads: int,
                      num_kv_heads: int, kv_scales=None) -> None:
    t, d = qkv.shape[0], cos_sin.shape[1]
    q, k, v = qkv.view(t, -1, d).split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    q.copy_(rope_ref(q, positions, cos_sin))
    k.copy_(rope_ref(k, positions, cos_sin))
    write_kv_ref(k, v, k_cache, v_cache, slot_mapping, kv_scales)
    if kv_scales is not None:  # the written rows as the cache now holds them
        kept = slot_mapping >= 0
        k[kept] = kv_round_trip_ref(k[kept])
        v[kept] = kv_round_trip_ref(v[kept])
