"""`hosttune status` output: the fleet table (one line per host) with each failing finding under it, or JSON."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

from hosttune.status import HostStatus
from hosttune.status_file import FindingBrief

COLUMNS = ("HOST", "STATE", "AGE", "HOSTTUNE", "DRIVER", "RELEASE", "FAILING")


def state(s: HostStatus) -> str:
    if not s.reachable:
        return "UNREACHABLE"
    if s.is_error:
        return "ERROR"
    if s.stale:
        return "STALE"
    return "DRIFT" if s.findings else "ok"


def _row(s: HostStatus) -> tuple[str, ...]:
    versions = s.docs[0].versions if s.docs else {}
    age = "-" if s.age_s is None else f"{s.age_s:.0f}s"
    return (s.host.name, state(s), age, versions.get("hosttune", "-"), versions.get("driver") or "-",
            versions.get("release") or "-", str(len(s.findings)))


def _details(s: HostStatus) -> list[str]:
    if s.error or not s.reachable:
        return [f"    {s.error}"]
    lines = [f"    {d.pass_name} pass: probe failed: {d.error}" for d in s.docs if d.error]
    return lines + [f"    {f.check_id:<19} {f.severity:<8} {_said(f)}" for f in s.findings]


def _said(f: FindingBrief) -> str:
    return f"cannot judge: {f.detail}" if f.status == "error" else f.detail


def render_table(statuses: list[HostStatus]) -> str:
    rows = [COLUMNS] + [_row(s) for s in statuses]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for row, s in zip(rows, [None, *statuses]):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
        if s is not None and state(s) != "ok":
            lines += _details(s)
    counts = Counter(state(s) for s in statuses)
    hosts = "host" if len(statuses) == 1 else "hosts"
    lines.append(f"{len(statuses)} {hosts}: " + ", ".join(f"{n} {k.lower()}" for k, n in sorted(counts.items())))
    return "\n".join(lines)


def render_json(statuses: list[HostStatus]) -> str:
    return json.dumps([{"host": s.host.name, "state": state(s), "age_s": s.age_s, "error": s.error,
                        "findings": [asdict(f) for f in s.findings], "passes": [asdict(d) for d in s.docs]}
                       for s in statuses], indent=1)
