"""Parsers for kernel, CPU, memory, NUMA and NVMe facts (the probe's meta/bootloader/system/sysctl sections)."""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

from hosttune import cpulist
from hosttune.probes.facts import CpuFacts, NvmeDevice
from hosttune.probes.machine import is_transient
from hosttune.probes.sections import keyed


def _os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def parse_meta(text: str) -> dict:
    """grep -H of /etc/os-release, hostname, machine-id, osrelease, /proc/1/comm, /proc/cmdline; plus where the
    machine-id lives and uid.

    For an image (`image:` line) the hostname is its /etc/hostname, the kernel the newest
    under /lib/modules and PID 1 the init /sbin/init resolves to; nothing is active.
    """
    files: dict[str, list[str]] = {}
    for path, value in keyed(text):
        files.setdefault(path, []).append(value)
    release = _os_release("\n".join(files.get("/etc/os-release", [])))
    uid = files.get("uid", [""])[0].strip()
    first = lambda *keys: next((files[k][0].strip() for k in keys if k in files), "")  # noqa: E731
    return {
        "hostname": first("/proc/sys/kernel/hostname", "/etc/hostname"),
        "machine_id": first("/etc/machine-id"),
        "machine_id_transient": is_transient("machine-id-mount" in files, first("machine-id-fs"))
        if "machine-id-fs" in files else None,
        "image": first("image"),
        "kernel": first("/proc/sys/kernel/osrelease", "kernel-image"),
        "pid1": first("/proc/1/comm", "init"),
        "cmdline_active": tuple(shlex.split(files.get("/proc/cmdline", [""])[0])),
        "os_id": release.get("ID", ""),
        "os_version": release.get("VERSION_ID", ""),
        "os_like": tuple(release.get("ID_LIKE", "").split()),
        "is_root": uid == "0" if uid else None,
    }


def parse_bootloader(text: str) -> tuple[tuple[str, ...] | None, str]:
    """The configured kernel command line (what the next boot gets) and where it came from."""
    fields = dict(keyed(text))
    if "args" not in fields:
        return None, fields.get("source", "")
    try:
        words = tuple(shlex.split(fields["args"]))
    except ValueError:
        words = tuple(fields["args"].split())
    return words, fields.get("source", "")


GRUB_DROPIN = "/etc/default/grub.d/90-hosttune.cfg"  # where apply writes its kernel parameters on grub hosts


def grub_overrides(text: str, ours: str = GRUB_DROPIN) -> tuple[str, ...]:
    """The grub drop-ins read after `ours` (by file name, as grub sources them) that set GRUB_CMDLINE_LINUX_DEFAULT
    anew rather than append to it: whatever `ours` put there is gone by the time update-grub reads it."""
    name = PurePosixPath(ours).name
    return tuple(sorted(v.strip() for k, v in keyed(text) if k == "resets" and PurePosixPath(v.strip()).name > name))


def _files(text: str) -> dict[str, str]:
    """grep -sH '' FILE... output → {path: first line}."""
    out: dict[str, str] = {}
    for path, value in keyed(text):
        out.setdefault(path, value.strip())
    return out


def parse_cpu(text: str) -> CpuFacts:
    files = _files(text)
    governors = {}
    for path, value in files.items():
        if m := re.match(r"/sys/devices/system/cpu/cpu(\d+)/cpufreq/scaling_governor$", path):
            governors[int(m.group(1))] = value
    states = []
    base = "/sys/devices/system/cpu/cpu0/cpuidle"
    for name_path in sorted(p for p in files if p.startswith(base) and p.endswith("/name")):
        state = name_path.rsplit("/", 2)[1]
        disabled = files.get(f"{base}/{state}/disable", "0") == "1"
        latency = int(files.get(f"{base}/{state}/latency", "0") or 0)
        states.append((files[name_path], disabled, latency))
    online = files.get("/sys/devices/system/cpu/online", "")
    max_cstate = files.get("/sys/module/intel_idle/parameters/max_cstate")
    cpus = cpulist.parse(online) if online else ()
    return CpuFacts(
        count=len(cpus),
        online=cpus,
        governors=governors,
        idle_driver=files.get("/sys/devices/system/cpu/cpuidle/current_driver"),
        idle_states=tuple(states),
        intel_idle_max_cstate=int(max_cstate) if max_cstate and max_cstate.lstrip("-").isdigit() else None,
    )


