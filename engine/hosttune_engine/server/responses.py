"""OpenAI response bodies: completions, chat completions, their stream chunks, usage, logprobs, errors.

Each builder returns a plain dict in the field order of OpenAI's API (and
vLLM's extras: `stop_reason`, and the token ids `with_token_ids` adds); `dumps`
turns one into compact JSON bytes.
Requests are parsed by the models in `schemas/`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hosttune_engine.server.api_errors import ApiError

MIN_LOGPROB = -9999.0  # JSON has no -Infinity; vLLM clamps the same way


def dumps(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


def error_body(err: ApiError) -> dict:
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.status}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


@dataclass(frozen=True)
class TokenText:
    """A token as logprobs show it: its text (U+FFFD where it holds part of a character) and its own bytes."""

    text: str
    raw: bytes


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token and its log-probability, with the most likely alternatives."""

    token: TokenText
    logprob: float
    top: tuple[tuple[TokenText, float], ...] = ()


def _lp(value: float) -> float:
    return max(value, MIN_LOGPROB)


def completion_logprobs(entries: list[LogprobEntry], text_offset: int = 0) -> dict:
    """The legacy completions format; `text_offset` is where the first token starts in the choice's text."""
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token.text)
    return {"tokens": [e.token.text for e in entries], "token_logprobs": [_lp(e.logprob) for e in entries],
            "top_logprobs": [_with_sampled(e) for e in entries], "text_offset": offsets}


def _with_sampled(e: LogprobEntry) -> dict:
    # OpenAI's legacy format: the best alternatives and the sampled token, so up to logprobs + 1 entries
    return {**{t.text: _lp(lp) for t, lp in e.top}, e.token.text: _lp(e.logprob)}


def chat_logprobs(entries: list[LogprobEntry]) -> dict:
    def item(token: TokenText, lp: float) -> dict:
        return {"token": token.text, "logprob": _lp(lp), "bytes": list(token.raw)}

    return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries]}


def with_token_ids(body: dict, token_ids=None, prompt_token_ids=None) -> dict:
    """`body` (a choice, chunk or response) with vLLM's `return_token_ids` fields: `prompt_token_ids`, the prompt
    as the model read it, and `token_ids`, the tokens generated (in a stream, those this chunk adds). A field left
    None is left out."""
    ids = {"prompt_token_ids": prompt_token_ids, "token_ids": token_ids}
    return {**body, **{k: list(v) for k, v in ids.items() if v is not None}}


# -- whole responses --------------------------------------------------------------------
def completion_choice(index: int, text: str, logprobs: dict | None, finish_reason, stop_reason) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def chat_choice(index: int, text: str, logprobs: dict | None, finish_reason, stop_reason) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason, "stop_reason": stop_reason}


def completion(request_id: str, created: int, model: str, choices: list[dict], usage_body: dict) -> dict:
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": usage_body}


def chat_completion(request_id: str, created: int, model: str, choices: list[dict], usage_body: dict) -> dict:
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage_body}


# -- stream chunks ------------------------------------------------------------------------
def completion_chunk(request_id: str, created: int, model: str, choices: list[dict],
                     with_usage: bool = False, usage_body: dict | None = None) -> dict:
    body = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if with_usage:  # with include_usage every chunk carries usage: null (or its counts so far), the last the totals
        body["usage"] = usage_body
    return body


def chat_chunk(request_id: str, created: int, model: str, choices: list[dict],
               with_usage: bool = False, usage_body: dict | None = None) -> dict:
    body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices}
    if with_usage:
        body["usage"] = usage_body
    return body


def chat_delta_choice(index: int, delta: dict, logprobs: dict | None, finish_reason=None, stop_reason=None) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def model_list(names: tuple[str, ...], root: str, max_model_len: int | None, created: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "hosttune",
                                        "root": root, "parent": None, "max_model_len": max_model_len}
                                       for name in names]}
