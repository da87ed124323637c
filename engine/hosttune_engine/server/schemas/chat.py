"""The body of /v1/chat/completions: its messages, tools and logprobs, the shared fields, then the template's.

`read_messages` also reads the messages /tokenize takes.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from hosttune_engine.server.schemas.body import Boolean, Integer, RequestBody, describe, fault, positive_max_tokens
from hosttune_engine.server.schemas.options import MAX_LOGPROBS, GenerationFields, GenerationOptions


def read_messages(messages) -> tuple[dict, ...]:
    """Chat messages with string roles; content as a string or an array of text parts."""
    if not isinstance(messages, list):
        raise fault(f"messages must be a non-empty array of objects, got {describe(messages)}", "messages")
    if not messages:
        raise fault("messages must not be empty", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise fault(f"messages[{i}] must be an object with a string role", "messages")
        out.append({**m, "content": _message_text(m.get("content"), i)})
    return tuple(out)


def read_template_kwargs(kwargs: dict) -> dict:
    """The chat template's own arguments (bos_token, a template's flags); the messages are the request's."""
    if "messages" in kwargs:
        raise fault("chat_template_kwargs must not set messages; send them as the request's messages",
                    "chat_template_kwargs")
    return kwargs


def continue_final(value: bool, info: ValidationInfo) -> bool:
    """A validator for continue_final_message: not with add_generation_prompt, which would open a new message
    after the one to continue (vLLM's rule and words)."""
    if value and info.data.get("add_generation_prompt", True):
        raise fault("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                    "continue_final_message")
    return value


def _message_text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise fault(f"messages[{i}].content: only text parts are supported", "messages")
        return "\n".join(p["text"] for p in content)
    raise fault(f"messages[{i}].content must be a string or an array of text parts", "messages")


class _ChatHead(RequestBody):
    messages: Any = Field(None, validate_default=True)
    tool_choice: Any = "auto"
    tools: Any = None
    top_logprobs: Integer | None = Field(None, ge=0, le=MAX_LOGPROBS)
    logprobs: Boolean = Field(False, validate_default=True)
    max_completion_tokens: Integer | None = None
    max_tokens: Integer | None = None

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

    _max_completion_tokens = field_validator("max_completion_tokens")(positive_max_tokens)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens_unless_completion_tokens(cls, value, info: ValidationInfo):
        return None if info.data.get("max_completion_tokens") is not None else value

    _max_tokens = field_validator("max_tokens")(positive_max_tokens)


CHAT_UNSUPPORTED = {"echo": (False,), "chat_template": ()}  # as UNSUPPORTED


class _ChatTail(RequestBody):
    add_generation_prompt: Boolean = True
    add_special_tokens: Boolean = False  # the template writes BOS itself where the model wants one, as in vLLM
    chat_template_kwargs: dict = Field(default_factory=dict)
    continue_final_message: Boolean = False  # the prompt ends inside the final message, which the model continues
    echo: Any = None
    chat_template: Any = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, kwargs: dict):
        return read_template_kwargs(kwargs)

    _continue_final = field_validator("continue_final_message")(continue_final)

    @field_validator(*CHAT_UNSUPPORTED, mode="plain")
    @classmethod
    def _chat_neutral(cls, value, info: ValidationInfo):  # its own name: validators of one name override
        if value not in CHAT_UNSUPPORTED[info.field_name]:
            raise fault(f"{info.field_name} is not supported by this server", info.field_name)
        return value


class ChatRequest(_ChatTail, GenerationFields, _ChatHead):  # checked head, shared options, tail
    """A /v1/chat/completions body, parsed with `ChatRequest.parse(body)`."""

    @property
    def template_kwargs(self) -> dict:
        return self.chat_template_kwargs

    @property
    def options(self) -> GenerationOptions:
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        if self.max_completion_tokens is not None:
            return self.generation_options(self.max_completion_tokens, logprobs, "max_completion_tokens")
        return self.generation_options(self.max_tokens, logprobs)
