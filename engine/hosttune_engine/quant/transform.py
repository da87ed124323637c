"""Quantization as a transform of a built model: each quantized projection's nn.Linear (or fused
MergedLinear) is swapped for an Fp8Linear or Int4Linear of the same shape; the model stays a plain
module and the rest of the engine does not know.

`quantized_projections` lists what a spec quantizes in a model (on the meta device it costs no
memory, which is how checkpoints are checked before any weight is allocated).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hosttune_engine.errors import QuantizationError
from hosttune_engine.layers.linear import MergedLinear
from hosttune_engine.quant.fp8_linear import Fp8Linear
from hosttune_engine.quant.int4_linear import Int4Linear
from hosttune_engine.quant.quant_linear import WHOLE, QuantLinear
from hosttune_engine.quant.quantize import quantize_weight
from hosttune_engine.quant.spec import QuantSpec


@dataclass(frozen=True)
class Projection:
    """One linear layer of the model and the checkpoint modules that fill it (one per shard)."""

    module: str  # engine module name, e.g. model.layers.0.self_attn.qkv_proj
    parts: dict  # shard (None when unfused) -> checkpoint module name, e.g. "q" -> ...self_attn.q_proj
    shards: dict  # shard -> rows
    in_features: int
    bias: bool


def _projections(model: nn.Module) -> list[Projection]:
    fused_parts = {}
    for part, (fused, shard) in model.packed_modules.items():
        fused_parts.setdefault(fused, {})[shard] = part
    head = getattr(model, "lm_head", None)
    found = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or m is head:
            continue
        if isinstance(m, MergedLinear):
            fused = name.rsplit(".", 1)[1]
            parts = {s: name.rsplit(".", 1)[0] + "." + fused_parts[fused][s] for s in m.shard_slices}
            shards = {s: sl.stop - sl.start for s, sl in m.shard_slices.items()}
        else:
            parts, shards = {WHOLE: name}, {WHOLE: m.out_features}
        found.append(Projection(name, parts, shards, m.in_features, m.bias is not None))
    return found


def quantized_projections(model: nn.Module, spec: QuantSpec) -> list[Projection]:
    """The projections `spec` quantizes; a fused one must be quantized in all its parts or none."""
    chosen = []
    for p in _projections(model):
        flags = {spec.is_quantized(name) for name in p.parts.values()}
        if len(flags) > 1:
            raise QuantizationError(f"{p.module}: the checkpoint quantizes some of {', '.join(p.parts.values())} "
                                    "but not all; the engine fuses them into one projection")
        if flags.pop():
            chosen.append(p)
    return chosen


def _make(p: Projection, spec: QuantSpec, dtype, device) -> QuantLinear:
    cls = Fp8Linear if spec.layout.is_fp8 else Int4Linear
    return cls(p.in_features, p.shards, p.bias, spec, dtype, device, p.module)


TENSOR_PARALLEL = ("tp_parts", "tp_shards", "tp_in_features")  # see QuantLinear


def _swap(model: nn.Module, name: str, layer: QuantLinear) -> None:
    """Put `layer` in the place of module `name`, keeping what tensor parallelism recorded on the old one: the
    part of the checkpoint it holds and its hooks (a row-parallel layer's all-reduce, an input gather)."""
    old = model.get_submodule(name)
    for attr in TENSOR_PARALLEL:
        if hasattr(old, attr):
            setattr(layer, attr, getattr(old, attr))
    for key, hook in old._forward_pre_hooks.items():
        layer.register_forward_pre_hook(hook, with_kwargs=key in old._forward_pre_hooks_with_kwargs)
    for hook in old._forward_hooks.values():
        layer.register_forward_hook(hook)
    model.set_submodule(name, layer)


def apply_quantization(model: nn.Module, spec: QuantSpec, dtype: torch.dtype, device: torch.device) -> None:
    """Swap every projection `spec` quantizes for its quantized layer on `device` (weights to be loaded)."""
    for p in quantized_projections(model, spec):
        _swap(model, p.module, _make(p, spec, dtype, device))
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the replaced bf16 weights' memory goes back for the KV cache


@torch.no_grad()
def quantize_loaded(model: nn.Module, spec: QuantSpec, dtype: torch.dtype) -> None:
    """Quantize a model whose plain weights are loaded (dummy weights) through the checkpoint path: each
    weight is written into the layout's tensors by the checkpoint writer's code and loaded from them."""
    for p in quantized_projections(model, spec):
        plain = model.get_submodule(p.module)
        layer = _make(p, spec, dtype, plain.weight.device)
        start = 0
        for shard, rows in p.shards.items():
            w = plain.weight[start:start + rows]
            tensors = {"weight": w} if spec.at_load else quantize_weight(w, spec)
            if p.bias:
                tensors["bias"] = plain.bias[start:start + rows]
            for kind, t in tensors.items():
                layer.load_shard(shard, kind, t, f"{p.parts[shard]}.{kind}")
            start += rows
        _swap(model, p.module, layer)
    check_loaded(model)
    if model.lm_head.weight.device.type == "cuda":
        torch.cuda.empty_cache()


def check_loaded(model: nn.Module) -> None:
    """Every quantized layer got all its checkpoint tensors (and derived what its kernels need)."""
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.check_complete()
            m.finish_loading()
