"""The check catalogue, in report order."""

from __future__ import annotations

import difflib
from dataclasses import replace

from hosttune.checks import access, active, cpu, driver, fabric, gpu, gpu_health, host_health, irq, memory, service, service_monitor, tools
from hosttune.checks.base import Check
from hosttune.errors import HosttuneError
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Finding
from hosttune.config.profile import Profile

# The probe sections each check's facts come from, of those the probe prints on every host (gather.HOST_SECTIONS):
# where one is missing from its output, the check cannot be judged (Check.reads).
READS: dict[str, tuple[str, ...]] = {
    "driver.version": ("system",), "driver.held": ("packages",), "cuda.toolkit": ("cuda",),
    "gpu.persistence": ("services",), "cpu.governor": ("system",), "cpu.cstates": ("system", "bootloader"),
    "kernel.rcu_nocbs": ("system", "bootloader"), "irq.irqbalance": ("services",),
    "irq.gpu_affinity": ("gpu-pci", "services"), "numa.topology": ("system", "sysctl"), "mm.thp": ("system",),
    "nvme.power": ("system",), "tools.numactl": ("tools",), "python.version": ("tools",), "gpu.xid": ("kernel-log",),
    "gpu.count": ("gpu-pci",), "sys.shm": ("health-host",), "pci.p2p": ("pci-health",), "pci.aer": ("pci-health",),
    "monitor.installed": ("monitor",), "monitor.stale": ("monitor",),
}
CATALOGUE: tuple[Check, ...] = tuple(replace(c, reads=READS.get(c.id, ())) for c in (
    *driver.CHECKS, *gpu.CHECKS, *cpu.CHECKS, *irq.CHECKS, *memory.CHECKS, *tools.CHECKS,
    *gpu_health.CHECKS, *host_health.CHECKS, *fabric.CHECKS, *active.CHECKS, *access.CHECKS,
    *service.CHECKS, *service_monitor.CHECKS,
))
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
