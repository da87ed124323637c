"""Check a quantized checkpoint against its config before any weight is allocated.

The model is built on the meta device (shapes only) to list the projections the spec quantizes; the
safetensors headers (names, dtypes, shapes; no data) are read; every quantized tensor the layout
needs must be there with its dtype and shape. One QuantizationError names the first that is not.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hosttune_engine.errors import QuantizationError
from hosttune_engine.quant.layouts import checkpoint_tensors, require_layout
from hosttune_engine.quant.spec import QuantSpec
from hosttune_engine.quant.transform import quantized_projections


def _headers(files: list[Path]) -> dict[str, tuple[torch.dtype, tuple[int, ...], str]]:
    from safetensors import safe_open

    found = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                found[name] = (_DTYPES.get(sl.get_dtype()), tuple(sl.get_shape()), f"{path.name}:{name}")
    return found


_DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F32": torch.float32,
           "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32, "I64": torch.int64,
           "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "F64": torch.float64, "BOOL": torch.bool}


def check_checkpoint(meta_model, spec: QuantSpec, files: list[Path]) -> None:
    """Raise a QuantizationError unless every quantized tensor is present with its layout's dtype and shape."""
    headers = _headers(files)
    for p in quantized_projections(meta_model, spec):
        for shard, module in p.parts.items():
            for suffix, want in checkpoint_tensors(spec, p.shards[shard], p.in_features, module).items():
                name = f"{module}.{suffix}"
                if name not in headers:
                    raise QuantizationError(f"{files[0].parent}: {name} is missing; a {spec.layout.value} "
                                            f"checkpoint stores {', '.join(_suffixes(spec, p, shard))} per layer")
                dtype, shape, source = headers[name]
                require_layout(name, dtype, shape, want, source)


def _suffixes(spec, p, shard) -> list[str]:
    return list(checkpoint_tensors(spec, p.shards[shard], p.in_features, p.module))
