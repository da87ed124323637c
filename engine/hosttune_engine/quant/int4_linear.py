"""A linear layer with 4-bit weights in groups along K: w[n, k] = (q - zero[n, g]) * scale[n, g], g = g_idx[k].

AWQ and GPTQ checkpoints are both converted at load into the one layout the kernels read
(kernels/int4_layout.py): `qweight` [N, K/8] int32 packed along K, `scales` [N, G] as stored (fp16),
`zeros` [N, G] uint8 unpacked (GPTQ v1's stored zero - 1 undone), and for act-order checkpoints `perm`
[K], the input columns sorted by group, so the kernels only ever see plain groups.
"""

from __future__ import annotations

import torch

from hosttune_engine.errors import QuantizationError
from hosttune_engine.kernels.int4_layout import dequantize_ref, group_order, groups_are_full, repack
from hosttune_engine.quant.int4_packing import AWQ_ORDER, unpack_int4
from hosttune_engine.quant.kernel_dispatch import int4_linear
from hosttune_engine.quant.quant_linear import QuantLinear
from hosttune_engine.quant.spec import Layout


class Int4Linear(QuantLinear):
    def __init__(self, in_features: int, shards: dict, bias: bool, spec, dtype, device, where: str):
        super().__init__(in_features, shards, bias, spec, dtype, device, where)
        n, k = self.out_features, in_features
        self.shard_layout(next(iter(shards)))  # refuses widths the group size or the packing does not fit
        self.group_size = spec.group_size
        groups = k // spec.group_size
        self.register_buffer("qweight", torch.zeros(n, k // 8, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros(n, groups, dtype=torch.float16, device=device))
        self.register_buffer("zeros", torch.zeros(n, groups, dtype=torch.uint8, device=device))
        self.register_buffer("perm", torch.arange(k, dtype=torch.int32, device=device))
        self._g_idx_loaded: torch.Tensor | None = None
        self.permuted = False  # whether perm is not the identity (an act-order checkpoint)

    def store_shard(self, shard, rows: slice, tensors: dict) -> None:
        device = self.qweight.device
        t = {name: v.to(device) for name, v in tensors.items()}
        if self.spec.layout is Layout.AWQ:
            values = unpack_int4(t["qweight"], 1, AWQ_ORDER)  # [K, N/8] -> [K, N]
            zeros = unpack_int4(t["qzeros"], 1, AWQ_ORDER)
        else:
            values = unpack_int4(t["qweight"], 0)  # [K/8, N] -> [K, N]
            zeros = unpack_int4(t["qzeros"], 1) + self.spec.zero_offset
            g_idx = t["g_idx"]
            if self.gathered_from is not None:
                values, g_idx = self._own_groups(values, g_idx)
            self._take_g_idx(g_idx - self.first_group, shard)
        qweight, scales, zeros = repack(values, t["scales"], zeros.clamp_max(15), self.kernel_perm, self.group_size)
        self.qweight[rows].copy_(qweight)
        self.zeros[rows].copy_(zeros)
        self.scales[rows].copy_(scales)

    @property
    def first_group(self) -> int:
        """The checkpoint's group this rank's first input column is in (row-parallel; 0 otherwise)."""
        split = self.input_split
        return 0 if split is None else split[0] // self.group_size

    def _own_groups(self, values: torch.Tensor, g_idx: torch.Tensor):
        """Act-order, row-parallel: this rank's groups of the whole layer's columns (values [K, N], g_idx [K]),
        sorted by group; `input_columns` [K / ranks] names them in the whole input, which the layer's gather
        hook (parallel/quant_split.py) picks them from."""
        gs, k = self.group_size, self.gathered_from
        if not groups_are_full(g_idx, gs, k // gs):
            raise QuantizationError(f"{self.where}: g_idx must give every group exactly {gs} columns "
                                    "(as GPTQ's act-order does)")
        start = self.first_group * gs
        cols = torch.argsort(g_idx.long(), stable=True)[start:start + self.in_features]
        self.register_buffer("input_columns", cols.to(self.qweight.device), persistent=False)
        return values[cols], g_idx[cols]

    @property
    def kernel_perm(self) -> torch.Tensor | None:
        return self.perm if self.permuted else None

    def _take_g_idx(self, g_idx: torch.Tensor, shard) -> None:
        """All shards of a fused projection read the same input, so they must group its columns alike."""
        groups = self.scales.shape[1]
        if (g_idx < 0).any() or (g_idx >= groups).any():
            raise QuantizationError(f"{self.where}: g_idx names groups outside 0..{groups - 1}")
        if self._g_idx_loaded is not None:
            if not torch.equal(self._g_idx_loaded, g_idx):
                raise QuantizationError(f"{self.where}.{shard}: its g_idx differs from the other projections fused "
                                        "with it; the engine needs one column grouping per input")
            return
        if not groups_are_full(g_idx, self.group_size, groups):
            raise QuantizationError(f"{self.where}: g_idx must give every group exactly {self.group_size} columns "
                                    "(as GPTQ's act-order does)")
        self._g_idx_loaded = g_idx
        perm = group_order(g_idx, self.group_size)
        self.permuted = perm is not None
        if perm is not None:
            self.perm.copy_(perm)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_ref(self.qweight, self.scales, self.zeros, self.kernel_perm, self.group_size).to(dtype)

    def kernel_forward(self, x, choice, prologue) -> torch.Tensor:
        return int4_linear(self, x, choice, prologue)
