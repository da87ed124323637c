"""The KV cache memory: one tensor for all layers, sized from the engine's share of the GPU; an e4m3 cache has a
second one beside it, the rows' scales (kernels/kv_quant.py)."""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.cache.kv_shape import SCALE_BYTES, KVCacheShape  # noqa: F401  (imported from here too)
from hosttune_engine.errors import ConfigError
from hosttune_engine.kernels.kv_quant import KV_FP8
from hosttune_engine.layers.attention import Attention


def num_blocks_for_memory(total_bytes: int, utilization: float, used_bytes: int, reserved_bytes: int,
                         shape: KVCacheShape) -> int:
    """Blocks that fit in this engine's share of the GPU, `total_bytes * utilization`, after what it holds
    already (`used_bytes`: its weights) and its activation peak (`reserved_bytes`) come off.

    The share is of the GPU's whole memory, not of what is free when the engine starts: engines that share a
    GPU (several replicas on one, each given a part) get the pools their shares say, whichever starts first.
    """
    return max(0, int(total_bytes * utilization) - used_bytes - reserved_bytes) // shape.bytes_per_block



def check_free_memory(wanted_bytes: int, free_bytes: int, total_bytes: int, utilization: float) -> None:
    """The pool and the activation peak must fit what the GPU has free: other processes may hold more of it
    than the share leaves them."""
    if wanted_bytes > free_bytes:
        gib = 2**30
        raise ConfigError(f"gpu_memory_utilization={utilization} of this GPU's {total_bytes / gib:.1f} GiB asks for "
                          f"{wanted_bytes / gib:.1f} GiB more, but only {free_bytes / gib:.1f} GiB is free (other "
                          f"processes hold the rest); lower gpu_memory_utilization or free the GPU")

class KVPool:
    """Paged caches [layers, k/v, blocks, block_size, H_kv, D] (and, for an e4m3 cache, scales [layers, k/v,
    blocks, block_size, H_kv]); each layer gets contiguous views."""

    def __init__(self, shape: KVCacheShape, num_blocks: int, device: torch.device, dtype: torch.dtype):
        self.shape = shape
        self.num_blocks = num_blocks
        rows = (shape.num_layers, 2, num_blocks, shape.block_size, shape.num_kv_heads)
        self.cache = torch.zeros(*rows, shape.head_dim, dtype=KV_FP8 if shape.fp8 else dtype, device=device)
        self.scales = torch.zeros(rows, dtype=torch.float32, device=device) if shape.fp8 else None

    def bind(self, model: nn.Module) -> None:
        """Point each attention layer, in order, at its slice of the pool."""
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        assert len(layers) == self.shape.num_layers
        for i, attn in enumerate(layers):
            attn.k_cache, attn.v_cache = self.cache[i, 0], self.cache[i, 1]
            attn.kv_scales = None if self.scales is None else (self.scales[i, 0], self.scales[i, 1])
