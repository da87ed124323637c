"""A scripted OpenAI-compatible server whose timings are known exactly.

It answers `/v1/completions` and `/v1/chat/completions` (streaming or not),
`/v1/models`, `/tokenize` and `/health`, and generates no text: every output token is
the word " tok". What it does is fixed by a `Script`:

- A request holds one of `capacity` slots while it is served; requests past that wait
  in a FIFO queue of at most `max_queue` (then get 429 with Retry-After). So with
  fixed lengths the server saturates at `capacity / service time` requests per second.
- Once a request has a slot (at time s), its first token is sent at
  s + ttft + ttft_per_prompt_token * prompt_tokens, and token i (0-based) at the
  first token's time plus itl[0] + ... + itl[i-1] (the itl list repeats). Deadlines
  are absolute, so sleep overshoot never accumulates.
- Prompt tokens are counted as 1 + the number of whitespace-separated words (a BOS
  token plus one per word); `/tokenize` counts the same way.
- Every `error_every`-th request (1-based) sends an error event inside its 200 stream
  after `error_after` tokens; every `fail_status_every`-th gets HTTP 500.

Run it as `python -m hosttune.bench.testserver --port 0 ...`; it prints
`listening on http://127.0.0.1:PORT` once it accepts connections. It binds only to
127.0.0.1. It is a test fixture and a benchmark target, not a product.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import selectors
from collections import deque
from dataclasses import dataclass

from aiohttp import web

MODEL = "scripted"
TOKEN_TEXT = " tok"


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


def count_tokens(text: str) -> int:
    """The server's tokenizer: a BOS token plus one token per whitespace-separated word."""
    return 1 + len(text.split())


class Slots:
    """`capacity` slots handed out in arrival order; waiters queue up to `max_queue`."""

    def __init__(self, capacity: int | None, max_queue: int | None) -> None:
        self.capacity = capacity
        self.max_queue = max_queue
        self.num_busy = 0
        self.waiters: deque[asyncio.Future] = deque()

    def can_enter(self) -> bool:
        return self.max_queue is None or self.capacity is None or (
            self.num_busy < self.capacity or len(self.waiters) < self.max_queue
        )

    async def enter(self) -> None:
        if self.capacity is None or (self.num_busy < self.capacity and not self.waiters):
            self.num_busy += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        await waiter  # the slot is handed over by leave(), num_busy unchanged

    def leave(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.num_busy -= 1


class ScriptedServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.slots = Slots(script.capacity, script.max_queue)
        self.num_requests = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        count = count_tokens(_prompt_text(body))
        return web.json_response({"tokens": list(range(count)), "count": count})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.num_requests += 1
        number = self.num_requests
        script = self.script
        if script.fail_status_every and number % script.fail_status_every == 0:
            return web.json_response({"error": {"message": "scripted failure"}}, status=500)
        if not self.slots.can_enter():
            return web.json_response(
                {"error": {"message": "server full"}}, status=429, headers={"Retry-After": "1"}
            )
        await self.slots.enter()
        try:
            return await self._serve(request, body, number)
        finally:
            self.slots.leave()

    async def _serve(self, request: web.Request, body: dict, number: int) -> web.StreamResponse:
        is_chat = request.path.endswith("/chat/completions")
        prompt_tokens = count_tokens(_prompt_text(body))
        num_tokens = int(body.get("max_tokens") or 16)
        start = asyncio.get_running_loop().time()
        deadlines = self._deadlines(start, prompt_tokens, num_tokens)
        if not body.get("stream"):
            await _sleep_until(deadlines[-1])
            return web.json_response(_whole(is_chat, prompt_tokens, num_tokens))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if is_chat:
            await response.write(_event(_chat_chunk({"role": "assistant", "content": ""})))
        is_error = self.script.error_every and number % self.script.error_every == 0
        await self._stream(response, deadlines, is_chat, is_error)
        if body.get("stream_options", {}).get("include_usage") and not is_error:
            await response.write(_event(_usage(is_chat, prompt_tokens, num_tokens)))
        await response.write(b"data: [DONE]\n\n")
        return response

    def _deadlines(self, start: float, prompt_tokens: int, num_tokens: int) -> list[float]:
        script = self.script
        first = start + script.ttft + script.ttft_per_prompt_token * prompt_tokens
        deadlines = [first]
        for i in range(num_tokens - 1):
            deadlines.append(deadlines[-1] + script.itl[i % len(script.itl)])
        return deadlines

    async def _stream(self, response: web.StreamResponse, deadlines: list[float],
                      is_chat: bool, is_error: bool) -> None:
        chunk = _event(_chat_chunk({"content": TOKEN_TEXT}) if is_chat else _text_chunk(TOKEN_TEXT))
        for i, deadline in enumerate(deadlines):
            if is_error and i == self.script.error_after:
                await response.write(_event({"error": {"message": "scripted error", "code": 500}}))
                return
            await _sleep_until(deadline)
            await response.write(chunk)


async def _sleep_until(deadline: float) -> None:
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def _prompt_text(body: dict) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"])
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _text_chunk(text: str) -> dict:
    return {"id": "cmpl-scripted", "object": "text_completion", "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def _chat_chunk(delta: dict) -> dict:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def _usage(is_chat: bool, prompt_tokens: int, num_tokens: int) -> dict:
    return {"id": "cmpl-scripted", "object": "chat.completion.chunk" if is_chat else "text_completion",
            "model": MODEL, "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": num_tokens,
                      "total_tokens": prompt_tokens + num_tokens}}


def _whole(is_chat: bool, prompt_tokens: int, num_tokens: int) -> dict:
    text = TOKEN_TEXT * num_tokens
    choice = {"index": 0, "finish_reason": "length"}
    choice.update({"message": {"role": "assistant", "content": text}} if is_chat else {"text": text})
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": num_tokens,
             "total_tokens": prompt_tokens + num_tokens}
    return {"id": "cmpl-scripted", "model": MODEL, "choices": [choice], "usage": usage}


def _parse_args(argv: list[str] | None) -> tuple[Script, int, float, bool]:
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
    parser.add_argument("--fast", action="store_true",
                        help="use uvloop: more streams, but delays rounded up to 1 ms")
    parser.add_argument("--lifetime", type=float, default=3600.0,
                        help="exit after this many seconds, so a forgotten server stops")
    args = parser.parse_args(argv)
    script = Script(
        ttft=args.ttft, ttft_per_prompt_token=args.ttft_per_prompt_token,
        itl=tuple(float(x) for x in args.itl.split(",")), capacity=args.capacity,
        max_queue=args.max_queue, error_every=args.error_every,
        error_after=args.error_after, fail_status_every=args.fail_status_every,
    )
    return script, args.port, args.lifetime, args.fast


async def serve(script: Script, port: int, lifetime: float) -> None:
    runner = web.AppRunner(ScriptedServer(script).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    await asyncio.sleep(lifetime)
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    script, port, lifetime, is_fast = _parse_args(argv)
    if is_fast:
        from uvloop import run  # more connections per second, but 1 ms timer resolution
        run(serve(script, port, lifetime))
        return
    # epoll (asyncio's default) and uvloop round timer waits up to whole milliseconds;
    # select() takes microseconds, so the scripted delays hold to a fraction of a
    # millisecond. select() is limited to about 1,000 open connections.
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(serve(script, port, lifetime))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
