"""A scripted OpenAI-compatible server whose timings are known exactly.

It answers `POST /v1/completions` and `/v1/chat/completions` (streaming or not),
`GET /v1/models`, `POST /tokenize`, `GET /metrics` and `GET /health`, and generates no
text: every output token is the word " tok". What it does is fixed by a `Script`:

- A request holds one of `capacity` slots while it is served; requests past that wait
  in a FIFO queue of at most `max_queue` (then get 429 with Retry-After). So with fixed
  lengths the server saturates at `capacity / service time` requests per second.
- Once a request has a slot (at time s), its first token is sent at
  s + ttft + ttft_per_prompt_token * prompt_tokens, and token i (0-based) at the first
  token's time plus itl[0] + ... + itl[i-1] (the itl list repeats). Deadlines are
  absolute, so timer overshoot never accumulates.
- Prompt tokens are counted as 1 + the number of whitespace-separated words (a BOS
  token plus one per word); `/tokenize` counts the same way.
- With `step`, every deadline is rounded up to a multiple of `step` on the monotonic
  clock: all streams get their tokens at the same instants, as from a batched decode
  step (the hardest pattern for a client: hundreds of chunks at once).
- Prompts go through a prefix cache (cache.py); the usage event reports the
  cached tokens as `prompt_tokens_details.cached_tokens`. Timings do not depend on it.
- `/metrics` gives vLLM's queue, batch and KV-cache gauges for the slots.
- Every `error_every`-th request (1-based) sends an error event inside its 200 stream
  after `error_after` tokens; every `fail_status_every`-th gets HTTP 500.
- With `outage`, completions get 503 (with `Retry-After: retry_after`, unless that is None) for
  that many seconds from the first completion request, as from an engine that restarts.
- With `--tls-cert` and `--tls-key` it speaks https.

It speaks HTTP/1.1 straight from an asyncio protocol and writes each token from a timer
callback, so its own overhead is tens of microseconds per request and a few per token:
the scripted delays are what a client sees, to a fraction of a millisecond.

Run it as `python -m scripted_server --port 0 ...` with tests/support on the path (launch.py
does that); it prints `listening on http://127.0.0.1:PORT` once it accepts connections, binds
only to 127.0.0.1, and exits after `--lifetime` seconds. A test fixture and benchmark target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import select
import selectors
import socket
import ssl
from collections import deque
from dataclasses import dataclass

from scripted_server.cache import PrefixCache, render_metrics
from scripted_server.stream import Stream, json_response, parse_request, text_response

MODEL = "scripted"


@dataclass(frozen=True)
class Script:
    ttft: float = 0.05
    ttft_per_prompt_token: float = 0.0
    itl: tuple[float, ...] = (0.01,)
    capacity: int | None = None  # concurrent requests served; None: no limit
    max_queue: int | None = None  # waiting requests beyond capacity; None: no limit
    error_every: int = 0
    error_after: int = 1
    fail_status_every: int = 0
    step: float = 0.0  # if set, tokens go out on a shared clock tick, as from a batched decode step
    has_tokenize: bool = True  # False: no /tokenize route, like an endpoint that lacks one
    outage: float = 0.0  # seconds of 503 from the first completion request
    retry_after: int | None = 1  # the outage's Retry-After; None: no header


def count_tokens(text: str) -> int:
    """The server's tokenizer: a BOS token plus one token per whitespace-separated word."""
    return 1 + len(text.split())


class Slots:
    """`capacity` slots handed out in arrival order; waiters queue up to `max_queue`."""

    def __init__(self, capacity: int | None, max_queue: int | None) -> None:
        self.capacity = capacity
        self.max_queue = max_queue
        self.num_busy = 0
        self.waiters: deque[Stream] = deque()

    def can_enter(self) -> bool:
        if self.capacity is None or self.num_busy < self.capacity:
            return True
        return self.max_queue is None or len(self.waiters) < self.max_queue

    def enter(self, stream: Stream) -> None:
        if self.capacity is None or self.num_busy < self.capacity:
            self.num_busy += 1
            stream.start()
        else:
            stream.is_queued = True
            self.waiters.append(stream)

    def leave(self, stream: Stream) -> None:
        if stream in self.waiters:  # gone before it got a slot
            self.waiters.remove(stream)
            return
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.is_closed:
                waiter.start()  # the slot passes on; num_busy is unchanged
                return
        self.num_busy -= 1


