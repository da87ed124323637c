"""Parse the monitor section: hosttune's version in its virtualenv on the host, its timers and their intervals."""

from __future__ import annotations

import re

from hosttune.probes.facts_serve import MonitorFacts, TimerState
from hosttune.probes.sections import keyed

_DIST_INFO = re.compile(r"^hosttune-(?P<version>[^-]+)\.dist-info$")


def parse_monitor(text: str) -> MonitorFacts:
    pairs = keyed(text)
    installed = next((m["version"] for k, v in pairs if k == "installed" and (m := _DIST_INFO.match(v.strip()))), None)
    intervals = dict(v.partition(":")[::2] for k, v in pairs if k == "interval")
    timers, block = [], {}
    for key, value in pairs + [("unit", "")]:
        if key != "unit":
            continue
        name, sep, field = value.partition("=")
        if sep:
            block[name] = field
        elif block.get("Id"):
            timers.append(_timer(block, intervals))
            block = {}
    written = {name: int(when) for k, v in pairs if k == "written" for name, _, when in [v.partition(":")] if when.isdigit()}
    now = dict(pairs).get("now", "").strip()
    return MonitorFacts(installed, tuple(timers), written, int(now) if now.isdigit() else None)


def _timer(block: dict[str, str], intervals: dict[str, str]) -> TimerState:
    name = block["Id"]
    interval = intervals.get(name, "").partition("=")[2].strip()
    return TimerState(name, block.get("LoadState", ""), block.get("ActiveState", ""), block.get("UnitFileState", ""), interval)
