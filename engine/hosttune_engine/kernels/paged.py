"""Addressing of paged KV caches, shared by the attention kernels and references.

A cache is [num_blocks, PAGE, H_kv, D]; token n of a sequence lives in block
block_table[n // PAGE] at offset n % PAGE.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def paged_token_offsets(bt_row_ptr, start_n, offs_n, n_valid, stride_kb, stride_ks,
                        PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets of tokens `offs_n` (one tile starting at `start_n`) in a paged cache."""
    if PAGE % BLOCK_N == 0:
        # The tile lies inside one page: one block id, contiguous slots.
        blk = tl.load(bt_row_ptr + start_n // PAGE).to(tl.int64)
        offsets = blk * stride_kb + (offs_n % PAGE) * stride_ks
    else:
        blk = tl.load(bt_row_ptr + offs_n // PAGE, mask=offs_n < n_valid, other=0).to(tl.int64)
        offsets = blk * stride_kb + (offs_n % PAGE) * stride_ks
    return offsets


def gather_pages(cache: torch.Tensor, block_table_row: torch.Tensor, num_tokens: int,
                 scale: torch.Tensor | None = None) -> torch.Tensor:
    """The first `num_tokens` tokens of one sequence from a paged cache -> [num_tokens, H_kv, D]; an e4m3 cache
    with its `scale` [num_blocks, block_size, H_kv] comes back dequantized, in fp32 (kernels/kv_quant.py)."""
    page = cache.shape[1]
    blocks = block_table_row[: -(-num_tokens // page)].long()
    rows = cache[blocks].reshape(-1, *cache.shape[2:])[:num_tokens]
    if scale is None:
        return rows
    return rows.float() * scale[blocks].reshape(-1, scale.shape[2])[:num_tokens, :, None]
