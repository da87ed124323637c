"""Typed fields out of decoded JSON: each reader returns the value or raises a 400 naming the field.

Null means "use the default", as in OpenAI's API. Messages never quote more
than a few characters of what the client sent, so error bodies stay small.
"""

from __future__ import annotations

import math

from hosttune_engine.server.api_errors import bad_request

INT64 = 2**63


def describe(value) -> str:
    """A JSON value's type, and a short value for scalars (never the whole input)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {str(value)[:24]}"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_field(body: dict, name: str, ok, expected: str, default=None):
    value = body.get(name)
    if value is None:
        return default
    if not ok(value):
        raise bad_request(f"{name} must be {expected}, got {describe(value)}", name)
    return value


def read_int(body, name, default=None, lo=None, hi=None):
    value = read_field(body, name, is_int, "an integer", default)
    check_range(name, value, lo, hi)
    return value


def read_number(body, name, default=None, lo=None, hi=None):
    value = read_field(body, name, is_number, "a finite number", default)
    check_range(name, value, lo, hi)
    return float(value) if value is not None else None


def read_bool(body, name, default=False):
    return read_field(body, name, lambda v: isinstance(v, bool), "a boolean", default)


def read_str(body, name, default=None):
    return read_field(body, name, lambda v: isinstance(v, str), "a string", default)


def read_object(body, name, default=None):
    return read_field(body, name, lambda v: isinstance(v, dict), "an object", default)


def read_token_ids(value, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(is_int(t) and 0 <= t < INT64 for t in value):
        raise bad_request(f"{name} must be an array of non-negative integer token ids", name)
    return tuple(value)


def check_range(name, value, lo, hi) -> None:
    if value is None:
        return
    if lo is not None and value < lo:
        raise bad_request(f"{name} must be at least {lo}, got {str(value)[:24]}", name)
    if hi is not None and value > hi:
        raise bad_request(f"{name} must be at most {hi}, got {str(value)[:24]}", name)


def reject_unless(body: dict, name: str, neutral) -> None:
    value = body.get(name)
    if value is not None and value not in neutral:
        raise bad_request(f"{name} is not supported by this server", name)
