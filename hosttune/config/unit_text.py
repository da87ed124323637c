"""The one rule for a serving value that ends up on a systemd unit line (an Environment= entry or an ExecStart=
argument): one line of printable text. The inventory's `deploy:` (flags and env) and `deploy --set` both apply it,
so a value one accepts the other accepts too."""

from __future__ import annotations

from typing import Any

SCALARS = (str, int, float, bool, type(None))


def control_character(text: str) -> str | None:
    """The first control character in text (a tab, a newline, an escape...), or None."""
    return next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)


def unit_text_error(value: Any) -> str | None:
    """Why `value` cannot go on a unit line, in words (no place named), or None when it can."""
    if not isinstance(value, SCALARS):
        return f"must be a single-line scalar (got {type(value).__name__})"
    bad = control_character(str(value))
    if bad is not None:
        return (f"the value holds a control character ({bad!r}), which a systemd unit line cannot carry: give it on "
                "one line of printable text")
    return None
