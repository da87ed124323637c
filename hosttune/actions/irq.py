"""irqbalance off, GPU MSI interrupts on their cores now and at every boot."""

from __future__ import annotations

from hosttune import cpulist
from hosttune.actions.base import KernelWrite, Service, Step, blocked
from hosttune.actions.units import boot_unit, lasting
from hosttune.checks.base import is_systemd, not_systemd
from hosttune.checks.boot_scripts import IRQ_UNIT as UNIT, irq_affinity_script
from hosttune.checks.irq import wanted_pins
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile


def irqbalance(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """systemctl disable --now irqbalance (or enable --now, if the profile wants it)."""
    want = bool(profile.irq.irqbalance)
    if not want and not _installed(facts):
        return []  # nothing to stop: an image's plan would otherwise show it as not fixable
    if not is_systemd(facts):
        return [blocked("irq.irqbalance", f"{not_systemd(facts)}: {'start' if want else 'stop'} irqbalance with the host's init system")]
    verb = "started and enabled" if want else "stopped and disabled"
    if facts.image:  # nothing runs in an image: what it starts at boot is all there is to change
        verb = f"{'enabled' if want else 'disabled'} from the image's first boot"
    return [Step(("irq.irqbalance",), f"irqbalance {verb}", (Service("irqbalance.service", enabled=want, running=want),))]


def _installed(facts: Facts) -> bool:
    svc = facts.services.get("irqbalance")
    return bool(svc and (svc.running or svc.active == "active" or svc.enabled not in (None, "not-found", "")))


def gpu_affinity(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """smp_affinity_list of each GPU MSI IRQ written now; a boot unit writes it again (IRQ affinity does not survive a reboot)."""
    setting = profile.irq.gpu_affinity
    devices = [d for d in facts.pci if d.irqs]
    pins = wanted_pins(facts, setting)
    ops: tuple = ()
    notes: tuple[str, ...] = ()
    if is_systemd(facts):
        ops += boot_unit(UNIT, "pin GPU interrupts", irq_affinity_script(pins), after=("nvidia-persistenced.service",))
    else:
        notes = (f"not persisted: {not_systemd(facts)}; the pinning is lost at reboot",)
    for dev, (_, cores) in zip(devices, pins):
        wanted = set(cpulist.parse(cores))
        wrong = tuple(f"/proc/irq/{i.irq}/smp_affinity_list" for i in dev.irqs if not set(i.cpus) <= wanted)
        if wrong:
            ops += (KernelWrite(wrong, cores),)
    return [Step(("irq.gpu_affinity",), f"GPU interrupts on their cores {lasting(facts)}", ops, notes=notes)]
