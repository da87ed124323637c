"""The monitor's wheel folder: every wheel the hosttune wheel needs, found in it before anything is uploaded.

The host installs with `pip install --no-index` from that folder, so a dependency missing there would fail pip in the
middle of an apply. Each wheel's `Requires-Dist` is read from its METADATA, its environment markers judged for this
Python (the one `pip wheel` filled the folder for), and the search follows the dependencies' own wheels.
"""

from __future__ import annotations

import os
import platform
import re
import sys
import zipfile
from pathlib import Path

from hosttune.errors import ProfileError

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?[^;]*(?:;(.*))?$")
_TOKEN = re.compile(r"\s*(\(|\)|===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b|and\b|or\b|'[^']*'|\"[^\"]*\"|[A-Za-z_.]+)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_dependency(folder: Path, root: Path) -> tuple[str, str] | None:
    """(the wheel that needs it, the requirement) for the first dependency with no wheel in `folder`, or None."""
    wheels = {normalized(p.name.split("-")[0]): p for p in folder.glob("*.whl")}
    seen, todo = set(), [root]
    while todo:
        wheel = todo.pop()
        for requirement in requires(wheel):
            name = normalized(_REQUIREMENT.match(requirement).group(1))
            if name not in wheels:
                return wheel.name, requirement.split(";")[0].strip()
            if name not in seen:
                seen.add(name)
                todo.append(wheels[name])
    return None


def requires(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist that hold for this Python, extras left out."""
    try:
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            text = z.read(name).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile, StopIteration):
        raise ProfileError(f"monitor.wheels: {wheel} is not a wheel (no .dist-info/METADATA in it); make the folder "
                           f"with `pip wheel PATH-TO-HOSTTUNE -w {wheel.parent}`") from None
    lines = [line.split(":", 1)[1].strip() for line in text.split("\n\n")[0].splitlines()
             if line.lower().startswith("requires-dist:")]
    return [line for line in lines if _REQUIREMENT.match(line) and _holds(_REQUIREMENT.match(line).group(3))]


def _environment() -> dict[str, str]:
    info = sys.implementation
    version = f"{info.version.major}.{info.version.minor}.{info.version.micro}"
    return {"python_version": "%d.%d" % sys.version_info[:2], "python_full_version": platform.python_version(),
            "os_name": os.name, "sys_platform": sys.platform, "platform_release": platform.release(),
            "platform_system": platform.system(), "platform_version": platform.version(),
            "platform_machine": platform.machine(), "platform_python_implementation": platform.python_implementation(),
            "implementation_name": info.name, "implementation_version": version, "extra": ""}


def _holds(marker: str | None) -> bool:
    """PEP 508 environment markers; `extra` is never set (hosttune is installed without extras)."""
    if not marker or not marker.strip():
        return True
    tokens = [t.group(1) for t in _TOKEN.finditer(marker)]
    value, rest = _or(tokens, _environment())
    return value and not rest


def _or(tokens, env):
    value, tokens = _and(tokens, env)
    while tokens and tokens[0] == "or":
        right, tokens = _and(tokens[1:], env)
        value = value or right
    return value, tokens


def _and(tokens, env):
    value, tokens = _atom(tokens, env)
    while tokens and tokens[0] == "and":
        right, tokens = _atom(tokens[1:], env)
        value = value and right
    return value, tokens


def _atom(tokens, env):
    if tokens[0] == "(":
        value, tokens = _or(tokens[1:], env)
        return value, tokens[1:]
    left, op, right = (_term(t, env) for t in tokens[:3])
    return _compare(left, " ".join(op.split()), right), tokens[3:]


def _term(token: str, env: dict[str, str]) -> str:
    return token[1:-1] if token[:1] in "'\"" else env.get(token, token)


def _version(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def _compare(left: str, op: str, right: str) -> bool:
    if op in ("in", "not in"):
        return (left in right) == (op == "in")
    a, b = _version(left), _version(right)
    if a is None or b is None or op in ("===",):
        return {"==": left == right, "===": left == right, "!=": left != right}.get(op, False)
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,
            "~=": a >= b}.get(op, False)
