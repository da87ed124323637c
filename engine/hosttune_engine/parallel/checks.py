"""What a tensor-parallel engine checks before it starts a process or takes GPU memory.

Each failure is a ConfigError of one line that says what to change.
"""

from __future__ import annotations

import os
from functools import partial

import torch

from hosttune_engine.config import EngineConfig
from hosttune_engine.errors import ConfigError
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.layout import ShardLayout, check_divides_heads

GIB = 2**30


def check_gpu_count(world_size: int, num_gpus: int) -> None:
    if num_gpus < world_size:
        visible = ""
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            visible = f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})"
        raise ConfigError(f"tensor_parallel_size={world_size} needs {world_size} GPUs, but this process sees "
                          f"{num_gpus}{visible}; list more GPUs in CUDA_VISIBLE_DEVICES or lower "
                          "tensor_parallel_size")


def check_shard_fits(shard_bytes: int, gpu_bytes: list[int], utilization: float) -> None:
    """Every rank's weights must fit in `utilization` of its GPU (rank r on GPU r)."""
    for rank, total in enumerate(gpu_bytes):
        if shard_bytes > total * utilization:
            raise ConfigError(
                f"rank {rank}'s shard of the weights takes {shard_bytes / GIB:.1f} GiB, more than "
                f"gpu_memory_utilization={utilization} of GPU {rank}'s {total / GIB:.1f} GiB; "
                f"raise tensor_parallel_size")


def shard_bytes(cfg: ModelConfig, world_size: int, dtype: torch.dtype) -> int:
    """Bytes of one rank's weights, from a model built on the meta device (no memory, no GPU)."""
    from hosttune_engine.model.loader import build_model
    from hosttune_engine.parallel.transform import shard_model

    layout = ShardLayout.of(cfg, 0, world_size)
    model = build_model(cfg, torch.device("meta"), dtype, partial(shard_model, layout=layout, group=None))
    return sum(p.numel() * p.element_size() for p in model.parameters())


def check_startup(config: EngineConfig, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Heads, GPU count and shard size, for `config.tensor_parallel_size` ranks on `device`'s kind."""
    world_size = config.tensor_parallel_size
    check_divides_heads(cfg, world_size)
    if device.type != "cuda":
        return
    check_gpu_count(world_size, torch.cuda.device_count())
    totals = [torch.cuda.get_device_properties(rank).total_memory for rank in range(world_size)]
    check_shard_fits(shard_bytes(cfg, world_size, dtype), totals, config.gpu_memory_utilization)
