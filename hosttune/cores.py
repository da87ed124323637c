"""Housekeeping and serving cores: the default core sets, from the host's CPUs and NUMA layout.

The first cores of every NUMA node keep the kernel's chores (RCU callbacks, GPU interrupts);
the rest serve. Profiles say `rcu_nocbs: auto` and `gpu_affinity: housekeeping` to get these
sets, so a default never names a CPU the host does not have. An explicit CPU list that
does is reported by the check (`beyond`), never written to a host.
"""

from __future__ import annotations

from hosttune import cpulist
from hosttune.probes.facts import Facts, PciDevice

AUTO = "auto"  # rcu_nocbs: every online CPU but the housekeeping ones
HOUSEKEEPING = "housekeeping"  # gpu_affinity: the housekeeping cores of the GPU's NUMA node
NUMA_LOCAL = "numa-local"  # gpu_affinity: every CPU of the GPU's NUMA node
CPUS_PER_HOUSEKEEPER = 16


def online(facts: Facts) -> tuple[int, ...]:
    """The host's online CPUs; () when the probe could not read them (or for an image)."""
    if facts.cpu.online:
        return facts.cpu.online
    return tuple(range(facts.cpu.count))


def nodes(facts: Facts) -> dict[int, tuple[int, ...]]:
    """NUMA node → its online CPUs; one node of every CPU when the kernel reports none."""
    cpus = set(online(facts))
    found = {node: tuple(c for c in members if c in cpus) for node, members in sorted(facts.numa_nodes.items())}
    found = {node: members for node, members in found.items() if members}
    return found or ({0: tuple(sorted(cpus))} if cpus else {})


def _first_of(cpus: tuple[int, ...]) -> tuple[int, ...]:
    """One core per 16 CPUs, at least two, never the whole node (unless it has a single CPU)."""
    ordered = sorted(cpus)
    num = max(2, len(ordered) // CPUS_PER_HOUSEKEEPER)
    return tuple(ordered[:max(1, min(num, len(ordered) - 1))])


def housekeeping(facts: Facts, node: int | None = None) -> tuple[int, ...]:
    """The housekeeping cores of one NUMA node, or of every node."""
    layout = nodes(facts)
    if node is not None and node in layout:
        return _first_of(layout[node])
    return tuple(sorted(c for members in layout.values() for c in _first_of(members)))


def rcu_nocbs(facts: Facts, setting: str | None) -> tuple[int, ...] | None:
    """The CPUs whose RCU callbacks are offloaded; None when unknown (an image without CPU facts)."""
    if setting is None:
        return None
    if setting != AUTO:
        return cpulist.parse(setting)
    cpus = online(facts)
    if not cpus:
        return None
    keep = set(housekeeping(facts))
    return tuple(c for c in cpus if c not in keep)


def gpu_irq_cores(dev: PciDevice, facts: Facts, setting: str) -> tuple[int, ...]:
    """The cores a GPU's IRQs belong on, by the profile's setting."""
    if setting == HOUSEKEEPING:
        return housekeeping(facts, dev.numa_node)
    if setting != NUMA_LOCAL:
        return cpulist.parse(setting)
    if dev.numa_node is not None and dev.numa_node in facts.numa_nodes:
        return facts.numa_nodes[dev.numa_node]
    if dev.local_cpus:
        return dev.local_cpus
    return online(facts)


def beyond(facts: Facts, cpus: tuple[int, ...]) -> tuple[int, ...]:
    """CPUs of a set that this host does not have online (() when the host's CPUs are unknown)."""
    have = set(online(facts))
    return tuple(c for c in cpus if c not in have) if have else ()
