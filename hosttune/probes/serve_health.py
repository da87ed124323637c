"""Parse the serve section: one JSON line per unit, engine port, front port and upstream server."""

from __future__ import annotations

import json

from hosttune.errors import ProbeError
from hosttune.probes.facts_serve import EndpointHealth, FrontHealth, ServeFacts, UnitHealth, UpstreamServer


def _unit(doc: dict) -> UnitHealth:
    restarts = str(doc.get("restarts") or "")
    return UnitHealth(str(doc["name"]), str(doc["load"]), str(doc["active"]), str(doc["sub"]), str(doc.get("result", "")),
                      str(doc.get("type", "")), int(restarts) if restarts.isdigit() else None,
                      tuple(str(line) for line in doc.get("journal") or ()))


def _endpoint(doc: dict) -> EndpointHealth:
    seconds = doc.get("seconds")
    return EndpointHealth(str(doc["role"]), int(doc["port"]), str(doc["health"]), str(doc["generation"]),
                          None if seconds is None else float(seconds), float(doc["timeout_s"]))


def _front(doc: dict) -> FrontHealth:
    return FrontHealth(str(doc["conf"]), int(doc["port"]), str(doc["scheme"]), str(doc["health"]))


def _upstream(doc: dict) -> UpstreamServer:
    return UpstreamServer(str(doc["conf"]), str(doc["server"]), bool(doc["down"]), bool(doc["reachable"]))


_KINDS = {"unit": _unit, "endpoint": _endpoint, "front": _front, "upstream": _upstream}
_FIELDS = {"unit": "units", "endpoint": "endpoints", "front": "fronts", "upstream": "upstreams"}


def parse_serve(text: str) -> ServeFacts:
    items: dict[str, list] = {name: [] for name in _FIELDS.values()}
    release = engine = ""
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
            if doc["kind"] == "release":
                release, engine = str(doc["id"]), str(doc["engine"])
            elif doc["kind"] in _KINDS:
                items[_FIELDS[doc["kind"]]].append(_KINDS[doc["kind"]](doc))
        except (ValueError, KeyError, TypeError) as exc:
            raise ProbeError(f"unreadable serve line {line[:120]!r}: {exc}") from None
    return ServeFacts(release, engine, **{name: tuple(v) for name, v in items.items()})