def parse_numa_nodes(text: str) -> dict[int, tuple[int, ...]]:
    nodes = {}
    for path, value in _files(text).items():
        if m := re.match(r"/sys/devices/system/node/node(\d+)/cpulist$", path):
            nodes[int(m.group(1))] = cpulist.parse(value)
    return nodes


def parse_numactl_hardware(text: str) -> dict[int, tuple[int, ...]]:
    """`numactl --hardware` → {node: cpus} (used for recorded outputs and cross-checks)."""
    nodes = {}
    for line in text.splitlines():
        if m := re.match(r"node (\d+) cpus:(.*)$", line.strip()):
            nodes[int(m.group(1))] = tuple(int(c) for c in m.group(2).split())
    return nodes


def selected(text: str) -> str | None:
    """'always [madvise] never' → 'madvise'."""
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else None


def parse_system(text: str) -> dict:
    files = _files(text)
    nvme = []
    for path, model in files.items():
        if m := re.match(r"/sys/class/nvme/(nvme\d+)/model$", path):
            name = m.group(1)
            nvme.append(NvmeDevice(name, model.strip(), files.get(f"/sys/class/nvme/{name}/device/power_state")))
    balancing = files.get("/proc/sys/kernel/numa_balancing")
    ps_latency = files.get("/sys/module/nvme_core/parameters/default_ps_max_latency_us")
    thp = files.get("/sys/kernel/mm/transparent_hugepage/enabled")
    return {
        "cpu": parse_cpu(text),
        "numa_nodes": parse_numa_nodes(text),
        "numa_balancing": int(balancing) if balancing and balancing.isdigit() else None,
        "thp_enabled": selected(thp) if thp else None,
        "thp_configured": _thp_unit_mode([v for k, v in keyed(text) if k == "/etc/default/hosttune-thp"]),
        "nvme": tuple(sorted(nvme, key=lambda d: d.name)),
        "nvme_ps_max_latency_us": int(ps_latency) if ps_latency and ps_latency.lstrip("-").isdigit() else None,
        "module_version_text": _all_lines(text, "/proc/driver/nvidia/version"),
        "nvml_libs": [v for k, v in keyed(text) if k == "nvml-lib"],
    }


def _thp_unit_mode(lines: list[str]) -> str | None:
    """hosttune's THP boot unit reads THP_MODE=... from /etc/default/hosttune-thp; the last one wins, comments aside."""
    mode = None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "THP_MODE":
            mode = value.strip().strip('"\'') or None
    return mode


def _all_lines(text: str, path: str) -> str:
    return "\n".join(v for k, v in keyed(text) if k == path)


def _sysctl_order(path: str) -> tuple[str, int]:
    """systemd-sysctl order: by file name across directories; /etc wins a same-name tie."""
    p = PurePosixPath(path)
    if p.name == "sysctl.conf":
        return ("~~~~", 0)  # /etc/sysctl.conf is read last
    rank = 0 if path.startswith("/etc/") else 1 if path.startswith("/run/") else 2
    return (p.name, -rank)


def sysctl_files(text: str, key: str = "kernel.numa_balancing") -> tuple[tuple[str, str], ...]:
    """Each file a boot reads that sets key, with the value it sets, in systemd-sysctl's order (the last one wins;
    a file shadowed by a same-name one in a higher directory is not read)."""
    by_file: dict[str, str] = {}
    for path, line in keyed(text):
        name, sep, value = line.partition("=")
        if sep and name.strip().replace("/", ".") == key and not line.lstrip().startswith(("#", ";")):
            by_file[path] = value.strip()
    winners: dict[str, str] = {}
    for path in sorted(by_file, key=_sysctl_order, reverse=True):
        winners.setdefault(PurePosixPath(path).name, path)
    return tuple((path, by_file[path]) for path in sorted(winners.values(), key=_sysctl_order))


def parse_sysctl_conf(text: str, key: str = "kernel.numa_balancing") -> tuple[int | None, str]:
    """The value a boot will apply for key, and the file that sets it."""
    files = sysctl_files(text, key)
    if not files:
        return None, ""
    last, value = files[-1]
    return (int(value) if value.isdigit() else None), last
