"""Parsers for GPU health: `nvidia-smi -q -x` health fields, `nvidia-smi nvlink -s` and `-e`."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from hosttune.errors import ProbeError
from hosttune.probes.facts_health import GpuHealth, NvLink
from hosttune.probes.gpu import _number, _text, normalize_bdf


def _int(gpu: ET.Element, path: str) -> int | None:
    return _number(_text(gpu, path))


def _yes(gpu: ET.Element, path: str) -> bool | None:
    value = _text(gpu, path)
    return None if value is None else value.lower() == "yes"


def _sram(gpu: ET.Element, counter: str) -> int | None:
    """SRAM uncorrectable errors: one counter before r535, parity + SEC-DED after."""
    old = _int(gpu, f"ecc_errors/{counter}/sram_uncorrectable")
    parts = [_int(gpu, f"ecc_errors/{counter}/sram_uncorrectable_{k}") for k in ("parity", "secded")]
    if old is not None:
        return old
    return None if all(p is None for p in parts) else sum(p or 0 for p in parts)


def _margin(gpu: ET.Element) -> int | None:
    """Degrees below slowdown: r535+ report it (gpu_temp_tlimit), older drivers the threshold."""
    tlimit = _int(gpu, "temperature/gpu_temp_tlimit")
    if tlimit is not None:
        return tlimit
    temp, slow = _int(gpu, "temperature/gpu_temp"), _int(gpu, "temperature/gpu_temp_slow_threshold")
    return None if temp is None or slow is None else slow - temp


def _health(index: int, gpu: ET.Element) -> GpuHealth:
    power = "gpu_power_readings" if gpu.find("gpu_power_readings") is not None else "power_readings"
    return GpuHealth(
        index=index,
        bdf=normalize_bdf(_text(gpu, "pci/pci_bus_id") or gpu.get("id", "")),
        name=_text(gpu, "product_name") or "",
        vbios=_text(gpu, "vbios_version"),
        virtualization=_text(gpu, "gpu_virtualization_mode/virtualization_mode"),
        remap_corr=_int(gpu, "remapped_rows/remapped_row_corr"),
        remap_unc=_int(gpu, "remapped_rows/remapped_row_unc"),
        remap_pending=_yes(gpu, "remapped_rows/remapped_row_pending"),
        remap_failure=_yes(gpu, "remapped_rows/remapped_row_failure"),
        remap_banks_none=_int(gpu, "remapped_rows/row_remapper_histogram/row_remapper_histogram_none"),
        retired_sbe=_int(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
        retired_dbe=_int(gpu, "retired_pages/double_bit_retirement/retired_count"),
        retired_pending=_yes(gpu, "retired_pages/pending_retirement"),
        sram_unc_volatile=_sram(gpu, "volatile"),
        sram_unc_aggregate=_sram(gpu, "aggregate"),
        dram_unc_volatile=_int(gpu, "ecc_errors/volatile/dram_uncorrectable"),
        dram_unc_aggregate=_int(gpu, "ecc_errors/aggregate/dram_uncorrectable"),
        sram_threshold_exceeded=_yes(gpu, "ecc_errors/aggregate/sram_threshold_exceeded"),
        unrepairable_memory=_yes(gpu, "ecc_errors/unrepairable_memory"),
        memory_missing=all(gpu.find(tag) is None for tag in ("remapped_rows", "retired_pages", "ecc_errors")),
        recovery_action=_text(gpu, "gpu_recovery_action"),
        temp_c=_int(gpu, "temperature/gpu_temp"),
        slowdown_margin_c=_margin(gpu),
        power_limit_w=_number(_text(gpu, f"{power}/current_power_limit") or _text(gpu, f"{power}/enforced_power_limit"), float),
        power_default_w=_number(_text(gpu, f"{power}/default_power_limit"), float),
        app_clock_mhz=_int(gpu, "applications_clocks/graphics_clock"),
        app_clock_default_mhz=_int(gpu, "default_applications_clocks/graphics_clock"),
        fabric_state=_text(gpu, "fabric/state"),
        fabric_status=_text(gpu, "fabric/status"),
    )


def parse_health_xml(text: str) -> tuple[GpuHealth, ...]:
    """`nvidia-smi -q -x` → each GPU's health fields."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ProbeError(f"nvidia-smi -q -x printed invalid XML: {exc}") from exc
    return tuple(_health(i, g) for i, g in enumerate(root.findall("gpu")))


_GPU = re.compile(r"^GPU (\d+): ")
_LINK = re.compile(r"^\s*Link (\d+): (.*)$")


def _per_link(text: str):
    """(gpu, link, rest of line) for every 'Link N: ...' line under its 'GPU N: ...' header."""
    gpu = None
    for line in text.splitlines():
        if m := _GPU.match(line):
            gpu = int(m[1])
        elif (m := _LINK.match(line)) and gpu is not None:
            yield gpu, int(m[1]), m[2].strip()


def parse_nvlink_status(text: str) -> tuple[NvLink, ...]:
    """`nvidia-smi nvlink -s`: 'Link 0: 26.562 GB/s' or 'Link 1: <inactive>' per GPU."""
    links = []
    for gpu, link, rest in _per_link(text):
        speed = re.match(r"([\d.]+) GB/s", rest)
        links.append(NvLink(gpu, link, speed is not None, float(speed[1]) if speed else None))
    return tuple(links)


def parse_nvlink_errors(text: str) -> dict[str, int]:
    """`nvidia-smi nvlink -e`: 'Link 0: Replay Errors: 0' → {'GPU0 link 0 Replay Errors': 0}."""
    counters = {}
    for gpu, link, rest in _per_link(text):
        name, sep, value = rest.rpartition(":")
        if sep and value.strip().isdigit():
            counters[f"GPU{gpu} link {link} {name.strip()}"] = int(value)
    return counters
