"""GPU health: Xid events, the GPUs every layer sees, memory health, clocks and power."""

from __future__ import annotations

from collections import Counter

from hosttune import cpulist
from hosttune.checks.base import Check, gpu_unavailable, has_gpus, none_found, not_read, unread
from hosttune.checks.xid_codes import FATAL, meaning
from hosttune.probes.facts import Facts
from hosttune.probes.facts_health import GpuHealth
from hosttune.checks.findings import Severity, Status, Verdict, show
from hosttune.config.profile import Profile

RETIRED_PAGES_RMA = 60  # NVIDIA's replacement threshold for retired pages


def _gpu_label(facts: Facts, bdf: str) -> str:
    """'GPU0' for a kernel-log address (domain:bus:device) of a GPU NVML sees, else the address."""
    for g in facts.gpu.gpus:
        if g.bdf.startswith(bdf):
            return f"GPU{g.index}"
    return f"PCI {bdf}"


def xid(facts: Facts, profile: Profile) -> Verdict:
    log = facts.health.kernel_log
    desired = "no Xid event since boot"
    if not log.events and not has_gpus(facts):
        return none_found(facts, "the kernel log", "no NVIDIA GPU on this host and no Xid in its kernel log")
    if not log.read:
        return Verdict(Status.ERROR, desired, detail="the probe's output has no kernel-log section: no Xid can be seen")
    if log.source is None:
        return Verdict(Status.ERROR, desired, detail="cannot read the kernel log (dmesg or journalctl -k): run as root (become: true)")
    counts = Counter((e.bdf, e.code) for e in log.events)
    lines = [f"{_gpu_label(facts, bdf)} Xid {code}{f' x{n}' if n > 1 else ''}: {meaning(code)}"
             for (bdf, code), n in sorted(counts.items(), key=lambda kv: (kv[0][1] not in FATAL, kv[0]))]
    active = f"{log.total} Xid event(s) since boot (from {log.source})"
    if not counts:
        return Verdict(Status.OK, desired, None, active)
    fatal = any(code in FATAL for _, code in counts)
    more = f"; {log.total - len(log.events)} older line(s) not shown" if log.total > len(log.events) else ""
    return Verdict(Status.DRIFT, desired, None, active, "; ".join(lines) + more,
                   severity=Severity.CRITICAL if fatal else Severity.WARNING)


def _indices(spec: str | None) -> tuple[int, ...]:
    return tuple(cpulist.parse(spec)) if spec else ()


def _node_problems(facts: Facts) -> list[str]:
    """nvidia-uvm and the device nodes, where the probe read them (gpu-nodes)."""
    h = facts.health
    if h.uvm_loaded is None:
        return []
    problems = []
    if not h.uvm_loaded:
        problems.append("nvidia-uvm is not loaded: CUDA cannot start (modprobe nvidia-uvm)")
    nodes = set(h.device_nodes)
    missing = [n for n in ("/dev/nvidiactl", "/dev/nvidia-uvm") if n not in nodes]
    per_gpu = [n for n in nodes if n.removeprefix("/dev/nvidia").isdigit()]
    if len(per_gpu) < len(facts.gpu.gpus):  # minor numbers need not match NVML indices: count them
        missing.append(f"{len(facts.gpu.gpus) - len(per_gpu)} of the /dev/nvidiaN nodes")
    if missing:
        problems.append(f"device node(s) missing: {', '.join(missing)} (nvidia-modprobe -c N -u creates them)")
    return problems


