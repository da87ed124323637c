"""Whether an endpoint serves the model --model names, and takes the key sent, checked before a run.

--model skips finding the model at /v1/models, so a mistyped name or a key refused was found by the run: every
request answered 404 (or 401), thousands a second, for the whole warm-up and duration. A 401 at /v1/models ends the
bench before its run. Then one request of one token asks the server itself: a 401 or 403 refuses the key (a server
may guard the completion routes and leave /v1/models open); where /v1/models lists models and not this one, a 404 or
400 that names it (vLLM's) refuses the name (SGLang serves any name it is given).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp

from hosttune.bench.client import Client, Target, key_advice, listed_models, session
from hosttune.bench.record import reason_of
from hosttune.errors import BenchError

LIST_TIMEOUT = 10.0
PROBE_TIMEOUT = 30.0  # one token from a server that is up, busy or not
NUM_NAMED = 5  # models named in the error line, of a long list


async def check_model(target: Target) -> None:
    """Raise a BenchError where the endpoint refuses the key a request sends, or lists other models than
    `target.model` and refuses a request naming it; a server that lists nothing, or takes the name, is measured."""
    listed = await _listed(target)
    async with Client(replace(target, timeout=min(target.timeout, PROBE_TIMEOUT))) as client:
        result = await client.stream("hello", 1)
    if result.status in (401, 403):
        raise BenchError(f"{target.endpoint} answered {result.status}: {key_advice(target.headers)}")
    if not listed or target.model in listed:
        return
    reason = reason_of(result.error)
    if result.status in (400, 404) and target.model in reason:  # not a missing route, nor another field refused
        more = f" and {len(listed) - NUM_NAMED} more" if len(listed) > NUM_NAMED else ""
        raise BenchError(f"--model {target.model}: {target.endpoint} answered {reason}; the server "
                         f"lists {', '.join(listed[:NUM_NAMED])}{more}")


async def _listed(target: Target) -> list[str] | None:
    """The models /v1/models lists, or None where it lists none (no such route, no answer). A 401 there refuses the
    key (or its want) that every request would send: a BenchError saying so."""
    endpoint = target.url.rstrip("/") + "/v1/models"
    try:
        async with session(LIST_TIMEOUT, target.headers, target.tls) as client_session:
            async with client_session.get(endpoint, allow_redirects=False) as resp:
                status, text = resp.status, await resp.text()
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):
        return None
    if status == 401:
        raise BenchError(f"{endpoint} answered 401: {key_advice(target.headers)}")
    return listed_models(text) if status == 200 else None
