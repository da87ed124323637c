"""Which attention heads, MLP columns and vocabulary rows each rank of a tensor-parallel model holds.

Query heads and MLP columns split evenly. KV heads split evenly when there are at least as many as ranks;
with fewer, each KV head is replicated on `world_size / num_kv_heads` consecutive ranks, the ones whose
query heads read it. The vocabulary splits in equal padded chunks, so any vocabulary size works.
"""

from __future__ import annotations

from dataclasses import dataclass

from hosttune_engine.errors import ConfigError
from hosttune_engine.model.model_config import ModelConfig


def check_divides_heads(cfg: ModelConfig, world_size: int) -> None:
    """Raise ConfigError unless the model's heads and MLP split over `world_size` ranks."""
    hq, hkv, tp = cfg.num_heads, cfg.num_kv_heads, world_size
    if hq % tp:
        raise ConfigError(f"tensor_parallel_size={tp} must divide the model's {hq} attention heads "
                          f"({hkv} KV heads); use one of {_sizes_that_split(cfg)}")
    if hkv % tp and tp % hkv:
        raise ConfigError(f"tensor_parallel_size={tp} and the model's {hkv} KV heads must divide one another "
                          f"({hq} attention heads); use one of {_sizes_that_split(cfg)}")
    if cfg.intermediate_size % tp:
        raise ConfigError(f"tensor_parallel_size={tp} must divide the MLP width {cfg.intermediate_size}; "
                          f"use one of {_sizes_that_split(cfg)}")


def _sizes_that_split(cfg: ModelConfig) -> str:
    """Every size the three checks above pass, so the one a refusal suggests is not refused in turn."""
    hq, hkv = cfg.num_heads, cfg.num_kv_heads
    fits = [n for n in range(1, hq + 1)
            if hq % n == 0 and (hkv % n == 0 or n % hkv == 0) and cfg.intermediate_size % n == 0]
    return ", ".join(map(str, fits))


@dataclass(frozen=True)
class ShardLayout:
    """Rank `rank` of `world_size`: its query heads, KV heads, MLP columns and vocabulary rows."""

    rank: int
    world_size: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank (1 when replicated)
    first_head: int
    first_kv_head: int
    intermediate_size: int  # MLP columns on this rank
    vocab_size: int  # the whole vocabulary
    vocab_rows: int  # vocabulary rows per rank, padded: world_size * vocab_rows >= vocab_size

    @classmethod
    def of(cls, cfg: ModelConfig, rank: int, world_size: int) -> "ShardLayout":
        check_divides_heads(cfg, world_size)
        heads = cfg.num_heads // world_size
        kv_heads = max(1, cfg.num_kv_heads // world_size)
        first_kv = rank * cfg.num_kv_heads // world_size  # replicated: the KV head this rank's queries use
        return cls(rank=rank, world_size=world_size, num_heads=heads, num_kv_heads=kv_heads,
                   first_head=rank * heads, first_kv_head=first_kv,
                   intermediate_size=cfg.intermediate_size // world_size, vocab_size=cfg.vocab_size,
                   vocab_rows=-(-cfg.vocab_size // world_size))

    @property
    def first_vocab_row(self) -> int:
        return self.rank * self.vocab_rows
