"""The bodies of /tokenize (a prompt or chat messages) and /detokenize (token ids)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from hosttune_engine.server.schemas.body import Boolean, RequestBody, describe, fault, token_ids
from hosttune_engine.server.schemas.chat import continue_final, read_messages, read_template_kwargs


class TokenizeRequest(RequestBody):
    """A /tokenize body: exactly one of a prompt (a string) or messages (an array)."""

    is_chat: bool = False  # set from the body's keys: messages given, not a prompt
    model: str | None = None
    messages: Any = Field(None, validate_default=True)
    prompt: Any = Field(None, validate_default=True)
    add_special_tokens: Boolean = Field(None, validate_default=True)  # unset: True for a prompt, False for messages
    add_generation_prompt: Boolean = True
    chat_template_kwargs: dict = Field(default_factory=dict)  # as chat's, so messages count as chat reads them
    continue_final_message: Boolean = False  # as chat's

    @classmethod
    def _whole_body(cls, body: dict) -> dict:
        if ("prompt" in body) == ("messages" in body):
            raise fault("give exactly one of prompt (a string) or messages (an array)", None)
        return {**body, "is_chat": "messages" in body}

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, kwargs: dict):
        return read_template_kwargs(kwargs)

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


    @field_validator("continue_final_message")
    @classmethod
    def _continue_final(cls, value: bool, info: ValidationInfo) -> bool:
        return continue_final(value, info) if info.data.get("is_chat") else False


class DetokenizeRequest(RequestBody):
    """A /detokenize body: the token ids to turn back into text."""

    tokens: Any = Field(None, validate_default=True)
    model: str | None = None

    @field_validator("tokens", mode="plain")
    @classmethod
    def _tokens(cls, tokens) -> tuple[int, ...]:
        return token_ids(tokens, "tokens")
