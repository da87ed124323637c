"""CPU frequency governor, now and at every boot."""

from __future__ import annotations

from hosttune.actions.base import KernelWrite, Step
from hosttune.actions.units import boot_unit, lasting
from hosttune.checks.base import is_systemd, not_systemd
from hosttune.checks.boot_scripts import GOVERNOR_UNIT as UNIT, governor_script
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile


def governor_path(cpu: int) -> str:
    return f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"


def governor(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """scaling_governor written on every CPU that differs, and a boot unit that writes it again."""
    want = profile.cpu.governor
    ops: tuple = ()
    notes: tuple[str, ...] = ()
    if is_systemd(facts):
        ops += boot_unit(UNIT, f"CPU frequency governor {want}", governor_script(want))
    else:
        notes = (f"not persisted: {not_systemd(facts)}; set the governor at boot another way",)
    wrong = tuple(governor_path(c) for c, g in sorted(facts.cpu.governors.items()) if g != want)
    if wrong:
        ops += (KernelWrite(wrong, want),)
    return [Step(("cpu.governor",), f"CPU governor {want} {lasting(facts)}", ops, notes=notes)]
