"""Top-p (nucleus) threshold per row without sorting the vocabulary.

A row keeps a token when the probability mass of the tokens strictly more probable than it is at most
top_p. That mass, G(v) = sum of probs > v, only falls as v grows, so the kept tokens are those at or above
the smallest v with G(v) <= top_p. The kernel finds that v by bisecting the bit patterns of non-negative
fp32 numbers (ordered like the numbers themselves): 30 passes over the row, each one reduction, where a
sort would move the whole row. It also returns G at the threshold, for the caller to decide how many of
the tokens tied at the threshold still fit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_last_dim_contiguous, check_tensor

ONE_BITS = 0x3F800000  # fp32 1.0: no probability is above it, so G(1.0) = 0
ITERATIONS = 30  # 2**30 > ONE_BITS: the bisection of [0, ONE_BITS] ends on one pattern


@triton.jit
def _nucleus_kernel(probs_ptr, top_p_ptr, thr_ptr, above_ptr, stride, n_cols,
                    ONE: tl.constexpr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = probs_ptr + row * stride
    p = tl.load(top_p_ptr + row)
    lo = tl.zeros((), dtype=tl.int32)  # G(lo) > p is assumed; hi always has G(hi) <= p
    hi = tl.full((), ONE, tl.int32)
    mass_hi = tl.zeros((), dtype=tl.float32)
    for _ in range(ITERS):
        mid = lo + (hi - lo) // 2
        v = mid.to(tl.float32, bitcast=True)
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < n_cols, other=0.0)
            total += tl.where(x > v, x, 0.0)
        mass = tl.sum(total, axis=0)
        fits = mass <= p
        hi = tl.where(fits, mid, hi)
        mass_hi = tl.where(fits, mass, mass_hi)
        lo = tl.where(fits, lo, mid)
    keep_all = p >= 1.0
    tl.store(thr_ptr + row, tl.where(keep_all, 0.0, hi.to(tl.float32, bitcast=True)))
    tl.store(above_ptr + row, tl.where(keep_all, 0.0, mass_hi))


def nucleus_threshold(probs: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [N, V] fp32 (rows sum to 1), top_p [N] fp32 -> (threshold [N], mass strictly above it [N]).
    A row with top_p >= 1 gets threshold 0: it keeps every token."""
    check_tensor("probs", probs, 2, (torch.float32,))
    check_tensor("top_p", top_p, 1, (torch.float32,), probs.device)
    check(top_p.shape[0] == probs.shape[0], "top_p needs one value per row of probs")
    check_last_dim_contiguous("probs", probs)
    n, vocab = probs.shape
    thr = torch.empty(n, dtype=torch.float32, device=probs.device)
    above = torch.empty_like(thr)
    if n:
        block = min(4096, triton.next_power_of_2(vocab))
        _nucleus_kernel[(n,)](probs, top_p.contiguous(), thr, above, probs.stride(0), vocab,
                              ONE=ONE_BITS, ITERS=ITERATIONS, BLOCK=block, num_warps=8)
    return thr, above


def nucleus_threshold_ref(probs: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same bisection in torch ops, all rows at once (CPU, and the kernel's reference)."""
    n = probs.shape[0]
    lo = torch.zeros(n, dtype=torch.int32, device=probs.device)
    hi = torch.full((n,), ONE_BITS, dtype=torch.int32, device=probs.device)
    mass_hi = torch.zeros(n, dtype=torch.float32, device=probs.device)
    for _ in range(ITERATIONS):
        mid = lo + (hi - lo) // 2
        mass = torch.where(probs > mid.view(torch.float32)[:, None], probs, 0.0).sum(-1)
        fits = mass <= top_p
        hi, mass_hi, lo = torch.where(fits, mid, hi), torch.where(fits, mass, mass_hi), torch.where(fits, lo, mid)
    keep_all = top_p >= 1.0
    zero = torch.zeros_like(mass_hi)
    return torch.where(keep_all, zero, hi.view(torch.float32)), torch.where(keep_all, zero, mass_hi)
