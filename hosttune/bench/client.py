"""An async streaming client for OpenAI-compatible endpoints.

One `Client` holds one pool of keep-alive connections (no limit on their number), so a
single process keeps hundreds of streams open. Streams go through `connection.py`,
which timestamps bytes as the socket delivers them; `discover_model` uses aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from array import array
from dataclasses import dataclass, field
from urllib.parse import urlparse

import aiohttp

from hosttune.bench.backoff import retry_after_seconds
from hosttune.bench.connection import ConnectionPool, HttpError, Response
from hosttune.bench.record import FAILED, OK, REJECTED
from hosttune.bench.workload import Messages
from hosttune.errors import BenchError

COMPLETIONS = "completions"
CHAT = "chat"
REDIRECT_ADVICE = ("give --url the address it redirects to (bench follows no redirect: each would add a round trip to "
                   "a request's latency)")
ERROR_BYTES = 500  # of an error body kept in a record: an OpenAI error message whole, not a page of HTML


@dataclass(frozen=True)
class Target:
    """Where to send requests and what to send."""

    url: str  # base URL, e.g. http://127.0.0.1:8000
    model: str
    api: str = COMPLETIONS  # COMPLETIONS or CHAT
    timeout: float = 600.0  # seconds for a whole request
    is_ignore_eos: bool = True  # ask for exactly max_tokens (vLLM/SGLang extension)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold an API key
    priority: int | None = None  # request priority, lower first (vLLM/hosttune extension)
    tls: ssl.SSLContext | None = field(default=None, repr=False, compare=False)  # https: whom to trust

    @property
    def endpoint(self) -> str:
        path = "/v1/chat/completions" if self.api == CHAT else "/v1/completions"
        return self.url.rstrip("/") + path


@dataclass(frozen=True)
class StreamResult:
    """One request's timings on the perf_counter clock, and how it ended."""

    sent: float
    end: float
    chunks: array  # arrival time of each event that carried output text
    outcome: str
    status: int
    error: str
    output_tokens: int
    reported_prompt_tokens: int | None
    cached_tokens: int | None = None  # prompt tokens the server found in its prefix cache
    text: str = ""  # the output text, when asked to keep it
    retry_after: float | None = None  # a refusal's Retry-After, in seconds


