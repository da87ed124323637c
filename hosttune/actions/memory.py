"""Transparent hugepages and automatic NUMA balancing: now, and from every boot on."""

from __future__ import annotations

from hosttune.actions.base import CommentOut, FileWrite, KernelWrite, Step, managed_header
from hosttune.rendering import render
from hosttune.actions.units import boot_unit, lasting
from hosttune.checks.base import is_systemd, not_systemd
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.probes.system import parse_sysctl_conf
from hosttune.config.profile import Profile

THP_UNIT = "hosttune-thp"
THP_DEFAULTS = "/etc/default/hosttune-thp"  # the probe reads THP_MODE from here
THP_SYSFS = "/sys/kernel/mm/transparent_hugepage/enabled"
SYSCTL_FILE = "/etc/sysctl.d/90-hosttune.conf"
NUMA_KEY = "kernel.numa_balancing"
NUMA_PROC = "/proc/sys/kernel/numa_balancing"


def thp(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """THP mode written to sysfs now, and by a boot unit reading THP_MODE from /etc/default/hosttune-thp."""
    want = profile.memory.thp
    ops: tuple = ()
    notes: tuple[str, ...] = ()
    if is_systemd(facts):
        defaults = FileWrite(THP_DEFAULTS, (managed_header("transparent hugepages") + f"THP_MODE={want}\n").encode(), 0o644)
        ops += (defaults, *boot_unit(THP_UNIT, f"transparent hugepages {want}", render("hosttune-thp.sh.j2"),
                                     environment_file=THP_DEFAULTS))
    else:
        notes = (f"not persisted: {not_systemd(facts)}; add transparent_hugepage={want} to the kernel command line",)
    if facts.thp_enabled != want:
        ops += (KernelWrite((THP_SYSFS,), want),)
    return [Step(("mm.thp",), f"transparent hugepages {want} {lasting(facts)}", ops, notes=notes)]


def _overrides_ours(source: str, value: int | str | None) -> bool:
    """Would `source` still win over our sysctl.d file? Asks the probe's own parser."""
    if not source or source == SYSCTL_FILE:
        return False
    text = f"{SYSCTL_FILE}:{NUMA_KEY} = 0\n{source}:{NUMA_KEY} = {value}\n"
    return parse_sysctl_conf(text)[1] == source


def _setting_files(facts: Facts) -> tuple[tuple[str, str], ...]:
    """The sysctl files that set NUMA balancing, with their values; the one that wins at boot among them."""
    source = facts.numa_balancing_source
    if not source or source in (path for path, _ in facts.numa_balancing_files):
        return facts.numa_balancing_files
    return (*facts.numa_balancing_files, (source, str(facts.numa_balancing_configured)))


def numa_balancing(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """kernel.numa_balancing in /etc/sysctl.d/90-hosttune.conf (a file that would override it is edited) and now."""
    want = int(bool(profile.numa.balancing))
    content = managed_header("NUMA balancing") + f"{NUMA_KEY} = {want}\n"
    ops: tuple = (FileWrite(SYSCTL_FILE, content.encode(), 0o644),)
    if facts.numa_balancing_configured != want:  # every file read after ours that sets another value, not only the last
        ops += tuple(CommentOut(path, NUMA_KEY) for path, value in _setting_files(facts)
                     if value != str(want) and _overrides_ours(path, value))
    if facts.numa_balancing is not None and facts.numa_balancing != want:
        ops += (KernelWrite((NUMA_PROC,), str(want)),)
    return [Step(("numa.topology",), f"{NUMA_KEY}={want} {lasting(facts, is_by_unit=False)}", ops)]  # sysctl.d needs no unit
