"""The FP8 KV cache's format: each token's key and value rows, per KV head, as e4m3 with one fp32 scale.

A row of D values x (rounded to the model's dtype first, what an unquantized cache would hold) is stored as
q = x / s in e4m3 with s = max|x| / 448 (the per-token rule of kernels/fp8_scaled_mm.py), and read back as
q * s. Scales sit beside the caches, [num_blocks, block_size, H_kv] fp32, one per cached row, so a row carries
its own range whatever the layer, head or token (keys with large biases included) and the cache holds 1 byte
a value plus 4 a row instead of 2 a value: 1.94x the tokens at D = 128.

Every attention path reads what the cache holds: the decode kernel that writes this step's token rounds it
through e4m3 in registers before attending it, and the RoPE + KV write leaves a prompt's keys and values in
qkv as the cache holds them, where a fresh prompt's prefill reads them, so a sequence's output does not depend
on how its prompt was chunked or which prefix was cached.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor

KV_FP8 = torch.float8_e4m3fn
KV_FP8_MAX = 448.0


def is_fp8_cache(cache: torch.Tensor) -> bool:
    return cache.dtype == KV_FP8


def kv_quantize_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (the model's dtype) -> (e4m3 [..., D], fp32 scales [...])."""
    scale = x.float().abs().amax(-1).clamp_min(1e-12) / KV_FP8_MAX
    return (x.float() / scale[..., None]).clamp(-KV_FP8_MAX, KV_FP8_MAX).to(KV_FP8), scale


def kv_dequantize_ref(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 [..., D] and scales [...] -> fp32 [..., D]."""
    return q.float() * scale[..., None]


def kv_round_trip_ref(x: torch.Tensor) -> torch.Tensor:
    """What the cache gives back for x, in x's dtype."""
    return kv_dequantize_ref(*kv_quantize_ref(x)).to(x.dtype)


@triton.jit
def kv_row_scales(x):
    """Scales [R] of rows x [R, D] (fp32): max|x| / 448 (never zero)."""
    return tl.maximum(tl.max(tl.abs(x), 1), 1e-12) / 448.0


@triton.jit
def kv_e4m3(x, scale):
    """Rows x [R, D] (fp32) over their scales [R], clamped to e4m3's range, still fp32: cast where stored."""
    return tl.minimum(tl.maximum(x / scale[:, None], -448.0), 448.0)


@triton.jit
def kv_round_trip(x, dtype: tl.constexpr):
    """Rows x [R, D] as the cache returns them (quantized, then scaled back), in `dtype`."""
    scale = kv_row_scales(x)
    return (kv_e4m3(x, scale).to(tl.float8e4nv).to(tl.float32) * scale[:, None]).to(dtype)


def check_kv_scales(k_cache: torch.Tensor, v_cache: torch.Tensor, kv_scales, model_dtype: torch.dtype) -> None:
    """Caches in the model's dtype take no scales; e4m3 caches need (k_scale, v_scale), each
    [num_blocks, block_size, H_kv] fp32 and contiguous."""
    if not is_fp8_cache(k_cache):
        check(k_cache.dtype == model_dtype and v_cache.dtype == model_dtype,
              "the KV caches hold {} and {}, expected {} (or e4m3 with scales)", k_cache.dtype, v_cache.dtype,
              model_dtype)
        check(kv_scales is None, "KV scales are only for e4m3 caches, got {} caches", k_cache.dtype)
        return
    check(is_fp8_cache(v_cache), "k_cache is e4m3 but v_cache is {}", v_cache.dtype)
    check(kv_scales is not None and len(kv_scales) == 2, "e4m3 KV caches need kv_scales = (k_scale, v_scale)")
    for name, s in zip(("k_scale", "v_scale"), kv_scales):
        check_tensor(name, s, 3, dtypes=(torch.float32,), device=k_cache.device)
        check(s.shape == k_cache.shape[:3] and s.is_contiguous(),
              "{} must be [num_blocks, block_size, H_kv] = {} and contiguous, got {}", name, tuple(k_cache.shape[:3]),
              tuple(s.shape))


def scale_args(k_cache: torch.Tensor, kv_scales):
    """(k_scale, v_scale, FP8_KV) for a kernel launch: the caches themselves stand in (unread) without scales."""
    if kv_scales is None:
        return k_cache, k_cache, False
    return kv_scales[0], kv_scales[1], True
