"""The part of each quantized checkpoint tensor one tensor-parallel rank reads, and the splits a layout allows.

A column-parallel layer holds output rows `start:stop` of each checkpoint projection (N), a row-parallel one
input columns `start:stop` (K). Each layout stores N and K along its own dims, packs some of them eight to
an int32 and gives a scale to a block or group of them, so a rank reads, per tensor:

| tensor | rows r0:r1 (column-parallel) | columns k0:k1 (row-parallel) |
| --- | --- | --- |
| FP8 `weight` [N, K] | rows r0:r1 | columns k0:k1 |
| FP8 block scale [N/bn, K/bk] | rows r0/bn : r1/bn | columns k0/bk : k1/bk |
| FP8 channel scale [N, 1] | rows r0:r1 | all |
| FP8 tensor scale, `input_scale` | all | all |
| AWQ `qweight` [K, N/8] | columns r0/8 : r1/8 | rows k0:k1 |
| GPTQ `qweight` [K/8, N] | columns r0:r1 | rows k0/8 : k1/8 (act-order: all) |
| `qzeros` [G, N/8], `scales` [G, N] | columns r0/8 : r1/8, r0:r1 | rows k0/g : k1/g |
| GPTQ `g_idx` [K] | all | k0:k1 (act-order: all) |

An act-order (desc_act) GPTQ layer's groups are scattered over K, so no contiguous run of input columns holds
whole groups: its row-parallel rank holds groups k0/g : k1/g of the group-sorted columns instead, reads all of
`qweight` and `g_idx` to pick out their columns, and gathers its input from every rank (`parallel/quant_split.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.quant.layouts import TensorLayout, checkpoint_tensors
from hosttune_engine.quant.spec import Layout, QuantSpec

Part = tuple[int, int, int]  # (dim, start, stop) of a checkpoint tensor


@dataclass(frozen=True)
class Split:
    """The unit a rank's share of a quantized layer must be whole multiples of, and its name for errors."""

    unit: int  # rows or columns a rank's share must be a multiple of
    what: str  # e.g. "128-column FP8 blocks"


def row_split_unit(spec: QuantSpec) -> Split | None:
    """What each rank's output rows (column-parallel) must be made of, or None when any rows will do."""
    if spec.at_load:
        return None
    if spec.layout in (Layout.FP8_BLOCK, Layout.FP8_CT_BLOCK):
        return Split(spec.block[0], f"{spec.block[0]}-row FP8 blocks")
    if not spec.layout.is_fp8:
        return Split(8, "8-row packs of 4-bit zeros")
    return None


def column_split_unit(spec: QuantSpec) -> Split | None:
    """What each rank's input columns (row-parallel) must be made of, or None when any columns will do (an
    act-order layer splits its group-sorted columns, in whole groups too)."""
    if spec.at_load:
        return None
    if spec.layout in (Layout.FP8_BLOCK, Layout.FP8_CT_BLOCK):
        return Split(spec.block[1], f"{spec.block[1]}-column FP8 blocks")
    if not spec.layout.is_fp8:
        return Split(spec.group_size, f"{spec.group_size}-column groups")
    return None


def gathers_input(spec: QuantSpec) -> bool:
    """Whether a row-parallel layer of this layout holds whole groups of scattered columns (act-order), so it
    needs the whole input, not only its rank's columns."""
    return spec.layout is Layout.GPTQ and spec.desc_act and not spec.at_load


def tensor_part(spec: QuantSpec, kind: str, rows: tuple[int, int] | None, cols: tuple[int, int] | None) -> Part | None:
    """The part of checkpoint tensor `kind` a rank holding `rows` (or input `cols`) reads; None: all of it."""
    if rows is not None:
        return _rows_part(spec, kind, *rows)
    if cols is not None:
        return _columns_part(spec, kind, *cols)
    return None


def _rows_part(spec: QuantSpec, kind: str, r0: int, r1: int) -> Part | None:
    if spec.at_load or kind in ("weight", "bias"):
        return (0, r0, r1)
    if spec.layout.is_fp8:
        return _fp8_scale_part(spec, kind, 0, r0, r1)
    if kind == "g_idx":
        return None
    packed = kind == "qzeros" or (kind == "qweight" and spec.layout is Layout.AWQ)
    return (1, r0 // 8, r1 // 8) if packed else (1, r0, r1)


def _columns_part(spec: QuantSpec, kind: str, k0: int, k1: int) -> Part | None:
    if spec.at_load or kind == "weight":
        return (1, k0, k1)
    if spec.layout.is_fp8:
        return _fp8_scale_part(spec, kind, 1, k0, k1)
    g = spec.group_size
    if kind in ("qzeros", "scales"):
        return (0, k0 // g, k1 // g)
    if gathers_input(spec):
        return None
    return {"qweight": (0, k0 // 8, k1 // 8) if spec.layout is Layout.GPTQ else (0, k0, k1),
            "g_idx": (0, k0, k1)}[kind]


def _fp8_scale_part(spec: QuantSpec, kind: str, dim: int, start: int, stop: int) -> Part | None:
    if kind == "input_scale" or spec.layout is Layout.FP8_TENSOR:
        return None
    if spec.layout is Layout.FP8_CHANNEL:
        return (0, start, stop) if dim == 0 else None
    b = spec.block[dim]
    return (dim, start // b, -(-stop // b))


def local_tensors(spec: QuantSpec, n: int, k: int, gathered_from: int | None, where: str) -> dict[str, TensorLayout]:
    """The layouts of the tensors a rank reads for its layer [n, k]; `gathered_from`: the checkpoint's K of an
    act-order row-parallel layer, whose `qweight` and `g_idx` are read whole."""
    layouts = checkpoint_tensors(spec, n, k, where)
    if gathered_from is not None:
        layouts["qweight"] = TensorLayout((torch.int32,), ((gathered_from // 8, n),))
        layouts["g_idx"] = TensorLayout((torch.int32,), ((gathered_from,),))
    return layouts