class ScriptedServer:
    """Routes parsed requests; one instance per listening socket."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.slots = Slots(script.capacity, script.max_queue)
        self.cache = PrefixCache()
        self.num_requests = 0
        self.outage_ends: float | None = None

    def handle(self, connection: "Connection", method: str, path: str, body: bytes) -> None:
        routes = {
            ("GET", "/health"): lambda: connection.reply(json_response(200, {"status": "ok"})),
            ("GET", "/metrics"): lambda: connection.reply(text_response(render_metrics(
                len(self.slots.waiters), self.slots.num_busy, self.script.capacity))),
            ("GET", "/v1/models"): lambda: connection.reply(json_response(200, {
                "object": "list", "data": [{"id": MODEL, "object": "model"}]})),
            ("POST", "/tokenize"): (lambda: self._tokenize(connection, body))
            if self.script.has_tokenize else None,
            ("POST", "/v1/completions"): lambda: self._complete(connection, body, False),
            ("POST", "/v1/chat/completions"): lambda: self._complete(connection, body, True),
        }
        route = routes.get((method, path))  # None: 404
        if route is None:
            connection.reply(json_response(404, {"error": {"message": f"no route {path}"}}))
            return
        route()

    def _tokenize(self, connection: "Connection", body: bytes) -> None:
        count = count_tokens(_prompt_text(json.loads(body or b"{}")))
        connection.reply(json_response(200, {"tokens": list(range(count)), "count": count}))

    def _complete(self, connection: "Connection", raw: bytes, is_chat: bool) -> None:
        body = json.loads(raw or b"{}")
        self.num_requests += 1
        number, script = self.num_requests, self.script
        if script.fail_status_every and number % script.fail_status_every == 0:
            connection.reply(json_response(500, {"error": {"message": "scripted failure"}}))
            return
        if self._is_out():
            extra = f"Retry-After: {script.retry_after}\r\n" if script.retry_after is not None else ""
            connection.reply(json_response(503, {"error": {"message": "restarting"}}, extra=extra))
            return
        if not self.slots.can_enter():
            connection.reply(json_response(429, {"error": {"message": "server full"}},
                                           extra="Retry-After: 1\r\n"))
            return
        is_error = bool(script.error_every) and number % script.error_every == 0
        text = _prompt_text(body)
        stream = Stream(connection, self, body, count_tokens(text), is_chat, is_error)
        stream.cached_tokens = self.cache.admit(text)
        connection.stream = stream
        self.slots.enter(stream)

    def _is_out(self) -> bool:
        if not self.script.outage:
            return False
        now = asyncio.get_running_loop().time()
        if self.outage_ends is None:
            self.outage_ends = now + self.script.outage
        return now < self.outage_ends

    def deadlines(self, start: float, prompt_tokens: int, num_tokens: int) -> list[float]:
        script = self.script
        first = start + script.ttft + script.ttft_per_prompt_token * prompt_tokens
        deadlines = [first]
        for i in range(num_tokens - 1):
            deadlines.append(deadlines[-1] + script.itl[i % len(script.itl)])
        if script.step:
            deadlines = [math.ceil(d / script.step) * script.step for d in deadlines]
        return deadlines


class Connection(asyncio.Protocol):
    """One client connection: parses requests, one at a time (no pipelining)."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.stream: Stream | None = None
        self.received = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.buffer:  # a new request starts arriving: its delays count from here
            self.received = asyncio.get_running_loop().time()
        self.buffer += data
        while self.stream is None:
            parsed = parse_request(self.buffer)
            if parsed is None:
                return
            method, path, body, self.buffer = parsed
            self.server.handle(self, method, path, body)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.close()

    def reply(self, data: bytes) -> None:
        self.transport.write(data)

    def stream_done(self) -> None:
        self.stream = None
        if self.buffer:
            self.data_received(b"")


