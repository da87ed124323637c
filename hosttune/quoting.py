"""The one place where values become shell text.

Inventory values reach a remote shell only through `join` (argv → one quoted command
line) or as separate argv elements; nothing else in hosttune glues shell strings.
"""

import shlex
from collections.abc import Sequence


def quote(value: str) -> str:
    """Quote one value so a POSIX shell reads it back as exactly one word."""
    return shlex.quote(str(value))


def join(argv: Sequence[str]) -> str:
    """Turn an argument vector into a command line a POSIX shell splits back into argv."""
    if not argv:
        raise ValueError("empty command")
    return " ".join(quote(arg) for arg in argv)
