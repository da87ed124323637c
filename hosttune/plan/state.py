"""The current state of everything a plan would change, read in one read-only round trip.

The probe's facts say *that* something differs; this says exactly what is there now (file
bytes for diffs and backups, unit states, kernel values, package versions), so the plan
drops what already holds and the journal records what rollback must restore.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field, replace

from hosttune.actions.base import CommentOut, FileWrite, KernelWrite, Remove, Packages, Service, Step, Symlink
from hosttune.errors import ProbeError
from hosttune.probes.software import parse_packages
from hosttune.transport.base import Transport, image_script

@dataclass(frozen=True)
class FileState:
    path: str
    kind: str  # "file" | "dir" | "other" | "absent"
    link: str | None = None  # the link's own target, when path is a symbolic link
    real: str | None = None  # the fully resolved path, when path is a symbolic link
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    sha256: str | None = None
    content: bytes | None = None

    @property
    def exists(self) -> bool:
        return self.kind != "absent" or self.link is not None


@dataclass(frozen=True)
class UnitState:
    unit: str
    enabled: str  # systemctl is-enabled: enabled, disabled, static, masked, ... ; "" when not found
    active: str | None  # systemctl is-active; None under --root


@dataclass(frozen=True)
class PackageState:
    name: str
    installed: str | None
    available: tuple[str, ...] = ()


@dataclass(frozen=True)
class State:
    files: dict[str, FileState] = field(default_factory=dict)
    units: dict[str, UnitState] = field(default_factory=dict)
    kernel: dict[str, str | None] = field(default_factory=dict)
    packages: dict[str, PackageState] = field(default_factory=dict)
    held: tuple[str, ...] = ()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state_script() -> str:
    return image_script("hosttune.plan", "state.sh")


def rooted(root: str | None, path: str) -> str:
    """Where a host path lies under --root."""
    return path if not root or root == "/" else root.rstrip("/") + path


def unrooted(root: str | None, path: str) -> str:
    """The host path of a path under --root."""
    prefix = "" if not root or root == "/" else root.rstrip("/")
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


def requests_for(steps: list[Step], root: str | None) -> list[tuple[str, str]]:
    """(kind, value) pairs: what the plan must know about the host to prune and journal these steps."""
    wanted: dict[tuple[str, str], None] = {}
    for step in steps:
        for op in step.ops:
            for req in _requests_of(op, root):
                wanted[req] = None
    return list(wanted)


def _requests_of(op, root: str | None) -> list[tuple[str, str]]:
    if isinstance(op, (FileWrite, CommentOut, Symlink, Remove)):
        return [("file", rooted(root, op.path))]
    if isinstance(op, Service):
        return [("unit", op.unit)]
    if isinstance(op, KernelWrite):
        return [] if root and root != "/" else [("kernel", p) for p in op.paths]
    if isinstance(op, Packages):
        return [("pkg", n) for n in op.names] + [("held", "")]
    return []


def read_state(transport: Transport, requests: list[tuple[str, str]], *, root: str | None, manager: str | None) -> State:
    """Ask the host (read-only) about every request, in one command."""
    if not requests:
        return State()
    output = transport.read_script(state_script(), root or "/", manager or "none", *(f"{k}:{v}" for k, v in requests),
                                   what="reading the current state")
    return parse_state(output, requests, root)


_START = re.compile(r"^@@s:(\d+)$")
_END = re.compile(r"^@@s-end:(\d+)$")


def _answers(output: str) -> dict[int, list[str]]:
    answers: dict[int, list[str]] = {}
    current: int | None = None
    for line in output.splitlines():
        if m := _START.match(line):
            current = int(m.group(1))
            answers[current] = []
        elif _END.match(line):
            current = None
        elif current is not None:
            answers[current].append(line)
    return answers


def parse_state(output: str, requests: list[tuple[str, str]], root: str | None) -> State:
    """The state script's output → State (keyed by host paths, not rooted ones)."""
    answers = _answers(output)
    files: dict[str, FileState] = {}
    units: dict[str, UnitState] = {}
    kernel: dict[str, str | None] = {}
    packages: dict[str, PackageState] = {}
    held: tuple[str, ...] = ()
    for index, (kind, value) in enumerate(requests):
        lines = answers.get(index)
        if lines is None:
            raise ProbeError(f"no answer about {kind} {value!r} from the state script")
        fields = _fields(lines)
        if kind == "file":
            path = unrooted(root, value)
            files[path] = _file_state(path, fields, root)
            if (linked := files[path]).link and linked.real:  # a write through the link lands there, and is journaled so
                files.setdefault(linked.real, replace(linked, path=linked.real, link=None, real=None))
        elif kind == "unit":
            active = _first(fields, "active") if not root or root == "/" else None
            units[value] = UnitState(value, _first(fields, "enabled") or "", active)
        elif kind == "kernel":
            kernel[value] = _first(fields, "value")
        elif kind == "pkg":
            packages[value] = _package_state(value, fields)
        elif kind == "held":
            held = parse_packages("\n".join(lines))[2]
    return State(files, units, kernel, packages, held)


def _fields(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key, []).append(value)
    return out


def _first(fields: dict[str, list[str]], key: str) -> str | None:
    values = fields.get(key)
    return values[0].strip() if values else None


def _file_state(path: str, fields: dict[str, list[str]], root: str | None) -> FileState:
    stat = (_first(fields, "stat") or "absent").split()
    real = _first(fields, "real")
    kind = stat[0]
    common = dict(path=path, kind=kind, link=_first(fields, "link"), real=unrooted(root, real) if real else real)
    if kind != "file":
        return FileState(**common)
    data = base64.b64decode(_first(fields, "data") or "")
    return FileState(**common, mode=int(stat[1], 8), uid=int(stat[2]), gid=int(stat[3]),
                     sha256=_first(fields, "sha"), content=data)


def _package_state(name: str, fields: dict[str, list[str]]) -> PackageState:
    installed = None
    for line in fields.get("installed", []):
        version, _, status = line.partition("\t")
        if status.strip().startswith(("ii", "hi")):
            installed = version.strip()
    available = tuple(dict.fromkeys(v.strip() for v in fields.get("available", []) if v.strip()))
    return PackageState(name, installed, available)
