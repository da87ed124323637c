"""The body of /v1/completions: its prompts, echo, logprobs and max_tokens, then the shared fields."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field, field_validator

from hosttune_engine.server.schemas.body import (Boolean, Integer, RequestBody, describe, fault, is_int,
                                                  positive_max_tokens, token_ids)
from hosttune_engine.server.schemas.options import MAX_LOGPROBS, GenerationFields, GenerationOptions

Prompt = str | tuple[int, ...]
DEFAULT_MAX_TOKENS = 16  # vLLM's, for a completion that leaves max_tokens out (as many as the context leaves)


class _CompletionHead(RequestBody):
    NULL_IS_A_VALUE = frozenset({"max_tokens"})  # as in vLLM: left out, 16; null, up to the context length

    echo: Boolean = False
    prompt: Any = Field(None, validate_default=True)
    logprobs: Integer | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_tokens: Integer | None = None
    add_special_tokens: Boolean = True  # the tokenizer's BOS and the like around a text prompt, as vLLM's default

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
        if all(is_int(t) for t in prompt):
            return (token_ids(prompt, "prompt"),)
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(isinstance(p, list) for p in prompt):
            return tuple(token_ids(p, "prompt") for p in prompt)
        raise fault(expected, "prompt")

    _max_tokens = field_validator("max_tokens")(positive_max_tokens)


class CompletionRequest(GenerationFields, _CompletionHead):  # checked head first, then the shared options
    """A /v1/completions body, parsed with `CompletionRequest.parse(body)`."""

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        return self.prompt

    @property
    def options(self) -> GenerationOptions:
        left_out = "max_tokens" not in self.model_fields_set
        return replace(self.generation_options(self.max_tokens, self.logprobs),
                       default_max_tokens=DEFAULT_MAX_TOKENS if left_out else None)
