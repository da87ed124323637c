"""Parsers for the software stack: CUDA toolkits, packages and holds, services, tools."""

from __future__ import annotations

import re
from dataclasses import replace

from hosttune.probes.facts import CudaFacts, ServiceState
from hosttune.probes.sections import keyed

_RELEASE = re.compile(r"release (\d+\.\d+)")


def nvcc_release(text: str) -> str | None:
    """`nvcc --version` → "12.4"."""
    match = _RELEASE.search(text)
    return match.group(1) if match else None


def _toolkit_version(path: str) -> str | None:
    match = re.search(r"cuda-(\d+\.\d+)", path)
    return match.group(1) if match else None


def parse_cuda(text: str) -> CudaFacts:
    pairs = keyed(text)
    fields = dict(pairs)
    target = fields.get("symlink", "").strip() or None
    if target == "/usr/local/cuda":
        target = None  # readlink -f of a missing link names itself
    path = tuple(p for p in fields.get("path", "").split(":") if p)
    ld = tuple(p for p in fields.get("ld", "").split(":") if p)
    nvcc_lines = " ".join(v for k, v in pairs if k == "nvcc-version")
    return CudaFacts(
        nvcc_version=nvcc_release(nvcc_lines),
        nvcc_path=fields.get("nvcc", "").strip() or None,
        symlink_target=target,
        symlink_version=nvcc_release(fields.get("symlink-nvcc", "")) or (_toolkit_version(target) if target else None),
        toolkits=tuple(v.strip() for k, v in pairs if k == "toolkit"),
        path=path,
        ld_library_path=ld,
    )


def parse_packages(text: str) -> tuple[str | None, dict[str, str], tuple[str, ...]]:
    """→ (package manager, {installed package: version}, held package names)."""
    manager, installed, held = None, {}, []
    for key, value in keyed(text):
        if key == "manager":
            manager = value.strip()
        elif key == "pkg":
            name, _, rest = value.partition("\t")
            version, _, status = rest.partition("\t")
            if status.strip().startswith(("ii", "hi")):
                installed[name] = version
        elif key == "held":
            held.append(value.strip().split(":")[0])
        elif key == "lock":
            held.append(_versionlock_name(value.strip()))
    return manager, installed, tuple(sorted(set(h for h in held if h)))


def _versionlock_name(entry: str) -> str:
    """dnf versionlock entries are NAME-[EPOCH:]VERSION-RELEASE.ARCH; keep NAME."""
    entry = entry.lstrip("!")
    match = re.match(r"^(.+?)-(?:\d+:)?\d[^-]*-[^-]+$", entry)
    return match.group(1) if match else entry


def _unit_blocks(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    """`systemctl show` property lines (tagged unit:KEY=VALUE), one dict per unit."""
    blocks: list[dict[str, str]] = [{}]
    for key, value in pairs:
        if key != "unit":
            continue
        if not value.strip():  # systemctl separates units with a blank line
            blocks.append({})
            continue
        prop, _, val = value.partition("=")
        blocks[-1][prop] = val.strip()
    return [b for b in blocks if "Id" in b]


def parse_services(text: str) -> dict[str, ServiceState]:
    pairs = keyed(text)
    fields = dict(pairs)
    running = set(fields.get("running", "").split())
    out = {}
    for block in _unit_blocks(pairs):
        name = block.get("Id", "").removesuffix(".service")
        missing = block.get("LoadState") == "not-found"
        out[name] = ServiceState(
            name=name,
            active=block.get("ActiveState"),
            enabled="not-found" if missing else (block.get("UnitFileState") or None),
            running=name[:15] in running,  # comm is cut at 15 chars
        )
    for name in ("irqbalance", "nvidia-persistenced"):
        if name not in out and "running" in fields:
            out[name] = ServiceState(name=name, running=name[:15] in running)
    for name, _, digest in (value.partition(":") for key, value in pairs if key == "script"):
        out[name] = replace(out.get(name) or ServiceState(name=name), script=digest.strip())
    return out


def parse_tools(text: str) -> dict:
    pairs = keyed(text)
    fields = dict(pairs)
    version = re.search(r"Python (\d+\.\d+(?:\.\d+)?)", fields.get("python3", ""))
    return {
        "numactl": fields.get("numactl", "").strip() or None,
        "python_version": version.group(1) if version else None,
        "pythons": tuple(sorted({v.strip() for k, v in pairs if k == "python"})),
    }
