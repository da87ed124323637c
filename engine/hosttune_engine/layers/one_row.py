"""The plain (bf16) projections and the LM head on their planned kernels: a transform of a built model.

A one-token step streams every weight once. The Triton GEMV does that faster than cuBLAS at one row, and the
small layer before a projection can ride in its prologue: RMSNorm (with the residual add) before qkv_proj and
gate_up_proj, SwiGLU before down_proj. Where the plan says so for a step's row count, such a layer hands its
projection a deferred input (layers/deferred.py) and the projection computes both in one launch; other
counts, the torch backend and CPU tensors run cuBLAS / torch.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from hosttune_engine.kernels.gemv import gemv, gemv_rmsnorm, gemv_swiglu
from hosttune_engine.layers.deferred import DeferredRMSNorm, DeferredSwiGLU, materialized, source_of
from hosttune_engine.plan.kinds import Kernel


def _on_gpu(x) -> bool:  # tests point this at the CPU to run the path under the Triton interpreter
    return source_of(x).is_cuda


def planned(op_plan, use_triton: bool, x):
    """The planned choice for x's row count, or None where torch runs (no plan, backend off, a CPU tensor)."""
    if op_plan is None or not use_triton or not _on_gpu(x):
        return None
    return op_plan.at(x.shape[0])


def plan_projection(module: nn.Module, op_plan) -> None:
    """Give a projection its operation's choices (a plain one also the forward that reads them)."""
    module.kernel_plan = op_plan
    if type(module).forward is nn.Linear.forward:
        module.use_triton = bool(getattr(module, "use_triton", False))
        module.forward = partial(_linear_forward, module)


def plan_logits(model: nn.Module, op_plan) -> None:
    """The LM head's choices, read by `compute_logits` (which keeps its fp32-out cuBLAS path above one row)."""
    if getattr(model, "lm_head", None) is None:
        return
    model.kernel_plan_logits = op_plan
    model.use_triton = bool(getattr(model, "use_triton", False))
    if not hasattr(model, "_plain_logits"):
        model._plain_logits = model.compute_logits
    model.compute_logits = partial(_logits_forward, model)


def _linear_forward(module: nn.Linear, x) -> torch.Tensor:
    w, b = module.weight, module.bias
    choice = planned(module.kernel_plan, module.use_triton, x)
    if choice is not None and choice.kernel is Kernel.GEMV:
        if isinstance(x, DeferredRMSNorm):
            return gemv_rmsnorm(x.x, x.weight, x.eps, w, b, x.residual, x.residual_out, config=choice.args)
        if isinstance(x, DeferredSwiGLU):
            return gemv_swiglu(x.gate_up, w, b, config=choice.args)
        return gemv(x, w, b, config=choice.args)
    return F.linear(materialized(x), w, b)


def _logits_forward(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    choice = planned(model.kernel_plan_logits, model.use_triton, hidden)
    if choice is not None and choice.kernel is Kernel.GEMV:
        return gemv(hidden, model.lm_head.weight, out_dtype=torch.float32, config=choice.args)
    if choice is not None and choice.runs_reference:
        return F.linear(hidden, model.lm_head.weight).float()
    return model._plain_logits(hidden)
