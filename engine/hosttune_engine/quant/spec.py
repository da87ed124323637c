"""What a checkpoint's `quantization_config` says, parsed into one frozen spec, or refused with a reason.

Accepted: FP8 block-wise (`quant_method: fp8`, as the Qwen3 and DeepSeek FP8 releases), FP8 in the
compressed-tensors layout (per-tensor, per-channel or block weights), and 4-bit AWQ (`version: gemm`)
and GPTQ (symmetric or with zeros, `desc_act` false or true). Anything else is a QuantizationError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from hosttune_engine.errors import ConfigError, QuantizationError


class Layout(Enum):
    FP8_BLOCK = "fp8-block"  # weight + weight_scale_inv per block (Hugging Face fine-grained FP8)
    FP8_CHANNEL = "fp8-channel"  # compressed-tensors: weight + weight_scale [N, 1]
    FP8_TENSOR = "fp8-tensor"  # compressed-tensors: weight + weight_scale [1]
    FP8_CT_BLOCK = "fp8-ct-block"  # compressed-tensors: weight + weight_scale per block
    AWQ = "awq"  # qweight [K, N/8], qzeros [G, N/8], scales [G, N]
    GPTQ = "gptq"  # qweight [K/8, N], qzeros [G, N/8], scales [G, N], g_idx [K]

    @property
    def is_fp8(self) -> bool:
        return self.value.startswith("fp8")


@dataclass(frozen=True)
class QuantSpec:
    """How every quantized linear layer of a checkpoint is stored."""

    layout: Layout
    block: tuple[int, int] | None = None  # FP8 block (rows, cols)
    group_size: int = 128  # 4-bit: input columns per scale
    zero_point: bool = True  # 4-bit: zero points stored (False: symmetric, zero 8)
    desc_act: bool = False  # GPTQ: groups follow g_idx, not column order
    zero_offset: int = 0  # GPTQ v1 stores zero - 1
    static_input_scale: bool = False  # compressed-tensors static activations: an input_scale per layer
    fp8_activations: bool = False  # batched GEMMs may round activations to e4m3 (per token) for FP8 tensor cores
    ignore: tuple[str, ...] = ()  # modules kept in the checkpoint's dtype
    at_load: bool = False  # FP8 quantized by the engine from a bf16 checkpoint

    @property
    def scale_name(self) -> str:
        return "weight_scale_inv" if self.layout is Layout.FP8_BLOCK else "weight_scale"

    def is_quantized(self, module: str) -> bool:
        """Whether the checkpoint module `module` (e.g. model.layers.0.self_attn.q_proj) is quantized."""
        return not any(_matches(pattern, module) for pattern in self.ignore)


def _matches(pattern: str, module: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], module) is not None
    return module == pattern or module.endswith("." + pattern) or pattern in module.split(".")


def parse_quantization_config(raw: dict | None, source: str) -> QuantSpec | None:
    """The spec of a config.json `quantization_config` (None when there is none)."""
    if not raw:
        return None
    method = raw.get("quant_method")
    parsers = {"fp8": _parse_fp8, "compressed-tensors": _parse_compressed_tensors, "awq": _parse_awq,
               "gptq": _parse_gptq}
    if method not in parsers:
        raise QuantizationError(f"{source}: quantization method {method!r} is not supported; "
                                f"supported: {', '.join(parsers)}")
    return parsers[method](raw, f"{source}: quantization_config")


def _require(ok: bool, source: str, message: str) -> None:
    if not ok:
        raise QuantizationError(f"{source}: {message}")


def _parse_fp8(raw: dict, source: str) -> QuantSpec:
    _require(raw.get("fmt", "e4m3") == "e4m3", source, f"fmt {raw.get('fmt')!r} is not supported (e4m3 is)")
    _require(raw.get("activation_scheme", "dynamic") == "dynamic", source,
             f"activation_scheme {raw.get('activation_scheme')!r} is not supported (dynamic is)")
    block = raw.get("weight_block_size")
    _require(isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block),
             source, f"weight_block_size must be two positive ints, got {block!r}")
    return QuantSpec(Layout.FP8_BLOCK, block=tuple(block), ignore=tuple(raw.get("modules_to_not_convert") or ()))


def _parse_awq(raw: dict, source: str) -> QuantSpec:
    version = str(raw.get("version", "gemm")).lower()
    _require(version == "gemm", source, f"AWQ version {version!r} is not supported (gemm is)")
    _require(raw.get("bits", raw.get("w_bit")) == 4, source, f"{raw.get('bits')}-bit AWQ is not supported (4 is)")
    group = raw.get("group_size", raw.get("q_group_size", 128))
    _require(isinstance(group, int) and group > 0, source, f"group_size must be a positive int, got {group!r}")
    _require(raw.get("zero_point", True), source, "AWQ without zero points is not supported")
    return QuantSpec(Layout.AWQ, group_size=group,
                     ignore=tuple(raw.get("modules_to_not_convert") or ()))


def _parse_gptq(raw: dict, source: str) -> QuantSpec:
    _require(raw.get("bits") == 4, source, f"{raw.get('bits')}-bit GPTQ is not supported (4 is)")
    group = raw.get("group_size", 128)
    _require(isinstance(group, int) and group > 0, source,
             f"group_size {group!r} is not supported (a positive group size is; -1, one group per row, is not)")
    _require(not raw.get("lm_head"), source, "a quantized lm_head is not supported")
    fmt = raw.get("checkpoint_format", "gptq")
    _require(fmt in ("gptq", "gptq_v2"), source, f"checkpoint_format {fmt!r} is not supported (gptq, gptq_v2 are)")
    return QuantSpec(Layout.GPTQ, group_size=group, zero_point=not raw.get("sym", True),
                     desc_act=bool(raw.get("desc_act", False)), zero_offset=1 if fmt == "gptq" else 0,
                     ignore=tuple(raw.get("modules_to_not_convert") or ()))


CT_STRATEGIES = {"channel": Layout.FP8_CHANNEL, "tensor": Layout.FP8_TENSOR, "block": Layout.FP8_CT_BLOCK}


def _parse_compressed_tensors(raw: dict, source: str) -> QuantSpec:
    fmt = raw.get("format")
    _require(fmt in ("float-quantized", "naive-quantized"), source,
             f"compressed-tensors format {fmt!r} is not supported (float-quantized FP8 is)")
    groups = raw.get("config_groups") or {}
    _require(len(groups) == 1, source, f"one config group is supported, got {len(groups)}")
    (group,) = groups.values()
    _require("Linear" in (group.get("targets") or []), source, "the config group must target Linear layers")
    weights = group.get("weights") or {}
    _require(weights.get("type") == "float" and weights.get("num_bits") == 8, source,
             f"{weights.get('num_bits')}-bit {weights.get('type')} weights are not supported (8-bit float are)")
    _require(weights.get("symmetric", True), source, "asymmetric FP8 weights are not supported")
    strategy = weights.get("strategy")
    _require(strategy in CT_STRATEGIES, source, f"weight strategy {strategy!r} is not supported "
                                                f"({', '.join(CT_STRATEGIES)} are)")
    block = weights.get("block_structure") if strategy == "block" else None
    _require(strategy != "block" or (isinstance(block, list) and len(block) == 2), source,
             f"block weights need a block_structure of two ints, got {block!r}")
    acts = group.get("input_activations")
    return QuantSpec(CT_STRATEGIES[strategy], block=tuple(block) if block else None,
                     static_input_scale=_static_input(acts, source), fp8_activations=bool(acts),
                     ignore=tuple(raw.get("ignore") or ()))


def _static_input(acts: dict | None, source: str) -> bool:
    if not acts:
        return False
    _require(acts.get("type") == "float" and acts.get("num_bits") == 8, source,
             "input activations must be 8-bit float or absent")
    _require(acts.get("dynamic") or acts.get("strategy") == "tensor", source,
             f"static {acts.get('strategy')} input activations are not supported (static tensor or dynamic are)")
    return not acts.get("dynamic")


def at_load_spec() -> QuantSpec:
    """`quantization="fp8"`: a bf16 checkpoint quantized at load, one scale per output channel."""
    return QuantSpec(Layout.FP8_CHANNEL, at_load=True, fp8_activations=True, ignore=("lm_head",))


def resolve_spec(checkpoint_spec: QuantSpec | None, quantization: str | None, load_format: str,
                 source: str) -> QuantSpec | None:
    """The spec a model loads with: its checkpoint's, FP8 at load (`quantization="fp8"`), or for dummy
    weights any layout by name."""
    if quantization is None:
        return checkpoint_spec
    if checkpoint_spec is not None:
        raise ConfigError(f"{source} is already quantized ({checkpoint_spec.layout.value}); "
                          f"drop quantization={quantization!r}")
    if quantization == "fp8":
        return at_load_spec()
    if load_format == "dummy":
        from hosttune_engine.quant.dummy_specs import dummy_spec

        return dummy_spec(quantization)
    raise ConfigError(f"quantization={quantization!r} is only for dummy weights; a checkpoint says its own "
                      "layout in config.json, and quantization='fp8' quantizes a bf16 checkpoint at load")
