"""The probe script's output format: named sections with their exit codes."""

from __future__ import annotations

import re
from dataclasses import dataclass

_START = re.compile(r"^@@ht:(?P<name>[\w-]+)$")
_END = re.compile(r"^@@ht-end:(?P<name>[\w-]+):(?P<rc>\d+)$")


@dataclass(frozen=True)
class Section:
    name: str
    text: str
    rc: int


def split(output: str) -> dict[str, Section]:
    """Cut probe output into sections; a section without its end marker is dropped."""
    sections: dict[str, Section] = {}
    name, lines = None, []
    for line in output.splitlines():
        if m := _START.match(line):
            name, lines = m["name"], []
        elif (m := _END.match(line)) and m["name"] == name:
            text = "\n".join(lines)
            sections[name] = Section(name, text[:-1] if text.endswith("\n") else text, int(m["rc"]))
            name = None
        elif name is not None:
            lines.append(line)
    return sections


def keyed(text: str) -> list[tuple[str, str]]:
    """Lines of 'key:value' (grep -H output or our own tags), in order."""
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key, value))
    return pairs


def by_key(text: str) -> dict[str, str]:
    """'key:value' lines as a dict; a repeated key keeps its last value."""
    return dict(keyed(text))
