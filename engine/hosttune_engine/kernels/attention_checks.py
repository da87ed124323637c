"""Input checks shared by the paged attention wrappers."""

from __future__ import annotations

import torch

from hosttune_engine.kernels.checks import check, check_last_dim_contiguous, check_pow2, check_tensor
from hosttune_engine.kernels.kv_quant import KV_FP8, check_kv_scales


def check_paged_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, kv_scales=None) -> None:
    """Caches in q's dtype, or e4m3 with their scales (kernels/kv_quant.py)."""
    check_tensor("q", q, 3)
    check_last_dim_contiguous("q", q)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, 4, dtypes=(q.dtype, KV_FP8), device=q.device)
        check(c.is_contiguous(), "the KV caches must be contiguous [num_blocks, block_size, H_kv, D]")
    check_kv_scales(k_cache, v_cache, kv_scales, q.dtype)
    check(k_cache.shape == v_cache.shape, "k_cache and v_cache shapes differ")
    d = q.shape[2]
    check(k_cache.shape[3] == d, "cache head dim {} != query head dim {}", k_cache.shape[3], d)
    check_pow2("head dim", d)
    check(d >= 16, "head dim must be >= 16, got {}", d)
    check(q.shape[1] % k_cache.shape[2] == 0, "{} query heads do not group over {} KV heads", q.shape[1],
          k_cache.shape[2])
    check_pow2("block size", k_cache.shape[1])
    check_tensor("block_tables", block_tables, 2, dtypes=(torch.int32,), device=q.device)
    check_last_dim_contiguous("block_tables", block_tables)
    check_tensor("seq_lens", seq_lens, 1, dtypes=(torch.int32,), device=q.device)
    check(block_tables.shape[0] == seq_lens.shape[0], "block_tables and seq_lens disagree on the batch size")