def count(facts: Facts, profile: Profile) -> Verdict:
    want = profile.health
    pci, nvml = facts.gpu.pci_devices, facts.gpu.gpus
    # an image: no PCI bus read, the build machine's would be nobody's business, and there is no other
    if facts.image or not pci and not nvml and not want.gpu_count:
        return none_found(facts, "GPU state", "no NVIDIA GPU on this host")
    problems = []
    if len(pci) != len(nvml):
        lost = sorted(set(pci) - {g.bdf for g in nvml})
        problems.append(f"PCI shows {len(pci)} GPU(s), NVML {len(nvml)}" + (f": the driver lost {', '.join(lost)}" if lost else ""))
    if want.gpu_count is not None and len(pci) != want.gpu_count:
        problems.append(f"the profile expects {want.gpu_count} GPU(s), PCI shows {len(pci)}")
    absent = [i for i in _indices(want.gpus) if i not in {g.index for g in nvml}]
    if absent:
        problems.append(f"the inventory selects GPU {', '.join(map(str, absent))}, which NVML does not show")
    if nvml:
        problems += _node_problems(facts)
    desired = f"PCI = NVML{f' = {want.gpu_count}' if want.gpu_count is not None else ''}, nvidia-uvm loaded"
    uvm = {True: "loaded", False: "not loaded", None: "not read"}[facts.health.uvm_loaded]
    active = f"PCI {len(pci)}, NVML {len(nvml)}, nvidia-uvm {uvm}"
    if problems:
        return Verdict(Status.DRIFT, desired, None, active, "; ".join(problems))
    if nvml and facts.health.uvm_loaded is None:  # the counts agree; what CUDA needs besides is unknown
        return Verdict(Status.ERROR, desired, None, active, "nvidia-uvm and the device nodes were not read (the "
                       "probe's output has no gpu-nodes section)")
    return Verdict(Status.OK, desired, None, active)


def _memory_problems(g: GpuHealth) -> tuple[list[str], list[str]]:
    """(problems, pending) for one GPU."""
    p, pending, name = [], [], f"GPU{g.index}"
    if g.remap_failure:
        p.append(f"{name} row remapping failed: replace the GPU")
    if g.unrepairable_memory:
        p.append(f"{name} reports unrepairable memory: replace the GPU")
    if g.sram_threshold_exceeded:
        p.append(f"{name} SRAM uncorrectable errors past NVIDIA's threshold: replace the GPU")
    if g.remap_banks_none:
        p.append(f"{name} has {g.remap_banks_none} memory bank(s) with no spare rows left")
    if (g.retired_sbe or 0) + (g.retired_dbe or 0) >= RETIRED_PAGES_RMA:
        p.append(f"{name} retired {(g.retired_sbe or 0) + (g.retired_dbe or 0)} pages (replace at {RETIRED_PAGES_RMA})")
    for kind, value in (("DRAM", g.dram_unc_volatile), ("SRAM", g.sram_unc_volatile)):
        if value:
            p.append(f"{name} {value} uncorrectable {kind} ECC error(s) since the last reset")
    if g.recovery_action not in (None, "None"):
        p.append(f"{name}: the driver asks for recovery action {g.recovery_action}")
    if g.remap_pending or g.retired_pending:
        pending.append(f"{name} has a row remap / page retirement waiting for a GPU reset")
    return p, pending


def _no_health_fields(facts: Facts) -> Verdict | None:
    """not-applicable without GPUs; an error when GPUs are there but nvidia-smi -q -x gave nothing."""
    if missing := gpu_unavailable(facts):
        return missing
    if not facts.health.gpus:
        return Verdict(Status.ERROR, "-", detail="nvidia-smi -q -x gave no GPU health, clock or power fields")
    return None


def memory_health(facts: Facts, profile: Profile) -> Verdict:
    if missing := _no_health_fields(facts):
        return missing
    gpus = facts.health.gpus
    problems, pending = [], []
    for g in gpus:
        p, w = _memory_problems(g)
        problems, pending = problems + p, pending + w
    desired = "no remap failure or pending remap, no uncorrectable ECC error"
    active = show([f"GPU{g.index} remapped {g.remap_corr or 0}+{g.remap_unc or 0} unc, DRAM unc {g.dram_unc_aggregate or 0} (lifetime)" for g in gpus])
    if problems:
        return Verdict(Status.DRIFT, desired, None, active, "; ".join(problems + pending))
    if pending:
        return Verdict(Status.PENDING_REBOOT, desired, desired, active, "; ".join(pending) + ": drain it, then nvidia-smi -r or reboot")
    if blind := [f"GPU{g.index}" for g in gpus if g.memory_missing]:
        return not_read(desired, active, "remapped rows, retired pages or ECC error counters", blind)
    return Verdict(Status.OK, desired, None, active)


