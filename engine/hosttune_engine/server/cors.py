"""Calls from web pages of other origins (CORS), allowed for the origins `--allowed-origins` names.

As vLLM's server allows them (Starlette's CORSMiddleware: any method and request header, no credentials): a
preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered before the API key is checked,
since a browser sends none with it, and every answer to an allowed origin says it may be read. With no origin
allowed (the default, where vLLM allows any) nothing here runs, and a browser keeps other sites' pages from
calling the server.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.bodies import error_response

PREFLIGHT_MAX_AGE_S = 600
METHODS = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"


@dataclass(frozen=True)
class Origins:
    """The origins whose pages may call the server; "*" for any."""

    allowed: tuple[str, ...]

    def allows(self, origin: str) -> bool:
        return "*" in self.allowed or origin in self.allowed

    def headers(self, origin: str) -> dict[str, str]:
        """What says to the browser that a page of `origin` may read the answer."""
        if "*" in self.allowed:
            return {"Access-Control-Allow-Origin": "*"}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def cors_middleware(origins: Origins):
    """Answers preflights itself; the server's first middleware, so no API key is asked of them."""

    @web.middleware
    async def cors(request: web.Request, handler):
        origin = request.headers.get("Origin")
        if request.method != "OPTIONS" or origin is None or "Access-Control-Request-Method" not in request.headers:
            return await handler(request)
        if not origins.allows(origin):
            return error_response(ApiError(400, "Disallowed CORS origin", "BadRequestError"))
        asked = request.headers.get("Access-Control-Request-Headers")
        allowed = {**origins.headers(origin), "Access-Control-Allow-Methods": METHODS,
                   "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)}
        if asked:  # any request header, as vLLM's allowed_headers ["*"]: the ones the page asked for
            allowed["Access-Control-Allow-Headers"] = asked
        return web.Response(text="OK", headers=allowed)

    return cors


def allow_origin(origins: Origins):
    """An on_response_prepare hook: every answer to an allowed origin (errors and streams too) may be read by it."""

    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and origins.allows(origin):
            response.headers.update(origins.headers(origin))

    return hook
