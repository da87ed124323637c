"""Rotary position embedding with a precomputed fp32 cos/sin table."""

from __future__ import annotations

import math

import torch

from hosttune_engine.errors import UnsupportedModelError
from hosttune_engine.kernels.rope import rope, rope_ref
from hosttune_engine.layers.backend import KernelLayer


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise UnsupportedModelError(f"rope scaling type {kind!r} is not supported (default, linear, llama3 are)")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(head_dim: int, max_positions: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos of each angle, then sin."""
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), rope_inv_freq(head_dim, theta, scaling))
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous()


class RotaryEmbedding(KernelLayer):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None = None):
        super().__init__()
        self._table_args = (head_dim, max_positions, theta, scaling)
        self.register_buffer("cos_sin", rope_cos_sin(*self._table_args), persistent=False)

    def fill_table(self) -> None:
        """Compute the table again (a model built on the meta device, then given storage)."""
        self.cos_sin = rope_cos_sin(*self._table_args).to(self.cos_sin.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions [T]; q [T, Hq, D], k [T, Hkv, D] -> rotated q, k."""
        fn = rope if self.use_triton else rope_ref
        return fn(q, positions, self.cos_sin), fn(k, positions, self.cos_sin)
