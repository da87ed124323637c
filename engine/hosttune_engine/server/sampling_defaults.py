"""The model's own sampling defaults: what its generation_config.json says a request that leaves temperature,
top_p, top_k, repetition_penalty or min_p out samples with, as vLLM reads it (its `--generation-config auto`).

Only values that differ from transformers' defaults count (vLLM reads the file's diff against them), and
do_sample is not read. max_new_tokens is not applied; `Server` logs what is used once at start.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from hosttune_engine.server.schemas.options import GenerationOptions

# transformers' GenerationConfig defaults: a file's value equal to one of them is no default of the model's
TRANSFORMERS_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0}
NOT_APPLIED = ("max_new_tokens",)
APPLIED = ("temperature", "top_p", "top_k", "repetition_penalty", "min_p")


@dataclass(frozen=True)
class SamplingDefaults:
    """temperature, top_p, top_k, repetition_penalty and min_p for requests that leave them out (None: the API's
    own default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    not_applied: tuple[str, ...] = ()  # "max_new_tokens=64": what the file sets that is not applied
    repetition_penalty: float | None = None
    min_p: float | None = None

    @classmethod
    def read(cls, folder: str | None) -> "SamplingDefaults":
        """From the folder's generation_config.json; none where there is no folder (`--generation-config vllm`) or
        the file is missing or unreadable (the model load names what is wrong with it)."""
        if folder is None:
            return cls()
        try:
            raw = json.loads((Path(folder) / "generation_config.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return cls()
        if not isinstance(raw, dict):
            return cls()
        given = {k: v for k, v in raw.items() if _is_number(v) and TRANSFORMERS_DEFAULTS.get(k) != v}
        top_k = given.get("top_k")
        return cls(_within(given, "temperature", lambda t: t >= 0), _within(given, "top_p", lambda p: 0 < p <= 1),
                   int(top_k) if top_k is not None and float(top_k).is_integer() and top_k >= -1 else None,
                   tuple(f"{k}={given[k]}" for k in NOT_APPLIED if k in given),
                   _within(given, "repetition_penalty", lambda r: r > 0),
                   _within(given, "min_p", lambda m: 0 <= m <= 1))

    def fill(self, options: GenerationOptions) -> GenerationOptions:
        """`options` with the model's default in each of temperature, top_p, top_k, repetition_penalty and min_p
        the request left out."""
        mine = {k: getattr(self, k) for k in options.unset if getattr(self, k) is not None}
        return replace(options, **mine) if mine else options

    def describe(self) -> str | None:
        """One log line on what requests get from the model's file, or None where it gives nothing."""
        used = [f"{k} {getattr(self, k)}" for k in APPLIED if getattr(self, k) is not None]
        if not used and not self.not_applied:
            return None
        line = f"sampling defaults from generation_config.json: {', '.join(used) or 'none used'}"
        if self.not_applied:
            line += f"; not applied: {', '.join(self.not_applied)}"
        return line


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _within(given: dict, name: str, rule) -> float | None:
    """The file's value, where a request could have sent it (else the API's default, as if it were not there)."""
    value = given.get(name)
    return float(value) if value is not None and rule(value) else None
