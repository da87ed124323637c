"""A monitor pass as Prometheus text for node_exporter's textfile collector: every series carries `pass`, so
the regular and the --active pass each write their own file without colliding."""

from __future__ import annotations

from hosttune.checks.findings import Severity, Status
from hosttune.fleet import HostReport
from hosttune.status_file import StatusDoc

_HELP = {
    "hosttune_check_status": ("gauge", "1 for the status each check has on this host, 0 for the others."),
    "hosttune_check_critical": ("gauge", "1 when the check's finding is critical (its alert pages)."),
    "hosttune_monitor_probe_ok": ("gauge", "Whether the pass could probe this host."),
    "hosttune_monitor_failing_findings": ("gauge", "Findings that drift or wait for a reboot, by severity."),
    "hosttune_monitor_last_run_timestamp_seconds": ("gauge", "When the pass finished (Unix time)."),
    "hosttune_monitor_run_duration_seconds": ("gauge", "How long the pass took."),
    "hosttune_info": ("gauge", "Versions on this host: hosttune, the GPU driver, the kernel, the live engine release."),
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def _series(report: HostReport, doc: StatusDoc) -> dict[str, list[str]]:
    base = {"host": doc.host, "pass": doc.pass_name}
    out: dict[str, list[str]] = {name: [] for name in _HELP}
    for f in report.findings:
        for status in Status:
            out["hosttune_check_status"].append(f"{_labels(**base, check=f.check_id, status=status.value)} {int(f.status is status)}")
        out["hosttune_check_critical"].append(f"{_labels(**base, check=f.check_id)} {int(f.severity is Severity.CRITICAL)}")
    out["hosttune_monitor_probe_ok"].append(f"{_labels(**base)} {int(not doc.error)}")
    for severity in Severity:
        count = sum(1 for f in doc.failing if f.severity == severity.value)
        out["hosttune_monitor_failing_findings"].append(f"{_labels(**base, severity=severity.value)} {count}")
    out["hosttune_monitor_last_run_timestamp_seconds"].append(f"{_labels(**base)} {doc.when:.3f}")
    out["hosttune_monitor_run_duration_seconds"].append(f"{_labels(**base)} {doc.duration_s:.3f}")
    out["hosttune_info"].append(f"{_labels(**base, **doc.versions)} 1")
    return out


def render(report: HostReport, doc: StatusDoc) -> str:
    lines = []
    for name, values in _series(report, doc).items():
        kind, text = _HELP[name]
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *(name + v for v in values)]
    return "\n".join(lines) + "\n"
