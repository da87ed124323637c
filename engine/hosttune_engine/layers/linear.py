"""Projections on the kernels their plan names: `Linear`, `MergedLinear` (several checkpoint tensors stacked
along the output dim) and the LM head's logits.

A one-token step streams every weight once. The Triton GEMV does that faster than cuBLAS at one row, and the
small layer before a projection can ride in its prologue: RMSNorm (with the residual add) before qkv_proj and
gate_up_proj, SwiGLU before down_proj. Where the plan says so for a step's row count, the fused module that
owns both (layers/fused.py) calls the projection with that layer as its prologue (layers/prologue.py) and the
projection computes both in one launch; other counts, the torch backend, a layer without a plan and CPU
tensors run cuBLAS / torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hosttune_engine.errors import ModelLoadError
from hosttune_engine.kernels.gemv import gemv, gemv_rmsnorm, gemv_swiglu
from hosttune_engine.layers.backend import KernelLayer
from hosttune_engine.layers.prologue import NormPrologue, Prologue, SwiGLUPrologue
from hosttune_engine.plan.kinds import Kernel


def _on_gpu(x: torch.Tensor) -> bool:  # tests point this at the CPU to run the path under the Triton interpreter
    return x.is_cuda


def planned(op_plan, use_triton: bool, x: torch.Tensor):
    """The planned choice for x's row count, or None where torch runs (no plan, backend off, a CPU tensor)."""
    if op_plan is None or not use_triton or not _on_gpu(x):
        return None
    return op_plan.at(x.shape[0])


class Linear(KernelLayer, nn.Linear):
    """y = x W^T + b; `kernel_plan` (its operation's choices, planner/prepare.py) picks the kernel per call."""

    kernel_plan = None

    def forward(self, x: torch.Tensor, prologue: Prologue | None = None) -> torch.Tensor:
        """x [T, K] -> [T, N]; a prologue (RMSNorm or SwiGLU of x) rides in the one-row GEMV's, else runs first."""
        w, b = self.weight, self.bias
        choice = planned(self.kernel_plan, self.use_triton, x)
        if choice is not None and choice.kernel is Kernel.GEMV and x.shape[0] == 1:
            if isinstance(prologue, NormPrologue):
                p = prologue
                return gemv_rmsnorm(x, p.weight, p.eps, w, b, p.residual, p.residual_out, config=choice.args)
            if isinstance(prologue, SwiGLUPrologue):
                return gemv_swiglu(x, w, b, config=choice.args)
        x = x if prologue is None else prologue.apply(x)
        if choice is not None and choice.kernel is Kernel.GEMV:
            return gemv(x, w, b, config=choice.args)
        return F.linear(x, w, b)


class MergedLinear(Linear):
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


def logits(head: Linear, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [N, H] -> fp32 logits [N, V] on the LM head's planned kernel: the GEMV writing fp32 at one row."""
    choice = planned(head.kernel_plan, head.use_triton, hidden)
    if choice is not None and choice.kernel is Kernel.GEMV:
        return gemv(hidden, head.weight, out_dtype=torch.float32, config=choice.args)
    if choice is not None and choice.runs_reference:
        return F.linear(hidden, head.weight).float()
    return logits_from_hidden(hidden, head.weight)


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
