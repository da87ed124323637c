"""Write a Hugging Face checkpoint in a quantized layout from a plain (bf16/fp32) one.

Every projection the spec quantizes is replaced by its layout's tensors (quant/quantize.py, round
to nearest); everything else is cast to `dtype`; config.json gets the layout's quantization_config.
For GPTQ with desc_act, each input's columns are put into groups by decreasing importance (the
summed squared weights of the projections that read it), and the projections sharing that input
share the grouping, as GPTQ's act-order does with one Hessian per input.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hosttune_engine.quant.layouts import checkpoint_tensors, quantization_config
from hosttune_engine.quant.quantize import quantize_weight
from hosttune_engine.quant.spec import Layout, QuantSpec
from hosttune_engine.quant.transform import quantized_projections

COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
          "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model")


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(path)))
    return state


def act_order_g_idx(weights: list[torch.Tensor], group_size: int) -> torch.Tensor:
    """Groups by decreasing column importance: column perm[i] goes to group i // group_size."""
    importance = sum(w.float().pow(2).sum(0) for w in weights)
    perm = torch.argsort(importance, descending=True)
    g_idx = torch.empty_like(perm)
    g_idx[perm] = torch.arange(len(perm)) // group_size
    return g_idx


def quantize_state_dict(state: dict, meta_model, spec: QuantSpec, dtype: torch.dtype) -> dict:
    """The checkpoint tensors of `state` in `spec`'s layout."""
    out = {}
    projections = quantized_projections(meta_model, spec)
    for p in projections:  # refuse a width the layout cannot hold before quantizing anything
        for shard, name in p.parts.items():
            checkpoint_tensors(spec, p.shards[shard], p.in_features, name)
    for p in projections:
        names = list(p.parts.values())
        weights = [state.pop(f"{name}.weight") for name in names]
        g_idx = act_order_g_idx(weights, spec.group_size) if spec.desc_act else None
        for name, w in zip(names, weights):
            tensors = quantize_weight(w, spec, scale_dtype=_scale_dtype(spec, dtype), g_idx=g_idx)
            out.update({f"{name}.{suffix}": t.contiguous() for suffix, t in tensors.items()})
    for name, t in state.items():
        out[name] = t.to(dtype).contiguous() if t.is_floating_point() else t
    return out


def _scale_dtype(spec: QuantSpec, dtype: torch.dtype) -> torch.dtype:
    # compressed-tensors stores scales in the model's dtype; the block-wise FP8 releases in bf16 (Qwen3)
    # or fp32 (DeepSeek): fp32 here.
    return torch.float32 if spec.layout is Layout.FP8_BLOCK else dtype


def write_quantized(source: Path, target: Path, spec: QuantSpec, dtype: torch.dtype,
                    calibration_ids: list[int] | None = None) -> Path:
    """Write `source` quantized in `spec`'s layout into `target` (created); returns `target`. With
    `calibration_ids` (token ids of representative text), 4-bit layouts first get activation-aware scales
    (checkpoint/scale_search.py)."""
    from safetensors.torch import save_file

    from hosttune_engine.model.loader import build_model
    from hosttune_engine.model.model_config import ModelConfig

    cfg = ModelConfig.from_folder(source)
    meta = build_model(cfg, torch.device("meta"), dtype)
    state = read_state_dict(source)
    if calibration_ids and not spec.layout.is_fp8:
        from hosttune_engine.checkpoint.scale_search import search_scales

        search_scales(state, source, cfg.num_layers, calibration_ids, spec.group_size)
    tensors = quantize_state_dict(state, meta, spec, dtype)
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.pop("dtype", None)
    config.update(torch_dtype=str(dtype).removeprefix("torch."), quantization_config=quantization_config(spec))
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in COPIED:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    return target
