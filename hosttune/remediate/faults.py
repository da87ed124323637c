"""Failing findings and the host's serving state in, faults out: each with the ladder that fixes it.

A fault names what is wrong (a unit down, a GPU with a fatal Xid, a pending row remap, ...), the GPU or
unit it is on, and its ladder: the rungs to try, lowest first. Pure: tests are data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hosttune.checks.findings import Finding
from hosttune.probes.facts import Facts
from hosttune.remediate.history import Ledger
from hosttune.remediate.rungs import Rung
from hosttune.remediate.state import HostSnapshot
from hosttune.remediate.xid import GPU_LADDER, RETIRE_LADDER, XidPolicy, classify

SERVICE_LADDER = (Rung.RESTART, Rung.DRAIN, Rung.RESET, Rung.REBOOT, Rung.CORDON)
FABRIC_LADDER = (Rung.RESTART, Rung.REBOOT, Rung.CORDON)
MISSING_LADDER = (Rung.REBOOT, Rung.CORDON)
FABRIC_UNIT = "nvidia-fabricmanager.service"
DOWN = ("failed", "inactive")  # "activating" is a unit on its way up: left alone
# The checks faults come from: where one cannot be judged, remediate cannot see what it watches.
WATCHED = ("serve.units", "gpu.fabric", "gpu.count", "gpu.xid", "gpu.memory_health", "gpu.nvlink", "gpu.clocks_power")


class FaultKind(str, Enum):
    UNIT_DOWN = "unit-down"
    XID = "xid"
    REMAP_PENDING = "remap-pending"
    GPU_RETIRE = "gpu-retire"
    NVLINK_DOWN = "nvlink-down"
    FABRIC_DOWN = "fabric-manager-down"
    GPU_MISSING = "gpu-missing"
    CLOCKS_STUCK = "clocks-stuck"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    check_id: str
    ladder: tuple[Rung, ...]
    reason: str  # one line that names its place (the GPU, the unit), as the plan and a cordon file show it
    gpu: int | None = None
    unit: str | None = None

    @property
    def key(self) -> tuple[str, int | None, str | None]:
        return (self.kind.value, self.gpu, self.unit)

    @property
    def where(self) -> str:
        return self.unit or (f"GPU{self.gpu}" if self.gpu is not None else "host")


def _failing(findings: tuple[Finding, ...], check_id: str) -> bool:
    return any(f.check_id == check_id and f.is_failing for f in findings)


def unit_faults(snapshot: HostSnapshot, findings: tuple[Finding, ...] = ()) -> list[Fault]:
    """Units that should run and do not: the live release's replicas (or its one service), and every unit a
    failing serve.units finding names (nginx, the probe timer)."""
    wanted = [r.unit for r in snapshot.replicas] or [u for u in snapshot.units if not u.startswith("hosttune-engine@")]
    down = [u for u in wanted if snapshot.units.get(u, "inactive") in DOWN]
    named = [u for f in findings if f.check_id == "serve.units" and f.is_failing for u in f.subjects if u not in down]
    return [Fault(FaultKind.UNIT_DOWN, "serve.units", SERVICE_LADDER, f"{u} is {snapshot.units.get(u) or 'inactive'}", unit=u)
            for u in down] + [Fault(FaultKind.UNIT_DOWN, "serve.units", SERVICE_LADDER, f"{u} is not running (serve.units)", unit=u)
                              for u in named]


def _index(facts: Facts, bdf: str) -> int | None:
    return next((g.index for g in facts.gpu.gpus if g.bdf.startswith(bdf)), None)


def xid_faults(facts: Facts, ledger: Ledger, now: float, policy: XidPolicy) -> list[Fault]:
    faults = []
    for v in classify(ledger, now, policy):
        gpu = _index(facts, v.bdf)
        where = f"GPU{gpu}" if gpu is not None else f"PCI {v.bdf}"
        faults.append(Fault(FaultKind.XID, "gpu.xid", v.ladder, f"{where}: {v.reason}", gpu=gpu, unit=None if gpu is not None else v.bdf))
    return faults


def memory_faults(facts: Facts) -> list[Fault]:
    faults = []
    for g in facts.health.gpus:
        if g.remap_failure or g.unrepairable_memory:
            faults.append(Fault(FaultKind.GPU_RETIRE, "gpu.memory_health", RETIRE_LADDER,
                                f"GPU{g.index}: row remapping failed or memory unrepairable: replace the GPU", gpu=g.index))
        elif g.remap_pending or g.retired_pending:
            faults.append(Fault(FaultKind.REMAP_PENDING, "gpu.memory_health", GPU_LADDER,
                                f"GPU{g.index}: a row remap waits for a GPU reset", gpu=g.index))
    return faults


def nvlink_faults(facts: Facts, findings: tuple[Finding, ...]) -> list[Fault]:
    if not _failing(findings, "gpu.nvlink"):
        return []
    down = sorted({l.gpu for l in facts.health.nvlinks or () if not l.active})
    return [Fault(FaultKind.NVLINK_DOWN, "gpu.nvlink", GPU_LADDER, f"GPU{g}: NVLink down", gpu=g) for g in down]


def fabric_faults(facts: Facts, findings: tuple[Finding, ...]) -> list[Fault]:
    fm = facts.health.fabric
    if not _failing(findings, "gpu.fabric") or not fm.nvswitches or fm.running or fm.active == "active":
        return []
    return [Fault(FaultKind.FABRIC_DOWN, "gpu.fabric", FABRIC_LADDER, "Fabric Manager is not running", unit=FABRIC_UNIT)]


def missing_faults(facts: Facts, findings: tuple[Finding, ...]) -> list[Fault]:
    pci, nvml = facts.gpu.pci_devices, facts.gpu.gpus
    if not _failing(findings, "gpu.count") or len(pci) <= len(nvml):
        return []
    lost = sorted(set(pci) - {g.bdf for g in nvml})
    return [Fault(FaultKind.GPU_MISSING, "gpu.count", MISSING_LADDER,
                  f"PCI shows {len(pci)} GPU(s), NVML {len(nvml)}" + (f": lost {', '.join(lost)}" if lost else ""))]


def clock_faults(facts: Facts, findings: tuple[Finding, ...]) -> list[Fault]:
    if not _failing(findings, "gpu.clocks_power"):
        return []
    stuck = [g for g in facts.health.gpus if g.app_clock_mhz and g.app_clock_default_mhz and g.app_clock_mhz < g.app_clock_default_mhz]
    return [Fault(FaultKind.CLOCKS_STUCK, "gpu.clocks_power", GPU_LADDER,
                  f"GPU{g.index}: clocks stuck at {g.app_clock_mhz} MHz, default {g.app_clock_default_mhz}", gpu=g.index)
            for g in stuck]


def find_faults(facts: Facts, findings: tuple[Finding, ...], snapshot: HostSnapshot, ledger: Ledger, now: float,
                policy: XidPolicy = XidPolicy()) -> list[Fault]:
    """Every fault on the host, one per (kind, GPU or unit); GPU faults merge into one per GPU, the highest start first."""
    faults = (unit_faults(snapshot, findings) + fabric_faults(facts, findings) + missing_faults(facts, findings)
              + xid_faults(facts, ledger, now, policy) + memory_faults(facts) + nvlink_faults(facts, findings)
              + clock_faults(facts, findings))
    return _one_per_gpu(faults)


def _one_per_gpu(faults: list[Fault]) -> list[Fault]:
    """A GPU with several faults climbs one ladder: the one that reaches furthest soonest (a retire before a reset)."""
    kept: dict[object, Fault] = {}
    for f in faults:
        key = ("gpu", f.gpu) if f.gpu is not None and f.ladder != (Rung.LOG,) else f.key
        old = kept.get(key)
        if old is None or _severity(f) > _severity(old):
            kept[key] = f
    return list(kept.values())


def _severity(f: Fault) -> tuple[int, int]:
    return (max(f.ladder[1:2] or f.ladder), -len(f.ladder))
