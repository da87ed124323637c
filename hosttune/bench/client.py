"""An async streaming client for OpenAI-compatible endpoints, built on aiohttp.

One `Client` holds one connection pool (no limit on connections, keep-alive on), so a
single process can keep hundreds of streams open. `stream()` sends one request and
timestamps every server-sent event that carries output as it is read off the socket.
"""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from dataclasses import dataclass

import aiohttp

from hosttune.bench.record import FAILED, OK, REJECTED
from hosttune.errors import BenchError

try:  # orjson parses a stream event in a fraction of json's time; optional
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

COMPLETIONS = "completions"
CHAT = "chat"


@dataclass(frozen=True)
class Target:
    """Where to send requests and what to send."""

    url: str  # base URL, e.g. http://127.0.0.1:8000
    model: str
    api: str = COMPLETIONS  # COMPLETIONS or CHAT
    timeout: float = 600.0  # seconds for a whole request
    is_ignore_eos: bool = True  # ask for exactly max_tokens (vLLM/SGLang extension)

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


class Client:
    """A pool of keep-alive connections to one endpoint. Use as an async context manager."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Client":
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(total=self.target.timeout)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.session is not None
        await self.session.close()

    def payload(self, prompt: str, max_tokens: int) -> dict:
        body: dict = {
            "model": self.target.model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.target.is_ignore_eos:
            body["ignore_eos"] = True
        if self.target.api == CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    async def stream(self, prompt: str, max_tokens: int) -> StreamResult:
        """Send one streaming request and record when each output event arrived."""
        assert self.session is not None
        events = _EventReader()
        data = json.dumps(self.payload(prompt, max_tokens)).encode()
        headers = {"Content-Type": "application/json"}
        sent = time.perf_counter()
        status = 0
        try:
            async with self.session.post(self.target.endpoint, data=data, headers=headers) as resp:
                status = resp.status
                if status != 200:
                    body = await resp.read()
                    return events.result(sent, _http_outcome(status), status, _http_error(status, body))
                async for data_chunk in resp.content.iter_any():
                    events.feed(data_chunk, time.perf_counter())
                    if events.is_done:
                        break
        except asyncio.TimeoutError:
            return events.result(sent, FAILED, status, f"timeout: no complete response in {self.target.timeout:g}s")
        except aiohttp.ClientError as exc:
            return events.result(sent, FAILED, status, f"transport: {type(exc).__name__}: {exc}")
        return events.result(sent, *events.verdict(status))


def _http_outcome(status: int) -> str:
    return REJECTED if status == 429 else FAILED


def _http_error(status: int, body: bytes) -> str:
    return f"http {status}: {body[:200].decode(errors='replace')}"


class _EventReader:
    """Splits a server-sent event stream into events and timestamps the ones with output."""

    def __init__(self) -> None:
        self.buffer = b""
        self.chunks = array("d")
        self.is_done = False
        self.error = ""
        self.usage: dict | None = None

    def feed(self, data: bytes, now: float) -> None:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), now)

    def _event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.is_done = True
            return
        try:
            event = _loads(payload)
        except ValueError:
            self.error = f"stream-error: unparsable event {payload[:100]!r}"
            self.is_done = True
            return
        if "error" in event:
            self.error = f"stream-error: {_error_message(event['error'])}"
            self.is_done = True
            return
        if event.get("usage"):
            self.usage = event["usage"]
        if any(_has_output(choice) for choice in event.get("choices") or ()):
            self.chunks.append(now)

    def verdict(self, status: int) -> tuple[str, int, str]:
        if self.error:
            return FAILED, status, self.error
        if not self.is_done:
            return FAILED, status, "stream-cut: the stream ended without [DONE]"
        return OK, status, ""

    def result(self, sent: float, outcome: str, status: int, error: str) -> StreamResult:
        usage = self.usage or {}
        output_tokens = usage.get("completion_tokens", len(self.chunks))
        return StreamResult(
            sent=sent, end=time.perf_counter(), chunks=self.chunks, outcome=outcome,
            status=status, error=error, output_tokens=output_tokens,
            reported_prompt_tokens=usage.get("prompt_tokens"),
        )


def _has_output(choice: dict) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content"))


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))[:200]
    return str(error)[:200]


async def discover_model(url: str, timeout: float = 10.0) -> str:
    """The first model the endpoint lists at /v1/models."""
    endpoint = url.rstrip("/") + "/v1/models"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(endpoint) as resp:
                body = await resp.json(content_type=None) if resp.status == 200 else {}
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise BenchError(f"cannot reach {endpoint}: {exc or type(exc).__name__}; is the server up?") from None
    models = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)]
    if not models:
        raise BenchError(f"{endpoint} lists no model; pass --model NAME")
    return models[0]
