"""Checks of NUMA placement, transparent hugepages and NVMe power management."""

from __future__ import annotations

from hosttune import cpulist
from hosttune.checks.base import Check, image_verdict, na, none_found, unmanaged
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Severity, Status, Verdict, judge, show
from hosttune.config.profile import Profile


def topology_text(facts: Facts) -> str:
    """GPU → NUMA node → CPUs, for the report."""
    parts = []
    for dev in facts.pci:
        gpu = next((g for g in facts.gpu.gpus if g.bdf == dev.bdf), None)
        label = f"GPU{gpu.index}" if gpu else dev.bdf
        node = "no NUMA info" if dev.numa_node is None else f"node {dev.numa_node}"
        cpus = facts.numa_nodes.get(dev.numa_node, dev.local_cpus) if dev.numa_node is not None else dev.local_cpus
        parts.append(f"{label} → {node} → CPUs {cpulist.format(cpus) or '?'}")
    return "; ".join(parts)


def numa(facts: Facts, profile: Profile) -> Verdict:
    want = profile.numa.balancing
    if want is None:
        return unmanaged("NUMA balancing not managed by the profile")
    desired = int(want)
    active, configured = facts.numa_balancing, facts.numa_balancing_configured
    if facts.image:
        where = f"configured in {facts.numa_balancing_source}" if facts.numa_balancing_source else ""
        return image_verdict(f"kernel.numa_balancing={desired}",
                             None if configured is None else f"kernel.numa_balancing={configured}", where)
    if active is None:
        return na("kernel without NUMA balancing support", f"kernel.numa_balancing={desired}")
    status = judge(desired, configured, active, reboot=False)
    notes = [topology_text(facts)] if facts.pci else []
    if len(facts.numa_nodes) <= 1:
        notes.append("single NUMA node")
    if configured is None and status is Status.OK and desired == 0 and len(facts.numa_nodes) > 1:
        status = Status.DRIFT
        notes.append("no sysctl.d file sets kernel.numa_balancing=0: the default (1) returns at boot")
    if facts.numa_balancing_source:
        notes.append(f"configured in {facts.numa_balancing_source}")
    return Verdict(status, f"kernel.numa_balancing={desired}", show(configured), show(active), "; ".join(n for n in notes if n))


def thp(facts: Facts, profile: Profile) -> Verdict:
    want = profile.memory.thp
    if want is None:
        return unmanaged("transparent hugepages not managed by the profile")
    configured = facts.cmdline_param("transparent_hugepage", configured=True) or facts.thp_configured
    if facts.image:
        return image_verdict(want, configured)
    if facts.thp_enabled is None:
        return na("kernel without transparent hugepages", want)
    status = judge(want, configured, facts.thp_enabled, reboot=False)
    return Verdict(status, want, configured, facts.thp_enabled)


def nvme_power(facts: Facts, profile: Profile) -> Verdict:
    if profile.nvme.apst is None:
        return unmanaged("NVMe power not managed by the profile")
    if not facts.nvme:
        return none_found(facts, "NVMe power state", "no NVMe devices")
    want_latency = "0" if not profile.nvme.apst else None
    asleep = [f"{d.name} in {d.power_state}" for d in facts.nvme if d.power_state not in (None, "D0")]
    active = facts.nvme_ps_max_latency_us
    configured = facts.cmdline_param("nvme_core.default_ps_max_latency_us", configured=True)
    problems = list(asleep)
    if want_latency is not None and str(active) != want_latency:
        problems.append(f"APST allowed (default_ps_max_latency_us={active})")
    status = Status.DRIFT if problems else Status.OK
    if status is Status.DRIFT and not asleep and configured == want_latency:
        status = Status.PENDING_REBOOT
    devices = ", ".join(f"{d.name} {d.power_state or '?'}" for d in facts.nvme)
    return Verdict(status, "D0, APST off (nvme_core.default_ps_max_latency_us=0)", configured,
                   f"{devices}; ps_max_latency_us={show(active)}", "; ".join(problems))


CHECKS = (
    Check("numa.topology", "NUMA placement and balancing", Severity.WARNING,
          "Automatic NUMA balancing migrates the engine's pages while it serves; cross-node memory halves bandwidth.",
          "write the profile's kernel.numa_balancing (0: off) to /etc/sysctl.d/90-hosttune.conf, comment it out of each "
          "sysctl file that would override that, and apply it now", False, numa),
    Check("mm.thp", "Transparent hugepages", Severity.INFO,
          "THP mode decides whether large host buffers stall on compaction or get hugepages without asking.",
          "set /sys/kernel/mm/transparent_hugepage/enabled now and at boot (a boot unit), and correct a "
          "transparent_hugepage= on the kernel command line, which would override it", False, thp),
    Check("nvme.power", "NVMe power state", Severity.WARNING,
          "An NVMe drive waking from a low-power state stalls model loads and swap-ins by milliseconds.",
          "add nvme_core.default_ps_max_latency_us=0 to the kernel command line, reboot; sleeping devices are "
          "kept in D0 now already (runtime power management off)", True, nvme_power),
)
