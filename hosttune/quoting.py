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


# systemd unit files are not shell, but values reach them the same way: one word per value.
_SYSTEMD_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,+@-")


def systemd_word(value: str, *, exec_line: bool = False) -> str:
    """Quote one value for a unit file's ExecStart= (exec_line) or Environment= line.

    Double quotes with backslash escapes when needed; % is doubled (specifiers), and $ too
    on exec lines (variable expansion). Newlines cannot be written and raise ValueError.
    """
    value = str(value)
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"a unit file value cannot contain a line break: {value!r}")
    value = value.replace("%", "%%")
    if exec_line:
        value = value.replace("$", "$$")
    if value and all(c in _SYSTEMD_SAFE or c == "%" or (exec_line and c == "$") for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_exec(argv: Sequence[str]) -> str:
    """An argument vector as an ExecStart= command line that systemd splits back into argv."""
    if not argv:
        raise ValueError("empty command")
    return " ".join(systemd_word(arg, exec_line=True) for arg in argv)
