"""Parsers for the host-level health sections: shared memory, nvidia-uvm, Fabric Manager,
the CUDA probe's JSON (smoke test and active load), DCGM's diagnostic and the all-reduce."""

from __future__ import annotations

import json
import re

from hosttune.errors import ProbeError
from hosttune.probes.facts_health import ActiveRun, AllReduce, CudaRun, CudaSmoke, FabricManager, LoadSample, ShmFacts
from hosttune.probes.gpu import normalize_bdf
from hosttune.probes.sections import by_key, keyed


def parse_shm(df_line: str, mount_line: str) -> ShmFacts:
    """`df -Pk /dev/shm`'s data line and /dev/shm's /proc/mounts line."""
    fields = df_line.split()
    fstype = mount_line.split()[2] if len(mount_line.split()) > 2 else None
    if len(fields) < 6 or not fields[1].isdigit():
        return ShmFacts(fstype=fstype)
    return ShmFacts(int(fields[1]), int(fields[2]), fstype)


def parse_health_host(text: str) -> dict:
    """The hypervisor flag of /proc/cpuinfo and /dev/shm."""
    fields = by_key(text)
    return {
        "hypervisor": fields.get("hypervisor") == "yes",
        "shm": parse_shm(fields.get("shm", ""), fields.get("shm-mount", "")),
    }


def parse_gpu_nodes(text: str) -> dict:
    """The nvidia-uvm module and the NVIDIA device nodes."""
    pairs = keyed(text)
    return {
        "uvm_loaded": ("uvm-module", "yes") in pairs,
        "device_nodes": tuple(v for k, v in pairs if k == "devnode"),
    }


def parse_fabric_manager(text: str, nvswitches: int) -> FabricManager:
    """'Fabric Manager version is : 535.129.03', systemctl's answers, the process."""
    fields = by_key(text)
    version = re.search(r"(\d+\.\d+(?:\.\d+)?)\s*$", fields.get("version", ""))
    return FabricManager(
        nvswitches=nvswitches,
        active=fields.get("active") or None,
        enabled=fields.get("enabled") or None,
        running=fields.get("running") == "yes",
        version=version[1] if version else None,
    )


def _json(text: str, what: str) -> dict:
    try:
        doc = json.loads(text.strip().splitlines()[-1] if text.strip() else "")
    except (json.JSONDecodeError, IndexError) as exc:
        raise ProbeError(f"{what} printed no JSON: {text.strip()[-200:]!r}") from exc
    if not isinstance(doc, dict):
        raise ProbeError(f"{what} printed {type(doc).__name__}, not an object")
    return doc


def parse_cuda_smoke(text: str, rc: int) -> CudaRun:
    """The CUDA probe's smoke JSON. rc 127: no python3 to drive libcuda; 124: it timed out."""
    if rc == 127:
        return CudaRun(error="no python3 on the host to drive libcuda")
    if rc == 124:
        return CudaRun(runtime="libcuda", error="the CUDA smoke test did not finish within its timeout (a hung GPU?)")
    doc = _json(text, "the CUDA probe")
    gpus = tuple(CudaSmoke(g["index"], normalize_bdf(g.get("bdf") or ""), bool(g["ok"]), g.get("error") or "", g.get("ms"))
                 for g in doc.get("gpus", []))
    return CudaRun(doc.get("runtime"), doc.get("error"), gpus)


def _sample(s: dict) -> LoadSample:
    return LoadSample(s["gpu"], s.get("pstate"), s.get("sm_mhz"), s.get("sm_max_mhz"), s.get("util_pct"),
                      s.get("power_w"), tuple(s.get("reasons") or ()))


def parse_active_load(text: str, rc: int) -> ActiveRun:
    """The CUDA probe's load JSON: seconds, samples, error."""
    if rc in (124, 137):
        return ActiveRun(load_error="the GPU load did not finish within its timeout")
    if rc == 127:
        return ActiveRun(load_error="no python3 on the host to drive libcuda")
    doc = _json(text, "the GPU load")
    return ActiveRun(float(doc.get("seconds") or 0.0), doc.get("error"), tuple(_sample(s) for s in doc.get("samples", [])))


_DIAG_ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*(Pass|Fail|Warn|Skip)\b", re.IGNORECASE)


_NO_HOSTENGINE = re.compile(r"unable to (establish a connection|connect)|host engine", re.IGNORECASE)


def parse_dcgm_diag(text: str, rc: int) -> tuple[str, str]:
    """`dcgmi diag -r 1`'s table → ("pass" | "fail" | "unavailable", the failing rows or why)."""
    if rc != 0 and _NO_HOSTENGINE.search(text) and "|" not in text:
        return "unavailable", text.strip().splitlines()[0][:200] if text.strip() else f"dcgmi exited {rc}"
    failed = [m[1] for line in text.splitlines() if (m := _DIAG_ROW.match(line)) and m[2].lower() == "fail"]
    if failed or rc != 0:
        tail = text.strip().splitlines()[-1:] if not failed else []
        return "fail", ", ".join(failed) or f"dcgmi exited {rc}: {' '.join(tail)[:200]}"
    return "pass", ""


def parse_allreduce(text: str, rc: int) -> tuple[AllReduce | None, str | None]:
    if rc == 127:
        return None, "no python with a CUDA torch on the host (the engine's virtualenv has one)"
    if rc in (124, 137):
        return None, "the all-reduce did not finish within 120 s (an NCCL hang: check pci.p2p and gpu.nvlink)"
    try:
        doc = _json(text, "the all-reduce")
    except ProbeError as exc:
        return None, f"the all-reduce failed (exit {rc}): {exc}"
    if "error" in doc:
        return None, str(doc["error"])
    return AllReduce(int(doc["num_gpus"]), int(doc["bytes"]), float(doc["busbw_gbps"])), None
