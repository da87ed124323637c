"""The model on a host, as placement needs it: does the folder exist, how many attention heads,
how many bytes of weights. Read-only: one `sh -c` round trip, parsed by a pure function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hosttune.transport.base import Transport

# Prints "dir:" when the folder exists, then config.json between markers, then one
# "weights:BYTES NAME" line per safetensors file. The path arrives as an argument, never as code.
_READ = r"""set -u
m=$1
[ -d "$m" ] || { echo "missing:"; exit 0; }
echo "dir:"
if [ -r "$m/config.json" ]; then echo "config-begin:"; head -c 1000000 -- "$m/config.json"; echo; echo "config-end:"; fi
for f in "$m"/*.safetensors; do
    [ -f "$f" ] && printf 'weights:%s %s\n' "$(stat -L -c %s -- "$f")" "${f##*/}"
done
exit 0
"""


@dataclass(frozen=True)
class ModelShape:
    path: str
    exists: bool
    num_heads: int | None = None  # num_attention_heads of config.json
    num_kv_heads: int | None = None  # num_key_value_heads (GQA); the attention heads when absent
    weight_bytes: int | None = None  # all *.safetensors files; None when there are none
    error: str = ""  # why config.json could not be read, when it could not
    architectures: tuple[str, ...] = ()  # config.json's "architectures"

    @property
    def weight_gb(self) -> float:
        return (self.weight_bytes or 0) / 1e9


def parse_model(path: str, text: str) -> ModelShape:
    lines = text.splitlines()
    if "dir:" not in lines:
        return ModelShape(path, False)
    sizes = [int(line[8:].split(" ", 1)[0]) for line in lines if line.startswith("weights:")]
    weights = sum(sizes) if sizes else None
    if "config-begin:" not in lines:
        return ModelShape(path, True, weight_bytes=weights, error="no readable config.json")
    start, end = lines.index("config-begin:"), len(lines) - 1 - lines[::-1].index("config-end:")
    try:
        config = json.loads("\n".join(lines[start + 1:end]))
    except ValueError as exc:
        return ModelShape(path, True, weight_bytes=weights, error=f"config.json is not JSON ({exc})")
    archs = config.get("architectures") if isinstance(config, dict) else None
    archs = tuple(str(a) for a in archs) if isinstance(archs, list) else ()
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    heads = _positive(config.get("num_attention_heads"))
    kv = _positive(config.get("num_key_value_heads")) or heads
    return ModelShape(path, True, heads, kv, weights, "" if heads else "config.json has no num_attention_heads", archs)


def model_problem(model: ModelShape, supported: tuple[str, ...]) -> str:
    """Why an engine that loads `supported` architectures (() any) cannot load this folder; "" when it can."""
    if not model.exists:
        return "does not exist on the host"
    if model.error:
        return f"has {model.error}" if model.error.startswith("no ") else f"cannot be loaded: {model.error}"
    if supported and not set(model.architectures) & set(supported):
        named = ", ".join(model.architectures) or "no architecture"
        return f"is {named} (config.json), which the engine does not load (it loads {', '.join(supported)})"
    return ""


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_model(transport: Transport, path: str) -> ModelShape:
    return parse_model(path, transport.read_script(_READ, path, what=f"reading the model folder {path}", timeout=60))
