"""OpenAI request bodies: parsed from decoded JSON into frozen dataclasses, with validation.

A body that breaks a rule raises `ApiError` (HTTP 400) whose message names the
field and what it must be, in vLLM's wording where vLLM has one (the typed
readers are in `fields.py`). Unknown fields are ignored (as vLLM does); known
fields this server does not implement are rejected when set to anything but
their neutral value. Response bodies are built in `responses.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hosttune_engine.errors import ConfigError
from hosttune_engine.sampling import SamplingParams
from hosttune_engine.server.api_errors import bad_request
from hosttune_engine.server.fields import (INT64, describe, is_int, read_bool, read_field, read_int, read_number,
                                           read_object, read_str, read_token_ids, reject_unless)

MAX_LOGPROBS = 20


# -- requests -----------------------------------------------------------------------
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


def _read_stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request(f"stop must be a string or an array of strings, got {describe(body['stop'])}", "stop")
    if any(not s for s in stop):
        raise bad_request("stop strings must not be empty", "stop")
    return tuple(stop)


def _read_stream_options(body: dict, stream: bool) -> bool:
    options = read_object(body, "stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options can only be set when stream is true", "stream_options")
    return read_bool(options, "include_usage", False)


def _read_max_tokens(body: dict, name: str, default: int | None) -> int | None:
    value = read_field(body, name, is_int, "an integer", default)
    if value is not None and value < 1:
        raise bad_request(f"{name} must be at least 1, got {value}.", name)
    return value


def read_options(body: dict, max_tokens: int | None, logprobs: int | None) -> GenerationOptions:
    for name, neutral in (("presence_penalty", (0,)), ("frequency_penalty", (0,)), ("repetition_penalty", (1,)),
                          ("logit_bias", ({},)), ("min_tokens", (0,)), ("suffix", ("",))):
        reject_unless(body, name, neutral)
    n = read_int(body, "n", 1, lo=1, hi=128)
    best_of = read_int(body, "best_of", n)
    if best_of != n:
        raise bad_request("best_of is not supported by this server (it must equal n)", "best_of")
    stream = read_bool(body, "stream", False)
    seed = read_int(body, "seed", None, lo=-INT64, hi=INT64 - 1)
    stop_ids = body.get("stop_token_ids")
    return GenerationOptions(
        model=read_str(body, "model"), n=n, max_tokens=max_tokens,
        temperature=read_number(body, "temperature", 1.0, lo=0),
        top_p=read_number(body, "top_p", 1.0), top_k=read_int(body, "top_k", 0, lo=-1, hi=2**31),
        seed=seed, stop=_read_stop(body),
        stop_token_ids=read_token_ids(stop_ids, "stop_token_ids") if stop_ids is not None else (),
        ignore_eos=read_bool(body, "ignore_eos"), skip_special_tokens=read_bool(body, "skip_special_tokens", True),
        include_stop_str_in_output=read_bool(body, "include_stop_str_in_output"), logprobs=logprobs,
        stream=stream, include_usage=_read_stream_options(body, stream),
        priority=read_int(body, "priority", 0, lo=-INT64, hi=INT64 - 1))


Prompt = str | tuple[int, ...]


@dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple[Prompt, ...]
    options: GenerationOptions

    @classmethod
    def parse(cls, body: dict) -> "CompletionRequest":
        if read_bool(body, "echo"):
            raise bad_request("echo is not supported by this server", "echo")
        prompts = _read_prompts(body.get("prompt"))
        logprobs = read_int(body, "logprobs", None, lo=0, hi=MAX_LOGPROBS)
        return cls(prompts, read_options(body, _read_max_tokens(body, "max_tokens", None), logprobs))


def _read_prompts(prompt) -> tuple[Prompt, ...]:
    """A string, an array of strings, an array of token ids, or an array of token-id arrays."""
    if isinstance(prompt, str):
        return (prompt,)
    expected = "prompt must be a string, an array of strings, an array of token ids or an array of such arrays"
    if not isinstance(prompt, list) or not prompt:
        raise bad_request(f"{expected}; got {describe(prompt)}" if prompt != [] else "prompt must not be empty",
                          "prompt")
    if all(is_int(t) for t in prompt):
        return (read_token_ids(prompt, "prompt"),)
    if all(isinstance(p, str) for p in prompt):
        return tuple(prompt)
    if all(isinstance(p, list) for p in prompt):
        return tuple(read_token_ids(p, "prompt") for p in prompt)
    raise bad_request(expected, "prompt")


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict, ...]
    options: GenerationOptions
    add_generation_prompt: bool = True
    template_kwargs: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, body: dict) -> "ChatRequest":
        messages = read_messages(body.get("messages"))
        tools = body.get("tools")
        if tools and body.get("tool_choice", "auto") != "none":
            raise bad_request("tools are not supported by this server", "tools")
        fmt = read_object(body, "response_format")
        if fmt is not None and fmt.get("type") != "text":
            raise bad_request("response_format other than {\"type\": \"text\"} is not supported", "response_format")
        top = read_int(body, "top_logprobs", None, lo=0, hi=MAX_LOGPROBS)
        if top is not None and not body.get("logprobs"):
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
        logprobs = (top or 0) if read_bool(body, "logprobs") else None
        max_tokens = _read_max_tokens(body, "max_completion_tokens", None) or _read_max_tokens(body, "max_tokens", None)
        return cls(messages, read_options(body, max_tokens, logprobs),
                   read_bool(body, "add_generation_prompt", True), read_object(body, "chat_template_kwargs", {}))


def read_messages(messages) -> tuple[dict, ...]:
    """Chat messages with string roles; content as a string or an array of text parts."""
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"messages must be a non-empty array of objects, got {describe(messages)}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string role", "messages")
        out.append({**m, "content": _message_text(m.get("content"), i)})
    return tuple(out)


def _message_text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise bad_request(f"messages[{i}].content: only text parts are supported", "messages")
        return "\n".join(p["text"] for p in content)
    raise bad_request(f"messages[{i}].content must be a string or an array of text parts", "messages")


@dataclass(frozen=True)
class TokenizeRequest:
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    model: str | None = None

    @classmethod
    def parse(cls, body: dict) -> "TokenizeRequest":
        if ("prompt" in body) == ("messages" in body):
            raise bad_request("give exactly one of prompt (a string) or messages (an array)")
        model = read_str(body, "model")
        if "messages" in body:
            return cls(messages=read_messages(body["messages"]), add_special_tokens=read_bool(body, "add_special_tokens"),
                       add_generation_prompt=read_bool(body, "add_generation_prompt", True), model=model)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request(f"prompt must be a string, got {describe(prompt)}", "prompt")
        return cls(prompt=prompt, add_special_tokens=read_bool(body, "add_special_tokens", True), model=model)


@dataclass(frozen=True)
class DetokenizeRequest:
    tokens: tuple[int, ...]
    model: str | None = None

    @classmethod
    def parse(cls, body: dict) -> "DetokenizeRequest":
        return cls(read_token_ids(body.get("tokens"), "tokens"), read_str(body, "model"))
