"""The layout the 4-bit kernels read, made once at load from any public 4-bit layout.

W[k, n] = (q - zero[n, g]) * scale[n, g] with the input columns taken in group order: position k' of
the stored rows holds input column perm[k'] (perm is None when groups are plain, g = k // group_size;
act-order checkpoints are sorted by group at load, so every kernel sees plain groups and gathers the
few activations instead of every scale).

- qweight [N, K/8] int32, rows contiguous along K, so a GEMV program owning a few output rows streams
  long vectorised runs of words, as the bf16 GEMV streams w [N, K]. The columns are interleaved in
  blocks of PB = pack_block(group_size) (64 for groups of 64 or more): word j of a block holds, at
  nibble i, the block's column R i + j (R = PB / 8 words a block), so nibble i of R consecutive words
  multiplies R consecutive activations: the GEMV loads them with one vector load instead of R gathers.
- scales [N, G] (fp16/bf16/fp32) and zeros [N, G] uint8: one of each per row and group.
"""

from __future__ import annotations

import torch

from hosttune_engine.kernels.checks import check, check_tensor


def group_order(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """perm [K] int32 that sorts the input columns by group (stable), or None when g_idx is plain."""
    g = g_idx.long().cpu()
    if torch.equal(g, torch.arange(len(g)) // group_size):
        return None
    return torch.argsort(g, stable=True).to(device=g_idx.device, dtype=torch.int32)


def groups_are_full(g_idx: torch.Tensor, group_size: int, groups: int) -> bool:
    """Whether every group holds exactly group_size columns (what sorting them into plain groups needs)."""
    counts = torch.bincount(g_idx.long().cpu(), minlength=groups)
    return bool((counts == group_size).all())


def pack_block(group_size: int) -> int:
    """Columns interleaved together: the largest power of two up to 64 that divides the group size."""
    return tile_in_group(64, group_size)


def stored_columns(k: int, group_size: int) -> torch.Tensor:
    """[K]: the column (in group order) that stored position p = 8 word + nibble holds."""
    r = pack_block(group_size) // 8
    p = torch.arange(k)
    word, nibble = p // 8, p % 8
    return (word // r) * (8 * r) + r * nibble + word % r


def repack(values: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, perm: torch.Tensor | None,
           group_size: int):
    """values [K, N] (ints 0-15), scales / zeros [G, N] -> (qweight [N, K/8] int32, scales [N, G],
    zeros [N, G] uint8) in the kernels' layout."""
    q = values if perm is None else values[perm.long()]
    k, n = q.shape
    r = pack_block(group_size) // 8
    # word j of a pack block holds, at nibble i, its column r i + j (`stored_columns`): a transpose per block
    nibbles = q.to(torch.int32).view(k // (8 * r), 8, r, n).transpose(1, 2).reshape(k // 8, 8, n)  # word, nibble
    words = torch.zeros(k // 8, n, dtype=torch.int32, device=q.device)
    for i in range(7):
        words += nibbles[:, i] << 4 * i
    top = nibbles[:, 7]
    words += (top - 16 * (top >= 8).int()) * (1 << 28)  # nibble 7 as the sign's bits, without overflow
    return words.t().contiguous(), scales.t().contiguous(), zeros.t().to(torch.uint8).contiguous()


def tile_in_group(block_k: int, group_size: int) -> int:
    """The largest K tile up to block_k that lies inside one group."""
    while group_size % block_k:
        block_k //= 2
    return block_k


def check_int4_weight(qweight, scales, zeros, perm, group_size: int, k: int, device) -> None:
    check_tensor("qweight", qweight, 2, dtypes=(torch.int32,), device=device)
    n = qweight.shape[0]
    check(qweight.shape[1] * 8 == k and qweight.is_contiguous(), "qweight must be [N, K/8] = [N, {}] and "
          "contiguous, got {}", k // 8, tuple(qweight.shape))
    check(group_size > 0 and k % group_size == 0 and group_size % 8 == 0,
          "group_size {} must be a multiple of 8 dividing K {}", group_size, k)
    groups = k // group_size
    check_tensor("scales", scales, 2, dtypes=(torch.float16, torch.bfloat16, torch.float32), device=device)
    check_tensor("zeros", zeros, 2, dtypes=(torch.uint8,), device=device)
    for name, t in (("scales", scales), ("zeros", zeros)):
        check(tuple(t.shape) == (n, groups) and t.is_contiguous(), "{} must be [{}, {}] and contiguous, got {}",
              name, n, groups, tuple(t.shape))
    if perm is not None:
        check_tensor("perm", perm, 1, dtypes=(torch.int32,), device=device)
        check(perm.shape[0] == k and perm.is_contiguous(), "perm must be [K] = [{}] and contiguous", k)


def dequantize_ref(qweight, scales, zeros, perm, group_size: int) -> torch.Tensor:
    """The kernels' layout -> fp32 W [N, K] in input-column order."""
    n, k = qweight.shape[0], qweight.shape[1] * 8
    r = pack_block(group_size) // 8
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32).view(1, 1, 8, 1)
    # word j of a pack block holds, at nibble i, its column r i + j (`stored_columns`): [N, blocks, i, j]
    q = (qweight.view(n, k // (8 * r), 1, r) >> shifts) & 0xF
    q = q.view(n, k // group_size, group_size).float()
    w = ((q - zeros[:, :, None].float()) * scales[:, :, None].float()).view(n, k)  # group order
    if perm is None:
        return w
    out = torch.empty_like(w)
    out[:, perm.long()] = w
    return out
