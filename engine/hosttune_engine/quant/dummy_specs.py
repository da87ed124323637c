"""Layouts by name, for random (dummy) weights quantized in-process: benchmarks of a quantized model need
no checkpoint on disk."""

from __future__ import annotations

from hosttune_engine.errors import ConfigError
from hosttune_engine.quant.spec import Layout, QuantSpec, at_load_spec

DUMMY_SPECS = {
    "fp8": at_load_spec(),
    "fp8-block": QuantSpec(Layout.FP8_BLOCK, block=(128, 128), ignore=("lm_head",)),
    "fp8-channel": QuantSpec(Layout.FP8_CHANNEL, fp8_activations=True, ignore=("lm_head",)),
    "fp8-tensor": QuantSpec(Layout.FP8_TENSOR, fp8_activations=True, ignore=("lm_head",)),
    "awq": QuantSpec(Layout.AWQ, group_size=128, ignore=("lm_head",)),
    "gptq": QuantSpec(Layout.GPTQ, group_size=128, zero_point=False, zero_offset=1, ignore=("lm_head",)),
}


def dummy_spec(name: str) -> QuantSpec:
    if name not in DUMMY_SPECS:
        raise ConfigError(f"quantization must be one of {', '.join(DUMMY_SPECS)}; got {name!r}")
    return DUMMY_SPECS[name]
