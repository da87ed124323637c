"""The HTTP routes: the aiohttp application and the small endpoints beside the generation ones.

Every error leaves as an OpenAI error body: `ApiError` with its status, aiohttp's
own (404 route, 405 method, 413 body too large) with theirs. A bug still gives
a 500 with a short body, and its traceback goes to the log.
"""

from __future__ import annotations

import logging

from aiohttp import web

from hosttune_engine import __version__
from hosttune_engine.server import responses as r
from hosttune_engine.server.bodies import error_response, ids_response, json_response, read_body
from hosttune_engine.server.completions import create_chat_completion, create_completion
from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.auth import KeyRing, auth_middleware
from hosttune_engine.server.cors import Origins, allow_origin, cors_middleware
from hosttune_engine.server.schemas.tokenize import DetokenizeRequest, TokenizeRequest
from hosttune_engine.server.state import STATE, ServerState

log = logging.getLogger("hosttune_engine.server")

HTTP_ERROR_TYPES = {404: "NotFoundError", 405: "MethodNotAllowed", 413: "RequestTooLarge"}
CLIENT_CLOSED = 499  # the access log's status for a client that closed its connection first (nginx's code)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e, _error_headers(e.status, request.app[STATE].config.retry_after_s))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None  # a 405 names the methods
        return error_response(ApiError(e.status, (e.text or e.reason)[:300],
                                       HTTP_ERROR_TYPES.get(e.status, "BadRequestError")), allow)
    except ConnectionResetError:  # the client went away mid-answer: nothing can reach it, and nothing failed here
        log.info("client closed the connection during %s %s", request.method, request.path)
        return web.Response(status=CLIENT_CLOSED)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal server error", "InternalServerError"))


def _error_headers(status: int, retry_after_s: int) -> dict | None:
    if status in (429, 503):
        return {"Retry-After": str(retry_after_s)}
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    return None


async def health(request: web.Request) -> web.Response:
    """GET /health: 200 once warmed up, 503 while starting, warming up, draining or failed."""
    state = request.app[STATE]
    return json_response(state.health.body(state.stats()), state.health.status_code())


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format with vLLM's metric names."""
    state = request.app[STATE]
    text = state.metrics.render(state.stats())
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})


async def models(request: web.Request) -> web.Response:
    """GET /v1/models"""
    state = request.app[STATE]
    return json_response(r.model_list(state.model_names, state.config.engine.model, state.max_model_len,
                                      state.created))


async def tokenize(request: web.Request) -> web.Response:
    """POST /tokenize: {"prompt": text} or {"messages": [...]} -> {"tokens", "count", "max_model_len"}"""
    state = request.app[STATE]
    req = await read_body(request, TokenizeRequest)
    state.check_model(req.model)
    prompts = state.usable_prompts()
    if req.messages is not None:
        ids = await prompts.encode_chat(req.messages, req.add_generation_prompt, req.chat_template_kwargs,
                                        req.add_special_tokens, continue_final=req.continue_final_message)
    else:
        ids = await prompts.encode(req.prompt, req.add_special_tokens)
    return await ids_response({"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}, "tokens")


async def detokenize(request: web.Request) -> web.Response:
    """POST /detokenize: {"tokens": [...]} -> {"prompt": text}"""
    state = request.app[STATE]
    req = await read_body(request, DetokenizeRequest)
    state.check_model(req.model)
    return json_response({"prompt": await state.usable_prompts().decode(req.tokens)})


async def version(request: web.Request) -> web.Response:
    return json_response({"version": __version__})


def build_app(state: ServerState) -> web.Application:
    config = state.config
    origins = Origins(config.allowed_origins)
    middlewares = [cors_middleware(origins), errors_as_json] if config.allowed_origins else [errors_as_json]
    if config.api_keys:
        ring = KeyRing(tuple(k.encode("utf-8", "surrogateescape") for k in config.api_keys))
        middlewares.append(auth_middleware(ring, config.protect_probes))
    app = web.Application(middlewares=middlewares, client_max_size=config.max_body_bytes)
    app[STATE] = state
    if config.allowed_origins:
        app.on_response_prepare.append(allow_origin(origins))
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version)
    return app
