"""A plain checkpoint checked against its config.json before the writer reads a weight.

The loader's checks (every tensor the model needs, each in its shape, and no other), made from the
safetensors headers alone, so a checkpoint that does not fit is refused before anything is quantized
or written.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hosttune_engine.errors import ModelLoadError
from hosttune_engine.model.loader import IGNORED_SUFFIXES, build_model, expected_tensors, safetensors_files
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.quant.spec import QuantSpec
from hosttune_engine.quant.transform import quantized_projections


def check_source_fits(folder: Path, spec: QuantSpec) -> None:
    """Raise ModelLoadError naming the first tensor of `folder` that does not fit its config.json."""
    meta = build_model(ModelConfig.from_folder(folder), torch.device("meta"), torch.float32)
    found = header_shapes(folder)
    expected = expected_tensors(meta)
    missing = sorted(expected - found.keys())
    if missing:
        raise ModelLoadError(f"{folder}: weights missing from the checkpoint: {', '.join(missing[:5])}")
    extra = sorted(n for n in found.keys() - expected if not n.endswith(IGNORED_SUFFIXES) and n != "lm_head.weight")
    if extra:
        raise ModelLoadError(f"{folder}: checkpoint tensors the model does not have: {', '.join(extra[:5])}")
    for name, shape in model_shapes(meta, spec).items():
        if name in found and found[name] != shape:
            raise ModelLoadError(f"{folder}: {name}: shape {found[name]} does not match the model's {shape}; the "
                                 "checkpoint does not fit config.json")


def header_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the safetensors headers (no weight is read)."""
    from safetensors import safe_open

    shapes = {}
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes


def model_shapes(meta_model, spec: QuantSpec) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape: the model's parameters, and the parts its fused projections read."""
    shapes = {name: tuple(p.shape) for name, p in meta_model.named_parameters()}
    for p in quantized_projections(meta_model, spec):
        for shard, name in p.parts.items():
            shapes[f"{name}.weight"] = (p.shards[shard], p.in_features)
            if p.bias:
                shapes[f"{name}.bias"] = (p.shards[shard],)
    return shapes
