"""Render files from `templates/` (Jinja2), for the actions that write them and the checks that compare a host's copy.
Values that land in shell text pass the `q` filter."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from hosttune.quoting import quote


def template_dirs() -> list[Path]:
    """Inside the wheel (hosttune/templates), or beside the package in a source checkout."""
    here = Path(__file__).resolve().parent
    return [d for d in (here / "templates", here.parent / "templates") if d.is_dir()]


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in template_dirs()]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    return env


def render(name: str, **values) -> bytes:
    return _environment().get_template(name).render(**values).encode("utf-8")
