"""The fabric between GPUs: NVLink, NVSwitch's Fabric Manager, PCIe P2P paths and AER errors."""

from __future__ import annotations

from hosttune.checks.base import Check, gpu_unavailable, is_systemd, na, none_found
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Severity, Status, Verdict, show
from hosttune.config.profile import Profile

ACS_REQUEST_REDIRECT = 0x4
ACS_COMPLETION_REDIRECT = 0x8
TRANSLATED = ("DMA", "DMA-FQ")  # IOMMU group types that remap device DMA


def _rising(reads: tuple[dict[str, int], ...]) -> list[str]:
    if len(reads) < 2:
        return []
    first, second = reads[0], reads[-1]
    return [f"{k} {first[k]} -> {v}" for k, v in second.items() if k in first and v > first[k]]


def nvlink(facts: Facts, profile: Profile) -> Verdict:
    if missing := gpu_unavailable(facts):
        return missing
    links = facts.health.nvlinks
    if not links:
        return na("these GPUs report no NVLink")
    inactive = [f"GPU{l.gpu} link {l.link}" for l in links if not l.active]
    num_active = len(links) - len(inactive)
    desired = "every NVLink active, error counters not rising"
    active = f"{num_active} of {len(links)} links active"
    if num_active == 0 and len(facts.gpu.gpus) == 1:
        return na("one GPU whose NVLinks have no peer on this host (a pass-through VM or a single card)", desired)
    problems = ([f"inactive: {', '.join(inactive)}"] if inactive else []) + _rising(facts.health.nvlink_errors)
    return Verdict(Status.DRIFT if problems else Status.OK, desired, None, active, "; ".join(problems))


def _fm_problems(facts: Facts) -> list[str]:
    fm = facts.health.fabric
    problems = []
    if not fm.running and fm.active != "active":  # without systemd only the process tells
        problems.append("nvidia-fabricmanager is not running: every CUDA process fails with error 802")
    if is_systemd(facts) and fm.enabled not in ("enabled", None):
        problems.append(f"nvidia-fabricmanager is {fm.enabled}: it will not start after a reboot")
    driver = facts.gpu.driver_version
    if fm.version and driver and fm.version != driver:
        problems.append(f"Fabric Manager {fm.version} differs from driver {driver}: it refuses to start")
    return problems


def fabric(facts: Facts, profile: Profile) -> Verdict:
    if missing := gpu_unavailable(facts):
        return missing
    fm = facts.health.fabric
    states = [g for g in facts.health.gpus if g.fabric_state is not None]
    if not fm.nvswitches and not states:
        return na("no NVSwitch on this host and no GPU fabric state reported")
    problems = _fm_problems(facts) if fm.nvswitches else []
    problems += [f"GPU{g.index} fabric {g.fabric_state}/{g.fabric_status}" for g in states
                 if g.fabric_state != "Completed" or g.fabric_status not in ("Success", None)]
    desired = "Fabric Manager running at the driver's version; fabric state Completed/Success"
    configured = fm.enabled if fm.nvswitches and is_systemd(facts) else None
    running = "running" if fm.running or fm.active == "active" else "not running"
    active = f"{fm.nvswitches} NVSwitch(es), Fabric Manager {running}{f' {fm.version}' if fm.version else ''}"
    if states:
        active += f", fabric {show(sorted({g.fabric_state for g in states}))}"
    return Verdict(Status.DRIFT if problems else Status.OK, desired, configured, active, "; ".join(problems))


def _configured_iommu(facts: Facts) -> str | None:
    """What the configured kernel command line does to the IOMMU (None: no bootloader config found)."""
    if facts.cmdline_configured is None:
        return None
    pt = facts.cmdline_param("iommu", configured=True) == "pt"
    off = any(facts.cmdline_param(k, configured=True) == "off" for k in ("intel_iommu", "amd_iommu"))
    return "iommu=pt" if pt or off else "translated"


def _acs_redirects(facts: Facts) -> list[str]:
    return [f"ACS redirect on switch port {b.bdf} above GPU {b.gpu} (control 0x{b.acs_ctl:02x})"
            for b in facts.health.bridges
            if b.acs_ctl is not None and b.acs_ctl & (ACS_REQUEST_REDIRECT | ACS_COMPLETION_REDIRECT)]


