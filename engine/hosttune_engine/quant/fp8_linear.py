"""A linear layer with FP8 (e4m3) weights and one fp32 scale per (row block, column block).

Every public FP8 layout is a case of that: block-wise scales (rows and columns in blocks), one
scale per output channel (blocks of one row, one column block), one per tensor (one block per
shard). Shards of a fused projection keep their own scales: `scale_row` [N] names the scale row
of each output row, so blocks never straddle two shards whatever their sizes.
"""

from __future__ import annotations

import torch

from hosttune_engine.layers.linear import planned
from hosttune_engine.quant.kernel_dispatch import fp8_linear, fp8_swiglu_rows
from hosttune_engine.quant.quant_linear import QuantLinear
from hosttune_engine.quant.quantize import FP8, fp8_per_channel
from hosttune_engine.quant.spec import Layout


class Fp8Linear(QuantLinear):
    def __init__(self, in_features: int, shards: dict, bias: bool, spec, dtype, device, where: str):
        super().__init__(in_features, shards, bias, spec, dtype, device, where)
        n, k = self.out_features, in_features
        blocked = spec.layout in (Layout.FP8_BLOCK, Layout.FP8_CT_BLOCK)
        self.block_k = spec.block[1] if blocked else k  # columns one scale covers
        rows_per_scale = {name: self._scale_rows(s.stop - s.start) for name, s in self.shard_slices.items()}
        scale_row, self.scale_offsets, start = [], {}, 0
        for name, s in self.shard_slices.items():
            self.scale_offsets[name] = start
            scale_row.append(start + torch.arange(s.stop - s.start) // self._rows_per_block(s.stop - s.start))
            start += rows_per_scale[name]
        self.register_buffer("weight", torch.empty(n, k, dtype=FP8, device=device))
        self.register_buffer("weight_scale", torch.ones(start, -(-k // self.block_k), dtype=torch.float32,
                                                        device=device))
        self.register_buffer("scale_row", torch.cat(scale_row).to(device=device, dtype=torch.int32))
        # The FP8 tensor-core GEMM's unit operand scale, made here so a CUDA graph capture allocates none.
        self.register_buffer("unit_scale", torch.ones((), device=device), persistent=False)
        self.row_scale: torch.Tensor | None = None

    def _rows_per_block(self, rows: int) -> int:
        layout = self.spec.layout
        if layout in (Layout.FP8_BLOCK, Layout.FP8_CT_BLOCK):
            return self.spec.block[0]
        return 1 if layout is Layout.FP8_CHANNEL else rows

    def _scale_rows(self, rows: int) -> int:
        return -(-rows // self._rows_per_block(rows))

    def store_shard(self, shard, rows: slice, tensors: dict) -> None:
        if self.spec.at_load:
            weight, scale = fp8_per_channel(tensors["weight"].to(self.weight.device))
        else:
            weight, scale = tensors["weight"], tensors[self.spec.scale_name]
        start = self.scale_offsets[shard]
        self.weight[rows].copy_(weight)
        scale = scale.float().reshape(-1, self.weight_scale.shape[1])
        self.weight_scale[start:start + scale.shape[0]].copy_(scale)

    def finish_loading(self) -> None:
        """`row_scale` [N]: one scale per output row, where the scales do not vary along K (else None)."""
        if self.weight_scale.shape[1] == 1:
            self.row_scale = self.weight_scale[self.scale_row.long(), 0].contiguous()

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        scale = self.weight_scale[self.scale_row.long()]  # [N, KB]
        scale = scale.repeat_interleave(self.block_k, 1)[:, :self.in_features]
        return (self.weight.float() * scale).to(dtype)

    def kernel_forward(self, x, choice, prologue) -> torch.Tensor:
        return fp8_linear(self, x, choice, prologue)

    def swiglu_rows(self, x: torch.Tensor, prologue=None):
        """A gate_up projection's SwiGLU quantized per token, (e4m3 [T, N/2], scales [T, 1]), from its FP8 GEMM's
        epilogue; None where the plan runs another kernel for x's row count."""
        choice = planned(self.kernel_plan, self.use_triton, x)
        return None if choice is None else fp8_swiglu_rows(self, x, choice, prologue)
