"""KV-cache write: scatter this step's keys and values into their paged slots.

Caches are [num_blocks, block_size, H_kv, D]; slot s is block s // block_size,
offset s % block_size. A negative slot (padding) is skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import INDEX_DTYPES, check, check_last_dim_contiguous, check_tensor, next_pow2
from hosttune_engine.kernels.kv_quant import kv_quantize_ref


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_slot, stride_ch,
    n_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (d < head_dim)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    dst = slot * stride_slot + h * stride_ch + d
    tl.store(kc_ptr + dst, k, mask=mask)
    tl.store(vc_ptr + dst, v, mask=mask)


def _check(k, v, k_cache, v_cache, slot_mapping):
    check_tensor("k", k, 3)
    check_tensor("v", v, 3, dtypes=(k.dtype,), device=k.device)
    check(k.shape == v.shape, "k {} and v {} differ", tuple(k.shape), tuple(v.shape))
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, 4, dtypes=(k.dtype,), device=k.device)
        check(c.shape[2:] == k.shape[1:], "{} {} does not hold heads {}", name, tuple(c.shape), tuple(k.shape[1:]))
        check(c.is_contiguous(), "{} must be contiguous", name)
    check_tensor("slot_mapping", slot_mapping, 1, dtypes=INDEX_DTYPES, device=k.device)
    check(slot_mapping.shape[0] == k.shape[0], "slot_mapping needs one slot per token")
    check_last_dim_contiguous("k", k)
    check_last_dim_contiguous("v", v)


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """k, v [T, H_kv, D] -> k_cache, v_cache [N, B, H_kv, D] at slot_mapping [T] (in place)."""
    _check(k, v, k_cache, v_cache, slot_mapping)
    t, h, d = k.shape
    if t:
        _kv_write_kernel[(t,)](
            k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(1), k_cache.stride(2), h, d, BLOCK_H=next_pow2(h), BLOCK_D=next_pow2(d),
        )


def write_kv_ref(k, v, k_cache, v_cache, slot_mapping, kv_scales=None) -> None:
    """write_kv in torch; e4m3 caches take each row quantized, its scale into `kv_scales` (kernels/kv_quant.py)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for x, cache, i in ((k, k_cache, 0), (v, v_cache, 1)):
        rows = x[keep]
        if kv_scales is not None:
            rows, scale = kv_quantize_ref(rows)
            kv_scales[i].view(-1, kv_scales[i].shape[2])[slots] = scale
        cache.view(-1, *cache.shape[2:])[slots] = rows
