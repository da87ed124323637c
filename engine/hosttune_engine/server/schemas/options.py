"""The fields completions and chat share, and the `GenerationOptions` they become.

Known fields this server does not implement are refused when set to anything but
their neutral value (`UNSUPPORTED`), so a client never gets a 200 with output it
did not ask for. Each endpoint's model puts these fields after its own head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from hosttune_engine.errors import ConfigError
from hosttune_engine.sampling import SamplingParams
from hosttune_engine.server.api_errors import bad_request
from hosttune_engine.stop_strings import StopStrings
from hosttune_engine.server.schemas.body import (INT64, Boolean, Integer, RequestBody, zero_or_one, describe, fault,
                                                  token_ids)

MAX_LOGPROBS = 20
# where a model's generation_config.json has a say
DEFAULTED = frozenset({"temperature", "top_p", "top_k", "repetition_penalty", "min_p"})


@dataclass(frozen=True)
class GenerationOptions:
    """What completions and chat share: the model, sampling, stops, streaming and priority."""

    model: str | None = None
    n: int = 1
    max_tokens: int | None = None  # None: up to the context length, or default_max_tokens
    default_max_tokens: int | None = None  # where max_tokens is None: at most this many (None: the context length)
    max_tokens_field: str = "max_tokens"  # the body's field that set it, which a context error names
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # usage in every chunk too, as vLLM's stream_options.continuous_usage_stats
    priority: int = 0  # lower runs first, as in vLLM
    return_token_ids: bool = False  # the prompt's and each choice's token ids in the response, as vLLM's field
    unset: frozenset[str] = frozenset()  # of DEFAULTED, those the request left out: the model's defaults fill them

    def sampling(self, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
                logprobs=self.logprobs, include_stop_str_in_output=self.include_stop_str_in_output,
                skip_special_tokens=self.skip_special_tokens, presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
                min_p=self.min_p, min_tokens=self.min_tokens, logit_bias=self.logit_bias)
        except ConfigError as e:
            raise bad_request(str(e)) from None


# Fields of OpenAI's or vLLM's API that change what is generated: ignoring one would answer 200 with output the
# client did not ask for, so each is refused unless null or its neutral value. () refuses any value.
UNSUPPORTED = {"suffix": ("",), "use_beam_search": (False,),
               "prompt_logprobs": (), "truncate_prompt_tokens": (), "allowed_token_ids": (), "bad_words": ([],),
               "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
               "structured_outputs": ()}


class GenerationFields(RequestBody):
    """The shared fields as they come in a body; `generation_options` turns them into `GenerationOptions`."""

    suffix: Any = None
    use_beam_search: Any = None
    prompt_logprobs: Any = None
    truncate_prompt_tokens: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    response_format: dict | None = None
    n: Integer = Field(1, ge=1, le=128)
    best_of: Integer | None = None
    stream: Boolean = False
    seed: Integer | None = Field(None, ge=-INT64, le=INT64 - 1)
    model: str | None = None
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, allow_inf_nan=False)
    top_k: Integer = Field(0, ge=-1, le=2**31)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: Boolean = False
    skip_special_tokens: Boolean = True
    include_stop_str_in_output: Boolean = False
    stream_options: dict | None = None
    priority: Integer = Field(0, ge=-INT64, le=INT64 - 1)
    return_token_ids: Boolean = False
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, allow_inf_nan=False)
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    min_tokens: Integer = Field(0, ge=0, le=INT64 - 1)
    logit_bias: Any = ()

    @field_validator(*UNSUPPORTED, mode="plain")
    @classmethod
    def _neutral(cls, value, info: ValidationInfo):
        if value not in UNSUPPORTED[info.field_name]:
            raise fault(f"{info.field_name} is not supported by this server", info.field_name)
        return value

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, fmt: dict) -> dict:
        if fmt.get("type") != "text":
            raise fault("response_format other than {\"type\": \"text\"} is not supported", "response_format")
        return fmt

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value: int, info: ValidationInfo) -> int:
        if value != info.data.get("n", 1):
            raise fault("best_of is not supported by this server (it must equal n)", "best_of")
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, top_p: float) -> float:
        if not 0 < top_p <= 1:
            raise fault(f"top_p must be in (0, 1], got {top_p}.", "top_p")
        return top_p

    @field_validator("repetition_penalty")
    @classmethod
    def _repetition_penalty(cls, penalty: float) -> float:
        if not penalty > 0:
            raise fault(f"repetition_penalty must be greater than zero, got {penalty:g}.", "repetition_penalty")
        return penalty

    @field_validator("logit_bias", mode="plain")
    @classmethod
    def _logit_bias(cls, bias) -> tuple[tuple[int, float], ...]:
        """{"token id": bias}; each bias within [-100, 100] (clamped, as vLLM), ids checked against the vocabulary
        once the model is known."""
        if not isinstance(bias, dict):
            raise fault(f"logit_bias must be an object of token ids to biases, got {describe(bias)}", "logit_bias")
        pairs = []
        for key, value in bias.items():
            if not (key.isascii() and key.isdigit() and len(key) < 20):
                raise fault(f"logit_bias keys must be token ids (non-negative integers), got {key[:24]!r}",
                            "logit_bias")
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
                raise fault(f"logit_bias[{key}] must be a finite number, got {describe(value)}", "logit_bias")
            pairs.append((int(key), max(-100.0, min(100.0, float(value)))))
        return tuple(pairs)

    @field_validator("stop", mode="plain")
    @classmethod
    def _stop(cls, stop) -> StopStrings:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise fault(f"stop must be a string or an array of strings, got {describe(stop)}", "stop")
        if any(not s for s in stop):
            raise fault("stop strings must not be empty", "stop")
        indexed = StopStrings(stop)  # indexed here: a big body is parsed off the event loop and the engine thread
        if (costly := indexed.too_costly()) is not None:
            raise fault(costly, "stop")
        return indexed

    @field_validator("stop_token_ids", mode="plain")
    @classmethod
    def _stop_token_ids(cls, value) -> tuple[int, ...]:
        return token_ids(value, "stop_token_ids")

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, options: dict, info: ValidationInfo) -> dict:
        if not info.data.get("stream", False):
            raise fault("stream_options can only be set when stream is true", "stream_options")
        for name in ("include_usage", "continuous_usage_stats"):
            value = options.get(name)
            if value is not None and not isinstance(zero_or_one(value), bool):
                raise fault(f"stream_options.{name} must be a boolean, got {describe(value)}", f"stream_options.{name}")
        return options

    def generation_options(self, max_tokens: int | None, logprobs: int | None,
                           max_tokens_field: str = "max_tokens") -> GenerationOptions:
        stream_options = self.stream_options or {}
        usage = bool(stream_options.get("include_usage"))
        continuous = usage and bool(stream_options.get("continuous_usage_stats"))  # as in vLLM: only with usage
        same = {f.name: getattr(self, f.name) for f in fields(GenerationOptions) if f.name in type(self).model_fields}
        return GenerationOptions(**{**same, "max_tokens": max_tokens, "max_tokens_field": max_tokens_field,
                                    "logprobs": logprobs, "include_usage": usage, "continuous_usage": continuous,
                                    "unset": DEFAULTED - self.model_fields_set})
