"""The KV cache memory: one tensor for all layers, sized from free device memory."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hosttune_engine.layers.attention import Attention


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_block(self) -> int:
        """Keys and values of one block in every layer."""
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * self.dtype_bytes


def num_blocks_for_memory(free_bytes: int, utilization: float, reserved_bytes: int, shape: KVCacheShape) -> int:
    """Blocks that fit in `free_bytes * utilization` after `reserved_bytes` (activation peak) come off.

    `free_bytes` is measured after the weights are loaded, so other processes'
    memory and our own weights are already excluded.
    """
    return max(0, int(free_bytes * utilization) - reserved_bytes) // shape.bytes_per_block


class KVPool:
    """Paged caches [layers, k/v, blocks, block_size, H_kv, D]; each layer gets contiguous views."""

    def __init__(self, shape: KVCacheShape, num_blocks: int, device: torch.device, dtype: torch.dtype):
        self.shape = shape
        self.num_blocks = num_blocks
        self.cache = torch.zeros(shape.num_layers, 2, num_blocks, shape.block_size, shape.num_kv_heads,
                                 shape.head_dim, dtype=dtype, device=device)

    def bind(self, model: nn.Module) -> None:
        """Point each attention layer, in order, at its slice of the pool."""
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        assert len(layers) == self.shape.num_layers
        for i, attn in enumerate(layers):
            attn.k_cache, attn.v_cache = self.cache[i, 0], self.cache[i, 1]
