"""The model on a host, as placement needs it: does the folder exist, how many attention heads,
how many bytes of weights. Read-only: one `sh -c` round trip, parsed by a pure function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hosttune.transport.base import Transport

# Prints "dir:" when the folder exists, then config.json and the safetensors index between markers, one
# "weights:BYTES NAME" line per safetensors file and one "other:NAME" line per checkpoint file of another
# format. The path arrives as an argument, never as code.
_READ = r"""set -u
m=$1
[ -d "$m" ] || { echo "missing:"; exit 0; }
echo "dir:"
if [ -r "$m/config.json" ]; then echo "config-begin:"; head -c 1000000 -- "$m/config.json"; echo; echo "config-end:"; fi
i="$m/model.safetensors.index.json"
if [ -f "$i" ]; then echo "index-begin:"; head -c 20000000 -- "$i"; echo; echo "index-end:"; fi
for f in "$m"/*.safetensors; do
    [ -f "$f" ] && printf 'weights:%s %s\n' "$(stat -L -c %s -- "$f")" "${f##*/}"
done
for f in "$m"/*.bin "$m"/*.pt "$m"/*.pth; do
    [ -f "$f" ] && printf 'other:%s\n' "${f##*/}"
done
exit 0
"""
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class ModelShape:
    path: str
    exists: bool
    num_heads: int | None = None  # num_attention_heads of config.json
    num_kv_heads: int | None = None  # num_key_value_heads (GQA); the attention heads when absent
    weight_bytes: int | None = None  # all *.safetensors files; None when there are none
    error: str = ""  # why config.json could not be read, when it could not
    architectures: tuple[str, ...] = ()  # config.json's "architectures"
    weight_names: tuple[str, ...] = ()  # the *.safetensors files
    other_weights: tuple[str, ...] = ()  # *.bin, *.pt, *.pth checkpoint files (vLLM and SGLang load them)
    shards: tuple[str, ...] | None = None  # the files INDEX lists; None without an index
    index_error: str = ""  # why INDEX could not be read, when it could not
    quant_unit: int | None = None  # a tensor parallel shard of a row-parallel layer's input is whole units of this
    quant: str = ""  # what those units are, e.g. "awq groups"
    row_inputs: tuple[int, ...] = ()  # the input columns of the row-parallel layers (attention out, MLP down)
    max_positions: int | None = None  # max_position_embeddings of config.json
    quant_method: str = ""  # quantization_config's quant_method ("": not quantized)
    rope_scaled: bool = False  # config.json scales the rotary positions (rope_scaling): the engines stretch them

    @property
    def weight_gb(self) -> float:
        return (self.weight_bytes or 0) / 1e9


def _between(lines: list[str], name: str) -> str | None:
    """The text the read script printed between NAME-begin: and NAME-end:, None when it printed none."""
    if f"{name}-begin:" not in lines:
        return None
    start, end = lines.index(f"{name}-begin:"), len(lines) - 1 - lines[::-1].index(f"{name}-end:")
    return "\n".join(lines[start + 1:end])


def _weights(lines: list[str]) -> dict:
    """The folder's checkpoint files, as ModelShape fields."""
    found = [line[8:].split(" ", 1) for line in lines if line.startswith("weights:")]
    shards, index_error = _shards(_between(lines, "index"))
    return dict(weight_bytes=sum(int(size) for size, _ in found) if found else None,
                weight_names=tuple(name for _, name in found), shards=shards, index_error=index_error,
                other_weights=tuple(line[6:] for line in lines if line.startswith("other:")))


def _shards(text: str | None) -> tuple[tuple[str, ...] | None, str]:
    if text is None:
        return None, ""
    try:
        return tuple(sorted(set(json.loads(text)["weight_map"].values()))), ""
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, f"{INDEX} is not a safetensors index (no weight_map of tensor names to files)"


def parse_model(path: str, text: str) -> ModelShape:
    lines = text.splitlines()
    if "dir:" not in lines:
        return ModelShape(path, False)
    weights = _weights(lines)
    config_text = _between(lines, "config")
    if config_text is None:
        return ModelShape(path, True, error="no readable config.json", **weights)
    try:
        config = json.loads(config_text)
    except ValueError as exc:
        return ModelShape(path, True, error=f"config.json is not JSON ({exc})", **weights)
    archs = config.get("architectures") if isinstance(config, dict) else None
    archs = tuple(str(a) for a in archs) if isinstance(archs, list) else ()
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    heads = _positive(config.get("num_attention_heads"))
    kv = _positive(config.get("num_key_value_heads")) or heads
    return ModelShape(path, True, heads, kv, error="" if heads else "config.json has no num_attention_heads",
                      architectures=archs, row_inputs=_row_inputs(config, heads), **_quant(config), **weights,
                      max_positions=_positive(config.get("max_position_embeddings")),
                      rope_scaled=bool(config.get("rope_scaling")))


