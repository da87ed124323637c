"""Reading an OpenAI-style server-sent event stream from timestamped body pieces."""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass
from typing import Iterable

try:  # orjson parses an event in a fraction of json's time; optional
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads


@dataclass(frozen=True)
class StreamEvents:
    """What a completion stream said, and when."""

    chunks: array  # arrival time of each event that carried output text
    end: float  # arrival time of [DONE], else of the last byte
    usage: dict  # the usage event's numbers ({} when none came)
    error: str  # "" unless the stream carried an error or was cut short


def parse_stream(segments: Iterable[tuple[float, bytes]], end: float) -> StreamEvents:
    """Split `(arrival time, bytes)` pieces into events. An event is timed by the piece
    that completed its line. `end` is used when the stream has no [DONE]."""
    chunks = array("d")
    usage: dict = {}
    buffer = b""
    for now, data in segments:
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return StreamEvents(chunks, now, usage, "")
            error = _read_event(payload, now, chunks, usage)
            if error:
                return StreamEvents(chunks, now, usage, error)
    return StreamEvents(chunks, end, usage, "stream-cut: the stream ended without [DONE]")


def _read_event(payload: bytes, now: float, chunks: array, usage: dict) -> str:
    try:
        event = _loads(payload)
    except ValueError:
        return f"stream-error: unparsable event {payload[:100]!r}"
    if not isinstance(event, dict):
        return f"stream-error: unexpected event {payload[:100]!r}"
    if "error" in event:
        return f"stream-error: {_error_message(event['error'])}"
    if event.get("usage"):
        usage.update(event["usage"])
    if any(_has_output(choice) for choice in event.get("choices") or ()):
        chunks.append(now)
    return ""


def _has_output(choice: dict) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content"))


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))[:200]
    return str(error)[:200]
