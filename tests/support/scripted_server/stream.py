"""The test server's side of one response: HTTP/1.1 wire helpers and a `Stream` that
writes each token from a timer callback at its scripted deadline."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations; server.py imports this module
    from scripted_server.server import Connection, ScriptedServer

TOKEN_TEXT = " tok"
MAX_HEAD = 64 * 1024
REASONS = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}


def parse_request(buffer: bytes) -> tuple[str, str, bytes, bytes] | None:
    """(method, path, body, rest of buffer) once a whole request is in `buffer`."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[:end].decode("latin-1").split("\r\n")
    method, path, _ = (head[0].split(" ", 2) + ["", ""])[:3]
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body_end = end + 4 + length
    if len(buffer) < body_end:
        return None
    return method, path.split("?")[0], buffer[end + 4:body_end], buffer[body_end:]


def json_response(status: int, payload: dict, extra: str = "") -> bytes:
    body = json.dumps(payload).encode()
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n")
    return head.encode() + body


def text_response(text: str) -> bytes:
    body = text.encode()
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")


def event(payload: dict | str) -> bytes:
    """One server-sent event, framed as one HTTP chunk."""
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    data = b"data: " + text.encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def text_chunk(text: str) -> dict:
    return {"id": "cmpl-scripted", "object": "text_completion", "model": "scripted",
            "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def chat_chunk(delta: dict) -> dict:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": "scripted",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def usage(prompt_tokens: int, num_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": num_tokens,
            "total_tokens": prompt_tokens + num_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


TEXT_EVENT = event(text_chunk(TOKEN_TEXT))
CHAT_EVENT = event(chat_chunk({"content": TOKEN_TEXT}))


class Stream:
    """One completion request, from getting a slot to its last byte."""

    def __init__(self, connection: "Connection", server: "ScriptedServer", body: dict,
                 prompt_tokens: int, is_chat: bool, is_error: bool) -> None:
        self.connection = connection
        self.server = server
        self.prompt_tokens = prompt_tokens
        self.num_tokens = max(1, int(body.get("max_tokens") or 16))
        self.is_streaming = bool(body.get("stream"))
        self.is_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.is_chat = is_chat
        self.is_error = is_error
        self.deadlines: list[float] = []
        self.handle: asyncio.TimerHandle | None = None
        self.is_closed = False
        self.is_queued = False
        self.cached_tokens = 0

    def start(self) -> None:
        """The request got a slot: schedule its tokens from now."""
        loop = asyncio.get_running_loop()
        # From the request's arrival when it got a slot at once, else from now.
        start = max(self.connection.received, loop.time() if self.is_queued else 0.0)
        self.deadlines = self.server.deadlines(start, self.prompt_tokens, self.num_tokens)
        if not self.is_streaming:
            self.handle = loop.call_at(self.deadlines[-1], self._whole)
            return
        self.connection.reply(STREAM_HEAD)
        if self.is_chat:
            self.connection.reply(event(chat_chunk({"role": "assistant", "content": ""})))
        self.handle = loop.call_at(self.deadlines[0], self._emit, 0)

    def _emit(self, index: int) -> None:
        if self.is_error and index == self.server.script.error_after:
            self.connection.reply(event({"error": {"message": "scripted error", "code": 500}}))
            self._end()
            return
        self.connection.reply(CHAT_EVENT if self.is_chat else TEXT_EVENT)
        if index + 1 < self.num_tokens:
            loop = asyncio.get_running_loop()
            self.handle = loop.call_at(self.deadlines[index + 1], self._emit, index + 1)
            return
        if self.is_usage:
            self.connection.reply(event(self._usage_event()))
        self._end()

    def _usage_event(self) -> dict:
        chunk = chat_chunk({}) if self.is_chat else text_chunk("")
        chunk["choices"] = []
        chunk["usage"] = usage(self.prompt_tokens, self.num_tokens, self.cached_tokens)
        return chunk

    def _end(self) -> None:
        self.connection.reply(event("[DONE]") + b"0\r\n\r\n")
        self._finish()

    def _whole(self) -> None:
        text = TOKEN_TEXT * self.num_tokens
        choice: dict = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if self.is_chat
                      else {"text": text})
        payload = {"id": "cmpl-scripted", "model": "scripted", "choices": [choice],
                   "usage": usage(self.prompt_tokens, self.num_tokens)}
        self.connection.reply(json_response(200, payload))
        self._finish()

    def _finish(self) -> None:
        if self.is_closed:
            return
        self.is_closed = True
        self.server.slots.leave(self)
        self.connection.stream_done()

    def close(self) -> None:
        """The client went away: stop writing and give the slot back."""
        if self.handle is not None:
            self.handle.cancel()
        if not self.is_closed:
            self.is_closed = True
            self.server.slots.leave(self)
