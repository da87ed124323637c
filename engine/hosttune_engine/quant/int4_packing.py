"""Eight 4-bit values to an int32, in the orders the public 4-bit layouts use.

GPTQ packs in sequence: value i of a group of eight sits at bits 4i..4i+3 (qweight along the input
dim, qzeros along the output dim). AWQ packs along the output dim with its interleaved order: the
value at bits 4i..4i+3 is column AWQ_ORDER[i] of the group of eight.
"""

from __future__ import annotations

import torch

SEQUENTIAL = (0, 1, 2, 3, 4, 5, 6, 7)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_int4(values: torch.Tensor, dim: int, order: tuple[int, ...] = SEQUENTIAL) -> torch.Tensor:
    """values (ints 0-15, size along `dim` a multiple of 8) -> int32 with that size divided by 8."""
    v = values.movedim(dim, -1).to(torch.int64)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // 8, 8)[..., list(order)]  # nibble i <- column order[i]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=v.device)
    packed = (v << shifts).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim).contiguous()


def unpack_int4(packed: torch.Tensor, dim: int, order: tuple[int, ...] = SEQUENTIAL) -> torch.Tensor:
    """The inverse of `pack_int4`: int32 -> uint8 values 0-15, eight times longer along `dim`."""
    p = packed.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=p.device)
    nibbles = (p[..., None] >> shifts) & 0xF  # [..., C/8, 8]: nibble i
    columns = torch.empty_like(nibbles)
    columns[..., list(order)] = nibbles  # column order[i] <- nibble i
    return columns.reshape(*p.shape[:-1], -1).to(torch.uint8).movedim(-1, dim).contiguous()
