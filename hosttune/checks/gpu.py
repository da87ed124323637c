"""Checks of the GPUs themselves: P-state, persistence, PCIe link, ECC, MIG."""

from __future__ import annotations

from hosttune.checks.base import Check, gpu_unavailable, is_systemd, na, not_read, unmanaged, unread
from hosttune.probes.facts import Facts, GpuInfo
from hosttune.checks.findings import Severity, Status, Verdict, show
from hosttune.config.profile import Profile

BUSY_PCT = 30  # above this utilisation a GPU is "under load" and must be in its top state
SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")


def is_busy(gpu: GpuInfo) -> bool:
    return (gpu.utilization_pct or 0) >= BUSY_PCT and "gpu_idle" not in gpu.clock_event_reasons


def _per_gpu(facts: Facts, fn) -> list[str]:
    return [f"GPU{g.index} {fn(g)}" for g in facts.gpu.gpus]


def pstate(facts: Facts, profile: Profile) -> Verdict:
    if profile.gpu.pstate is None:
        return unmanaged("P-state not managed by the profile")
    if missing := gpu_unavailable(facts):
        return missing
    want = profile.gpu.pstate
    problems, notes = [], []
    for g in facts.gpu.gpus:
        if g.pstate is None:
            continue  # not read: said below unless something else already fails
        slow = [r for r in g.clock_event_reasons if r in SLOWDOWNS]
        if slow:
            problems.append(f"GPU{g.index} clocks held back by {', '.join(slow)}")
        if g.pstate != want and is_busy(g):
            problems.append(f"GPU{g.index} in {g.pstate} at {g.utilization_pct}% load")
        elif g.pstate != want:
            notes.append(f"GPU{g.index} idle in {g.pstate} (legitimate; judged under load)")
        if "sw_power_cap" in g.clock_event_reasons and is_busy(g):
            lowered = g.power_limit_w and g.power_limit_max_w and g.power_limit_w < g.power_limit_max_w
            if lowered:
                problems.append(f"GPU{g.index} capped by a lowered power limit {g.power_limit_w:.0f} W (max {g.power_limit_max_w:.0f} W)")
            else:
                notes.append(f"GPU{g.index} at its full power limit {g.power_limit_w} W under load (expected for dense math)")
    status = Status.DRIFT if problems else Status.OK
    active = show(_per_gpu(facts, lambda g: f"{g.pstate} {g.utilization_pct if g.utilization_pct is not None else '?'}% {g.sm_clock_mhz}/{g.sm_clock_max_mhz} MHz"))
    if not problems and (blind := unread(facts.gpu.gpus, "pstate")):
        return not_read(f"{want} under load, no slowdown", active, "P-state", blind)
    return Verdict(status, f"{want} under load, no slowdown", None, active, "; ".join(problems or notes))


def persistence(facts: Facts, profile: Profile) -> Verdict:
    if not profile.gpu.persistence:
        return unmanaged("persistence mode not managed by the profile")
    if missing := gpu_unavailable(facts):
        return missing
    off = [g.index for g in facts.gpu.gpus if g.persistence is False]
    daemon = facts.services.get("nvidia-persistenced")
    configured = daemon.enabled if daemon and is_systemd(facts) else None
    active = show(_per_gpu(facts, lambda g: show(g.persistence)))
    problems = []
    if off:
        problems.append(f"persistence off on GPU {', '.join(map(str, off))}: every process start re-initialises the GPU")
    if configured is not None and configured != "enabled":
        problems.append(f"nvidia-persistenced is {configured}: persistence will not survive a reboot")
    elif daemon and daemon.running is False and all(g.persistence for g in facts.gpu.gpus):
        problems.append("persistence is on but nvidia-persistenced is not running (set by nvidia-smi -pm, which is deprecated)")
    if not problems and (blind := unread(facts.gpu.gpus, "persistence")):
        return not_read("on, owned by nvidia-persistenced", active, "persistence mode", blind)
    status = Status.DRIFT if problems else Status.OK
    return Verdict(status, "on, owned by nvidia-persistenced", configured, active, "; ".join(problems))


def _link_problems(g: GpuInfo) -> list[str]:
    problems = []
    if g.pcie_width is not None and g.pcie_width_max is not None and g.pcie_width < g.pcie_width_max:
        problems.append(f"GPU{g.index} link x{g.pcie_width} of x{g.pcie_width_max}")
    if g.pcie_gen is not None and g.pcie_gen_max is not None and g.pcie_gen < g.pcie_gen_max and is_busy(g):
        problems.append(f"GPU{g.index} link Gen{g.pcie_gen} of Gen{g.pcie_gen_max} under load")
    return problems


