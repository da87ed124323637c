"""Traces to replay, for `--trace PATH`: when each request arrived and how long it was.

JSONL, one request a line, in any order:

    {"arrival": 0.25, "input_length": 812, "output_length": 64}

`arrival` is seconds from the trace's start; `timestamp` (milliseconds, as the Mooncake
traces write it) may be given instead. Lengths may also be named `prompt_tokens` and
`output_tokens`. Arrivals are shifted so that the first request arrives at 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from hosttune.bench.distributions import MAX_LENGTH, Replay
from hosttune.bench.input_file import read_input
from hosttune.errors import BenchError

INPUT_FIELDS = ("input_length", "prompt_tokens")
OUTPUT_FIELDS = ("output_length", "output_tokens")


@dataclass(frozen=True)
class Trace:
    arrivals: tuple[float, ...]  # seconds, sorted, the first at 0
    prompt_lengths: Replay
    output_lengths: Replay


def load_trace(path: Path) -> Trace:
    lines = [(number, line) for number, line in enumerate(read_input(path, "trace file").splitlines(), start=1)
             if line.strip()]
    rows = [_row(line, path, number) for number, line in lines]
    if not rows:
        raise BenchError(f"trace file {path} has no requests")
    _check_one_clock(rows, [number for number, _ in lines], path)
    rows = [(at, n, m) for at, n, m, _ in rows]
    rows.sort(key=lambda row: row[0])
    start = rows[0][0]
    return Trace(tuple(at - start for at, _, _ in rows),
                 Replay(tuple(n for _, n, _ in rows), str(path)),
                 Replay(tuple(m for _, _, m in rows), str(path)))


def _check_one_clock(rows: list[tuple[float, int, int, str]], numbers: list[int], path: Path) -> None:
    """Seconds on one line and milliseconds on another would replay a request 1000 times too early or late."""
    first = rows[0][3]
    for (_, _, _, key), number in zip(rows, numbers):
        if key != first:
            raise BenchError(f"{path}:{number}: \"{key}\" here, where line {numbers[0]} gives \"{first}\": give one "
                             "of them on every line")


def _row(line: str, path: Path, number: int) -> tuple[float, int, int, str]:
    try:
        item = json.loads(line)
    except ValueError:
        item = None
    if not isinstance(item, dict):
        raise BenchError(f"{path}:{number}: not a JSON object")
    if isinstance(item.get("arrival"), (int, float)):
        at, key = float(item["arrival"]), "arrival"
    elif isinstance(item.get("timestamp"), (int, float)):
        at, key = item["timestamp"] / 1000.0, "timestamp"
    else:
        raise BenchError(f"{path}:{number}: give \"arrival\" (seconds) or \"timestamp\" (milliseconds)")
    if not math.isfinite(at):
        raise BenchError(f"{path}:{number}: the arrival time must be a finite number")
    return at, _length(item, INPUT_FIELDS, path, number), _length(item, OUTPUT_FIELDS, path, number), key


def _length(item: dict, names: tuple[str, ...], path: Path, number: int) -> int:
    for name in names:
        if name in item:
            value = item[name]
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_LENGTH:
                raise BenchError(f"{path}:{number}: {name} must be an integer from 1 to {MAX_LENGTH}, got {value!r}")
            return value
    raise BenchError(f"{path}:{number}: give {names[0]} (or {names[1]})")
