"""Paged attention layer and the per-step metadata that drives it.

A step's tokens are packed: first the prefill chunks (sequences with more than
one new token), then one token per decoding sequence. RoPE and the KV-cache
write of all of them run first (`write`, one fused kernel on the Triton path),
then (`attend_qkv`) the prefill part runs the prefill kernel and the decode part
the split-K decode kernel, both reading the cache (a prefill with no cached
prefix reads this step's keys and values directly). A step of decodes alone
runs the three in the decode kernel (`write_attend`): one launch per layer
fewer, and q and k are not stored rotated only to be read back. An e4m3 cache
comes with its rows' scales (`kv_scales`, kernels/kv_quant.py), which every
kernel and reference here takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.kernels.decode_attention import (
    decode_attention, decode_attention_ref, decode_attention_rope,
)
from hosttune_engine.kernels.prefill_attention import prefill_attention, prefill_attention_ref
from hosttune_engine.kernels.rope_kv import rope_kv_write, rope_kv_write_ref
from hosttune_engine.layers.backend import KernelLayer


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int32/int64: cache slot of each token (-1: skip)
    num_prefill_tokens: int
    prefill_cu_seqlens_q: torch.Tensor | None = None  # [P + 1] int32
    prefill_seq_lens: torch.Tensor | None = None  # [P] int32, context incl. this chunk
    prefill_block_tables: torch.Tensor | None = None  # [P, W] int32
    prefill_max_query_len: int = 0
    prefill_max_context: int = 0  # the longest seq_lens entry, from the host (0: unknown, attention not split)
    prefill_has_prefix: bool = True  # False: every prefill context is this step's tokens alone
    decode_seq_lens: torch.Tensor | None = None  # [D] int32, context incl. this token
    decode_block_tables: torch.Tensor | None = None  # [D, W] int32
    decode_num_splits: int = 1


class Attention(KernelLayer):
    """Causal GQA attention over this layer's paged KV cache (`k_cache`, `v_cache`, set by the runner)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.k_cache: torch.Tensor | None = None  # [num_blocks, block_size, Hkv, D]
        self.v_cache: torch.Tensor | None = None
        self.kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None  # e4m3 caches: [num_blocks, block_size, Hkv]

    def write(self, positions: torch.Tensor, qkv: torch.Tensor, cos_sin: torch.Tensor,
              slot_mapping: torch.Tensor) -> None:
        """RoPE on q and k of qkv (in place) and k, v into their cache slots: work of a fixed shape per
        token count, which a piecewise graph captures (`core.mixed_graphs`)."""
        assert self.k_cache is not None, "the model runner must bind a KV cache first"
        fn = rope_kv_write if self.use_triton else rope_kv_write_ref
        fn(qkv, positions, cos_sin, self.k_cache, self.v_cache, slot_mapping, self.num_heads, self.num_kv_heads,
           kv_scales=self.kv_scales)

    def write_attend(self, positions: torch.Tensor, qkv: torch.Tensor, cos_sin: torch.Tensor,
                     meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """`write`, then `attend_qkv`; a step of decodes alone runs both in the decode kernel (Triton path)."""
        if not (self.use_triton and meta.num_prefill_tokens == 0):
            self.write(positions, qkv, cos_sin, meta.slot_mapping)
            return self.attend_qkv(qkv, meta, out)
        t = meta.slot_mapping.shape[0]
        return decode_attention_rope(qkv[:t], positions[:t], cos_sin, meta.slot_mapping, self.k_cache, self.v_cache,
                                     meta.decode_block_tables, meta.decode_seq_lens, self.num_heads,
                                     meta.decode_num_splits, scale=self.scale, out=out, kv_scales=self.kv_scales)

    def attend_qkv(self, qkv: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of the first `len(meta.slot_mapping)` rows of a written qkv -> [T, Hq, D] (into `out`)."""
        t, hq, hkv = meta.slot_mapping.shape[0], self.num_heads, self.num_kv_heads
        q, k, v = qkv[:t].view(t, hq + 2 * hkv, self.head_dim).split([hq, hkv, hkv], dim=1)  # strided views
        return self.attend(q, k, v, meta, out)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, Hq, D] over the cache (and this step's k, v [T, Hkv, D]) -> [T, Hq, D] (`out` if given)."""
        kc, vc, scales = self.k_cache, self.v_cache, self.kv_scales
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
        p = meta.num_prefill_tokens
        if p:
            args = (q[:p], kc, vc, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, meta.prefill_block_tables,
                    meta.prefill_max_query_len)
            if self.use_triton:
                contiguous = not meta.prefill_has_prefix
                prefill_attention(*args, scale=self.scale, contiguous=contiguous, out=out[:p],
                                  k=k[:p] if contiguous else None, v=v[:p] if contiguous else None,
                                  max_context=meta.prefill_max_context, kv_scales=scales)
            else:
                out[:p] = prefill_attention_ref(*args, scale=self.scale, kv_scales=scales)
        if q.shape[0] > p:
            args = (q[p:], kc, vc, meta.decode_block_tables, meta.decode_seq_lens, meta.decode_num_splits)
            if self.use_triton:
                decode_attention(*args, scale=self.scale, out=out[p:], kv_scales=scales)
            else:
                out[p:] = decode_attention_ref(*args, scale=self.scale, kv_scales=scales)
        return out
