"""The KV cache's shape and what a CPU pool of a given size holds, torch-free: `serve` checks that the pool holds
one whole context before its socket opens, with the numbers the model runner sizes the pool by."""

from __future__ import annotations

from dataclasses import dataclass

from hosttune_engine.errors import ConfigError

SCALE_BYTES = 4  # an e4m3 row's fp32 scale
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    fp8: bool = False  # e4m3 rows (dtype_bytes 1) with a scale each

    @property
    def bytes_per_block(self) -> int:
        """Keys and values of one block in every layer (and their scales)."""
        row = self.head_dim * self.dtype_bytes + (SCALE_BYTES if self.fp8 else 0)
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * row


def blocks_in_gib(gib: float, shape: KVCacheShape) -> int:
    """Blocks of `shape` a pool of `gib` GiB holds (none where one block is bigger)."""
    return int(gib * 2**30) // shape.bytes_per_block


def check_holds_context(blocks: int, block_size: int, max_model_len: int, size_option: str) -> int:
    """`blocks`, if they hold one sequence of max_model_len (else no request could use the whole context)."""
    if blocks < 1:
        raise ConfigError(f"the KV cache fits no block of {block_size} tokens; raise {size_option} or lower block_size")
    if blocks * block_size < max_model_len:
        raise ConfigError(
            f"the KV cache fits {blocks * block_size} tokens, fewer than max_model_len="
            f"{max_model_len}; raise {size_option} or lower max_model_len")
    return blocks
