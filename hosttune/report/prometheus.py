"""Prometheus text exposition (for node_exporter's textfile collector)."""

from __future__ import annotations

from hosttune.checks.findings import Status
from hosttune.fleet import HostReport


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(reports: list[HostReport]) -> str:
    lines = [
        "# HELP hosttune_host_reachable Whether hosttune could reach and probe the host.",
        "# TYPE hosttune_host_reachable gauge",
    ]
    lines += [f'hosttune_host_reachable{{host="{_label(r.host.name)}"}} {int(not r.probe_exit_bits)}' for r in reports]
    lines += [
        "# HELP hosttune_check_status 1 for the status each check has on each host.",
        "# TYPE hosttune_check_status gauge",
    ]
    for r in reports:
        for f in r.findings:
            for status in Status:
                labels = f'host="{_label(r.host.name)}",check="{f.check_id}",status="{status.value}"'
                lines.append(f"hosttune_check_status{{{labels}}} {int(f.status is status)}")
    lines += [
        "# HELP hosttune_probe_duration_seconds Wall time of the host's probe round trip.",
        "# TYPE hosttune_probe_duration_seconds gauge",
    ]
    lines += [f'hosttune_probe_duration_seconds{{host="{_label(r.host.name)}"}} {r.timings.total_s:.4f}' for r in reports if r.reachable]
    return "\n".join(lines) + "\n"
