"""What a tensor-parallel engine checks before it starts a process or takes GPU memory.

Each failure is a ConfigError of one line that says what to change.
"""

from __future__ import annotations

import os
from functools import partial

import torch
from torch import nn

from hosttune_engine.config import EngineConfig, check_tensor_parallel_size
from hosttune_engine.errors import ConfigError
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.layout import ShardLayout, check_divides_heads
from hosttune_engine.quant.spec import QuantSpec, resolve_spec
from hosttune_engine.quant.transform import apply_quantization

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


def shard_bytes(cfg: ModelConfig, world_size: int, dtype: torch.dtype, spec: QuantSpec | None = None) -> int:
    """Bytes of one rank's weights, quantized as `spec` says, from a model built on the meta device (no memory,
    no GPU); ConfigError where the quantized layers do not split into whole blocks or groups."""
    from hosttune_engine.model.loader import build_model
    from hosttune_engine.parallel.transform import shard_model

    layout = ShardLayout.of(cfg, 0, world_size)
    shard = partial(shard_model, layout=layout, group=None, spec=spec)
    quantize = None if spec is None else partial(apply_quantization, spec=spec, dtype=dtype)
    model = build_model(cfg, torch.device("meta"), dtype, shard, quantize)
    return weight_bytes(model)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and stored buffers (a quantized layer's weights and scales; not computed
    tables such as the rotary one)."""
    stored = [t for m in model.modules() for name, t in m._buffers.items()
              if t is not None and name not in m._non_persistent_buffers_set]
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *stored))


def planned_shard(cfg: ModelConfig, world_size: int, dtype: torch.dtype, spec: QuantSpec | None) -> ShardLayout | None:
    """The shards one of `world_size` ranks holds (every rank's have the same shapes), for a plan or a tune of a
    model config alone: None for one rank; refused as serve's start refuses the size (heads, the quantized
    layers' blocks and groups)."""
    check_tensor_parallel_size(world_size)
    if world_size == 1:
        return None
    shard_bytes(cfg, world_size, dtype, spec)  # ConfigError where a rank's quantized layers are not whole
    return ShardLayout.of(cfg, 0, world_size)


def check_startup(config: EngineConfig, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Heads, the quantized layers' blocks and groups, GPU count and shard size, for
    `config.tensor_parallel_size` ranks on `device`'s kind."""
    world_size = config.tensor_parallel_size
    check_divides_heads(cfg, world_size)
    spec = resolve_spec(cfg.quantization, config.quantization, config.load_format, config.model)
    weights = shard_bytes(cfg, world_size, dtype, spec)
    if device.type != "cuda":
        return
    check_gpu_count(world_size, torch.cuda.device_count())
    totals = [torch.cuda.get_device_properties(rank).total_memory for rank in range(world_size)]
    check_shard_fits(weights, totals, config.gpu_memory_utilization)
