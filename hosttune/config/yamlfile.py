"""YAML loading that remembers where each key was written, for errors that name a line.

Inventories and playbooks come from users and from other tools, so the loader is bounded:
a file must be UTF-8 and at most MAX_BYTES, nest at most MAX_DEPTH levels, and expand
(aliases counted as often as they are used) to at most MAX_VALUES values. Anything else
is an error naming the file and line, never a crash or an unbounded allocation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import ScalarNode

from hosttune.errors import HosttuneError

MAX_BYTES = 2 << 20
MAX_DEPTH = 50
MAX_VALUES = 100_000


class LocatedDict(dict):
    """A mapping read from YAML: `line` is where it starts, `lines[key]` where each key is."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.line = 0
        self.lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int:
        return self.lines.get(key, self.line)


class _Loader(yaml.SafeLoader):
    """SafeLoader with bounds on nesting depth and on what aliases expand to."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._num_values = 0
        self._weights: dict[str, int] = {}

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) and event.anchor in self._weights:
            self._count(self._weights[event.anchor], event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        before = self._num_values
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if getattr(event, "anchor", None) is not None:
            self._weights[event.anchor] = self._num_values - before
        return node

    def _count(self, num: int, mark) -> None:
        self._num_values += num
        if self._num_values > MAX_VALUES:
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_VALUES} values once aliases are expanded (an alias bomb?)", mark)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LocatedDict:
    loader.flatten_mapping(node)
    result = LocatedDict()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain name, not a list or mapping", key_node.start_mark)
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in result:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = line
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _decode(path: Path, data: bytes, error: type[HosttuneError]) -> str:
    """UTF-8 (a byte-order mark is fine); anything else names the first bad line."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or data[:2].count(b"\x00"):
        raise error(f"{path}:1: the file is UTF-16 or UTF-32 text; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8") from None


def load(path: Path, error: type[HosttuneError]) -> Any:
    """Parse a YAML file; syntax errors become `error` naming the file and line."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from exc
    if len(data) > MAX_BYTES:
        raise error(f"{path}: larger than {MAX_BYTES >> 20} MiB; split it or check that it is the right file")
    text = _decode(path, data, error)
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: invalid YAML: {exc.problem}") from exc
    except yaml.reader.ReaderError as exc:
        line = text[:exc.position].count("\n") + 1
        raise error(f"{path}:{line}: invalid YAML: character #x{exc.character:04x} is not allowed in YAML text") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: invalid YAML: {exc}") from exc
