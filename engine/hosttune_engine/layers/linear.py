"""Linear layers whose weight is several checkpoint tensors stacked along the output dim.

Fusing q/k/v (and gate/up) into one GEMM is how the engine runs them; the
checkpoint stores them apart, so each fused layer knows where each part goes.
"""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.errors import ModelLoadError


class MergedLinear(nn.Linear):
    """One GEMM for several projections of the same input; `shards` names the parts in order."""

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool):
        super().__init__(in_features, sum(shards.values()), bias=bias)
        self.shard_slices: dict[str, slice] = {}
        start = 0
        for name, size in shards.items():
            self.shard_slices[name] = slice(start, start + size)
            start += size

    @torch.no_grad()
    def load_shard(self, shard: str, kind: str, tensor: torch.Tensor, source: str) -> None:
        """Copy a checkpoint tensor (`kind` "weight" or "bias") into its slice."""
        target = getattr(self, kind)[self.shard_slices[shard]]
        if target.shape != tensor.shape:
            raise ModelLoadError(
                f"{source}: shape {tuple(tensor.shape)} does not match the model's {tuple(target.shape)}; "
                "the checkpoint does not fit config.json"
            )
        target.copy_(tensor)


_FP32_OUT_MM: dict[torch.device, bool] = {}


def logits_from_hidden(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [N, H] @ weight[V, H].T -> fp32 logits [N, V].

    On CUDA the half-precision GEMM writes fp32 directly (no bf16 rounding of
    logits, which would turn near-ties into ties); elsewhere, or where torch
    lacks `mm(out_dtype=)`, the output is upcast.
    """
    if hidden.dtype != torch.float32 and hidden.is_cuda and _FP32_OUT_MM.get(hidden.device, True):
        try:
            return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):
            _FP32_OUT_MM[hidden.device] = False
    return torch.nn.functional.linear(hidden, weight).float()

