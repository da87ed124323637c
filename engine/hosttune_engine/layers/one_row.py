"""Batch-1 decode on the Triton GEMV: a transform of a built model.

A one-token step streams every weight once. The Triton GEMV does that faster
than cuBLAS at one row, and the small layer before a projection can ride in
its prologue: RMSNorm (with the residual add) before qkv_proj and gate_up_proj,
SwiGLU before down_proj. With the transform, such a layer returns a deferred
input instead of a tensor, and the projection that consumes it computes both
in one launch. Steps of more rows, and the torch backend, run as before.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from hosttune_engine.kernels.gemv import gemv, gemv_rmsnorm, gemv_swiglu
from hosttune_engine.kernels.tuning import launch_config
from hosttune_engine.layers.deferred import CONSUMERS, DeferredRMSNorm, DeferredSwiGLU, materialized, source_of

GEMV_DEFAULT = {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4, "num_stages": 4}
DEFERRING = tuple(CONSUMERS)  # each feeds exactly one projection


def runs_one_row(layer: nn.Module, x) -> bool:
    """Whether a layer takes the one-row path: the Triton backend is on and x is one row on a GPU."""
    return layer.use_triton and x.shape[0] == 1 and _on_gpu(x)


def _on_gpu(x) -> bool:  # tests point this at the CPU to run the path under the Triton interpreter
    return source_of(x).is_cuda


def use_gemv_for_one_row(model: nn.Module) -> None:
    """Patch every projection (and `compute_logits`) to take one-row inputs through the GEMV, and let the
    norms and the activation that feed them defer. `set_kernel_backend(model, False)` turns it all off."""
    head = getattr(model, "lm_head", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module is not head:
            module.use_triton = True
            module.forward = partial(_linear_forward, module)
        elif hasattr(module, "defer_one_row") and name.endswith(DEFERRING):
            module.defer_one_row = True
    if head is not None:
        model.use_triton = True
        model.compute_logits = partial(_logits_forward, model, model.compute_logits)


def _config(dtype: torch.dtype, device) -> dict:
    return launch_config("gemv", f"{str(dtype).removeprefix('torch.')}-m1", device, GEMV_DEFAULT)


def _linear_forward(module: nn.Linear, x) -> torch.Tensor:
    w, b = module.weight, module.bias
    if runs_one_row(module, x):
        cfg = _config(w.dtype, w.device)
        if isinstance(x, DeferredRMSNorm):
            return gemv_rmsnorm(x.x, x.weight, x.eps, w, b, x.residual, x.residual_out, config=cfg)
        if isinstance(x, DeferredSwiGLU):
            return gemv_swiglu(x.gate_up, w, b, config=cfg)
        return gemv(x, w, b, config=cfg)
    return F.linear(materialized(x), w, b)


def _logits_forward(model: nn.Module, original, hidden: torch.Tensor) -> torch.Tensor:
    if runs_one_row(model, hidden):
        w = model.lm_head.weight
        return gemv(hidden, w, out_dtype=torch.float32, config=_config(w.dtype, w.device))
    return original(hidden)
