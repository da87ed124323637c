"""The health probe sections → Facts.health. Each section's failure is a probe error of its own."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hosttune.errors import ProbeError

BUSY_PCT = 30  # the same threshold as the GPU checks' "under load"
from hosttune.probes.facts import Facts, GpuInfo
from hosttune.probes.facts_health import ActiveRun, HealthFacts
from hosttune.probes import gpu_health, host_health, kernel_log, pci_health
from hosttune.probes.sections import Section


def _host(h: HealthFacts, sec: Section) -> HealthFacts:
    return replace(h, **host_health.parse_health_host(sec.text))


def _pci(h: HealthFacts, sec: Section) -> HealthFacts:
    aer, iommu, bridges, switches = pci_health.parse_pci_health(sec.text)
    return replace(h, aer=aer, iommu_types=iommu, bridges=bridges, fabric=replace(h.fabric, nvswitches=switches))


def _xml(h: HealthFacts, sec: Section) -> HealthFacts:
    return replace(h, gpus=gpu_health.parse_health_xml(sec.text)) if sec.rc == 0 else h


def _nvlink_errors(h: HealthFacts, sec: Section) -> HealthFacts:
    if sec.rc != 0:
        return h
    return replace(h, nvlink_errors=h.nvlink_errors + (gpu_health.parse_nvlink_errors(sec.text),))


def _active(h: HealthFacts) -> ActiveRun:
    return h.active or ActiveRun()


def _diag(h: HealthFacts, sec: Section) -> HealthFacts:
    result, detail = host_health.parse_dcgm_diag(sec.text, sec.rc)
    return replace(h, active=replace(_active(h), diag=result, diag_detail=detail))


def _allreduce(h: HealthFacts, sec: Section) -> HealthFacts:
    result, error = host_health.parse_allreduce(sec.text, sec.rc)
    return replace(h, active=replace(_active(h), allreduce=result, allreduce_error=error))


def _load(h: HealthFacts, sec: Section) -> HealthFacts:
    run = host_health.parse_active_load(sec.text, sec.rc)
    return replace(h, active=replace(_active(h), load_s=run.load_s, load_error=run.load_error, samples=run.samples))


_STEPS: tuple[tuple[str, Callable[[HealthFacts, Section], HealthFacts]], ...] = (
    ("health-host", _host),
    ("kernel-log", lambda h, s: replace(h, kernel_log=kernel_log.parse_kernel_log(s.text, s.rc))),
    ("pci-health", _pci),
    ("fabric", lambda h, s: replace(h, fabric=host_health.parse_fabric_manager(s.text, h.fabric.nvswitches))),
    ("smi-xml", _xml),
    ("nvlink-status", lambda h, s: replace(h, nvlinks=gpu_health.parse_nvlink_status(s.text) if s.rc == 0 else None)),
    ("nvlink-errors-1", _nvlink_errors),
    ("nvlink-errors-2", _nvlink_errors),
    ("cuda-smoke", lambda h, s: replace(h, cuda=host_health.parse_cuda_smoke(s.text, s.rc))),
    ("gpu-nodes", lambda h, s: replace(h, **host_health.parse_gpu_nodes(s.text))),
    ("active-load", _load),
    ("dcgm-diag", _diag),
    ("allreduce", _allreduce),
)


def with_health(facts: Facts, sections: dict[str, Section], errors: list[str]) -> Facts:
    """Facts with .health filled from whichever health sections the probe printed.

    After an active load, each GPU's P-state, clocks, utilisation and clock-event reasons are
    the ones it showed under that load, so the GPU checks judge them there and not at idle.
    """
    health = facts.health
    for name, apply in _STEPS:
        if name in sections:
            try:
                health = apply(health, sections[name])
            except (ValueError, KeyError, TypeError, ProbeError) as exc:
                errors.append(f"{name}: {exc}")
    gpus = tuple(_under_load(g, health.active) for g in facts.gpu.gpus) if health.active else facts.gpu.gpus
    return replace(facts, health=health, gpu=replace(facts.gpu, gpus=gpus))


def _under_load(g: GpuInfo, run: ActiveRun) -> GpuInfo:
    """The GPU as its slowest busy sample showed it, with every clock-event reason seen under load."""
    busy = [s for s in run.samples if s.gpu == g.index and (s.util_pct or 0) >= BUSY_PCT]
    if not busy:
        return g
    slowest = min(busy, key=lambda s: s.sm_mhz or 0)
    reasons = tuple(sorted({r for s in busy for r in s.reasons} - {"gpu_idle"}))
    return replace(g, pstate=slowest.pstate, sm_clock_mhz=slowest.sm_mhz, utilization_pct=slowest.util_pct,
                   power_draw_w=slowest.power_w, clock_event_reasons=reasons)
