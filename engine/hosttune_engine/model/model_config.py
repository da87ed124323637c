"""The parts of a Hugging Face config.json the engine uses, validated."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hosttune_engine.errors import ConfigError, ModelLoadError, UnsupportedModelError
from hosttune_engine.quant.spec import QuantSpec, parse_quantization_config

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_proj_bias: bool
    dtype: str | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    quantization: QuantSpec | None = None  # from quantization_config; None for plain weights

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        folder = Path(folder)
        path = folder / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder} has no config.json; point `model` at a Hugging Face model folder")
        raw = _read_json(path)
        generation = folder / "generation_config.json"
        if generation.is_file():
            settings = _read_json(generation)
            if not isinstance(settings, dict):
                raise ModelLoadError(f"{generation}: holds a JSON {type(settings).__name__}, not an object of "
                                     "generation settings")
            eos = settings.get("eos_token_id")
            if eos is not None:
                raw = {**raw, "eos_token_id": _as_list(raw.get("eos_token_id")) + _as_list(eos)}
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{source}: holds a JSON {type(raw).__name__}, not an object of model fields; "
                                 "point `model` at a Hugging Face model folder")
        raw = {k: v for k, v in raw.items() if v is not None}  # null is absent, as Hugging Face reads it
        _check_types(raw, source)
        arch = (raw.get("architectures") or [None])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        _check_unsupported_features(raw, arch, source)
        get = _getter(raw, source)
        heads = get("num_attention_heads")
        rope = raw.get("rope_parameters") or {}
        scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        _check_rope_scaling(scaling, source)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        return cls(
            architecture=arch,
            vocab_size=get("vocab_size"),
            hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"),
            num_layers=get("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or get("hidden_size") // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(_number(raw.get("rope_theta", rope.get("rope_theta", 10000.0)), "rope_theta", source)),
            rope_scaling=scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or bool(raw.get("attention_bias", False)),
            o_proj_bias=not is_qwen2 and bool(raw.get("attention_bias", False)),
            dtype=raw.get("torch_dtype") or raw.get("dtype"),
            eos_token_ids=tuple(dict.fromkeys(_as_list(raw.get("eos_token_id")))),
            bos_token_id=raw.get("bos_token_id"),
            quantization=parse_quantization_config(raw.get("quantization_config"), source),
        )._validated(source)

    def context_length(self, max_model_len: int | None) -> int:
        """`max_model_len`, or the model's positions; past them its rotary table ends, so a longer one is refused."""
        positions = self.max_position_embeddings
        if max_model_len is not None and max_model_len > positions:
            raise ConfigError(f"max_model_len={max_model_len} is past the model's {positions} positions "
                              f"(max_position_embeddings in config.json); give at most {positions}")
        return max_model_len or positions

    def _validated(self, source: str) -> "ModelConfig":
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"{source}: {self.num_heads} attention heads do not divide into "
                                 f"{self.num_kv_heads} key/value heads")
        if self.head_dim % 2:
            raise ModelLoadError(f"{source}: head_dim {self.head_dim} must be even for rotary embeddings")
        return self


def _check_unsupported_features(raw: dict, arch: str, source: str) -> None:
    if raw.get("use_sliding_window"):
        raise UnsupportedModelError(f"{source}: sliding-window attention is not supported")
    if raw.get("mlp_bias"):
        raise UnsupportedModelError(f"{source}: MLP biases (mlp_bias) are not supported")
    act = raw.get("hidden_act", "silu")
    if act not in SILU_NAMES:  # the MLP is SwiGLU: another activation would run as silu and serve wrong tokens
        raise UnsupportedModelError(f"{source}: hidden_act {act!r} is not supported; the MLP runs silu (SwiGLU)")


SILU_NAMES = ("silu", "swish")  # Hugging Face's names of the same function

SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings")
SWITCH_FIELDS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
OBJECT_FIELDS = ("quantization_config", "rope_scaling", "rope_parameters")


def _check_types(raw: dict, source: str) -> None:
    """Sizes are positive integers, nested settings objects, token ids integers; optional ones may be absent."""
    for key in SIZE_FIELDS:
        value = raw.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise ModelLoadError(f"{source}: {key} must be a positive integer, got {value!r}; fix config.json")
    for key in OBJECT_FIELDS:
        value = raw.get(key)
        if value is not None and not isinstance(value, dict):
            raise ModelLoadError(f"{source}: {key} must be an object of settings, got {value!r}; fix config.json")
    for key in SWITCH_FIELDS:
        if key in raw and type(raw[key]) is not bool and raw[key] not in (0, 1):  # 0 and 1: as Python reads them
            raise ModelLoadError(f"{source}: {key} must be true or false, got {raw[key]!r}; fix config.json")
    if not isinstance(raw.get("architectures", []), list):
        raise ModelLoadError(f"{source}: architectures must be an array of names, got {raw['architectures']!r}")
    _number(raw.get("rms_norm_eps", 1e-6), "rms_norm_eps", source)
    if not all(_is_token_id(t) for t in _as_list(raw.get("eos_token_id"))):
        raise ModelLoadError(f"{source}: eos_token_id must be a token id or an array of them, got "
                             f"{raw['eos_token_id']!r}; fix config.json")
    if not _is_token_id(raw.get("bos_token_id", 0)):
        raise ModelLoadError(f"{source}: bos_token_id must be a token id, got {raw['bos_token_id']!r}; fix config.json")


ROPE_SCALING_FIELDS = {"default": (), "linear": ("factor",),  # what layers/rotary.py reads of each kind
                       "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _check_rope_scaling(scaling: dict | None, source: str) -> None:
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in ROPE_SCALING_FIELDS:
        raise UnsupportedModelError(f"{source}: rope scaling type {kind!r} is not supported "
                                    f"({', '.join(ROPE_SCALING_FIELDS)} are)")
    for key in ROPE_SCALING_FIELDS[kind]:
        value = scaling.get(key)
        if type(value) not in (int, float) or not value > 0:
            raise ModelLoadError(f"{source}: rope_scaling {kind} needs {key}, a positive number; got {value!r}")


def _is_token_id(value) -> bool:
    return type(value) is int and value >= 0


def _number(value, key: str, source: str) -> float:
    if type(value) not in (int, float) or not value > 0:
        raise ModelLoadError(f"{source}: {key} must be a positive number, got {value!r}; fix config.json")
    return value


def _getter(raw: dict, source: str):
    def get(key: str):
        if key not in raw:
            raise ModelLoadError(f"{source}: required field {key!r} is missing")
        return raw[key]

    return get


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON: {e}") from e