def pcie_link(facts: Facts, profile: Profile) -> Verdict:
    if profile.gpu.pcie_link is None:
        return unmanaged("PCIe link not managed by the profile")
    if missing := gpu_unavailable(facts):
        return missing
    problems = [p for g in facts.gpu.gpus for p in _link_problems(g)]
    active = show(_per_gpu(facts, lambda g: f"Gen{g.pcie_gen}/{g.pcie_gen_max} x{g.pcie_width}/{g.pcie_width_max}"))
    if not problems and (blind := unread(facts.gpu.gpus, "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")):
        return not_read("maximum generation and width", active, "PCIe link", blind)
    status = Status.DRIFT if problems else Status.OK
    detail = "; ".join(problems) or "an idle GPU may train down its link generation to save power; width must be full"
    return Verdict(status, "maximum generation and width", None, active, detail)


def _mode_unread(gpus, mode: str) -> list[str]:
    """'GPU0', ... of the GPUs whose `mode` (ecc, mig) was not read, where their driver did not say they lack it."""
    return [f"GPU{g.index}" for g in gpus if getattr(g, f"{mode}_enabled") is None and mode not in g.unsupported]


def ecc(facts: Facts, profile: Profile) -> Verdict:
    if profile.gpu.ecc is None:
        return unmanaged("ECC not managed by the profile")
    if missing := gpu_unavailable(facts):
        return missing
    want = profile.gpu.ecc
    gpus = facts.gpu.gpus
    blind = _mode_unread(gpus, "ecc")
    if not blind and all(g.ecc_enabled is None for g in gpus):
        return na("these GPUs do not support ECC", show(want))
    pending_retire = [g.index for g in gpus if g.retirement_pending]
    wrong = [g for g in gpus if g.ecc_enabled is not None and g.ecc_enabled != want]
    pending_mode = [g for g in wrong if g.ecc_pending]
    active = show(_per_gpu(facts, lambda g: show(g.ecc_enabled)))
    if pending_retire:
        return Verdict(Status.DRIFT, show(want), None, active,
                       f"page retirement / row remap pending on GPU {', '.join(map(str, pending_retire))}: reset the GPU when drained")
    if wrong and len(pending_mode) == len(wrong):
        return Verdict(Status.PENDING_REBOOT, show(want), show(want), active, "ECC mode change pending until GPU reset or reboot")
    if not wrong and blind:
        return not_read(show(want), active, "ECC mode", blind)
    return Verdict(Status.DRIFT if wrong else Status.OK, show(want), None, active)


def mig(facts: Facts, profile: Profile) -> Verdict:
    if profile.gpu.mig is None:
        return unmanaged("MIG not managed by the profile")
    if missing := gpu_unavailable(facts):
        return missing
    want = profile.gpu.mig
    gpus = [g for g in facts.gpu.gpus if g.mig_enabled is not None]
    blind = _mode_unread(facts.gpu.gpus, "mig")
    if not gpus and not blind:
        return na("these GPUs do not support MIG", show(want))
    wrong = [g for g in gpus if g.mig_enabled != want]
    active = show(_per_gpu(facts, lambda g: show(g.mig_enabled)))
    if wrong and all(g.mig_pending for g in wrong):
        return Verdict(Status.PENDING_REBOOT, show(want), show(want), active, "MIG mode change pending until GPU reset")
    if not wrong and blind:
        return not_read(show(want), active, "MIG mode", blind)
    detail = f"MIG {show(not want)} on GPU {', '.join(str(g.index) for g in wrong)}" if wrong else ""
    return Verdict(Status.DRIFT if wrong else Status.OK, show(want), None, active, detail)


CHECKS = (
    Check("gpu.pstate", "GPU performance state", Severity.WARNING,
          "A GPU stuck below P0 or clock-limited by power or heat serves every token slower.",
          "enable persistence and remove clock limits; investigate power caps and cooling", False, pstate),
    Check("gpu.persistence", "GPU persistence mode", Severity.WARNING,
          "Without persistence the driver tears the GPU down between processes, adding seconds to engine start.",
          "enable and start nvidia-persistenced", False, persistence),
    Check("gpu.pcie_link", "GPU PCIe link", Severity.WARNING,
          "A GPU trained to fewer lanes or a lower generation moves weights and KV transfers slower.",
          "reseat the card or fix BIOS/slot settings (hosttune cannot change the link)", True, pcie_link),
    Check("gpu.ecc", "GPU ECC", Severity.CRITICAL,
          "ECC off risks silent corruption; pending retirements mean memory errors already happened.",
          "nvidia-smi -e to set ECC mode, then reset the GPU or reboot", True, ecc),
    Check("gpu.mig", "GPU MIG mode", Severity.WARNING,
          "MIG splits a GPU into slices; an engine expecting the whole GPU gets a fraction of it.",
          "nvidia-smi -mig to set MIG mode, then reset the GPU", True, mig),
)