def _prompt_text(body: dict) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"])
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def _parse_args(argv: list[str] | None) -> tuple[Script, argparse.Namespace]:
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible test server.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument("--ttft-per-prompt-token", type=float, default=0.0)
    parser.add_argument("--itl", default="0.01", help="comma-separated seconds, repeated")
    parser.add_argument("--capacity", type=int, default=None)
    parser.add_argument("--max-queue", type=int, default=None)
    parser.add_argument("--error-every", type=int, default=0)
    parser.add_argument("--error-after", type=int, default=1)
    parser.add_argument("--fail-status-every", type=int, default=0)
    parser.add_argument("--step", type=float, default=0.0,
                        help="send tokens only on multiples of this many seconds (batched decode)")
    parser.add_argument("--no-tokenize", action="store_true", help="answer /tokenize with 404")
    parser.add_argument("--outage", type=float, default=0.0, help="seconds of 503 from the first completion request")
    parser.add_argument("--retry-after", default="1", help="the outage's Retry-After seconds, or 'none'")
    parser.add_argument("--tls-cert", default=None, help="speak https with this certificate chain ...")
    parser.add_argument("--tls-key", default=None, help="... and this private key")
    parser.add_argument("--fast", action="store_true",
                        help="uvloop when installed (else asyncio's epoll): less overhead a token, timers round to 1 ms")
    parser.add_argument("--realtime", action="store_true",
                        help="run at real-time priority (SCHED_FIFO) when permitted, so other "
                             "processes on a shared machine cannot delay the scripted tokens")
    parser.add_argument("--lifetime", type=float, default=3600.0,
                        help="exit after this many seconds, so a forgotten server stops")
    args = parser.parse_args(argv)
    script = Script(
        ttft=args.ttft, ttft_per_prompt_token=args.ttft_per_prompt_token,
        itl=tuple(float(x) for x in args.itl.split(",")), capacity=args.capacity,
        max_queue=args.max_queue, error_every=args.error_every,
        error_after=args.error_after, fail_status_every=args.fail_status_every, step=args.step,
        has_tokenize=not args.no_tokenize, outage=args.outage,
        retry_after=None if args.retry_after == "none" else int(args.retry_after),
    )
    return script, args


async def serve(script: Script, port: int, lifetime: float, tls: ssl.SSLContext | None = None) -> None:
    loop = asyncio.get_running_loop()
    server = ScriptedServer(script)
    listener = await loop.create_server(lambda: Connection(server), "127.0.0.1", port, backlog=4096, ssl=tls)
    bound = listener.sockets[0].getsockname()[1]
    # https: the name a test certificate carries, for the client to check
    print(f"listening on https://localhost:{bound}" if tls else f"listening on http://127.0.0.1:{bound}", flush=True)
    await asyncio.sleep(lifetime)
    listener.close()


HAS_EPOLL = hasattr(selectors, "EpollSelector")  # Linux; elsewhere select() and its bound


class PreciseSelector(selectors.EpollSelector if HAS_EPOLL else selectors.SelectSelector):
    """epoll's registrations with select()'s timeout. epoll (asyncio's default) and uvloop round timer waits up to
    whole milliseconds, and select() takes microseconds, so the scripted delays hold to a fraction of one; but
    select() takes no descriptor past FD_SETSIZE (1,024), and a server past about 1,000 connections died. Here
    select() waits on the one epoll descriptor, which turns readable when any registered one is ready."""

    def select(self, timeout: float | None = None) -> list:
        if not HAS_EPOLL:
            return super().select(timeout)
        if timeout is None or timeout > 0:
            select.select([self.fileno()], [], [], timeout)
        return super().select(0)


def _allow_connections() -> None:
    """Raise the open-file limit to its hard one: past the soft one (often 1,024) connections are not accepted."""
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    except (ImportError, ValueError, OSError):
        pass


def raise_priority() -> str:
    """SCHED_FIFO if permitted, else a lower nice value; says which it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO"
    except (AttributeError, PermissionError, OSError):
        pass
    try:
        os.nice(-10)
        return "nice -10"
    except (PermissionError, OSError):
        return "normal"


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


def main(argv: list[str] | None = None) -> None:
    script, args = _parse_args(argv)
    if args.realtime:
        print(f"priority: {raise_priority()}", flush=True)
    if args.fast:
        try:
            from uvloop import run
        except ImportError:
            run = asyncio.run
        run(serve(script, args.port, args.lifetime, tls_context(args)))
        return
    _allow_connections()
    loop = asyncio.SelectorEventLoop(PreciseSelector())
    try:
        loop.run_until_complete(serve(script, args.port, args.lifetime, tls_context(args)))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
