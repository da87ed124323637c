"""The check catalogue, in report order."""

from __future__ import annotations

import difflib

from hosttune.checks import access, active, cpu, driver, fabric, gpu, gpu_health, host_health, irq, memory, service, service_monitor, tools
from hosttune.checks.base import Check
from hosttune.errors import HosttuneError
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Finding
from hosttune.config.profile import Profile

CATALOGUE: tuple[Check, ...] = (
    *driver.CHECKS, *gpu.CHECKS, *cpu.CHECKS, *irq.CHECKS, *memory.CHECKS, *tools.CHECKS,
    *gpu_health.CHECKS, *host_health.CHECKS, *fabric.CHECKS, *active.CHECKS, *access.CHECKS,
    *service.CHECKS, *service_monitor.CHECKS,
)
BY_ID = {c.id: c for c in CATALOGUE}


def run_checks(facts: Facts, profile: Profile) -> list[Finding]:
    return [check.run(facts, profile) for check in CATALOGUE]


def get_check(check_id: str) -> Check:
    try:
        return BY_ID[check_id.strip().lower()]  # ids are lower case: GPU.XID names gpu.xid
    except KeyError:
        close = difflib.get_close_matches(check_id.strip().lower(), BY_ID, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}? " if close else ""
        raise HosttuneError(f"unknown check {check_id!r}; {hint}known checks: {', '.join(BY_ID)}") from None
