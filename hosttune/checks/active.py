"""Checks of `hosttune check --active`: the GPUs under a bounded load, DCGM's quick diagnostic,
and all-reduce bus bandwidth. On a passive check they are not-applicable."""

from __future__ import annotations

from statistics import median

from hosttune.checks.base import Check, gpu_unavailable, na
from hosttune.checks.gpu import BUSY_PCT, SLOWDOWNS
from hosttune.probes.facts import Facts
from hosttune.probes.facts_health import LoadSample
from hosttune.checks.findings import Severity, Status, Verdict, show
from hosttune.config.profile import Profile

PASSIVE = "measured only by hosttune check --active"
CLOCK_FLOOR = 0.90  # under load without a power cap, the SM clock reaches this share of its maximum

# All-reduce bus bandwidth floors (GB/s): about 60% of what NCCL's tests reach on 8 GPUs of the model
# over NVSwitch; over PCIe, about half of one direction of the link.
NVLINK_FLOORS = (("H200", 250.0), ("H100", 250.0), ("H800", 150.0), ("H20", 250.0), ("A100", 120.0), ("A800", 80.0), ("V100", 60.0))
PCIE_FLOORS = {5: 20.0, 4: 10.0, 3: 5.0}


def _busy(samples: list[LoadSample]) -> list[LoadSample]:
    return [s for s in samples if (s.util_pct or 0) >= BUSY_PCT]


def _gpu_problems(index: int, samples: list[LoadSample]) -> tuple[list[str], str]:
    busy = _busy(samples)
    if not busy:
        return [f"GPU{index} never above {BUSY_PCT}% utilisation under the load"], f"GPU{index} idle"
    clock = int(median(s.sm_mhz or 0 for s in busy))
    top = max(s.sm_max_mhz or 0 for s in busy)
    reasons = sorted({r for s in busy for r in s.reasons} - {"gpu_idle"})
    pstates = sorted({s.pstate or "?" for s in busy})
    power = max(s.power_w or 0 for s in busy)
    problems = []
    if pstates != ["P0"]:
        problems.append(f"GPU{index} in {', '.join(pstates)} under load")
    if slow := [r for r in reasons if r in SLOWDOWNS]:
        problems.append(f"GPU{index} slowed down by {', '.join(slow)}")
    if "applications_clocks_setting" in reasons and clock < top * CLOCK_FLOOR:
        problems.append(f"GPU{index} clocks locked at {clock} of {top} MHz")
    elif clock < top * CLOCK_FLOOR and "sw_power_cap" not in reasons:
        problems.append(f"GPU{index} SM clock {clock} of {top} MHz under load")
    summary = f"GPU{index} {'/'.join(pstates)} {clock}/{top} MHz {power:.0f} W, reasons {show(reasons)}"
    return problems, summary


def load(facts: Facts, profile: Profile) -> Verdict:
    if missing := gpu_unavailable(facts):
        return missing
    run = facts.health.active
    desired = "P0 and full clocks under load, no slowdown"
    if run is None:
        return na(PASSIVE, desired)
    if run.load_error and not run.samples:
        return Verdict(Status.DRIFT, desired, None, "load failed", run.load_error)
    problems, summaries = ([run.load_error] if run.load_error else []), []
    for g in facts.gpu.gpus:
        p, summary = _gpu_problems(g.index, [s for s in run.samples if s.gpu == g.index])
        problems, summaries = problems + p, summaries + [summary]
    active = f"{run.load_s:.1f} s load: " + "; ".join(summaries)
    return Verdict(Status.DRIFT if problems else Status.OK, desired, None, active, "; ".join(problems))


def diag(facts: Facts, profile: Profile) -> Verdict:
    if missing := gpu_unavailable(facts):
        return missing
    run = facts.health.active
    if run is None:
        return na(PASSIVE, "pass")
    if run.diag is None:
        return na("DCGM (dcgmi) is not installed", "pass")
    if run.diag == "unavailable":
        return na(f"dcgmi is installed but its host engine does not answer: {run.diag_detail}", "pass")
    return Verdict(Status.OK if run.diag == "pass" else Status.DRIFT, "pass", None, run.diag, run.diag_detail)


def floor_gbps(facts: Facts, profile: Profile) -> tuple[float, str]:
    """The bus-bandwidth floor for this host's GPUs and the links between them."""
    if profile.health.allreduce_floor_gbps is not None:
        return profile.health.allreduce_floor_gbps, "the profile's floor"
    name = facts.gpu.gpus[0].name if facts.gpu.gpus else ""
    if any(l.active for l in facts.health.nvlinks or ()):
        floor = next((f for model, f in NVLINK_FLOORS if model in name), 50.0)
        return floor, f"floor for {name} over NVLink"
    gen = min((g.pcie_gen_max or 3 for g in facts.gpu.gpus), default=3)
    return PCIE_FLOORS.get(gen, 5.0), f"floor for PCIe Gen{gen}"


def allreduce(facts: Facts, profile: Profile) -> Verdict:
    if missing := gpu_unavailable(facts):
        return missing
    if len(facts.gpu.gpus) < 2:
        return na("one GPU: no all-reduce")
    run = facts.health.active
    floor, why = floor_gbps(facts, profile)
    desired = f">= {floor:.0f} GB/s bus bandwidth ({why})"
    if run is None:
        return na(PASSIVE, desired)
    if run.allreduce is None:
        error = run.allreduce_error or "the all-reduce did not run"
        if error.startswith("no python"):
            return na(error, desired)
        return Verdict(Status.DRIFT, desired, None, "failed", error)
    r = run.allreduce
    active = f"{r.busbw_gbps:.1f} GB/s on {r.num_gpus} GPUs ({r.bytes >> 20} MiB)"
    status = Status.OK if r.busbw_gbps >= floor else Status.DRIFT
    return Verdict(status, desired, None, active, "" if status is Status.OK else "check gpu.nvlink, pci.p2p and gpu.pcie_link")


CHECKS = (
    Check("gpu.load", "GPUs under a short load", Severity.WARNING,
          "Idle GPUs drop to low clocks legitimately, so only a GPU under load shows a P-state, clock lock or "
          "slowdown that would slow serving.",
          "see the clock-event reason it names: cooling for thermal slowdown, power delivery for HW "
          "slowdown, nvidia-smi -rgc for locked clocks", False, load),
    Check("gpu.diag", "DCGM quick diagnostic", Severity.CRITICAL,
          "DCGM's deployment diagnostic (dcgmi diag -r 1) catches driver, library, permission and memory problems "
          "the way NVIDIA's own fleet tooling does.",
          "follow the failing test's message in dcgmi diag -r 1", False, diag),
    Check("gpu.allreduce", "all-reduce bus bandwidth", Severity.WARNING,
          "Tensor parallelism all-reduces every layer's output; a host whose GPUs talk below the floor for their "
          "model and links serves every token slower.",
          "find the slow path with gpu.nvlink, pci.p2p and gpu.pcie_link, then nccl-tests' all_reduce_perf", False, allreduce),
)
