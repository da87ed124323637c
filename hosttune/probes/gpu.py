"""Parsers for GPU facts: NVML JSON (our probe), `nvidia-smi -q -x`, `--query-gpu` CSV."""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET

from hosttune.errors import ProbeError
from hosttune.probes.facts import GpuInfo


def normalize_bdf(bus_id: str) -> str:
    """NVML's "00000000:00:06.0" and sysfs's "0000:00:06.0" both become "0000:00:06.0"."""
    text = bus_id.strip().lower()
    domain, _, rest = text.partition(":")
    if not rest:
        return text
    if not re.fullmatch(r"[0-9a-f]{1,8}", domain):
        raise ProbeError(f"PCI bus id {bus_id.strip()!r} is not DOMAIN:BUS:DEVICE.FUNCTION")
    return f"{int(domain, 16):04x}:{rest}"


def parse_nvml_json(text: str) -> tuple[dict, tuple[GpuInfo, ...]]:
    """Our NVML probe's JSON → (system fields, GPUs)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"NVML probe printed invalid JSON: {exc}") from exc
    if "error" in doc:
        raise ProbeError(f"NVML: {doc['error']}")
    gpus = tuple(_gpu_from_json(g) for g in doc.get("gpus", []))
    system = {"driver_version": doc.get("driver_version"), "cuda_driver_version": doc.get("cuda_driver_version")}
    return system, gpus


def _gpu_from_json(g: dict) -> GpuInfo:
    fields = dict(g)
    fields["bdf"] = normalize_bdf(g.get("bdf") or "")
    fields["name"] = g.get("name") or "unknown"
    fields["uuid"] = g.get("uuid") or ""
    fields["clock_event_reasons"] = tuple(g.get("clock_event_reasons") or ())
    fields["unsupported"] = tuple(g.get("unsupported") or ())
    return GpuInfo(**fields)


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value in ("N/A", "", "[N/A]", "Unknown Error") else value


def said_na(node: ET.Element, path: str) -> bool:
    """The element is there and says N/A: the driver read it and the GPU has none (a missing element was not read)."""
    found = node.find(path)
    return found is not None and (found.text or "").strip() in ("N/A", "[N/A]")


def _number(value: str | None, kind=int):
    if value is None:
        return None
    match = re.match(r"^-?[\d.]+", value)
    return kind(float(match.group())) if kind is int and match else (kind(match.group()) if match else None)


def _on(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.lower() in ("enabled", "yes", "active")


_XML_REASONS = {
    "gpu_idle": "clocks_event_reason_gpu_idle",
    "applications_clocks_setting": "clocks_event_reason_applications_clocks_setting",
    "sw_power_cap": "clocks_event_reason_sw_power_cap",
    "hw_slowdown": "clocks_event_reason_hw_slowdown",
    "hw_thermal_slowdown": "clocks_event_reason_hw_thermal_slowdown",
    "hw_power_brake_slowdown": "clocks_event_reason_hw_power_brake_slowdown",
    "sync_boost": "clocks_event_reason_sync_boost",
    "sw_thermal_slowdown": "clocks_event_reason_sw_thermal_slowdown",
}


def _reasons(gpu: ET.Element) -> tuple[str, ...]:
    block = gpu.find("clocks_event_reasons")
    prefix_old = False
    if block is None:  # drivers before 535 call them throttle reasons
        block, prefix_old = gpu.find("clocks_throttle_reasons"), True
    if block is None:
        return ()
    out = []
    for name, tag in _XML_REASONS.items():
        if prefix_old:
            tag = tag.replace("clocks_event_reason_", "clocks_throttle_reason_")
        if _text(block, tag) == "Active":
            out.append(name)
    return tuple(out)


def _retirement_pending(gpu: ET.Element) -> bool | None:
    remap = _text(gpu, "remapped_rows/remapped_row_pending")
    if remap is not None:
        return remap.lower() == "yes"
    retired = _text(gpu, "retired_pages/pending_retirement")
    return None if retired is None else retired.lower() == "yes"


def _power(gpu: ET.Element, field: str) -> float | None:
    for block in ("gpu_power_readings", "power_readings"):
        for tag in (field, "average_power_draw" if field == "power_draw" else field):
            value = _number(_text(gpu, f"{block}/{tag}"), float)
            if value is not None:
                return value
    return None


def _gpu_from_xml(index: int, gpu: ET.Element) -> GpuInfo:
    ecc_now, ecc_next = _text(gpu, "ecc_mode/current_ecc"), _text(gpu, "ecc_mode/pending_ecc")
    mig_now, mig_next = _text(gpu, "mig_mode/current_mig"), _text(gpu, "mig_mode/pending_mig")
    link = "pci/pci_gpu_link_info"
    return GpuInfo(
        index=index,
        name=_text(gpu, "product_name") or "unknown",
        bdf=normalize_bdf(_text(gpu, "pci/pci_bus_id") or gpu.get("id", "")),
        uuid=_text(gpu, "uuid") or "",
        pstate=_text(gpu, "performance_state"),
        persistence=_on(_text(gpu, "persistence_mode")),
        sm_clock_mhz=_number(_text(gpu, "clocks/sm_clock")),
        sm_clock_max_mhz=_number(_text(gpu, "max_clocks/sm_clock")),
        power_draw_w=_power(gpu, "power_draw"),
        power_limit_w=_power(gpu, "current_power_limit") or _power(gpu, "power_limit"),
        power_limit_max_w=_power(gpu, "max_power_limit"),
        utilization_pct=_number(_text(gpu, "utilization/gpu_util")),
        clock_event_reasons=_reasons(gpu),
        pcie_gen=_number(_text(gpu, f"{link}/pcie_gen/current_link_gen")),
        pcie_gen_max=_number(_text(gpu, f"{link}/pcie_gen/max_link_gen")),
        pcie_width=_number(_text(gpu, f"{link}/link_widths/current_link_width")),
        pcie_width_max=_number(_text(gpu, f"{link}/link_widths/max_link_width")),
        ecc_enabled=_on(ecc_now),
        ecc_pending=None if ecc_now is None or ecc_next is None else ecc_now != ecc_next,
        retirement_pending=_retirement_pending(gpu),
        mig_enabled=_on(mig_now),
        mig_pending=None if mig_now is None or mig_next is None else mig_now != mig_next,
        memory_total_mib=_number(_text(gpu, "fb_memory_usage/total")),
        unsupported=tuple(m for m in ("ecc", "mig") if said_na(gpu, f"{m}_mode/current_{m}")),
    )


def parse_smi_xml(text: str) -> tuple[dict, tuple[GpuInfo, ...]]:
    """`nvidia-smi -q -x` → (system fields, GPUs)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ProbeError(f"nvidia-smi -q -x printed invalid XML: {exc}") from exc
    gpus = tuple(_gpu_from_xml(i, g) for i, g in enumerate(root.findall("gpu")))
    system = {"driver_version": _text(root, "driver_version"), "cuda_driver_version": _text(root, "cuda_version")}
    return system, gpus


