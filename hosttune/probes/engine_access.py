"""Parse the engine-access section: one JSON line per port of the deployed engine or its nginx front."""

from __future__ import annotations

import json

from hosttune.errors import ProbeError
from hosttune.probes.facts import EngineEndpoint


def parse_engine_access(text: str) -> tuple[EngineEndpoint, ...]:
    endpoints = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
            endpoints.append(EngineEndpoint(str(doc["role"]), int(doc["port"]), str(doc["scheme"]),
                                            tuple(str(a) for a in doc["listen"]), str(doc["status"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ProbeError(f"unreadable engine-access line {line[:120]!r}: {exc}") from None
    return tuple(endpoints)
