"""Durations and SLO strings as users type them: `90s`, `10m`, `500ms`, `ttft=500ms,e2e=2s`; rates as a
report prints them."""

from __future__ import annotations

import math
import re

from hosttune.bench.metrics import Slo
from hosttune.errors import BenchError

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|)\s*$")


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in `text`: a number with an optional unit ms, s, m or h (default s)."""
    match = _DURATION.match(text)
    if not match:
        raise BenchError(f"{what} {text!r}: write a number with ms, s, m or h, e.g. 90s or 10m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def rate_text(per_s: float) -> str:
    """A rate in requests/s with two decimals, or with two significant digits below 0.1/s (0.0040, not 0.00),
    so a sweep that searched low rates still says which."""
    if per_s == 0 or abs(per_s) >= 0.1:
        return f"{per_s:.2f}"
    return f"{per_s:.{1 - math.floor(math.log10(abs(per_s)))}f}"


def parse_positive_duration(text: str, what: str) -> float:
    """Seconds in `text`, as `parse_duration`, refusing zero."""
    seconds = parse_duration(text, what)
    if seconds <= 0:
        raise BenchError(f"{what} {text}: give a positive time, e.g. 1s")
    return seconds


def parse_slo(text: str, percentile: float = 95, max_error_rate: float = 0.01) -> Slo:
    """`ttft=500ms,tpot=50ms,e2e=2s` (any subset) into an Slo."""
    limits: dict[str, float] = {}
    terms = [t.strip() for t in text.split(",")]
    if any(terms) and "" in terms:  # `e2e=2s,$TTFT` with TTFT unset is a limit left out, not one fewer to meet
        raise BenchError(f"SLO {text!r} has an empty entry; give limits such as ttft=500ms,e2e=2s "
                         "(no empty term between commas)")
    for term in filter(None, terms):
        name, sep, value = term.partition("=")
        name = name.strip().lower()
        if not sep or name not in ("ttft", "tpot", "e2e"):
            raise BenchError(f"SLO term {term!r}: use ttft=..., tpot=... or e2e=..., e.g. e2e=2s")
        if name in limits:
            raise BenchError(f"SLO {text!r} gives {name} twice: give each limit once")
        limits[name] = parse_duration(value, f"SLO {name}")
    if not limits:
        raise BenchError(f"SLO {text!r} names no limit; e.g. --slo e2e=2s")
    return Slo(percentile=percentile, max_error_rate=max_error_rate, **limits)


def parse_shared_prefix(text: str) -> tuple[int, int]:
    """`4x16` (4 system prompts, 16 users each) into (4, 16)."""
    left, sep, right = text.lower().partition("x")
    if not sep or not left.strip().isdigit() or not right.strip().isdigit() or "0" in (left.strip(), right.strip()):
        raise BenchError(f"--shared-prefix {text!r}: write NxM, e.g. 4x16 (4 system prompts, 16 users each)")
    return int(left), int(right)
