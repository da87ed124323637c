"""The generation endpoints: /v1/completions and /v1/chat/completions, streamed (SSE) or whole.

A request meets its gates in this order: body and fields (400), model name
(404), server phase (503), admission (429), prompt length (400). Only then
does anything reach the engine loop. However the handler ends (done, client
gone, error), what is left of its sequences is aborted and its slots returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from hosttune_engine.errors import RequestError
from hosttune_engine.server import responses as r
from hosttune_engine.server.bodies import json_response, read_body
from hosttune_engine.server.engine_client import EngineDeadError
from hosttune_engine.server.generation import Choice, Generation
from hosttune_engine.server.api_errors import ApiError, bad_request
from hosttune_engine.server.schemas.chat import ChatRequest
from hosttune_engine.server.schemas.completion import CompletionRequest
from hosttune_engine.server.schemas.options import GenerationOptions
from hosttune_engine.server.state import STATE, ServerState
from hosttune_engine.server.streaming import DONE, ChunkWriter, sse

CLIENT_CLOSED = 499  # nginx's status for a client that went away; only ever logged


@dataclass(frozen=True)
class _Kind:
    id_prefix: str
    chat: bool
    what: str  # how context errors name the prompt


COMPLETION = _Kind("cmpl", False, "prompt")
CHAT = _Kind("chatcmpl", True, "messages")


async def create_completion(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions"""
    arrival = time.monotonic()
    state = request.app[STATE]
    req = await read_body(request, CompletionRequest)

    async def encode():
        return [await state.usable_prompts().encode(p, req.add_special_tokens, within_context=True)
                for p in req.prompts]

    text = req.prompts[0] if isinstance(req.prompts[0], str) else None
    return await _generate(request, state, COMPLETION, req.options, len(req.prompts), encode, text, arrival)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions"""
    arrival = time.monotonic()
    state = request.app[STATE]
    req = await read_body(request, ChatRequest)

    async def encode():
        return [await state.usable_prompts().encode_chat(req.messages, req.add_generation_prompt,
                                                         req.template_kwargs, req.add_special_tokens,
                                                         within_context=True,
                                                         continue_final=req.continue_final_message)]

    text = req.messages[-1]["content"]
    return await _generate(request, state, CHAT, req.options, 1, encode, text, arrival)


async def _generate(request, state: ServerState, kind: _Kind, options: GenerationOptions, num_prompts: int,
                    encode, prompt_text: str | None, arrival: float) -> web.StreamResponse:
    state.check_model(options.model)
    state.check_serving()
    options = state.sampling_defaults.fill(options)
    with state.admitted(options.n, num_prompts):
        prompts = await encode()
        builder = state.usable_prompts()
        builder.check_logprobs(options.logprobs)
        builder.check_logit_bias(options.logit_bias)
        samplings = [options.sampling(builder.max_tokens_for(len(p), options.max_tokens, options.default_max_tokens,
                                                             kind.what, options.max_tokens_field)) for p in prompts]
        request_id = state.new_request_id(kind.id_prefix)
        gen = Generation(state.client, request_id, prompts, samplings, options.n, options.priority, arrival,
                         state.shown_request_id(kind.id_prefix, request.headers.get("X-Request-Id")))
        status = CLIENT_CLOSED
        state.generations.add(gen)
        try:
            gen.start()
            if options.stream:
                response = await _stream(request, state, kind, options, gen)
            else:
                response = json_response(await _collect(state, kind, gen, options.return_token_ids))
            status = 200
            return response
        except ApiError as e:
            status = e.status
            raise
        finally:
            gen.abort()
            state.finish(gen, status, prompt_text)


def _as_api_error(error: Exception) -> ApiError:
    if isinstance(error, RequestError):
        return bad_request(str(error))
    if isinstance(error, EngineDeadError):
        return ApiError(500, "the engine failed; the server is exiting", "InternalServerError")
    return ApiError(500, f"internal error: {type(error).__name__}", "InternalServerError")


async def _collect(state: ServerState, kind: _Kind, gen: Generation, with_ids: bool) -> dict:
    created = int(time.time())
    try:
        async for _ in gen.updates():
            pass
    except (RequestError, EngineDeadError) as e:
        raise _as_api_error(e) from None
    choices = [_whole_choice(state, kind, c, with_ids) for c in gen.choices]
    body = r.chat_completion if kind.chat else r.completion
    whole = body(gen.shown_id, created, state.model_name, choices,
                 r.usage(gen.num_prompt_tokens, gen.num_output_tokens))
    # chat has one prompt, shown once for the response; completions show each choice's own (as vLLM does)
    return r.with_token_ids(whole, prompt_token_ids=gen.prompts[0]) if with_ids and kind.chat else whole


def _whole_choice(state: ServerState, kind: _Kind, c: Choice, with_ids: bool) -> dict:
    lps = None
    if c.sampling.logprobs is not None:
        entries = state.logprob_entries(c.logprobs)
        lps = r.chat_logprobs(entries) if kind.chat else r.completion_logprobs(entries)
    build = r.chat_choice if kind.chat else r.completion_choice
    choice = build(c.index, c.text, lps, c.finish_reason, c.stop_reason)
    if not with_ids:
        return choice
    return r.with_token_ids(choice, c.token_ids, None if kind.chat else c.prompt_token_ids)


async def _stream(request, state: ServerState, kind: _Kind, options: GenerationOptions,
                  gen: Generation) -> web.StreamResponse:
    updates = gen.updates()
    try:  # headers wait for the first output, so an engine refusal is still a plain 400
        first = await anext(updates)
    except (RequestError, EngineDeadError) as e:
        raise _as_api_error(e) from None
    writer = ChunkWriter(gen, kind.chat, state.model_name, int(time.time()), options, state.logprob_entries)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(writer.opening() + writer.chunks(first))
    try:
        async for batch in updates:
            data = writer.chunks(batch)
            if data:
                await response.write(data)
        await response.write(writer.closing())
    except (RequestError, EngineDeadError) as e:  # headers are out: the error goes in the stream
        await response.write(sse(r.error_body(_as_api_error(e))) + DONE)
    await response.write_eof()
    return response
