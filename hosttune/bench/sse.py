"""Reading an OpenAI-style server-sent event stream as its bytes arrive.

`EventStream.feed()` runs inside the socket callback for every piece of a response
body, so it must be cheap: an event that carries a token is recognised by a regular
expression over its bytes (a non-empty "text", "content", "reasoning_content" or "reasoning"
string) instead of a JSON parse. Events that could mean anything else — an "error"
or "usage" key, or no output at all — are parsed as JSON in full. A stream that keeps
its text (a conversation needs the answer for its next turn) parses every event.
"""

from __future__ import annotations

import json
import re
from array import array
from dataclasses import dataclass
from typing import Iterable

# A JSON key for output text followed by a string that is not empty.
_HAS_OUTPUT = re.compile(rb'"(?:text|content|reasoning_content|reasoning)"\s*:\s*"(?!")')


@dataclass(frozen=True)
class StreamEvents:
    """What a completion stream said, and when."""

    chunks: array  # arrival time of each event that carried output text
    end: float  # arrival time of [DONE] or of the error event, else the stream's end
    usage: dict  # the usage event's numbers ({} when none came)
    error: str  # "" unless the stream carried an error or was cut short
    text: str = ""  # the output text, when the stream was asked to keep it


class EventStream:
    """Incremental parser: feed it body pieces with their arrival times."""

    def __init__(self, is_keep_text: bool = False) -> None:
        self.partial = b""
        self.chunks = array("d")
        self.usage: dict = {}
        self.error = ""
        self.end_at: float | None = None  # set by [DONE] or an error event
        self.texts: list[str] | None = [] if is_keep_text else None

    def feed(self, data: bytes, now: float) -> None:
        if self.end_at is not None:
            return
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), now)
                if self.end_at is not None:
                    return

    def _event(self, payload: bytes, now: float) -> None:
        if self.texts is not None and payload != b"[DONE]":
            self.error = _read_event(payload, now, self.chunks, self.usage, self.texts)
            if self.error:
                self.end_at = now
        elif b'"error"' not in payload and b'"usage"' not in payload and _HAS_OUTPUT.search(payload):
            self.chunks.append(now)  # the common case: one more token
        elif payload == b"[DONE]":
            self.end_at = now
        else:
            self.error = _read_event(payload, now, self.chunks, self.usage)
            if self.error:
                self.end_at = now

    def result(self, end: float) -> StreamEvents:
        """The events so far; a stream that ended without [DONE] was cut short."""
        text = "".join(self.texts or ())
        if self.end_at is None:
            return StreamEvents(self.chunks, end, self.usage,
                                self.error or "stream-cut: the stream ended without [DONE]", text)
        return StreamEvents(self.chunks, self.end_at, self.usage, self.error, text)


def parse_stream(segments: Iterable[tuple[float, bytes]], end: float) -> StreamEvents:
    """Parse `(arrival time, bytes)` pieces at once. An event is timed by the piece that
    completed its line; `end` is used when the stream has no [DONE]."""
    stream = EventStream()
    for now, data in segments:
        stream.feed(data, now)
    return stream.result(end)


def _read_event(payload: bytes, now: float, chunks: array, usage: dict,
                texts: list[str] | None = None) -> str:
    try:
        event = json.loads(payload)
    except ValueError:
        return f"stream-error: unparsable event {payload[:100]!r}"
    if not isinstance(event, dict):
        return f"stream-error: unexpected event {payload[:100]!r}"
    if event.get("error") is not None:
        return f"stream-error: {_error_message(event['error'])}"
    if event.get("object") == "error":
        return f"stream-error: {_error_message(event)}"
    choices, event_usage = event.get("choices") or [], event.get("usage") or {}
    if not _is_choice_list(choices) or not isinstance(event_usage, dict):
        return f"stream-error: unexpected event {payload[:100]!r}"
    usage.update(_counts(event_usage))
    outputs = [text for choice in choices if (text := _output(choice))]
    if outputs:
        chunks.append(now)
        if texts is not None:
            texts += outputs
    return ""


def _is_choice_list(choices: object) -> bool:
    """OpenAI's shape: a list of objects, each with a string "text" or an object "delta" (when it has them)."""
    return isinstance(choices, list) and all(
        isinstance(c, dict) and isinstance(c.get("text", ""), (str, type(None)))
        and isinstance(c.get("delta") or {}, dict) for c in choices)


def _output(choice: dict) -> str:
    if choice.get("text"):
        return choice["text"]
    delta = choice.get("delta") or {}
    # A reasoning model's thinking, named reasoning_content until vLLM renamed it reasoning: tokens, as content is
    text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
    return text if isinstance(text, str) else ""


def _counts(usage: dict) -> dict:
    """The usage numbers a report can add up: whole token counts, and the cached ones among the prompt's (a
    null or a text count is left out, as if not reported)."""
    counts = {name: value for name, value in usage.items() if _is_count(value)}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and _is_count(details.get("cached_tokens")):
        counts["prompt_tokens_details"] = {"cached_tokens": details["cached_tokens"]}
    return counts


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))[:200]
    return str(error)[:200]
