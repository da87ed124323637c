"""The terminal report: findings per host, a per-host summary and a fleet summary."""

from __future__ import annotations

from hosttune.checks.findings import Finding, Status
from hosttune.fleet import HostReport, outliers

MARK = {
    Status.OK: "ok", Status.DRIFT: "DRIFT", Status.PENDING_REBOOT: "REBOOT",
    Status.NOT_APPLICABLE: "n/a", Status.ERROR: "ERROR",
}
COLOR = {Status.DRIFT: "yellow", Status.PENDING_REBOOT: "cyan", Status.ERROR: "red", Status.OK: "green"}


def _finding_lines(f: Finding, color) -> list[str]:
    status = color(f"{MARK[f.status]:<7}", COLOR.get(f.status))
    if not f.is_failing and f.status is not Status.ERROR:
        return [f"  {status} {f.check_id:<19} {f.active or f.desired}" + (f"  ({f.detail})" if f.detail else "")]
    pad = " " * 10
    lines = [f"  {status} {f.check_id:<19} {f.title}" + ("  [needs reboot]" if f.needs_reboot and f.is_failing else "")]
    lines += [f"{pad}desired    {f.desired}", f"{pad}configured {f.configured or '-'}", f"{pad}active     {f.active or '-'}"]
    if f.detail:
        lines.append(f"{pad}{f.detail}")
    if f.is_failing:
        lines.append(f"{pad}fix: {f.remediation}")
    return lines


def _summary(r: HostReport) -> str:
    if not r.reachable:
        return "UNREACHABLE"
    if r.error:
        return "PROBE ERROR"
    counts = [f"{r.count(s)} {s.value}" for s in Status if r.count(s)]
    return ", ".join(counts) + f"  ({r.timings.total_s:.2f}s)"


def not_applicable_lines(findings) -> list[str]:
    """The checks that do not apply, one line per reason (no GPU, no NVMe, ...), each naming its checks."""
    by_reason: dict[str, list[str]] = {}
    for f in findings:
        if f.status is Status.NOT_APPLICABLE:
            by_reason.setdefault(f.detail or "does not apply here", []).append(f.check_id)
    return [f"  n/a     {reason}: {', '.join(ids)}" for reason, ids in by_reason.items()]


def render(reports: list[HostReport], *, color=None, verbose: bool = False) -> str:
    color = color or (lambda text, _c: text)
    out: list[str] = []
    for r in reports:
        out.append(f"{r.host.name} [{r.host.group}] profile {r.profile}: {_summary(r)}")
        if r.error:
            out.append(f"  {color(r.error, 'red')}")
        for f in r.findings:
            if verbose or f.status is not Status.NOT_APPLICABLE:
                out.extend(_finding_lines(f, color))
        if not verbose:
            out.extend(not_applicable_lines(r.findings))
        for problem in (r.facts.probe_errors if r.facts else ()):
            out.append(f"  probe: {problem}")
        out.append("")
    out.extend(fleet_summary(reports))
    return "\n".join(out)


def fleet_summary(reports: list[HostReport]) -> list[str]:
    reachable = [r for r in reports if r.reachable]
    clean = [r for r in reachable if not r.exit_bits]  # as the exit code says: no drift, no error, no probe error
    lines = [
        f"fleet: {len(reports)} host{'' if len(reports) == 1 else 's'}, {len(clean)} clean, {len(reachable) - len(clean)} with findings or errors, "
        f"{len(reports) - len(reachable)} unreachable"
    ]
    failing: dict[str, int] = {}
    for r in reachable:
        for f in r.findings:
            if f.is_failing or f.status is Status.ERROR:
                failing[f.check_id] = failing.get(f.check_id, 0) + 1
    if failing:
        lines.append("most common: " + ", ".join(f"{k} ({v})" for k, v in sorted(failing.items(), key=lambda kv: -kv[1])[:6]))
    for o in outliers(reports):
        ref = f"group has {o.majority!r}" if o.majority else "no majority in the group"
        lines.append(f"outlier: {o.host} [{o.group}] {o.fact} = {o.value!r} ({ref})")
    unreachable = [r.host.name for r in reports if not r.reachable]
    if unreachable:
        lines.append("unreachable: " + ", ".join(unreachable))
    return lines
