"""Reading JSON request bodies and writing JSON and error responses.

Every way a body can be unreadable (wrong content type, not UTF-8, not JSON,
nested too deep) is a short 400 that never echoes the body; what the JSON
must hold is checked by the models in `schemas/`.
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

from hosttune_engine.server.responses import dumps, error_body
from hosttune_engine.server.api_errors import ApiError, bad_request

OFFLOAD_BYTES = 256 * 1024  # bigger bodies are parsed and checked off the event loop
OFFLOAD_IDS = 20_000  # longer lists of token ids are decoded and written off the event loop
IDS_SLICE = 65_536  # ids written at a time: a few milliseconds, after which the event loop may run


def off_loop(fn, *args):
    """fn(*args) on a worker thread, awaited: what would hold the event loop (and every stream) for long."""
    return asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def read_body(request: web.Request, model):
    """The body as `model` (a `RequestBody` of `schemas/`) parses it. A body sent without a Content-Type, or as
    a JSON media type of its own (application/vnd.api+json), is read as JSON too, as vLLM reads it. A big one
    (millions of token ids take a second to check) is parsed and checked on a worker thread, so the event loop
    keeps answering meanwhile."""
    if not _is_json(request.content_type) and "Content-Type" in request.headers:
        raise bad_request(f"Content-Type must be application/json, got {request.content_type[:60]!r}")
    raw = await request.read()  # aiohttp answers 413 past client_max_size
    if len(raw) > OFFLOAD_BYTES:
        return await off_loop(_parse_as, raw, model)
    return _parse_as(raw, model)


def _is_json(content_type: str) -> bool:
    """application/json, or an application/...+json type (RFC 6839's suffix), as FastAPI reads a body as JSON."""
    kind, _, subtype = content_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _parse_as(raw: bytes, model):
    return model.parse(_parse(raw))


def _parse(raw: bytes):
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise bad_request("the request body is not valid JSON: nested too deeply") from None
    except ValueError:  # Python's guard against slow int parsing (sys.get_int_max_str_digits)
        raise bad_request(f"the request body is not valid JSON: a number has more digits than "
                          f"{sys.get_int_max_str_digits()}") from None


def json_response(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=dumps(body), status=status, content_type="application/json")


async def ids_response(body: dict, field: str) -> web.Response:
    """`body` as JSON, where `field` holds token ids. Millions of them take one json.dumps half a second, all of it
    holding the GIL, so a long list is written on a worker thread a slice at a time, and the loop runs between."""
    if len(body[field]) < OFFLOAD_IDS:
        return json_response(body)
    raw = await off_loop(_dumps_ids, body, field)
    return web.Response(body=raw, content_type="application/json")


def _dumps_ids(body: dict, field: str) -> bytes:
    ids = body[field]
    slices = (",".join(map(str, ids[i:i + IDS_SLICE])) for i in range(0, len(ids), IDS_SLICE))
    empty = dumps({field: []})[1:-1]  # b'"tokens":[]'
    head, tail = dumps({**body, field: []}).split(empty, 1)
    return head + empty[:-1] + ",".join(slices).encode() + b"]" + tail


def error_response(err: ApiError, headers: dict | None = None) -> web.Response:
    return web.Response(body=dumps(error_body(err)), status=err.status, content_type="application/json",
                        headers=headers)
