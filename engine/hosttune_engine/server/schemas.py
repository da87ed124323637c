"""OpenAI request bodies as pydantic models, and the 400 a body that breaks a rule gets.

Each model takes decoded JSON. Null means "use the default", as in OpenAI's API;
unknown fields are ignored (as vLLM does); known fields this server does not
implement are rejected when set to anything but their neutral value. Fields are
checked in the order they are declared and the first fault is the answer: an
`ApiError` (HTTP 400) whose message names the field and what it must be, in
vLLM's wording where vLLM has one, never quoting more than a few characters of
what the client sent. Response bodies are built in `responses.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from hosttune_engine.errors import ConfigError
from hosttune_engine.sampling import SamplingParams
from hosttune_engine.server.api_errors import ApiError, bad_request

INT64 = 2**63
MAX_LOGPROBS = 20
Prompt = str | tuple[int, ...]

# pydantic's error types, as "<name> must be <expected>, got <what was sent>"
_EXPECTED = {"int_type": "an integer", "float_type": "a finite number", "finite_number": "a finite number",
             "bool_type": "a boolean", "string_type": "a string", "dict_type": "an object"}


def describe(value) -> str:
    """A JSON value's type, and a short value for scalars (never the whole input)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {str(value)[:24]}"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def fault(message: str, param: str | None) -> PydanticCustomError:
    """A rule broken inside a validator; `param` is the field the answer names."""
    return PydanticCustomError("api", "{message}", {"message": message, "param": param})


def _as_api_error(error: dict) -> ApiError:
    name = error["loc"][0] if error["loc"] else None
    ctx, kind, value = error.get("ctx") or {}, error["type"], error.get("input")
    if kind == "api":
        return bad_request(ctx["message"], ctx["param"])
    if kind in _EXPECTED:
        return bad_request(f"{name} must be {_EXPECTED[kind]}, got {describe(value)}", name)
    if kind in ("greater_than_equal", "less_than_equal"):
        word, bound = ("least", ctx["ge"]) if "ge" in ctx else ("most", ctx["le"])
        bound = int(bound) if float(bound).is_integer() else bound
        return bad_request(f"{name} must be at {word} {bound}, got {str(value)[:24]}", name)
    return bad_request(f"{name}: {error['msg']}", name)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def token_ids(value, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(_is_int(t) and 0 <= t < INT64 for t in value):
        raise fault(f"{name} must be an array of non-negative integer token ids", name)
    return tuple(value)


def _max_tokens(value: int | None, info: ValidationInfo) -> int | None:
    if value is not None and value < 1:
        raise fault(f"{info.field_name} must be at least 1, got {value}.", info.field_name)
    return value


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, body):
        if not isinstance(body, dict):
            raise fault(f"the request body must be a JSON object, got {describe(body)}", None)
        return {k: v for k, v in cls._whole_body(body).items() if v is not None}

    @classmethod
    def _whole_body(cls, body: dict) -> dict:
        """Rules about the body as a whole, checked before its fields."""
        return body

    @classmethod
    def parse(cls, body):
        try:
            return cls.model_validate(body)
        except ValidationError as e:
            raise _as_api_error(e.errors()[0]) from None


# -- what completions and chat share ---------------------------------------------------------
@dataclass(frozen=True)
class GenerationOptions:
    """What completions and chat share: the model, sampling, stops, streaming and priority."""

    model: str | None = None
    n: int = 1
    max_tokens: int | None = None  # None: up to the context length
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
    stream: bool = False
    include_usage: bool = False
    priority: int = 0  # lower runs first, as in vLLM

    def sampling(self, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
                logprobs=self.logprobs, include_stop_str_in_output=self.include_stop_str_in_output,
                skip_special_tokens=self.skip_special_tokens)
        except ConfigError as e:
            raise bad_request(str(e)) from None


# Fields of OpenAI's or vLLM's API that change what is generated: ignoring one would answer 200 with output the
# client did not ask for, so each is refused unless null or its neutral value. () refuses any value.
UNSUPPORTED = {"presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,),
               "logit_bias": ({},), "min_tokens": (0,), "suffix": ("",), "min_p": (0,), "use_beam_search": (False,),
               "prompt_logprobs": (), "truncate_prompt_tokens": (), "allowed_token_ids": (), "bad_words": ([],),
               "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
               "structured_outputs": ()}