def p2p(facts: Facts, profile: Profile) -> Verdict:
    if missing := gpu_unavailable(facts):
        return missing
    if facts.health.hypervisor:
        return na("a virtual machine: the hypervisor owns the IOMMU and ACS; check them on the host")
    if len(facts.gpu.gpus) < 2:
        return na("fewer than two GPUs: no peer-to-peer traffic")
    translated = sorted(b for b, t in facts.health.iommu_types.items() if t in TRANSLATED)
    unreadable = [b.bdf for b in facts.health.bridges if not b.readable]
    redirects = _acs_redirects(facts)
    configured = _configured_iommu(facts)
    desired = "IOMMU off or passthrough for GPUs, no ACS redirect between them"
    active = f"IOMMU {'translating' if translated else 'passthrough/off'}, {len(facts.health.bridges)} switch port(s) checked"
    if translated and configured == "iommu=pt" and not redirects:
        return Verdict(Status.PENDING_REBOOT, desired, configured, active, "iommu=pt is configured; the running kernel still translates GPU DMA")
    problems = ([f"the IOMMU translates DMA of {', '.join(translated)}: P2P goes through it (slow, or NCCL hangs)"] if translated else []) + redirects
    if unreadable and not problems:
        return Verdict(Status.ERROR, desired, configured, active, f"cannot read the PCI config space of {', '.join(unreadable)}: run as root")
    return Verdict(Status.DRIFT if problems else Status.OK, desired, configured, active, "; ".join(problems))


def _worst_first(counters: tuple[tuple[str, int], ...]) -> list[tuple[str, int]]:
    order = ("fatal", "nonfatal", "correctable")
    return sorted(counters, key=lambda cv: order.index(cv[0].split()[0]))


def aer(facts: Facts, profile: Profile) -> Verdict:
    counts = facts.health.aer
    if not counts:
        return none_found(facts, "PCIe error state", "no GPU, NVSwitch or NIC with AER counters in sysfs")
    bad = [a for a in counts if a.fatal or a.nonfatal]
    noisy = [a for a in counts if a.correctable and a not in bad]
    desired = "no AER error on GPU, NVSwitch and NIC links since boot"
    active = show([f"{a.kind} {a.bdf} {a.correctable}/{a.nonfatal}/{a.fatal}" for a in counts if a.correctable or a.nonfatal or a.fatal]) \
        if bad or noisy else f"{len(counts)} link(s), no errors"
    if not bad and not noisy:
        return Verdict(Status.OK, desired, None, active)
    detail = "; ".join(f"{a.kind} {a.bdf}: " + ", ".join(f"{c} {v}" for c, v in _worst_first(a.nonzero)[:6]) for a in bad + noisy)
    return Verdict(Status.DRIFT, desired, None, active + " (correctable/non-fatal/fatal)", detail,
                   severity=Severity.CRITICAL if bad else Severity.WARNING)


CHECKS = (
    Check("gpu.nvlink", "NVLink links", Severity.CRITICAL,
          "An inactive or erroring NVLink drops tensor-parallel all-reduces to PCIe speed or stalls NCCL "
          "until it times out.",
          "drain the host, reset the GPUs or reboot; links that stay down or keep counting errors need "
          "the baseboard serviced", False, nvlink),
    Check("gpu.fabric", "NVSwitch fabric", Severity.CRITICAL,
          "On NVSwitch systems the GPUs cannot run CUDA (error 802, system not yet initialized) until Fabric "
          "Manager, at exactly the driver's version, has set up the fabric.",
          "install nvidia-fabricmanager of the driver's version, then systemctl enable --now nvidia-fabricmanager", False, fabric),
    Check("pci.p2p", "PCIe peer-to-peer path (IOMMU, ACS)", Severity.WARNING,
          "With the IOMMU translating GPU DMA, or ACS redirecting peer traffic on PCIe switches, GPU-to-GPU copies "
          "go through the root complex: NCCL is slow or hangs at start.",
          "boot with iommu=pt (or the IOMMU off) and disable ACS on the PCIe switch ports in the BIOS "
          "(or with setpci at boot, as NCCL's troubleshooting guide shows)", True, p2p),
    Check("pci.aer", "PCIe AER errors", Severity.WARNING,
          "PCIe errors on a GPU or NIC link mean replays, a link retraining or a device about to drop off the bus: "
          "transfers slow down, and a fatal one ends in an Xid 79.",
          "reseat or replace the card, riser or cable of the device with errors; a reboot clears the counters", False, aer),
)
