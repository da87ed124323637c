"""Rotary position embedding, "neox" layout (the halves of each head rotate together).

`cos_sin` [max_pos, D] holds cos in its first D/2 columns and sin in the rest,
in fp32; the rotation is computed in fp32 and rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import INDEX_DTYPES, check, check_last_dim_contiguous, check_tensor, next_pow2


@triton.jit
def _rope_kernel(
    x_ptr, out_ptr, pos_ptr, cs_ptr,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_cs,
    n_heads,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    mask = (heads[:, None] < n_heads) & dmask[None, :]
    cos = tl.load(cs_ptr + pos * stride_cs + d, mask=dmask, other=0.0)[None, :]
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + d, mask=dmask, other=0.0)[None, :]
    base = x_ptr + t * stride_xt + heads[:, None] * stride_xh + d[None, :]
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
    obase = out_ptr + t * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(obase, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(obase + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D], positions [T], cos_sin [max_pos, D] fp32 -> rotated x [T, H, D]."""
    check_tensor("x", x, 3)
    check_tensor("positions", positions, 1, dtypes=INDEX_DTYPES, device=x.device)
    check_tensor("cos_sin", cos_sin, 2, dtypes=(torch.float32,), device=x.device)
    t, h, d = x.shape
    check(d % 2 == 0 and cos_sin.shape[1] == d, "head dim {} must be even and match cos_sin {}", d,
          tuple(cos_sin.shape))
    check(positions.shape[0] == t, "positions has {} entries for {} tokens", positions.shape[0], t)
    check_last_dim_contiguous("x", x)
    check(cos_sin.is_contiguous(), "cos_sin must be contiguous")
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    if t:
        _rope_kernel[(t,)](
            x, out, positions, cos_sin, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
            cos_sin.stride(0), h, HALF=d // 2, BLOCK_H=next_pow2(h), BLOCK_D=next_pow2(d // 2),
        )
    return out


def rope_ref(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    cs = cos_sin[positions.long()]  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
