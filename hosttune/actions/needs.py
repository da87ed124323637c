"""What an operation needs on the host before it can run: its preconditions, as data.

Each operation kind declares its needs (`Op.needs` in `actions/base.py`); the planner
(`hosttune.plan.preconditions`) checks them against facts read over the read-only transport,
before anything is sent. A need is met by the host as it is, by an earlier operation of the
same plan (`Op.provides`), by an operation the planner adds (a missing parent directory, a
package), or it is a plan-time error for that host.
"""

from __future__ import annotations

from dataclasses import dataclass
from posixpath import dirname
from typing import Union


VENV_BYTES_PER_WHEEL_BYTE = 3  # a virtualenv takes about this many bytes per byte of the wheels it is installed from


@dataclass(frozen=True)
class NeedCommand:
    """A program on the host's PATH (under --root: inside the image, which runs it with chroot).

    on_machine: the program runs on the machine that reaches the image (systemctl --root), not in it.
    """

    name: str
    on_machine: bool = False


@dataclass(frozen=True)
class NeedVenv:
    """`python -m venv` works: the interpreter is there and has ensurepip (Debian's pythonX-venv)."""

    python: str


@dataclass(frozen=True)
class NeedDir:
    """The directory `path` exists: something is created inside it by a temporary file and a rename."""

    path: str


@dataclass(frozen=True)
class NeedSpace:
    """`num_bytes` free on the filesystem that will hold `path` (summed over a plan per filesystem).

    note: how num_bytes is counted where that is not plain: how much is estimated and why (what pip fetches from
    an index), and where the writer puts its files.
    """

    path: str
    num_bytes: int
    note: str = ""


@dataclass(frozen=True)
class NeedPort:
    """Nothing listens on `port`, or only the units in `owners` (a unit name, or a prefix ending in '@')."""

    port: int
    owners: tuple[str, ...] = ()


@dataclass(frozen=True)
class NeedModel:
    """A model folder the engine can load: readable, with a config.json of an architecture it supports."""

    path: str
    engine: str


Need = Union[NeedCommand, NeedVenv, NeedDir, NeedSpace, NeedPort, NeedModel]


def parents(path: str) -> tuple[str, ...]:
    """Every directory above `path`, nearest first: /a/b/c → /a/b, /a, /."""
    out = []
    while path not in ("/", ""):
        path = dirname(path.rstrip("/")) or "/"
        out.append(path)
    return tuple(out)


def program(argv: tuple[str, ...]) -> str:
    """The program a command runs (`env VAR=x prog ...` runs prog)."""
    if argv and argv[0] == "env":
        return next((a for a in argv[1:] if "=" not in a), "env")
    return argv[0] if argv else ""


def size_text(num_bytes: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes} bytes"


def describe_need(need: Need) -> str:
    """One line: what is checked."""
    if isinstance(need, NeedCommand):
        return f"{need.name} on the {'machine running hosttune' if need.on_machine else 'host'}"
    if isinstance(need, NeedVenv):
        return f"{need.python} can make a virtualenv (python -m venv)"
    if isinstance(need, NeedDir):
        return f"directory {need.path}"
    if isinstance(need, NeedSpace):
        return f"{size_text(need.num_bytes)} free for {need.path}"
    if isinstance(need, NeedPort):
        return f"port {need.port} free" + (f" or held by {', '.join(need.owners)}" if need.owners else "")
    return f"model {need.path} loadable by {need.engine} (config.json and weights)"
