"""The tuned tables a plan reads for a GPU, checked before their entries are merged: the explicit table
(`$HOSTTUNE_KERNEL_CONFIGS`, {gpu: {kernel: {key: config}}}) and the cache's tables tuned on that GPU
({"kernels": {kernel: {key: config}}}). A hand-edited table that does not parse is refused in one line that
names its file, not ignored and not met as a traceback at launch."""

from __future__ import annotations

import json
import re

from hosttune_engine.errors import ConfigError
from hosttune_engine.kernels import tuning
from hosttune_engine.plan.launch import LaunchConfig


def check_tables(gpu: str) -> None:
    """Raise a `ConfigError` naming the file of the first malformed table `gpu`'s plan would read."""
    path = tuning.user_table_path()
    if path.is_dir():
        raise ConfigError(f"{path} (a tuned table, ${tuning.USER_ENV}) is a folder; name a JSON file")
    if path.is_file():
        raw = _parse(path)
        _object(raw, f"{path}", "GPU names")
        if gpu in raw:
            _kernels(raw[gpu], f"{path}: {gpu!r}")
    for cached in tuning.cached_paths(gpu):
        raw = _parse(cached)
        _object(raw, f"{cached}", "table fields")
        if "kernels" not in raw:
            raise ConfigError(f"{cached}: holds no \"kernels\" object (a table `hosttune-engine tune` writes); "
                              "fix it or remove it")
        _kernels(raw["kernels"], f"{cached}: kernels")


def table_name(name: str) -> str:
    """The GPU name a tuned table spells `name` as: the same name in another case, or the one table name that holds
    it as whole words ("H200" -> "NVIDIA H200", but not "NVIDIA": a family has a number); else `name` itself. A
    name that several tables hold is refused."""
    names, wanted = _table_names(), name.strip()
    same = [n for n in names if n.lower() == wanted.lower()]
    if same or not any(c.isdigit() for c in wanted):  # every family has a number: "NVIDIA" alone names no GPU
        return same[0] if same else name
    words = re.compile(rf"(?<!\w){re.escape(wanted)}(?!\w)", re.IGNORECASE)
    holding = sorted(n for n in names if words.search(n))
    if len(holding) > 1:
        raise ConfigError(f"--gpu {name!r}: several GPUs have tuned tables: {', '.join(map(repr, holding))}; "
                          "give one of those names")
    return holding[0] if holding else name


def _table_names() -> set[str]:
    names = {key.gpu for key, _ in tuning.cached_tables()}
    for path in (tuning.SHIPPED, tuning.user_table_path()):
        raw = _parse(path) if path.is_file() else {}
        names |= set(raw) if isinstance(raw, dict) else set()
    return names


def _parse(path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} (a tuned table): cannot read it: {e}") from None
    except ValueError as e:
        raise ConfigError(f"{path} (a tuned table) is not JSON: {e}; fix it or remove it") from None


def _kernels(kernels: object, where: str) -> None:
    _object(kernels, where, "kernels")
    for kernel, entries in kernels.items():
        _object(entries, f"{where} {kernel}", "entries")
        for name, entry in entries.items():
            _object(entry, f"{where} {kernel} {name}", "launch-config keys")
            LaunchConfig.from_table(entry, f"{where} {kernel} {name}")


def _object(value: object, where: str, of: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: holds a JSON {_json_type(value)}, not an object of {of}")


def _json_type(value: object) -> str:
    return {list: "list", str: "string", int: "int", float: "number", bool: "boolean"}.get(type(value), "null")
