"""What a plan's operations need on the host, read as it is now: programs, directories, free
space, listeners on ports, a Python that makes virtualenvs, installable packages.

One read-only round trip (`needs.sh`, its values as arguments) and a pure parser. Which
questions to ask, and what the answers mean for a plan, is `hosttune.plan.preconditions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hosttune.errors import ProbeError
from hosttune.transport.base import Transport, image_script

KINDS = ("cmd", "mcmd", "venv", "dir", "space", "port", "pkg")


@dataclass(frozen=True)
class HostNeeds:
    """The answers, keyed by what was asked. A key is absent when it was not asked."""

    commands: dict[str, str | None] = field(default_factory=dict)  # program → where it is (in the root), None: nowhere
    machine_commands: dict[str, str | None] = field(default_factory=dict)  # the same, on the machine itself
    venvs: dict[str, str] = field(default_factory=dict)  # python → "" when `python -m venv` works, else why not
    dirs: dict[str, str] = field(default_factory=dict)  # path → dir | absent | other
    space: dict[str, tuple[int, str]] = field(default_factory=dict)  # path → (free bytes, mount point)
    blocked: dict[str, str] = field(default_factory=dict)  # dir or space path → the non-directory where its directory must be
    ports: dict[int, tuple[str, ...] | None] = field(default_factory=dict)  # port → listening units ("?" unknown); None: not known
    candidates: dict[str, str | None] = field(default_factory=dict)  # package → installable version, None: none
    models: dict[str, str] = field(default_factory=dict)  # model folder → "" when loadable, else why not


_START = re.compile(r"^@@n:(\d+)$")
_END = re.compile(r"^@@n-end:(\d+)$")


def _answers(output: str) -> dict[int, dict[str, list[str]]]:
    answers: dict[int, dict[str, list[str]]] = {}
    current = None
    for line in output.splitlines():
        if m := _START.match(line):
            current = answers.setdefault(int(m.group(1)), {})
        elif _END.match(line):
            current = None
        elif current is not None:
            key, _, value = line.partition(":")
            current.setdefault(key, []).append(value)
    return answers


def _first(fields: dict[str, list[str]], key: str) -> str | None:
    return fields[key][0] if fields.get(key) else None


def parse_needs(output: str, requests: list[tuple[str, str]]) -> HostNeeds:
    """The script's output → HostNeeds; a request without an answer is a ProbeError."""
    answers = _answers(output)
    needs = HostNeeds()
    for index, (kind, value) in enumerate(requests):
        fields = answers.get(index)
        if fields is None:
            raise ProbeError(f"no answer about {kind} {value!r} from the preconditions script")
        _store(needs, kind, value, fields)
    return needs


def _store(needs: HostNeeds, kind: str, value: str, fields: dict[str, list[str]]) -> None:
    if kind in ("cmd", "mcmd"):
        (needs.commands if kind == "cmd" else needs.machine_commands)[value] = _first(fields, "found")
    elif kind == "venv":
        needs.venvs[value] = "" if "ok" in fields else (
            f"{value} is not installed" if "missing" in fields else (_first(fields, "fail") or "fails").strip())
    elif kind == "dir":
        needs.dirs[value] = _first(fields, "kind") or "absent"
    elif kind == "space":
        free, _, mount = (_first(fields, "free-kb") or "").partition(" ")
        if free.isdigit():
            needs.space[value] = (int(free) * 1024, mount)
    if kind in ("dir", "space") and (blocked := _first(fields, "blocked")):
        needs.blocked[value] = blocked
    elif kind == "port":
        needs.ports[int(value)] = None if "unknown" in fields else tuple(fields.get("listen", []))
    elif kind == "pkg":
        needs.candidates[value] = _first(fields, "candidate")


def read_needs(transport: Transport, requests: list[tuple[str, str]], *, root: str | None,
               manager: str | None) -> HostNeeds:
    """Ask the host (read-only) every question, in one command."""
    if not requests:
        return HostNeeds()
    script = image_script("hosttune.probes", "needs.sh")
    output = transport.read_script(script, root or "/", manager or "none", *(f"{k}:{v}" for k, v in requests),
                                   what="reading what the plan needs")
    return parse_needs(output, requests)
