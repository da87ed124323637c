"""A linear layer with 4-bit weights in groups along K: w[n, k] = (q[k, n] - zero[g, n]) * scale[g, n],
g = g_idx[k].

AWQ and GPTQ checkpoints are both converted at load into one layout the kernels read: `qweight`
[K/8, N] int32 packed along K in sequence (GPTQ's), `scales` [G, N] as stored (fp16), `zeros` [G, N]
uint8 unpacked (GPTQ v1's stored zero - 1 undone), `g_idx` [K] int32. `sorted_groups` says whether
g_idx is plain k // group_size (no act-order), which lets kernels skip the gather.
"""

from __future__ import annotations

import torch

from hosttune_engine.errors import QuantizationError
from hosttune_engine.quant.int4_packing import AWQ_ORDER, pack_int4, unpack_int4
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
        self.register_buffer("qweight", torch.zeros(k // 8, n, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros(groups, n, dtype=torch.float16, device=device))
        self.register_buffer("zeros", torch.zeros(groups, n, dtype=torch.uint8, device=device))
        self.register_buffer("g_idx", (torch.arange(k) // spec.group_size).to(device=device, dtype=torch.int32))
        self._g_idx_loaded: torch.Tensor | None = None
        self.sorted_groups = True

    def store_shard(self, shard, rows: slice, tensors: dict) -> None:
        device = self.qweight.device
        t = {name: v.to(device) for name, v in tensors.items()}
        if self.spec.layout is Layout.AWQ:
            qweight = pack_int4(unpack_int4(t["qweight"], 1, AWQ_ORDER), 0)  # [K, N/8] -> [K/8, N]
            zeros = unpack_int4(t["qzeros"], 1, AWQ_ORDER)
        else:
            qweight = t["qweight"]
            zeros = unpack_int4(t["qzeros"], 1) + self.spec.zero_offset
            self._take_g_idx(t["g_idx"], shard)
        self.qweight[:, rows].copy_(qweight)
        self.zeros[:, rows].copy_(zeros.clamp_max(15))
        self.scales[:, rows].copy_(t["scales"])

    def _take_g_idx(self, g_idx: torch.Tensor, shard) -> None:
        """All shards of a fused projection read the same input, so they must group its columns alike."""
        if (g_idx < 0).any() or (g_idx >= self.scales.shape[0]).any():
            raise QuantizationError(f"{self.where}: g_idx names groups outside 0..{self.scales.shape[0] - 1}")
        if self._g_idx_loaded is not None and not torch.equal(self._g_idx_loaded, g_idx):
            raise QuantizationError(f"{self.where}.{shard}: its g_idx differs from the other projections fused "
                                    "with it; the engine needs one column grouping per input")
        self._g_idx_loaded = g_idx
        self.g_idx.copy_(g_idx)
        self.sorted_groups = bool(torch.equal(g_idx.long().cpu(), torch.arange(len(g_idx)) // self.group_size))

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        g = self.g_idx.long()
        q = unpack_int4(self.qweight, 0).float()  # [K, N]
        w = (q - self.zeros[g].float()) * self.scales[g].float()
        return w.t().to(dtype)

    def kernel_forward(self, x: torch.Tensor) -> torch.Tensor:
        return int4_linear(self, x)