def parse_smi_csv(text: str) -> tuple[dict, tuple[GpuInfo, ...]]:
    """`nvidia-smi --query-gpu=index,name,pci.bus_id,pstate,persistence_mode,clocks.sm,
    clocks.max.sm,power.draw,power.limit,driver_version,compute_cap --format=csv`."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows or not rows[0] or rows[0][0].strip() != "index":
        raise ProbeError("nvidia-smi --query-gpu output has no header row")
    header = [h.split(" [")[0].strip() for h in rows[0]]
    gpus, driver = [], None
    for row in rows[1:]:
        rec = dict(zip(header, (v.strip() for v in row)))
        driver = rec.get("driver_version") or driver
        gpus.append(GpuInfo(
            index=int(rec["index"]),
            name=rec.get("name", "unknown"),
            bdf=normalize_bdf(rec.get("pci.bus_id", "")),
            pstate=rec.get("pstate"),
            persistence=_on(rec.get("persistence_mode")),
            compute_cap=rec.get("compute_cap"),
            sm_clock_mhz=_number(rec.get("clocks.current.sm") or rec.get("clocks.sm")),
            sm_clock_max_mhz=_number(rec.get("clocks.max.sm")),
            power_draw_w=_number(rec.get("power.draw"), float),
            power_limit_w=_number(rec.get("power.limit"), float),
        ))
    return {"driver_version": driver, "cuda_driver_version": None}, tuple(gpus)


_MODULE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_module_version(text: str) -> str | None:
    """/proc/driver/nvidia/version → the loaded kernel module's version."""
    match = _MODULE.search(text)
    return match.group(1) if match else None


def library_version(paths: list[str]) -> str | None:
    """The userspace driver version from libnvidia-ml.so.<version> file names."""
    versions = [m.group(1) for p in paths if (m := re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", p.strip()))]
    return max(versions, key=lambda v: tuple(int(x) for x in v.split("."))) if versions else None
