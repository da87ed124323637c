"""The status file a monitor pass leaves on its host: when it ran, with which versions, and what it found.

`hosttune monitor` writes it (/var/lib/hosttune/monitor/status.json, status-active.json for the --active
pass); `hosttune status` reads every host's in one round trip. Pure: documents in, documents out.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from hosttune.checks.findings import Finding, Status
from hosttune.config.monitor_spec import MAX_INTERVAL_S
from hosttune.errors import HosttuneError
from hosttune.fleet import HostReport
from hosttune.probes.machine import MachineIdentity, identity, recorded_gpus

FORMAT = 1
PASSES = ("regular", "active")
DETAIL_CHARS = 400  # a finding's detail is cut here: the file stays small for a fleet's read


class StatusError(HosttuneError):
    """A status file that cannot be read."""


@dataclass(frozen=True)
class FindingBrief:
    """A finding that is not ok, as much of it as the fleet table and a remedy need."""

    check_id: str
    status: str
    severity: str
    detail: str
    subjects: tuple[str, ...] = ()


@dataclass(frozen=True)
class StatusDoc:
    host: str
    pass_name: str  # "regular" | "active"
    when: float  # epoch seconds, the host's clock, at the end of the pass
    interval_s: int  # of this pass's timer
    duration_s: float
    versions: dict[str, str]  # hosttune, driver, kernel, release (the live engine release)
    counts: dict[str, int]  # findings per status
    findings: tuple[FindingBrief, ...]  # those not ok and not not-applicable
    error: str = ""  # why the probe failed, if it did
    machine_id: str = ""  # the host's persistent /etc/machine-id ("" none, or unknown: a failed probe, an older monitor)
    gpus: tuple[str, ...] = ()  # the host's GPUs' UUIDs (() none, or unknown)

    @property
    def machine(self) -> MachineIdentity:
        return MachineIdentity(self.machine_id, self.gpus)

    @property
    def failing(self) -> tuple[FindingBrief, ...]:
        return tuple(f for f in self.findings if f.status in (Status.DRIFT.value, Status.PENDING_REBOOT.value))

    @property
    def check_errors(self) -> tuple[FindingBrief, ...]:
        """Checks the pass could not judge (`hosttune check` exits 2 on them)."""
        return tuple(f for f in self.findings if f.status == Status.ERROR.value)


def brief(f: Finding) -> FindingBrief:
    detail = f.detail or f.active or ""
    return FindingBrief(f.check_id, f.status.value, f.severity.value, detail[:DETAIL_CHARS], f.subjects)


def versions(report: HostReport, hosttune: str) -> dict[str, str]:
    facts = report.facts
    if facts is None:
        return {"hosttune": hosttune}
    release = facts.serve.release if facts.serve else ""
    return {"hosttune": hosttune, "driver": facts.gpu.driver_version or facts.gpu.kernel_module_version or "",
            "kernel": facts.kernel, "release": release}


def status_doc(report: HostReport, pass_name: str, interval_s: int, when: float, duration_s: float,
               hosttune: str) -> StatusDoc:
    counts = {s.value: report.count(s) for s in Status}
    shown = tuple(brief(f) for f in report.findings if f.status not in (Status.OK, Status.NOT_APPLICABLE))
    host = report.facts.hostname if report.facts and report.facts.hostname else report.host.name
    unread = "; ".join(report.facts.probe_errors) if report.facts else ""  # a part of the host the probe could not read
    machine = identity(report.facts) if report.facts else MachineIdentity()
    return StatusDoc(host, pass_name, round(when, 3), interval_s, round(duration_s, 3), versions(report, hosttune),
                     counts, shown, report.error or unread, machine.machine_id, machine.gpus)


def to_json(doc: StatusDoc) -> str:
    return json.dumps({"format": FORMAT, **asdict(doc)}, indent=1, sort_keys=True) + "\n"


def parse_status(text: str) -> StatusDoc:
    try:
        raw = json.loads(text)
        findings = tuple(FindingBrief(str(f["check_id"]), str(f["status"]), str(f["severity"]), str(f["detail"]),
                                      tuple(str(s) for s in f.get("subjects") or ())) for f in raw["findings"])
        doc = StatusDoc(str(raw["host"]), str(raw["pass_name"]), float(raw["when"]), int(raw["interval_s"]),
                        float(raw["duration_s"]), {str(k): str(v) for k, v in raw["versions"].items()},
                        {str(k): int(v) for k, v in raw["counts"].items()}, findings, str(raw.get("error") or ""),
                        str(raw.get("machine_id") or ""), recorded_gpus(raw.get("gpus")))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:  # Overflow: int(Infinity)
        raise StatusError(f"unreadable status file: {type(exc).__name__}: {exc}") from None
    return _sensible(doc)


def _sensible(doc: StatusDoc) -> StatusDoc:
    """A document whose time, interval and pass can be judged: NaN, infinity or an interval of ages would never go
    stale."""
    if not math.isfinite(doc.when):
        raise StatusError(f"unreadable status file: when: must be a finite number of Unix seconds (got {doc.when})")
    if not math.isfinite(doc.duration_s):  # NaN would reach status --format json, which JSON cannot hold
        raise StatusError(f"unreadable status file: duration_s: must be a finite number of seconds (got {doc.duration_s})")
    if not 1 <= doc.interval_s <= MAX_INTERVAL_S:  # a profile's timers run at least weekly
        raise StatusError(f"unreadable status file: interval_s: must be 1 to {MAX_INTERVAL_S} seconds "
                          f"(got {doc.interval_s:.6g})")
    if doc.pass_name not in PASSES:
        raise StatusError(f"unreadable status file: pass_name: {doc.pass_name!r}, not 'regular' or 'active'")
    return doc
