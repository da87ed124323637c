"""Findings: the result of one check on one host, in three states (desired/configured/active)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    OK = "ok"
    DRIFT = "drift"
    PENDING_REBOOT = "pending-reboot"
    NOT_APPLICABLE = "not-applicable"
    ERROR = "error"


class Severity(str, Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Verdict:
    """What a check concluded, before the check's fixed metadata is attached."""

    status: Status
    desired: str
    configured: str | None = None
    active: str | None = None
    detail: str = ""
    severity: Severity | None = None  # overrides the check's severity for this finding
    subjects: tuple[str, ...] = ()  # what on the host the finding is about (unit names), for a remedy to act on
    unmanaged: bool = False  # not-applicable because the profile leaves it alone: so on any host, read or not


@dataclass(frozen=True)
class Finding:
    check_id: str
    title: str
    status: Status
    severity: Severity
    desired: str
    configured: str | None
    active: str | None
    detail: str
    remediation: str
    needs_reboot: bool
    why: str
    subjects: tuple[str, ...] = ()  # what on the host the finding is about (e.g. the failing units)

    @property
    def is_failing(self) -> bool:
        return self.status in (Status.DRIFT, Status.PENDING_REBOOT)


def judge(desired: object, configured: object, active: object, *, reboot: bool) -> Status:
    """Three-state verdict. configured None means "nothing persists this": judged on active alone."""
    if active == desired and configured in (None, desired):
        return Status.OK
    if reboot and configured == desired and active != desired:
        return Status.PENDING_REBOOT
    return Status.DRIFT


def show(value: object) -> str:
    """How a fact value is printed in a finding."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(show(v) for v in value) or "none"
    return str(value)
