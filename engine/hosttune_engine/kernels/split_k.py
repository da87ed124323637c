"""Split-K attention: one program's key range cut into parts, whose partial results are merged.

A split writes its partial output, normalised by its own softmax sum, and that sum's log (base 2,
with the running max folded in: the log-sum-exp) into fp32 scratch rows [R, Hq, S, D] and [R, Hq, S].
The merge weights the splits of a row by exp2(lse_s - max lse) and writes out [R, Hq, D]. A split
that saw no key writes lse -inf only, which weighs nothing: the merge does not read its output row (a
decode graph sized for long contexts runs mostly empty splits on short ones). Decode attention splits a
sequence's context (R = sequences); prefill attention splits each query tile's keys (R = tokens).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import next_pow2

MAX_SPLITS = 64
PROGRAMS_PER_SM = 2  # a split grid holds at most this many programs per SM
MIN_SPLIT_TILES = 8  # key tiles a split keeps at least: fewer, and the scratch and merge cost more than they save


@triton.jit
def store_split(mid_o_ptr, mid_lse_ptr, row, acc, m_i, l_i, valid, offs_d, HEAD_D: tl.constexpr):
    """One split's rows: `row` [R] int64 indexes (row, head, split) of the scratch, `valid` [R] says which
    rows to write; acc [R, D], m_i and l_i [R] are the online softmax state (base 2)."""
    has = l_i > 0  # an empty split contributes nothing
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    tl.store(mid_lse_ptr + row, lse, mask=valid)
    tl.store(mid_o_ptr + row[:, None] * HEAD_D + offs_d[None, :], o, mask=(valid & has)[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _merge_kernel(mid_o_ptr, mid_lse_ptr, o_ptr, stride_or, stride_oh, n_q_heads, num_splits,
                  BLOCK_S: tl.constexpr, HEAD_D: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_valid = s < num_splits
    row = (r.to(tl.int64) * n_q_heads + h) * num_splits + s
    lse = tl.load(mid_lse_ptr + row, mask=s_valid, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))  # [S]
    offs_d = tl.arange(0, HEAD_D)
    has = lse > float("-inf")  # an empty split's output row is not written
    o = tl.load(mid_o_ptr + row[:, None] * HEAD_D + offs_d[None, :], mask=(s_valid & has)[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(o_ptr + r.to(tl.int64) * stride_or + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))


def split_scratch(rows: int, heads: int, num_splits: int, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs [R, Hq, S, D] and log-sum-exps [R, Hq, S], fp32, views of one allocation (from torch's
    caching allocator; a captured decode graph keeps its own in the graph's pool)."""
    n = rows * heads * num_splits
    flat = torch.empty(n * (head_dim + 1), dtype=torch.float32, device=device)
    mid_o = flat[:n * head_dim].view(rows, heads, num_splits, head_dim)
    return mid_o, flat[n * head_dim:].view(rows, heads, num_splits)


def merge_splits(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge the partials of `split_scratch` into out [R, Hq, D] (each row's splits by their log-sum-exps)."""
    rows, heads, num_splits, d = mid_o.shape
    if rows:
        _merge_kernel[(rows, heads)](mid_o, mid_lse, out, out.stride(0), out.stride(1), heads, num_splits,
                                     BLOCK_S=next_pow2(num_splits), HEAD_D=d)
    return out


def choose_splits(programs: int, key_tiles: int, num_sms: int) -> int:
    """Splits for a grid of `programs`, each walking up to `key_tiles` key tiles: the largest power of two
    that keeps the split grid within PROGRAMS_PER_SM programs per SM and each split at MIN_SPLIT_TILES tiles
    or more. So a grid of more than one program per SM is not split (no scratch, no merge).

    Measured on the H200 (benchmarks/engine/chunk_attention.py, split counts 1-16 swept): splitting a grid
    of more than 132 programs (one per SM), or a context of 512 keys or fewer, was slower than one split;
    short chunks over a 1K-6K prefix ran 1.2-3.5x faster split this way. The powers of two are the counts
    that sweep measured."""
    limit = min(PROGRAMS_PER_SM * num_sms // max(programs, 1), key_tiles // MIN_SPLIT_TILES, MAX_SPLITS)
    return 1 << (max(limit, 1).bit_length() - 1)


@lru_cache(maxsize=None)
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sms(device: torch.device) -> int:
    """The number of SMs of a CUDA device (read once per device)."""
    return _sms(device.index if device.index is not None else torch.cuda.current_device())
