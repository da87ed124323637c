"""The boot-time scripts apply installs for settings the kernel forgets at each boot (the CPU governor, GPU IRQ
affinity), and whether a host's copy is the one the profile wants now: a profile changed since the last apply
leaves the unit enabled and its script setting the old values."""

from __future__ import annotations

import hashlib

from hosttune.probes.facts import Facts
from hosttune.rendering import render

GOVERNOR_UNIT = "hosttune-cpu-governor"
IRQ_UNIT = "hosttune-irq-affinity"
NOT_PERSISTED = "not persisted"
STALE_SCRIPT = "boot script differs"


def script_path(unit: str) -> str:
    return f"/usr/local/sbin/{unit}"


def governor_script(governor: str) -> bytes:
    return render("hosttune-cpu-governor.sh.j2", governor=governor)


def irq_affinity_script(pins: list[tuple[str, str]]) -> bytes:
    """pins: (PCI address, CPU list) of each GPU."""
    return render("hosttune-irq-affinity.sh.j2", pins=pins)


def persisted(facts: Facts, unit: str, script: bytes) -> str | None:
    """None where it is persisted as wanted: the unit enabled and its script what apply would write now;
    else NOT_PERSISTED or STALE_SCRIPT."""
    state = facts.services.get(unit)
    if not state or state.enabled != "enabled":
        return NOT_PERSISTED
    return None if state.script == hashlib.sha256(script).hexdigest() else STALE_SCRIPT