class Client:
    """Streams requests to one endpoint over a pool of keep-alive connections.

    Use as an async context manager."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.pool = ConnectionPool(target.url, target.headers, target.tls)
        self.path = urlparse(target.endpoint).path

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.pool.close()

    def payload(self, messages: Messages | str, max_tokens: int) -> dict:
        """The request body; a plain string is one user message. The completions API
        gets the messages' texts joined by spaces."""
        if isinstance(messages, str):
            messages = (("user", messages),)
        body: dict = {
            "model": self.target.model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.target.is_ignore_eos:
            body["ignore_eos"] = True
        if self.target.priority is not None:
            body["priority"] = self.target.priority
        if self.target.api == CHAT:
            body["messages"] = [{"role": role, "content": text} for role, text in messages]
        else:
            body["prompt"] = " ".join(text for _, text in messages)
        return body

    async def stream(self, messages: Messages | str, max_tokens: int,
                     is_keep_text: bool = False) -> StreamResult:
        """Send one streaming request; every output event is timed on arrival. With
        `is_keep_text` the result holds the output text too."""
        body = json.dumps(self.payload(messages, max_tokens)).encode()
        request = self.pool.request_bytes(self.path, body)
        sent = time.perf_counter()
        deadline = sent + self.target.timeout
        for is_retry in (False, True):
            try:
                connection = await asyncio.wait_for(self.pool.acquire(), deadline - time.perf_counter())
            except HttpError as exc:
                return _failure(sent, 0, f"transport: {exc}")
            except asyncio.TimeoutError:
                return _failure(sent, 0, f"timeout: no connection in {self.target.timeout:g}s")
            try:
                response = await asyncio.wait_for(connection.send(request, is_keep_text),
                                                  deadline - time.perf_counter())
            except asyncio.TimeoutError:
                partial = connection.parser.response if connection.parser is not None else None
                connection.close()
                return _timed_out(sent, partial, self.target.timeout)
            except HttpError as exc:
                # A kept-alive connection the server closed as we wrote: send once more.
                if not is_retry and connection.num_requests > 1 and not connection.is_answered:
                    continue
                return _failure(sent, 0, f"transport: {exc}")
            except asyncio.CancelledError:
                connection.close()
                raise
            self.pool.release(connection)
            return _result(sent, response)
        raise AssertionError("unreachable")


def _stream_error(events, headers: dict[str, str]) -> str:
    """The stream's error; a 200 that carried no event at all and is no event stream did not stream (a server that
    ignores stream: true answers a whole JSON body), which 'ended without [DONE]' would hide."""
    content_type = headers.get("content-type", "")
    if events.error.startswith("stream-cut") and not events.chunks and "event-stream" not in content_type:
        return (f"not-a-stream: the server answered {content_type or 'no Content-Type'}, not an event stream: bench "
                "needs one that streams (stream: true)")
    return events.error


def _failure(sent: float, status: int, error: str) -> StreamResult:
    return StreamResult(sent, time.perf_counter(), array("d"), FAILED, status, error, 0, None)


def _timed_out(sent: float, response: Response | None, timeout: float) -> StreamResult:
    """A request past its timeout, with what arrived of its stream: the tokens a slow server streamed count as
    streamed, and the error says it was still going, not that nothing came."""
    if response is None or response.events is None:
        return _failure(sent, 0, f"timeout: no complete response in {timeout:g}s")
    events = response.events.result(response.last_at or time.perf_counter())
    error = (f"timeout: the stream was still going after {timeout:g}s ({len(events.chunks)} tokens)" if events.chunks
             else f"timeout: the server answered 200 and streamed no token in {timeout:g}s")
    return StreamResult(sent, time.perf_counter(), events.chunks, FAILED, 200, error,
                        events.usage.get("completion_tokens", len(events.chunks)), events.usage.get("prompt_tokens"))


def _result(sent: float, response: Response) -> StreamResult:
    last = response.last_at or time.perf_counter()
    if response.events is None:
        outcome = REJECTED if response.status == 429 else FAILED
        error = f"http {response.status}: {bytes(response.body[:ERROR_BYTES]).decode(errors='replace')}"
        if 300 <= response.status < 400 and "location" in response.headers:
            error = f"http {response.status}: redirects to {response.headers['location'][:ERROR_BYTES]}"
        return StreamResult(sent, last, array("d"), outcome, response.status, error, 0, None,
                            retry_after=retry_after_seconds(response.headers.get("retry-after")))
    events = response.events.result(last)
    return StreamResult(
        sent=sent, end=events.end, chunks=events.chunks,
        outcome=FAILED if events.error else OK, status=200, error=_stream_error(events, response.headers),
        output_tokens=events.usage.get("completion_tokens", len(events.chunks)),
        reported_prompt_tokens=events.usage.get("prompt_tokens"),
        cached_tokens=(events.usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        text=events.text,
    )


def session(timeout: float, headers: tuple[tuple[str, str], ...] | dict = (),
            tls: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """An aiohttp session for the endpoint's other routes, trusting what the streams trust."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), headers=dict(headers),
                                 connector=aiohttp.TCPConnector(ssl=tls if tls is not None else True))


def listed_models(text: str) -> list[str] | None:
    """The model ids of a /v1/models body, or None when it is not an OpenAI model list."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def key_advice(headers) -> str:
    """What a 401 asks of the user: a key, or, when one was sent, another one."""
    if any(name.lower() == "authorization" for name, _ in dict(headers).items()):
        return "it refused the key sent (--api-key, $OPENAI_API_KEY or --header Authorization); check that key"
    return "pass the endpoint's key with --api-key (or $OPENAI_API_KEY)"


async def discover_model(url: str, timeout: float = 10.0, headers: tuple[tuple[str, str], ...] = (),
                         tls: ssl.SSLContext | None = None) -> str:
    """The first model the endpoint lists at /v1/models."""
    endpoint = url.rstrip("/") + "/v1/models"
    try:
        async with session(timeout, headers, tls) as session_:
            async with session_.get(endpoint, allow_redirects=False) as resp:
                if resp.status == 401:
                    raise BenchError(f"{endpoint} answered 401: {key_advice(headers)}")
                if 300 <= resp.status < 400:
                    raise BenchError(f"{endpoint} answered {resp.status}, a redirect to "
                                     f"{resp.headers.get('Location', 'nowhere')}: {REDIRECT_ADVICE}")
                if resp.status != 200:
                    raise BenchError(f"{endpoint} answered {resp.status}: not an OpenAI-compatible server? "
                                     "(or pass --model NAME)")
                text = await resp.text()
    except asyncio.TimeoutError:  # aiohttp's connection timeouts too
        raise BenchError(f"{endpoint} did not answer within {timeout:g}s; is the server up, and does it speak "
                         f"{urlparse(endpoint).scheme}?") from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise BenchError(f"cannot reach {endpoint}: {str(exc) or type(exc).__name__}; is the server up?") from None
    models = listed_models(text)
    if models is None:
        raise BenchError(f"{endpoint} did not answer an OpenAI model list: not an OpenAI-compatible server? "
                         "(or pass --model NAME)")
    if not models:
        raise BenchError(f"{endpoint} lists no model; pass --model NAME")
    return models[0]
