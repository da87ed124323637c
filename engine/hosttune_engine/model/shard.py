"""The part of a checkpoint tensor one rank holds, read from safetensors without reading the rest."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shard:
    """Rows (`dim` 0) or columns (`dim` 1) `start:stop` of a checkpoint tensor, zero-padded to `size`.

    `start == stop` reads nothing: a zero tensor (the bias of a row-parallel layer off rank 0, which the
    all-reduce would otherwise add once per rank)."""

    dim: int
    start: int
    stop: int
    size: int

    def __post_init__(self) -> None:
        assert self.dim in (0, 1) and 0 <= self.start <= self.stop and self.stop - self.start <= self.size


def shard_of(start: int, stop: int, size: int | None = None, dim: int = 0) -> Shard:
    return Shard(dim, start, stop, stop - start if size is None else size)


def read_tensor(f, name: str, shard: Shard | None) -> torch.Tensor:
    """Tensor `name` of an open safetensors file, or only its `shard` (`safe_open(...).get_slice`)."""
    if shard is None:
        return f.get_tensor(name)
    sliced = f.get_slice(name)
    shape = list(sliced.get_shape())
    stop = min(shard.stop, shape[shard.dim])
    if stop > shard.start:
        part = sliced[shard.start:stop] if shard.dim == 0 else sliced[:, shard.start:stop]
    else:
        part = None
    shape[shard.dim] = shard.size
    if part is not None and part.shape[shard.dim] == shard.size:
        return part
    out = torch.zeros(shape, dtype=part.dtype if part is not None else _dtype(sliced))
    if part is not None:
        out.narrow(shard.dim, 0, part.shape[shard.dim]).copy_(part)
    return out


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _dtype(sliced) -> torch.dtype:
    return _DTYPES.get(sliced.get_dtype(), torch.float32)