def context_problem(model: ModelShape, length: int) -> str:
    """Why an engine refuses a context of `length` tokens at start; "" when it takes it (or cannot be told: no
    positions in config.json, or rope scaling, which vLLM and SGLang stretch them by)."""
    positions = model.max_positions
    if positions is None or model.rope_scaled or length <= positions:
        return ""
    return f"past the {positions} positions of {model.path} (max_position_embeddings in config.json)"


def _quant(config: dict) -> dict:
    """The unit a row-parallel shard of a quantized checkpoint must be whole multiples of: a 4-bit layout's
    group of input columns, an FP8 layout's block of them. vLLM, SGLang and the bundled engine refuse a
    tensor parallel size that cuts one."""
    raw = config.get("quantization_config")
    method = str(raw.get("quant_method", "")) if isinstance(raw, dict) else ""
    if method in ("awq", "gptq"):
        group = _positive(raw.get("group_size", raw.get("q_group_size", 128)))  # -1: one group a row, any split
        return dict(quant_unit=group, quant=f"{method} groups", quant_method=method) if group else dict(
            quant_method=method)
    block = raw.get("weight_block_size") if method == "fp8" else None
    if isinstance(block, list) and len(block) == 2 and _positive(block[1]):
        return dict(quant_unit=block[1], quant="fp8 blocks", quant_method=method)
    return dict(quant_method=method)


def _row_inputs(config: dict, heads: int | None) -> tuple[int, ...]:
    """The attention output projection's inputs (heads × head size) and the MLP down projection's."""
    head_dim = _positive(config.get("head_dim"))
    hidden = _positive(config.get("hidden_size"))
    attention = heads * (head_dim or (hidden // heads if hidden else 0)) if heads else 0
    sizes = (attention, _positive(config.get("intermediate_size")), _positive(config.get("moe_intermediate_size")))
    return tuple(n for n in sizes if n)


def model_problem(model: ModelShape, supported: tuple[str, ...], *, any_format: bool = True,
                  needs_weights: bool = True, quant_methods: tuple[str, ...] = ()) -> str:
    """Why an engine that loads `supported` architectures (() any) cannot load this folder; "" when it can.
    any_format: the engine loads .bin and .pt checkpoints besides safetensors; needs_weights False: it starts
    with random weights (load-format dummy)."""
    if not model.exists:
        return "does not exist on the host"
    if model.error:
        return f"has {model.error}" if model.error.startswith("no ") else f"cannot be loaded: {model.error}"
    if supported and not set(model.architectures) & set(supported):
        named = ", ".join(model.architectures) or "no architecture"
        return f"is {named} (config.json), which the engine does not load (it loads {', '.join(supported)})"
    if quant_methods and model.quant_method and model.quant_method not in quant_methods:
        return (f"is quantized with {model.quant_method} (config.json quantization_config), which the engine does "
                f"not load (it loads {', '.join(quant_methods)})")
    return weights_problem(model, any_format) if needs_weights else ""


def weights_problem(model: ModelShape, any_format: bool) -> str:
    """Why the folder's checkpoint files are not a whole checkpoint; "" when they are."""
    if model.index_error:
        return f"cannot be loaded: {model.index_error}"
    if model.shards is not None:
        missing = sorted(set(model.shards) - set(model.weight_names))
        if missing:
            return (f"lacks {len(missing)} of the {len(model.shards)} shards {INDEX} lists "
                    f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): a copy that has not finished?")
    if model.weight_bytes is not None or (any_format and model.other_weights):  # weight_bytes: the safetensors
        return ""
    kinds = "*.safetensors, *.bin, *.pt or *.pth" if any_format else "*.safetensors"
    return f"has no weights ({kinds}); copy them there, or --set load-format=dummy for random weights"


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_model(transport: Transport, path: str) -> ModelShape:
    return parse_model(path, transport.read_script(_READ, path, what=f"reading the model folder {path}", timeout=60))
