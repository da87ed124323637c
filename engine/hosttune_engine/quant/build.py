"""Build a model whose projections are quantized without ever allocating their plain weights.

A 27B FP8 checkpoint is 27 GB on the device; building the bf16 model first and swapping its
projections would need 54 GB more at the peak. Here every parameter moves to the meta device as it is
registered (so at most one plain weight exists on the device, for a moment; buffers such as the rotary
table stay computed on the device), the quantized layers are put in on the device, and the parameters
left (embeddings, norms, an unquantized LM head) are allocated there empty for the loader to fill, tied
parameters staying tied.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

from hosttune_engine.quant.spec import QuantSpec
from hosttune_engine.quant.transform import apply_quantization

META = torch.device("meta")


@contextlib.contextmanager
def _parameters_on_meta():
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device != META:
            module._parameters[name] = nn.Parameter(param.to(META), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Each parameter still on meta -> an empty one on `device` (one per original, so ties hold)."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and param.device == META:
                if id(param) not in made:
                    made[id(param)] = nn.Parameter(torch.empty_like(param, device=device), requires_grad=False)
                module._parameters[name] = made[id(param)]


def build_quantized(build: Callable, cfg, device: torch.device, dtype: torch.dtype, spec: QuantSpec) -> nn.Module:
    """`build(cfg, device, dtype)` with `spec`'s projections quantized (weights to be loaded)."""
    with _parameters_on_meta():
        model = build(cfg, device, dtype)
    apply_quantization(model, spec, dtype, device)
    _materialize(model, device)
    return model
