"""What the FP8 and 4-bit linear layers share: shards of a fused projection, and collecting each shard's
checkpoint tensors until it is complete."""

from __future__ import annotations

import torch
from torch import nn

from hosttune_engine.errors import ModelLoadError
from hosttune_engine.layers.backend import KernelLayer
from hosttune_engine.layers.linear import planned
from hosttune_engine.layers.prologue import Prologue
from hosttune_engine.quant.layouts import require_layout
from hosttune_engine.quant.sharding import Part, gathers_input, local_tensors, tensor_part
from hosttune_engine.quant.spec import QuantSpec

WHOLE = None  # the shard name of an unfused layer


class QuantLinear(KernelLayer):
    """A linear layer [N, K] stored quantized; `shards` (name -> rows) for a fused projection.

    With tensor parallelism the transform that shards the model records what this rank holds of the
    checkpoint's projection (parallel/transform.py, kept when quantization swaps the layer in): `tp_parts`, the
    output rows of each shard (column-parallel); `tp_shards["weight"]`, the input columns, and
    `tp_in_features`, the checkpoint's K (row-parallel)."""

    kernel_plan = None  # its operation's choices (planner/prepare.py); without, the torch reference runs

    def __init__(self, in_features: int, shards: dict, bias: bool, spec: QuantSpec, dtype: torch.dtype,
                 device, where: str):
        super().__init__()
        self.in_features, self.out_features = in_features, sum(shards.values())
        self.spec, self.where = spec, where
        self.shard_slices: dict = {}
        start = 0
        for name, size in shards.items():
            self.shard_slices[name] = slice(start, start + size)
            start += size
        self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype, device=device)) if bias else None
        self._pending: dict = {name: {} for name in shards}

    def shard_layout(self, shard) -> dict:
        s = self.shard_slices[shard]
        return local_tensors(self.spec, s.stop - s.start, self.in_features, self.gathered_from, self.where)

    def checkpoint_part(self, shard, kind: str) -> Part | None:
        """The (dim, start, stop) of checkpoint tensor `kind` of `shard` this rank reads; None: all of it."""
        rows = getattr(self, "tp_parts", {}).get(shard)
        return tensor_part(self.spec, kind, None if rows is None else (rows.start, rows.stop), self.input_split)

    @property
    def input_split(self) -> tuple[int, int] | None:
        """Row-parallel: the checkpoint's input columns start:stop this rank holds (act-order: of the columns
        sorted by group)."""
        cols = getattr(self, "tp_shards", {}).get("weight")
        return None if cols is None or cols.dim != 1 else (cols.start, cols.stop)

    @property
    def gathered_from(self) -> int | None:
        """The checkpoint's K of a row-parallel layer that picks its columns out of the whole input (act-order)."""
        return getattr(self, "tp_in_features", None) if self.input_split and gathers_input(self.spec) else None

    @torch.no_grad()
    def load_shard(self, shard, kind: str, tensor: torch.Tensor, source: str) -> None:
        """Take one checkpoint tensor of a shard; a shard is converted once all its tensors are in."""
        rows = self.shard_slices[shard]
        if kind == "bias" and self.bias is not None:
            if tensor.shape != (rows.stop - rows.start,):
                raise ModelLoadError(f"{source}: bias shape {list(tensor.shape)} does not fit {self.where}")
            self.bias[rows].copy_(tensor)
            return
        want = self.shard_layout(shard)
        if kind not in want:
            raise ModelLoadError(f"{source}: a {self.spec.layout.value} layer has no {kind!r} tensor")
        require_layout(kind, tensor.dtype, tuple(tensor.shape), want[kind], source)
        pending = self._pending[shard]
        pending[kind] = tensor
        if set(pending) == set(want):
            self.store_shard(shard, rows, pending)
            pending.clear()
            pending["done"] = True

    def store_shard(self, shard, rows: slice, tensors: dict) -> None:
        raise NotImplementedError

    def check_complete(self) -> None:
        for shard, pending in self._pending.items():
            if not pending.get("done"):
                missing = sorted(set(self.shard_layout(shard)) - set(pending))
                raise ModelLoadError(f"{self.where}{'.' + shard if shard else ''}: checkpoint tensors missing: "
                                     f"{', '.join(missing)}")

    def finish_loading(self) -> None:
        """Derive what the kernels need once every tensor is in (nothing, unless a layer says otherwise)."""

    def forward(self, x: torch.Tensor, prologue: Prologue | None = None) -> torch.Tensor:
        """x [T, K] -> [T, N] in x's dtype; a prologue (layers/prologue.py) rides in the planned kernel where it
        has a fused form, else runs first."""
        choice = planned(self.kernel_plan, self.use_triton, x)
        if choice is not None and not choice.runs_reference:
            return self.kernel_forward(x, choice, prologue)
        x = x if prologue is None else prologue.apply(x)
        return torch.nn.functional.linear(x, self.dequantized(x.dtype), self.bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [N, K] as plain numbers (the torch reference path)."""
        raise NotImplementedError

    def kernel_forward(self, x: torch.Tensor, choice, prologue: Prologue | None) -> torch.Tensor:
        """The GPU path the plan's `choice` names, with x's prologue if any."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, layout={self.spec.layout.value}"