class _Options(_Body):
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Any = None
    min_tokens: Any = None
    suffix: Any = None
    min_p: Any = None
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
    n: int = Field(1, ge=1, le=128)
    best_of: int | None = None
    stream: bool = False
    seed: int | None = Field(None, ge=-INT64, le=INT64 - 1)
    model: str | None = None
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1, le=2**31)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream_options: dict | None = None
    priority: int = Field(0, ge=-INT64, le=INT64 - 1)

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

    @field_validator("stop", mode="plain")
    @classmethod
    def _stop(cls, stop) -> tuple[str, ...]:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise fault(f"stop must be a string or an array of strings, got {describe(stop)}", "stop")
        if any(not s for s in stop):
            raise fault("stop strings must not be empty", "stop")
        return tuple(stop)

    @field_validator("stop_token_ids", mode="plain")
    @classmethod
    def _stop_token_ids(cls, value) -> tuple[int, ...]:
        return token_ids(value, "stop_token_ids")

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, options: dict, info: ValidationInfo) -> dict:
        if not info.data.get("stream", False):
            raise fault("stream_options can only be set when stream is true", "stream_options")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise fault(f"include_usage must be a boolean, got {describe(usage)}", "include_usage")
        return options

    def generation_options(self, max_tokens: int | None, logprobs: int | None) -> GenerationOptions:
        usage = bool((self.stream_options or {}).get("include_usage"))
        same = {f.name: getattr(self, f.name) for f in fields(GenerationOptions) if f.name in type(self).model_fields}
        return GenerationOptions(**{**same, "max_tokens": max_tokens, "logprobs": logprobs, "include_usage": usage})


# -- /v1/completions ---------------------------------------------------------------------------
class _CompletionHead(_Body):
    echo: bool = False
    prompt: Any = Field(None, validate_default=True)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_tokens: int | None = None
    add_special_tokens: bool = True  # the tokenizer's BOS and the like around a text prompt, as vLLM's default

    @field_validator("echo")
    @classmethod
    def _echo(cls, echo: bool) -> bool:
        if echo:
            raise fault("echo is not supported by this server", "echo")
        return echo

    @field_validator("prompt", mode="plain")
    @classmethod
    def _prompts(cls, prompt) -> tuple[Prompt, ...]:
        """A string, an array of strings, an array of token ids, or an array of token-id arrays."""
        if isinstance(prompt, str):
            return (prompt,)
        expected = "prompt must be a string, an array of strings, an array of token ids or an array of such arrays"
        if prompt == []:
            raise fault("prompt must not be empty", "prompt")
        if not isinstance(prompt, list):
            raise fault(f"{expected}; got {describe(prompt)}", "prompt")
        if all(_is_int(t) for t in prompt):
            return (token_ids(prompt, "prompt"),)
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(isinstance(p, list) for p in prompt):
            return tuple(token_ids(p, "prompt") for p in prompt)
        raise fault(expected, "prompt")

    _max_tokens = field_validator("max_tokens")(_max_tokens)


class CompletionRequest(_Options, _CompletionHead):  # checked head first, then the shared options
    @property
    def prompts(self) -> tuple[Prompt, ...]:
        return self.prompt

    @property
    def options(self) -> GenerationOptions:
        return self.generation_options(self.max_tokens, self.logprobs)


