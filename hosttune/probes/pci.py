"""Parsers for GPU PCI functions in sysfs and the nvidia lines of /proc/interrupts."""

from __future__ import annotations

import re

from hosttune import cpulist
from hosttune.probes.facts import IrqAffinity, PciDevice


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"^-?\d+", value.strip())
    return int(match.group()) if match else None


def _device(bdf: str, files: dict[str, str], irq_lines: dict[int, str]) -> PciDevice:
    base = f"/sys/bus/pci/devices/{bdf}"
    numa = _int(files.get(f"{base}/numa_node"))
    local = files.get(f"{base}/local_cpulist", "")
    return PciDevice(
        bdf=bdf,
        numa_node=None if numa is None or numa < 0 else numa,
        local_cpus=cpulist.parse(local) if local else (),
        power_state=files.get(f"{base}/power_state"),
        link_speed=files.get(f"{base}/current_link_speed"),
        link_width=_int(files.get(f"{base}/current_link_width")),
        max_link_speed=files.get(f"{base}/max_link_speed"),
        max_link_width=_int(files.get(f"{base}/max_link_width")),
        irqs=tuple(IrqAffinity(irq, cpulist.parse(cpus)) for irq, cpus in sorted(irq_lines.items())),
    )


_IRQ_LINE = re.compile(r"^/proc/irq/(\d+)/smp_affinity_list:(.*)$")
_SYSFS_LINE = re.compile(r"^(/sys/bus/pci/devices/[^/]+/\w+):(.*)$")


def parse_gpu_pci(text: str) -> tuple[PciDevice, ...]:
    """The probe's gpu-pci section: 'device:BDF' then grep -H lines of its sysfs files and IRQs."""
    devices: list[tuple[str, dict[str, str], dict[int, str]]] = []
    for line in text.splitlines():
        if line.startswith("device:"):
            devices.append((line.partition(":")[2].strip(), {}, {}))
        elif devices and (m := _IRQ_LINE.match(line)):
            devices[-1][2][int(m.group(1))] = m.group(2).strip()
        elif devices and (m := _SYSFS_LINE.match(line)):  # the BDF in the path has colons too
            devices[-1][1][m.group(1)] = m.group(2).strip()
    return tuple(_device(bdf, files, irqs) for bdf, files, irqs in devices)


def parse_recorded_sysfs(text: str, bdf: str) -> PciDevice:
    """The recorded `numa_node: -1` / `irq 42 smp_affinity_list: 0-15` format of fixtures."""
    files, irqs = {}, {}
    base = f"/sys/bus/pci/devices/{bdf}"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if m := re.match(r"irq (\d+) smp_affinity_list$", key.strip()):
            irqs[int(m.group(1))] = value.strip()
        elif key.strip() and key.strip() != "msi_irqs":
            files[f"{base}/{key.strip()}"] = value.strip()
    return _device(bdf, files, irqs)


def parse_interrupts(text: str) -> dict[int, dict]:
    """/proc/interrupts → {irq: {"counts": [per-CPU], "name": str}} for the lines it has."""
    lines = text.splitlines()
    if not lines:
        return {}
    num_cpus = len(lines[0].split())
    out = {}
    for line in lines[1:]:
        head, sep, rest = line.partition(":")
        if not sep or not head.strip().isdigit():
            continue
        fields = rest.split()
        counts = [int(x) for x in fields[:num_cpus] if x.isdigit()]
        out[int(head)] = {"counts": counts, "name": " ".join(fields[num_cpus:])}
    return out
