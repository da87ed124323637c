"""How the quantized layers of a sharded model split: whole FP8 blocks and 4-bit groups on every rank, checked
before any weight is allocated, and the input gather of an act-order layer.

What each layout allows is the layout's (`quant/sharding.py`); this module holds it against the rows and
columns the sharding gave each layer.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from hosttune_engine.errors import ConfigError
from hosttune_engine.parallel.group import TensorParallelGroup
from hosttune_engine.quant.sharding import Split, column_split_unit, gathers_input, row_split_unit
from hosttune_engine.quant.spec import QuantSpec
from hosttune_engine.quant.transform import quantized_projections


def split_quantized(model: nn.Module, spec: QuantSpec, world_size: int, group: TensorParallelGroup | None) -> None:
    """Check that every layer `spec` quantizes splits into whole blocks or groups on this rank (ConfigError
    otherwise), and give each act-order row-parallel one its input gather."""
    if world_size == 1:
        return
    for p in quantized_projections(model, spec):
        module = model.get_submodule(p.module)
        for part, rows in getattr(module, "tp_parts", {}).items():
            _check_whole(row_split_unit(spec), rows, f"{p.parts[part]}.weight", "output rows", spec, world_size)
        cols = getattr(module, "tp_shards", {}).get("weight")
        if cols is None or cols.dim != 1:
            continue
        _check_whole(column_split_unit(spec), cols, f"{p.module}.weight", "input columns", spec, world_size)
        if gathers_input(spec):
            module.register_forward_pre_hook(partial(_gather_input, group), with_kwargs=True)


def _check_whole(split: Split | None, part, tensor: str, dim: str, spec: QuantSpec, world_size: int) -> None:
    if split is None or (part.start % split.unit == 0 and part.stop % split.unit == 0):
        return
    raise ConfigError(f"{tensor}: tensor_parallel_size={world_size} gives a rank its {dim} {part.start}:{part.stop}, "
                      f"not whole {split.what} ({spec.layout.value}); use a tensor_parallel_size whose share is a "
                      f"multiple of {split.unit}")


def _gather_input(group: TensorParallelGroup, module: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """x [T, K / ranks] (its prologue, if handed one, computed first) -> this rank's columns of the whole input,
    [T, K / ranks] in the layer's group order."""
    x, prologue = args[0], kwargs.get("prologue")
    whole = group.gather_columns(x if prologue is None else prologue.apply(x))  # [T, K]
    return (whole.index_select(1, module.input_columns),), {}
