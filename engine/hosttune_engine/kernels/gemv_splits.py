"""Split-K for the batch-1 quantized GEMVs: a projection with few output rows (o_proj, down_proj: N = hidden) gets
SPLIT programs per block of rows, each walking 1/SPLIT of K, so more weight bytes are in flight at once.

Each program adds its rows' fp32 partial sums into a scratch row [M, N] with atomics, then counts itself in
its row block's counter; the last of a block's SPLIT programs reads the sums (an atomic add of zero) and
clears them, adds the bias, writes y in its dtype and resets the counter. The scratch and counters are therefore zero
again after every call (a CUDA graph replays them with no memset), one pair per device and N, shared by the
projections of that width, which a step runs one after another on one stream.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 4  # the GEMVs take up to four rows
_BUFFERS: dict = {}


@triton.jit
def split_range(K, split, SPLIT: tl.constexpr, BLOCK_K: tl.constexpr):
    """[k_lo, k_hi) of split `split`: whole K tiles, as even as they divide; empty (k_lo = k_hi = K) for a split
    past the last tile, which an unrolled loop needs (its trip count over k_lo > k_hi is not zero)."""
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT) * BLOCK_K
    k_lo = tl.minimum(K, split * per)
    return k_lo, tl.minimum(K, k_lo + per)


@triton.jit
def store_row(y, y_ptr, b_ptr, part_ptr, m, N, offs_n, n_mask, stride_ym, HAS_BIAS: tl.constexpr,
              SPLIT: tl.constexpr):
    """Row m of a program's fp32 result: written (+ bias) in y's dtype, or with SPLIT > 1 added to the scratch
    (relaxed: finish_rows' count orders it)."""
    if SPLIT > 1:
        tl.atomic_add(part_ptr + m * N + offs_n, y, mask=n_mask, sem="relaxed")
    else:
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def finish_rows(part_ptr, cnt_ptr, y_ptr, b_ptr, pid, offs_n, n_mask, N, stride_ym, M: tl.constexpr,
                HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """After this program's partials: the last program of the row block writes y (+ bias) and clears the scratch."""
    tl.debug_barrier()  # every thread's partials are added before the block is counted
    done = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel")  # the last one sees every partial added before it
    if done == SPLIT - 1:
        for m in tl.static_range(M):
            zeros = tl.zeros_like(offs_n).to(tl.float32)  # adding zero reads the sums where the atomics made them
            y = tl.atomic_add(part_ptr + m * N + offs_n, zeros, mask=n_mask, sem="relaxed")
            tl.store(part_ptr + m * N + offs_n, zeros, mask=n_mask)  # every other add of the block is done
            store_row(y, y_ptr, b_ptr, part_ptr, m, N, offs_n, n_mask, stride_ym, HAS_BIAS, 1)
        tl.atomic_xchg(cnt_ptr + pid, 0)


def split_buffers(device: torch.device, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partial sums [ROWS, N], int32 row-block counters [N]) for GEMVs of width N on `device`, zero between
    calls. Made at the first call; made while a CUDA graph is captured, they come from that graph's memory pool
    and this cache keeps them alive for every later call."""
    key = (str(device), n)
    if key not in _BUFFERS:
        _BUFFERS[key] = (torch.zeros(ROWS, n, dtype=torch.float32, device=device),
                         torch.zeros(n, dtype=torch.int32, device=device))
    return _BUFFERS[key]


def split_grid(n: int, block_n: int, split: int) -> tuple[int, int]:
    return triton.cdiv(n, block_n), split