def _clock_power_problems(g: GpuHealth, margin: int | None) -> list[str]:
    p, name = [], f"GPU{g.index}"
    if g.app_clock_mhz and g.app_clock_default_mhz and g.app_clock_mhz < g.app_clock_default_mhz:
        p.append(f"{name} applications clocks {g.app_clock_mhz} MHz, below the default {g.app_clock_default_mhz}")
    if g.power_limit_w and g.power_default_w and g.power_limit_w < g.power_default_w - 1:
        p.append(f"{name} power limit {g.power_limit_w:.0f} W, below the default {g.power_default_w:.0f} W")
    if margin is not None and g.slowdown_margin_c is not None and g.slowdown_margin_c < margin:
        p.append(f"{name} {g.slowdown_margin_c} C from thermal slowdown (at {g.temp_c} C)")
    return p


def clocks_power(facts: Facts, profile: Profile) -> Verdict:
    if missing := _no_health_fields(facts):
        return missing
    gpus = facts.health.gpus
    problems = [p for g in gpus for p in _clock_power_problems(g, profile.health.thermal_margin_c)]
    by_model: dict[str, set[str]] = {}
    for g in gpus:
        by_model.setdefault(g.name, set()).add(g.vbios or "?")
    problems += [f"{model}: VBIOS differ ({', '.join(sorted(v))})" for model, v in by_model.items() if len(v) > 1]
    active = show([f"GPU{g.index} {g.power_limit_w or '?'}/{g.power_default_w or '?'} W, margin {show(g.slowdown_margin_c)} C, VBIOS {g.vbios}" for g in gpus])
    desired = f"default clocks and power limit, >= {profile.health.thermal_margin_c} C thermal margin, one VBIOS"
    blind = unread(gpus, "power_limit_w", "power_default_w", "app_clock_mhz", "slowdown_margin_c", "temp_c")
    if not problems and blind:
        return not_read(desired, active, "power limit, clocks or temperature", blind)
    return Verdict(Status.DRIFT if problems else Status.OK, desired, None, active, "; ".join(problems))


CHECKS = (
    Check("gpu.xid", "GPU Xid events since boot", Severity.CRITICAL,
          "An Xid is the driver reporting a GPU fault; the fatal ones (fallen off the bus, double-bit ECC, GSP timeouts) "
          "leave the GPU unusable until a reset, so the engine on it fails every request.",
          "drain the GPU's service, then reset it (nvidia-smi -r -i N) or reboot; a fatal Xid that comes back "
          "after a reset means the GPU, its riser or its power needs replacing", False, xid),
    Check("gpu.count", "GPUs seen by PCI, NVML and the inventory", Severity.CRITICAL,
          "A GPU that is on the PCI bus but missing from NVML, or missing altogether after a reboot, "
          "silently shrinks the replicas or tensor-parallel groups placed on that host.",
          "check dmesg for the missing GPU's Xid or probe errors, reseat or replace it; "
          "modprobe nvidia-uvm when the UVM module is missing", False, count),
    Check("gpu.memory_health", "GPU memory health", Severity.CRITICAL,
          "Uncorrectable ECC errors kill the processes using that memory; a failed or pending row remap means "
          "the GPU serves on bad rows until it is reset, or must be replaced.",
          "drain the GPU and reset it (nvidia-smi -r) to apply pending remaps; replace it on a remap "
          "failure, unrepairable memory or too many retired pages", True, memory_health),
    Check("gpu.clocks_power", "GPU clocks, power limit, thermals, VBIOS", Severity.WARNING,
          "Clocks locked low, a lowered power limit or a GPU running near its slowdown temperature make that GPU "
          "the slow rank every tensor-parallel step waits for; mixed VBIOS versions behave differently under load.",
          "nvidia-smi -rac and -rgc reset clocks, nvidia-smi -pl sets the default power limit; "
          "fix cooling; flash one VBIOS across the group (hosttune changes no clock or power setting)", False, clocks_power),
)
