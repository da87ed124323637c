"""Random weights in the quantized kernels' layouts, for timing them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.quant.quantize import fp8_per_channel


@dataclass
class Fp8Weights:
    weight: torch.Tensor  # [N, K] e4m3
    scale: torch.Tensor  # [N, 1] fp32
    scale_row: torch.Tensor  # [N] int32
    row_scale: torch.Tensor  # [N] fp32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weight, self.scale, self.scale_row))


@dataclass
class Int4Weights:
    qweight: torch.Tensor  # [N, K/8]
    scales: torch.Tensor  # [N, G]
    zeros: torch.Tensor  # [N, G]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))


def fp8_weights(n: int, k: int, device, seed: int) -> Fp8Weights:
    g = torch.Generator(device=device).manual_seed(seed)
    w, scale = fp8_per_channel(torch.randn(n, k, device=device, generator=g) * 0.02)
    scale = scale.float().reshape(n, 1).contiguous()
    return Fp8Weights(w, scale, torch.arange(n, device=device, dtype=torch.int32), scale[:, 0].contiguous())


def int4_weights(n: int, k: int, group: int, device, seed: int) -> Int4Weights:
    g = torch.Generator(device=device).manual_seed(seed)
    qweight = torch.randint(-2**31, 2**31 - 1, (n, k // 8), device=device, dtype=torch.int32, generator=g)
    scales = (torch.rand(n, k // group, device=device, generator=g) * 0.002 + 0.001).half()
    zeros = torch.randint(0, 16, (n, k // group), device=device, dtype=torch.uint8, generator=g)
    return Int4Weights(qweight, scales, zeros)
