"""Prompts from a dataset file, for `--dataset PATH`.

Formats, told apart by content:

- ShareGPT JSON: a list of `{"conversations": [{"from": "human"|"gpt"|"system",
  "value": TEXT}, ...]}`. An entry's human turns are its questions: a single-turn run
  sends the first, a conversation (`--turns`) sends them one per turn.
- JSONL, one object a line: `{"prompt": TEXT}` or `{"messages": [{"role": ...,
  "content": ...}, ...]}` (sent as they are to the chat API), each optionally with
  `"output_tokens"` (the length to ask for instead of `--max-tokens`). The same objects in
  one JSON list are read too.

Entries without a user message (ShareGPT entries with no human turn) are skipped; a file
with none left is an error, as is a line whose prompt (or every message of it) is empty.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from hosttune.bench.distributions import MAX_LENGTH, LengthDistribution
from hosttune.bench.input_file import read_input
from hosttune.bench.workload import Messages, Prompt, Question
from hosttune.errors import BenchError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}


@dataclass(frozen=True)
class Entry:
    messages: Messages
    output_tokens: int | None = None


def load_dataset(path: Path) -> tuple[Entry, ...]:
    text = read_input(path, "dataset file")
    if text.lstrip().startswith("["):
        entries = _sharegpt(_json(text, path), path)
    else:
        entries = [_jsonl_entry(line, path, number)
                   for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    entries = [e for e in entries if any(role == "user" for role, _ in e.messages)]
    if not entries:
        raise BenchError(f"dataset {path} holds no prompts: expected ShareGPT JSON or JSONL "
                         "lines with \"prompt\" or \"messages\"")
    return tuple(entries)


def estimate_tokens(text: str) -> int:
    """About 4 tokens per 3 English words, for reports when the server gives no count."""
    return max(1, round(len(text.split()) * 4 / 3))


def _json(text: str, path: Path) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BenchError(f"dataset {path}: not valid JSON ({exc})") from None


def _sharegpt(data: object, path: Path) -> list[Entry]:
    if not isinstance(data, list):
        raise BenchError(f"dataset {path}: a ShareGPT file is a JSON list of entries")
    entries = []
    for index, item in enumerate(data, start=1):
        turns = item.get("conversations") or item.get("conversation") if isinstance(item, dict) else None
        if isinstance(turns, list):
            entries.append(Entry(tuple(_sharegpt_turn(t) for t in turns if _sharegpt_turn(t))))
        elif isinstance(item, dict) and ("prompt" in item or "messages" in item):  # the JSONL objects, in a list
            entries.append(_entry(item, f"{path}: entry {index}"))
    return entries


def _sharegpt_turn(turn: object) -> tuple[str, str] | None:
    if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or not turn["value"].strip():
        return None
    role = ROLES.get(str(turn.get("from", "")).lower())
    return (role, turn["value"]) if role else None


def _jsonl_entry(line: str, path: Path, number: int) -> Entry:
    try:
        item = json.loads(line)
    except ValueError:
        raise BenchError(f"{path}:{number}: not a JSON object") from None
    return _entry(item, f"{path}:{number}")


def _entry(item: object, where: str) -> Entry:
    """A {"prompt"} or {"messages"} object, a JSONL line's or a JSON list's (`where` names it in errors)."""
    if not isinstance(item, dict):
        raise BenchError(f"{where}: not a JSON object")
    output = item.get("output_tokens")
    if output is not None and (not isinstance(output, int) or isinstance(output, bool) or not 1 <= output <= MAX_LENGTH):
        raise BenchError(f"{where}: output_tokens must be an integer from 1 to {MAX_LENGTH}, got {output!r}")
    if isinstance(item.get("prompt"), str):
        return _nonempty(Entry((("user", item["prompt"]),), output), where)
    messages = item.get("messages")
    if isinstance(messages, list) and all(_is_message(m) for m in messages) and messages:
        return _nonempty(Entry(tuple((m["role"], m["content"]) for m in messages), output), where)
    raise BenchError(f"{where}: give \"prompt\": TEXT or \"messages\": [{{\"role\", \"content\"}}, ...]")


def _nonempty(entry: Entry, where: str) -> Entry:
    """An entry with some text to send: an empty prompt measures nothing, or draws a 400 counted as a failure."""
    if not any(text.strip() for _, text in entry.messages):
        raise BenchError(f"{where}: the prompt is empty: give it some text, or delete the line")
    return entry


def _is_message(message: object) -> bool:
    return (isinstance(message, dict) and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str))


class Dataset:
    """Each request sends the next entry's messages (up to its first answer, for
    ShareGPT entries)."""

    num_users = None
    is_keep_text = False

    def __init__(self, entries: tuple[Entry, ...], outputs: LengthDistribution, source: str) -> None:
        self.entries = entries
        self.outputs = outputs
        self.source = source

    def next(self, rng: random.Random, index: int, user: int | None) -> Prompt:
        entry = self.entries[index % len(self.entries)]
        messages = _first_request(entry.messages)
        max_tokens = self.outputs.sample(rng, index)  # drawn always: lengths keep their order
        num_tokens = sum(estimate_tokens(text) for _, text in messages)
        return Prompt(messages, num_tokens, entry.output_tokens or max_tokens)

    def answered(self, user: int | None, prompt: Prompt, text: str, num_tokens: int) -> None:
        pass

    def describe(self) -> str:
        return f"{len(self.entries)} prompts from {self.source}"


def _first_request(messages: Messages) -> Messages:
    """The messages before the first answer that follows a question."""
    for i, (role, _) in enumerate(messages):
        if role == "assistant" and any(r == "user" for r, _ in messages[:i]):
            return messages[:i]
    return messages


def dataset_questions(entries: tuple[Entry, ...]) -> Question:
    """The user messages of every entry, in order: one per conversation turn."""
    questions = [text for entry in entries for role, text in entry.messages if role == "user"]
    if not questions:
        raise BenchError("the dataset has no user messages to ask in conversation turns")

    def question(rng: random.Random, index: int) -> tuple[str, int]:
        text = questions[index % len(questions)]
        return text, estimate_tokens(text)
    return question
