"""Activation-aware scales for 4-bit weights, as AWQ searches them.

A projection's input channels that carry large activations matter most; scaling weight column k up by
s_k before rounding (and the input down by s_k) gives those columns finer steps. For each input shared by
projections (RMSNorm -> q/k/v, RMSNorm -> gate/up, up * silu(gate) -> down) the search tries
s = mean|x|^alpha over a grid of alpha, rounds the scaled weights as the layout would, and keeps the
alpha whose outputs on calibration activations are closest to the unquantized ones. The inverse scale is
folded into what produces the input (the norm's weight, up_proj's rows), so the checkpoint stays a plain
model of the same architecture. The attention output (o_proj's input) keeps s = 1: with grouped-query
attention one v row feeds several heads' channels, so it cannot take a per-channel scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.quant.quantize import int4_group_params

ALPHAS = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class ScaledInput:
    """Projections that read one input, and the tensor whose rows (or 1-D weight) produce that input."""

    projections: tuple[str, ...]  # checkpoint modules, e.g. model.layers.0.self_attn.q_proj
    producer: str  # checkpoint tensor the inverse scale folds into
    engine_module: str  # the engine module whose input is recorded


def scaled_inputs(num_layers: int) -> list[ScaledInput]:
    found = []
    for i in range(num_layers):
        p = f"model.layers.{i}"
        found += [
            ScaledInput(tuple(f"{p}.self_attn.{n}_proj" for n in "qkv"), f"{p}.input_layernorm.weight",
                        f"{p}.self_attn.qkv_proj"),
            ScaledInput((f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"), f"{p}.post_attention_layernorm.weight",
                        f"{p}.mlp.gate_up_proj"),
            ScaledInput((f"{p}.mlp.down_proj",), f"{p}.mlp.up_proj.weight", f"{p}.mlp.down_proj"),
        ]
    return found


def rounded(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """w [N, K] rounded to 4 bits with zero points (AWQ's grid) and back: int4_values' arithmetic with each
    group's parameters broadcast over its columns rather than gathered per column (5x faster on a CPU)."""
    n, k = w.shape
    scales, zeros = int4_group_params(w, group_size, zero_point=True)  # [G, N]
    s, z = scales.float()[:, None], zeros.float()[:, None]  # [G, 1, N]
    q = (w.float().t().reshape(k // group_size, group_size, n) / s + z).round().clamp(0, 15)  # [G, gs, N]
    return ((q - z) * s).reshape(k, n).t()


def best_scale(weights: list[torch.Tensor], x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, float]:
    """(s [K], alpha) minimizing the squared output error of the rounded weights on activations x [T, K]."""
    w = torch.cat([t.float() for t in weights])  # [N, K]
    want = x @ w.t()
    mean = x.abs().mean(0).clamp_min(1e-8)
    best = (None, None, float("inf"))
    for alpha in ALPHAS:
        s = mean.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        err = (x @ (rounded(w * s, group_size) / s).t() - want).pow(2).mean().item()
        if err < best[2]:
            best = (s, alpha, err)
    return best[0], best[1]


def apply_scales(state: dict, found: ScaledInput, s: torch.Tensor) -> None:
    """Scale the projections' columns by s and the producer of their input by 1 / s (in place, fp32)."""
    for name in found.projections:
        key = f"{name}.weight"
        state[key] = (state[key].float() * s).to(state[key].dtype)
    producer = state[found.producer].float()
    producer = producer / s if producer.dim() == 1 else producer / s[:, None]
    state[found.producer] = producer.to(state[found.producer].dtype)


def record_inputs(source, ids: list[int], modules: list[str]) -> dict[str, torch.Tensor]:
    """The inputs [T, K] of the engine's `modules` over one teacher-forced pass of `ids` (CPU, fp32)."""
    from hosttune_engine.config import EngineConfig
    from hosttune_engine.core.engine import Engine
    from hosttune_engine.core.sequence import Sequence
    from hosttune_engine.sampling import SamplingParams

    eng = Engine(EngineConfig(model=str(source), dtype="float32", device="cpu", kernel_backend="torch",
                              max_model_len=len(ids) + 16, num_kv_blocks=-(-len(ids) // 16) + 4))
    model, seen = eng.runner.model, {}
    hooks = [model.get_submodule(m).register_forward_pre_hook(
        lambda mod, args, _m=m: seen.__setitem__(_m, args[0].detach().float())) for m in modules]
    seq = Sequence("calibration", ids, SamplingParams(temperature=0))
    eng.block_manager.allocate(seq, len(ids))
    with torch.inference_mode():
        eng.runner.prefill_logits(seq)
    for h in hooks:
        h.remove()
    return seen


def search_scales(state: dict, source, num_layers: int, ids: list[int], group_size: int) -> dict[str, float]:
    """Apply activation-aware scales to `state` (a plain checkpoint's tensors); returns alpha per input."""
    inputs = scaled_inputs(num_layers)
    recorded = record_inputs(source, ids, [f.engine_module for f in inputs])
    alphas = {}
    for found in inputs:
        s, alpha = best_scale([state[f"{n}.weight"] for n in found.projections], recorded[found.engine_module],
                              group_size)
        apply_scales(state, found, s)
        alphas[found.engine_module] = alpha
    return alphas
