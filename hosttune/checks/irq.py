"""Checks of interrupt handling: irqbalance and GPU IRQ affinity."""

from __future__ import annotations

from hosttune import cores, cpulist
from hosttune.checks.base import Check, is_systemd, none_found, unmanaged
from hosttune.checks.boot_scripts import IRQ_UNIT, NOT_PERSISTED, STALE_SCRIPT, irq_affinity_script, persisted, script_path
from hosttune.probes.facts import Facts, PciDevice
from hosttune.checks.findings import Severity, Status, Verdict
from hosttune.config.profile import Profile


def irqbalance(facts: Facts, profile: Profile) -> Verdict:
    if profile.irq.irqbalance is None:
        return unmanaged("irqbalance not managed by the profile")
    want_on = profile.irq.irqbalance
    desired = "running, enabled" if want_on else "stopped, disabled"
    svc = facts.services.get("irqbalance")
    running = bool(svc and (svc.running or svc.active == "active"))
    enabled = svc.enabled if svc and is_systemd(facts) else None
    installed = running or (enabled not in (None, "not-found", ""))
    active = "running" if running else "stopped"
    if not installed and not want_on:
        return Verdict(Status.OK, desired, "not installed", "-" if facts.image else active)
    configured = None if enabled is None else ("enabled" if enabled in ("enabled", "static", "alias") else "disabled")
    want_conf, want_active = ("enabled", "running") if want_on else ("disabled", "stopped")
    if facts.image:  # runs nothing: judged on what starts at its first boot
        ok = configured in (None, want_conf)
        detail = "" if ok else f"the image {'starts' if configured == 'enabled' else 'does not start'} irqbalance at boot"
        return Verdict(Status.OK if ok else Status.DRIFT, desired, configured, "-", detail)
    ok = active == want_active and configured in (None, want_conf)
    detail = "" if ok else "irqbalance rewrites smp_affinity every few seconds and undoes pinned GPU IRQs"
    return Verdict(Status.OK if ok else Status.DRIFT, desired, configured, active, detail)


def desired_cores(dev: PciDevice, facts: Facts, setting: str) -> tuple[int, ...]:
    """The cores a GPU's IRQs belong on: the profile's list, the NUMA node's housekeeping cores, or all its CPUs."""
    return cores.gpu_irq_cores(dev, facts, setting)


def wanted_pins(facts: Facts, setting: str) -> list[tuple[str, str]]:
    """(PCI address, CPU list) of each GPU with MSI interrupts: what the boot script pins."""
    return [(d.bdf, cpulist.format(desired_cores(d, facts, setting))) for d in facts.pci if d.irqs]


def gpu_affinity(facts: Facts, profile: Profile) -> Verdict:
    setting = profile.irq.gpu_affinity
    if setting is None:
        return unmanaged("GPU IRQ affinity not managed by the profile")
    devices = [d for d in facts.pci if d.irqs]
    if not devices:
        return none_found(facts, "GPU interrupt routing", "no GPU MSI interrupts on this host")
    outside, desired_text = [], []
    for dev in devices:
        wanted = desired_cores(dev, facts, setting)
        if missing := cores.beyond(facts, wanted):
            return Verdict(Status.ERROR, f"{dev.bdf}: {cpulist.format(wanted)}", None, None,
                           f"CPUs {cpulist.format(missing)} are not on this host (online: {cpulist.format(cores.online(facts))}); "
                           "set irq_cores for this host in the inventory, or use gpu_affinity: housekeeping")
        desired_text.append(f"{dev.bdf}: {cpulist.format(wanted)}")
        outside += [f"IRQ {i.irq} on {cpulist.format(i.cpus)}" for i in dev.irqs if not set(i.cpus) <= set(wanted)]
    active = "; ".join(f"{d.bdf}: " + ", ".join(f"{i.irq}→{cpulist.format(i.cpus)}" for i in d.irqs) for d in devices)
    configured = None
    if is_systemd(facts):
        configured = persisted(facts, IRQ_UNIT, irq_affinity_script(wanted_pins(facts, setting))) or "persisted"
    problems = [f"outside the wanted cores: {', '.join(outside)}"] if outside else []
    served = _served_elsewhere(facts, devices, setting)
    if served:
        problems.append(f"GPU interrupts served on CPUs {cpulist.format(served)} while the probe ran")
    if configured == NOT_PERSISTED:
        problems.append("IRQ affinity does not survive a reboot and no boot-time unit sets it")
    if configured == STALE_SCRIPT:
        problems.append(f"{script_path(IRQ_UNIT)} is not what apply would write for these cores: the next boot pins "
                        "what it says (the profile or irq_cores changed since the last apply, or the file was edited)")
    status = Status.DRIFT if problems else Status.OK
    return Verdict(status, "; ".join(desired_text), configured, active, "; ".join(problems))


def _served_elsewhere(facts: Facts, devices: list[PciDevice], setting: str) -> set[int]:
    """CPUs outside the wanted set whose count of a GPU IRQ in /proc/interrupts rose between the probe's two reads.

    The counts are since boot: a count from before the IRQ was pinned stays until the next boot, so one read
    alone would hold the check in drift after a correct apply."""
    cpus: set[int] = set()
    for dev in devices:
        wanted = set(desired_cores(dev, facts, setting))
        for irq in dev.irqs:
            before = facts.gpu_interrupts.get(irq.irq, ())
            after = facts.gpu_interrupts_later.get(irq.irq, ())
            cpus |= {cpu for cpu, (n0, n1) in enumerate(zip(before, after)) if n1 > n0 and cpu not in wanted}
    return cpus


CHECKS = (
    Check("irq.irqbalance", "irqbalance", Severity.CRITICAL,
          "irqbalance moves GPU interrupts back onto serving cores, undoing the pinning that keeps tail latency flat.",
          "systemctl disable --now irqbalance", False, irqbalance),
    Check("irq.gpu_affinity", "GPU IRQ affinity", Severity.WARNING,
          "GPU completion interrupts handled on a far NUMA node or on a busy serving core delay every kernel launch.",
          "write smp_affinity_list of each GPU MSI IRQ and install a boot-time unit that writes it again", False, gpu_affinity),
)