# -- /v1/chat/completions --------------------------------------------------------------------------
def read_messages(messages) -> tuple[dict, ...]:
    """Chat messages with string roles; content as a string or an array of text parts."""
    if not isinstance(messages, list) or not messages:
        raise fault(f"messages must be a non-empty array of objects, got {describe(messages)}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise fault(f"messages[{i}] must be an object with a string role", "messages")
        out.append({**m, "content": _message_text(m.get("content"), i)})
    return tuple(out)


def _message_text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise fault(f"messages[{i}].content: only text parts are supported", "messages")
        return "\n".join(p["text"] for p in content)
    raise fault(f"messages[{i}].content must be a string or an array of text parts", "messages")


class _ChatHead(_Body):
    messages: Any = Field(None, validate_default=True)
    tool_choice: Any = "auto"
    tools: Any = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    logprobs: bool = Field(False, validate_default=True)
    max_completion_tokens: int | None = None
    max_tokens: int | None = None

    @field_validator("messages", mode="plain")
    @classmethod
    def _messages(cls, messages) -> tuple[dict, ...]:
        return read_messages(messages)

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools, info: ValidationInfo):
        if tools and info.data.get("tool_choice") != "none":
            raise fault("tools are not supported by this server", "tools")
        return tools

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs(cls, logprobs, info: ValidationInfo):
        if info.data.get("top_logprobs") is not None and not logprobs:
            raise fault("top_logprobs needs logprobs set to true", "top_logprobs")
        return logprobs

    _max_completion_tokens = field_validator("max_completion_tokens")(_max_tokens)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens_unless_completion_tokens(cls, value, info: ValidationInfo):
        return None if info.data.get("max_completion_tokens") is not None else value

    _max_tokens = field_validator("max_tokens")(_max_tokens)


CHAT_UNSUPPORTED = {"continue_final_message": (False,), "echo": (False,), "chat_template": ()}  # as UNSUPPORTED


class _ChatTail(_Body):
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # the template writes BOS itself where the model wants one, as in vLLM
    chat_template_kwargs: dict = Field(default_factory=dict)
    continue_final_message: Any = None
    echo: Any = None
    chat_template: Any = None

    @field_validator(*CHAT_UNSUPPORTED, mode="plain")
    @classmethod
    def _chat_neutral(cls, value, info: ValidationInfo):  # its own name: validators of one name override
        if value not in CHAT_UNSUPPORTED[info.field_name]:
            raise fault(f"{info.field_name} is not supported by this server", info.field_name)
        return value


class ChatRequest(_ChatTail, _Options, _ChatHead):  # checked head, shared options, tail
    @property
    def template_kwargs(self) -> dict:
        return self.chat_template_kwargs

    @property
    def options(self) -> GenerationOptions:
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self.generation_options(self.max_completion_tokens or self.max_tokens, logprobs)


# -- /tokenize and /detokenize ----------------------------------------------------------------------
class TokenizeRequest(_Body):
    is_chat: bool = False  # set from the body's keys: messages given, not a prompt
    model: str | None = None
    messages: Any = Field(None, validate_default=True)
    prompt: Any = Field(None, validate_default=True)
    add_special_tokens: bool = Field(None, validate_default=True)  # unset: True for a prompt, False for messages
    add_generation_prompt: bool = True

    @classmethod
    def _whole_body(cls, body: dict) -> dict:
        if ("prompt" in body) == ("messages" in body):
            raise fault("give exactly one of prompt (a string) or messages (an array)", None)
        return {**body, "is_chat": "messages" in body}

    @field_validator("messages", mode="plain")
    @classmethod
    def _messages(cls, messages, info: ValidationInfo):
        return read_messages(messages) if info.data["is_chat"] else None

    @field_validator("prompt", mode="plain")
    @classmethod
    def _prompt(cls, prompt, info: ValidationInfo):
        if info.data["is_chat"]:
            return None
        if not isinstance(prompt, str):
            raise fault(f"prompt must be a string, got {describe(prompt)}", "prompt")
        return prompt

    @field_validator("add_special_tokens", mode="before")
    @classmethod
    def _special_tokens(cls, value, info: ValidationInfo):
        return (not info.data["is_chat"]) if value is None else value

    @field_validator("add_generation_prompt", mode="before")
    @classmethod
    def _generation_prompt_for_chat(cls, value, info: ValidationInfo):
        return value if info.data.get("is_chat") else True  # a prompt's body is not checked for it


class DetokenizeRequest(_Body):
    tokens: Any = Field(None, validate_default=True)
    model: str | None = None

    @field_validator("tokens", mode="plain")
    @classmethod
    def _tokens(cls, tokens) -> tuple[int, ...]:
        return token_ids(tokens, "tokens")
