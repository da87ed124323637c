"""The public on-disk layouts: the tensors each quantized linear layer [N, K] has in a checkpoint (name
suffix, dtype, shape) and the config.json `quantization_config` that announces them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.errors import QuantizationError
from hosttune_engine.quant.spec import Layout, QuantSpec

SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class TensorLayout:
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]  # accepted shapes (per-tensor scales: [1] or a scalar)


def _one(dtypes, *shape) -> TensorLayout:
    return TensorLayout(tuple(dtypes), (tuple(shape),))


def checkpoint_tensors(spec: QuantSpec, n: int, k: int, where: str) -> dict[str, TensorLayout]:
    """Suffix -> layout of every quantized tensor of the linear layer `where` (out N, in K)."""
    if spec.at_load:
        return {"weight": _one(SCALE_DTYPES, n, k)}
    layout = spec.layout
    if layout.is_fp8:
        out = {"weight": _one([torch.float8_e4m3fn], n, k), spec.scale_name: _fp8_scale(spec, n, k)}
        if spec.static_input_scale:
            out["input_scale"] = TensorLayout(SCALE_DTYPES, ((1,), ()))
        return out
    _check_int4_widths(spec, n, k, where)
    groups = k // spec.group_size
    if layout is Layout.AWQ:
        return {"qweight": _one([torch.int32], k, n // 8), "qzeros": _one([torch.int32], groups, n // 8),
                "scales": _one([torch.float16, torch.bfloat16], groups, n)}
    return {"qweight": _one([torch.int32], k // 8, n), "qzeros": _one([torch.int32], groups, n // 8),
            "scales": _one([torch.float16, torch.bfloat16], groups, n), "g_idx": _one([torch.int32], k)}


def _fp8_scale(spec: QuantSpec, n: int, k: int) -> TensorLayout:
    if spec.layout is Layout.FP8_CHANNEL:
        return _one(SCALE_DTYPES, n, 1)
    if spec.layout is Layout.FP8_TENSOR:
        return TensorLayout(SCALE_DTYPES, ((1,), ()))
    bn, bk = spec.block
    return _one(SCALE_DTYPES, -(-n // bn), -(-k // bk))


def _check_int4_widths(spec: QuantSpec, n: int, k: int, where: str) -> None:
    if k % spec.group_size:
        raise QuantizationError(f"{where}: group size {spec.group_size} does not divide its input width {k}")
    if n % 8 or k % 8:
        raise QuantizationError(f"{where}: 4-bit layers need widths that are multiples of 8, got [{n}, {k}]")
    if spec.group_size % 8:
        raise QuantizationError(f"{where}: group size {spec.group_size} is not a multiple of 8; the 4-bit kernels "
                                "pack eight columns of one group to a word")


def quantization_config(spec: QuantSpec) -> dict:
    """The config.json `quantization_config` of a checkpoint written in `spec`'s layout."""
    layout = spec.layout
    if layout is Layout.FP8_BLOCK:
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(spec.block), "modules_to_not_convert": list(spec.ignore)}
    if layout is Layout.AWQ:
        return {"quant_method": "awq", "bits": 4, "group_size": spec.group_size, "version": "gemm",
                "zero_point": spec.zero_point, "modules_to_not_convert": list(spec.ignore) or None}
    if layout is Layout.GPTQ:
        return {"quant_method": "gptq", "bits": 4, "group_size": spec.group_size, "desc_act": spec.desc_act,
                "sym": not spec.zero_point, "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
                "lm_head": False, "checkpoint_format": "gptq" if spec.zero_offset else "gptq_v2"}
    return _compressed_tensors_config(spec)


def _float8_args(strategy: str, dynamic: bool, block=None) -> dict:
    return {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": strategy,
            "block_structure": list(block) if block else None, "dynamic": dynamic, "actorder": None,
            "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def _compressed_tensors_config(spec: QuantSpec) -> dict:
    strategy = {Layout.FP8_CHANNEL: "channel", Layout.FP8_TENSOR: "tensor", Layout.FP8_CT_BLOCK: "block"}
    inputs = None  # weights only (W8A16)
    if spec.static_input_scale:
        inputs = _float8_args("tensor", False)
    elif spec.fp8_activations:
        inputs = _float8_args("group" if spec.block else "token", True)
        inputs["group_size"] = spec.block[1] if spec.block else None
    group = {"targets": ["Linear"], "weights": _float8_args(strategy[spec.layout], False, spec.block),
             "input_activations": inputs, "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": list(spec.ignore), "kv_cache_scheme": None}


def require_layout(name: str, dtype: torch.dtype, shape: tuple[int, ...], want: TensorLayout, source: str) -> None:
    """Raise unless a checkpoint tensor has one of the layout's dtypes and shapes."""
    if dtype not in want.dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in want.dtypes)
        raise QuantizationError(f"{source}: {name} has dtype {str(dtype).removeprefix('torch.')}; "
                                f"the layout stores {names}")
    if tuple(shape) not in want.shapes:
        raise QuantizationError(f"{source}: {name} has shape {list(shape)}; the layout and config.json "
                                f"need {' or '.join(str(list(s)) for s in want.shapes)}")
