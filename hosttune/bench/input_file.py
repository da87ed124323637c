"""The text of a file the bench reads (a dataset, a trace, a length file), or a one-line
error that names what is wrong with it."""

from __future__ import annotations

from pathlib import Path

from hosttune.errors import BenchError


def read_input(path: Path, what: str) -> str:
    """The UTF-8 text of `path`; `what` names the file in errors, e.g. 'trace file'."""
    if path.is_dir():
        raise BenchError(f"{what} {path} is a folder; give a file")
    if not path.is_file():
        raise BenchError(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BenchError(f"{what} {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 JSON") from None
    except OSError as exc:
        raise BenchError(f"cannot read {what} {path}: {exc.strerror}") from None
