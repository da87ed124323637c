"""Renderers of check results: table (terminal), json, junit, prometheus."""

from __future__ import annotations

from typing import Callable

from hosttune.errors import HosttuneError
from hosttune.fleet import HostReport
from hosttune.report import jsonout, junit, prometheus, table

FORMATS: dict[str, Callable[[list[HostReport]], str]] = {
    "table": table.render,
    "json": jsonout.render,
    "junit": junit.render,
    "prometheus": prometheus.render,
}


def render(fmt: str, reports: list[HostReport], **options) -> str:
    try:
        renderer = FORMATS[fmt]
    except KeyError:
        raise HosttuneError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}") from None
    return renderer(reports, **options) if options else renderer(reports)
