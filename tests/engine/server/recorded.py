"""A recorded set of valid and invalid requests, and the server's answers to them.

`tests/fixtures/engine_server/responses.json` holds the answers (status, content type, body)
of a server started as the `server` fixture starts it. `test_recorded_responses.py` replays
the same requests and expects the same answers, so a change to request parsing, validation
or response building that changes what a client sees shows up as a diff. After an intended
change, write the file again:

    PYTHONPATH=.:engine python -m tests.engine.server.recorded
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .test_faults import (BAD_INPUTS, CHAT_BAD_INPUTS, CHAT_FIELDS, COMPLETION_FIELDS, FUZZ_VALUES)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "engine_server" / "responses.json"
SERVER_ARGS = ["--max-batch-size", "4", "--max-queue", "4"]
VOLATILE = ("id", "created", "model", "root")  # differ on every call, or name a temporary folder
FIRST_CHUNK_ONLY = {"prompt_token_ids"}  # in a stream, on each choice's first chunk and no other

USER = [{"role": "user", "content": "hi"}]
GREEDY = {"max_tokens": 2, "temperature": 0, "seed": 7}

MORE_CASES = [  # (name, path, body): valid requests of every kind, and bodies with several faults
    ("completion", "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}),
    ("completion n=2 with logprobs", "/v1/completions",
     {"prompt": ["a", "b"], "n": 2, "max_tokens": 3, "temperature": 0, "logprobs": 2}),
    ("completion token ids", "/v1/completions", {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 2, "temperature": 0}),
    ("completion stream with usage", "/v1/completions",
     {"prompt": "hello", "max_tokens": 3, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
      "logprobs": 1}),
    ("completion seeded sampling", "/v1/completions", {"prompt": "hi", "max_tokens": 3, "temperature": 1.0, "seed": 3}),
    ("completion stop string kept", "/v1/completions",
     {"prompt": "hi", "max_tokens": 6, "temperature": 0, "stop": ["e", "a"], "include_stop_str_in_output": True}),
    ("chat", "/v1/chat/completions", {"messages": USER, "max_tokens": 3, "temperature": 0}),
    ("chat with logprobs", "/v1/chat/completions",
     {"messages": USER, "max_completion_tokens": 2, "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    ("chat stream", "/v1/chat/completions",
     {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text",
      "text": "hi"}]}], "max_tokens": 3, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}),
    ("completion token ids returned", "/v1/completions",
     {"prompt": [[3, 4], [4, 5]], "n": 2, "max_tokens": 3, "temperature": 0, "return_token_ids": True}),
    ("completion stream token ids", "/v1/completions",
     {"prompt": "hello", "max_tokens": 3, "temperature": 0, "stream": True, "return_token_ids": True}),
    ("chat token ids returned", "/v1/chat/completions",
     {"messages": USER, "max_tokens": 3, "temperature": 0, "return_token_ids": True}),
    ("chat stream token ids", "/v1/chat/completions",
     {"messages": USER, "max_tokens": 3, "temperature": 0, "stream": True, "return_token_ids": True,
      "stream_options": {"include_usage": True}}),
    ("chat tools off", "/v1/chat/completions",
     {"messages": USER, "max_tokens": 2, "temperature": 0, "tools": [{}], "tool_choice": "none",
      "response_format": {"type": "text"}}),
    ("chat max_completion_tokens over a bad max_tokens", "/v1/chat/completions",
     {"messages": USER, "max_completion_tokens": 2, "max_tokens": "x", "temperature": 0}),
    ("unknown model", "/v1/completions", {"prompt": "hi", "model": "nope"}),
    ("tokenize text", "/tokenize", {"prompt": "hello world"}),
    ("tokenize messages", "/tokenize", {"messages": USER}),
    ("tokenize both", "/tokenize", {"prompt": "a", "messages": USER}),
    ("tokenize null prompt", "/tokenize", {"prompt": None}),
    ("detokenize", "/detokenize", {"tokens": [1, 2, 3]}),
    ("detokenize bad", "/detokenize", {"tokens": [1, True]}),
    ("two faults: echo and prompt", "/v1/completions", {"echo": True, "prompt": 5}),
    ("two faults: max_tokens and n", "/v1/completions", {"prompt": "hi", "max_tokens": 0, "n": 0}),
    ("two faults: n and temperature", "/v1/completions", {"prompt": "hi", "n": "2", "temperature": "x"}),
    ("two faults: best_of and stream", "/v1/completions", {"prompt": "hi", "best_of": 3, "stream": "x"}),
    ("two faults: stop and priority", "/v1/completions", {"prompt": "hi", "stop": 5, "priority": "x"}),
    ("two faults: messages and tools", "/v1/chat/completions", {"messages": [], "tools": [{}]}),
    ("penalties, min_p, min_tokens and logit_bias", "/v1/completions",
     {"prompt": "hi", **GREEDY, "frequency_penalty": 1, "presence_penalty": -0.5, "repetition_penalty": 1.2,
      "min_p": 0.1, "min_tokens": 2, "logit_bias": {"5": 3}}),
    ("two faults: top_logprobs and penalty", "/v1/chat/completions",
     {"messages": USER, "top_logprobs": 2, "presence_penalty": 1}),
    ("stream_options include_usage not a bool", "/v1/completions",
     {"prompt": "hi", "stream": True, "stream_options": {"include_usage": 2}}),
    ("chat_template_kwargs not an object", "/v1/chat/completions", {"messages": USER, "chat_template_kwargs": []}),
    ("response_format json", "/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_object"}}),
    ("seed at the int64 edge", "/v1/completions", {"prompt": "hi", "seed": 2**63, "max_tokens": 1}),
    ("top_k past 2^31", "/v1/completions", {"prompt": "hi", "top_k": 2**31 + 1}),
]


def cases() -> list[tuple[str, str, str, str, bytes]]:
    """(name, method, path, content type, body) for every recorded request."""
    out = [(f"completions: {name}", "POST", "/v1/completions", ctype, _raw(body))
           for name, body, ctype, _ in BAD_INPUTS]
    out += [(f"chat: {name}", "POST", "/v1/chat/completions", "application/json", _raw(body))
            for name, body, _ in CHAT_BAD_INPUTS]
    out += [(name, "POST", path, "application/json", _raw(body)) for name, path, body in MORE_CASES]
    fuzz = [("/v1/completions", {"prompt": "hi", **GREEDY}, COMPLETION_FIELDS),
            ("/v1/chat/completions", {"messages": USER, **GREEDY}, CHAT_FIELDS + ["temperature", "stop", "n"]),
            ("/tokenize", {"prompt": "hi"}, ["prompt", "messages", "add_special_tokens"])]
    for path, base, fields in fuzz:
        out += [(f"{path} {field}={json.dumps(value)}", "POST", path, "application/json",
                 _raw({**base, field: value})) for field in fields for value in FUZZ_VALUES]
    out += [("models", "GET", "/v1/models", "", b""), ("version", "GET", "/version", "", b""),
            ("no such route", "POST", "/v1/nothing-here", "application/json", b"{}"),
            ("wrong method", "GET", "/v1/completions", "", b""),
            ("body too large", "POST", "/v1/completions", "application/json", b"x" * (9 * 2**20))]
    return out


def _raw(body) -> bytes:
    if isinstance(body, bytes):
        return body
    return body.encode() if isinstance(body, str) else json.dumps(body).encode()


def send(url: str, method: str, path: str, content_type: str, body: bytes) -> dict:
    """One request's answer as the fixture stores it: status, content type, Retry-After and the body."""
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(url + path, data=body or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, got, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, got, raw = e.code, e.headers, e.read()
    ctype = got.get("Content-Type", "")
    return {"status": status, "content_type": ctype, "retry_after": got.get("Retry-After"),
            "body": _events(raw) if ctype.startswith("text/event-stream") else _normalized(json.loads(raw))}


def _events(raw: bytes) -> dict:
    """A stream as a client assembles it: chunk boundaries depend on timing, so they are merged.

    Kept: each choice's concatenated text, logprobs and final reasons; every chunk shape
    (object, fields, choice fields); chunks without choices (usage, errors); the end marker.
    """
    choices, shapes, other, first_only = {}, set(), [], {}
    for event in (line[len(b"data: "):] for line in raw.split(b"\n\n") if line):
        if event == b"[DONE]":
            other.append("[DONE]")
            continue
        chunk = _normalized(json.loads(event))
        for choice in chunk.get("choices", ()):
            # fields a choice's first chunk alone carries: counted, not part of the shape, which would otherwise
            # tell a stream that came in one chunk from one that came in several
            for key in FIRST_CHUNK_ONLY & set(choice):
                first_only[f"{choice['index']} {key}"] = first_only.get(f"{choice['index']} {key}", 0) + 1
            shapes.add(json.dumps([chunk["object"], sorted(chunk), sorted(set(choice) - FIRST_CHUNK_ONLY)]))
            _merge(choices.setdefault(choice["index"], {}), choice)
        if not chunk.get("choices"):
            other.append(chunk)
    events = {"choices": [choices[i] for i in sorted(choices)], "shapes": sorted(shapes), "other": other}
    return {**events, "first_chunk_only": first_only} if first_only else events


def _merge(into: dict, part: dict) -> None:
    for key, value in part.items():
        if isinstance(value, dict):
            _merge(into.setdefault(key, {}), value)
        elif isinstance(value, list):
            into[key] = into.get(key, []) + value
        elif isinstance(value, str) and key in ("text", "content", "role"):
            into[key] = into.get(key, "") + value
        elif value is not None or key not in into:
            into[key] = value


def _normalized(body):
    if isinstance(body, dict):
        return {k: f"<{k}>" if k in VOLATILE else _normalized(v) for k, v in body.items()}
    if isinstance(body, list):
        return [_normalized(v) for v in body]
    return round(body, 4) if isinstance(body, float) else body


def record(url: str) -> dict[str, dict]:
    return {name: send(url, method, path, ctype, body) for name, method, path, ctype, body in cases()}


def main() -> None:
    from ..tiny import build_tiny_models
    from .harness import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_models(Path(tmp) / "models")["qwen2"]
        server = ServerProcess(model, Path(tmp), SERVER_ARGS)
        try:
            server.wait_ready()
            answers = record(server.url)
        finally:
            server.terminate()
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(answers, indent=1, ensure_ascii=True) + "\n")
    print(f"{len(answers)} answers -> {FIXTURE}")


if __name__ == "__main__":
    main()
