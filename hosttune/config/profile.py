"""Profiles (playbooks): the desired state of a host, one dataclass per component.

A playbook file is `playbooks/NAME.yaml` with `name`, optional `extends` and
`description`, and `settings` whose sections mirror the dataclasses below. A playbook path
is relative to the inventory that names it, an `extends:` path to the playbook. A setting
of null means "not managed": its check reports not-applicable. Inventory pins and
`tune:` override the playbook for one host or group.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hosttune import cpulist
from hosttune.errors import ProfileError
from hosttune.config.inventory import Host
from hosttune.config.monitor_spec import MonitorSpec
from hosttune.config.pins import pin_problem
from hosttune.config.yamlfile import LocatedDict, load

PSTATES = tuple(f"P{i}" for i in range(16))
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
THP_MODES = ("always", "madvise", "never")


@dataclass(frozen=True)
class DriverSpec:
    version: str | None = None
    held: bool = True
    packages: tuple[str, ...] | None = None  # None: the distribution's usual names for the pin

    def __post_init__(self):
        object.__setattr__(self, "version", _version(self.version, "driver.version", "driver"))
        _flags(self, "driver", "held")
        object.__setattr__(self, "packages", _names(self.packages, "driver.packages"))


@dataclass(frozen=True)
class CudaSpec:
    toolkit: str | None = None
    packages: tuple[str, ...] | None = None  # None: cuda-toolkit-X-Y for the pinned X.Y

    def __post_init__(self):
        object.__setattr__(self, "toolkit", _version(self.toolkit, "cuda.toolkit", "cuda"))
        object.__setattr__(self, "packages", _names(self.packages, "cuda.packages"))


@dataclass(frozen=True)
class GpuSpec:
    persistence: bool | None = True
    pstate: str | None = "P0"
    pcie_link: str | None = "max"
    ecc: bool | None = True
    mig: bool | None = False

    def __post_init__(self):
        _flags(self, "gpu", "persistence", "ecc", "mig")
        if self.persistence is False:  # the check and apply only turn it on: false would read as unmanaged
            raise ProfileError("gpu.persistence: false is not a state hosttune sets (it only turns persistence on, "
                               "through nvidia-persistenced); write null to leave it unmanaged")
        _choice(self.pstate, PSTATES, "gpu.pstate")
        _choice(self.pcie_link, ("max",), "gpu.pcie_link")


@dataclass(frozen=True)
class CpuSpec:
    governor: str | None = "performance"
    max_cstate: int | None = 1

    def __post_init__(self):
        _choice(self.governor, GOVERNORS, "cpu.governor")
        if self.max_cstate is not None and (not isinstance(self.max_cstate, int) or self.max_cstate < 0):
            raise ProfileError(f"cpu.max_cstate: must be a non-negative integer (got {self.max_cstate!r})")


@dataclass(frozen=True)
class KernelSpec:
    rcu_nocbs: str | None = None

    def __post_init__(self):
        if self.rcu_nocbs != "auto":  # auto: every CPU but each NUMA node's housekeeping cores
            _cpus(self.rcu_nocbs, "kernel.rcu_nocbs")


@dataclass(frozen=True)
class IrqSpec:
    irqbalance: bool | None = False
    gpu_affinity: str | None = "numa-local"  # "numa-local", "housekeeping" (its node's first cores) or a CPU list

    def __post_init__(self):
        _flags(self, "irq", "irqbalance")
        if self.gpu_affinity not in ("numa-local", "housekeeping"):
            _cpus(self.gpu_affinity, "irq.gpu_affinity")


@dataclass(frozen=True)
class NumaSpec:
    balancing: bool | None = False

    def __post_init__(self):
        _flags(self, "numa", "balancing")


@dataclass(frozen=True)
class MemorySpec:
    thp: str | None = "madvise"

    def __post_init__(self):
        _choice(self.thp, THP_MODES, "memory.thp")


@dataclass(frozen=True)
class NvmeSpec:
    apst: bool | None = False

    def __post_init__(self):
        _flags(self, "nvme", "apst")


@dataclass(frozen=True)
class ToolsSpec:
    numactl: bool | None = True
    python: str | None = None

    def __post_init__(self):
        _flags(self, "tools", "numactl")
        object.__setattr__(self, "python", _version(self.python, "tools.python", "python"))


@dataclass(frozen=True)
class HealthSpec:
    """GPU health and fabric checks: what a healthy host shows (null turns a check off)."""

    gpu_count: int | None = None  # GPUs the host must show; None: PCI and NVML only have to agree
    gpus: str | None = None  # the inventory's GPU selection (an index list): each must exist
    shm_min_mib: int | None = 1024
    thermal_margin_c: int | None = 5
    allreduce_floor_gbps: float | None = None  # None: the floor for the GPU model and link
    active_load_s: int = 6

    def __post_init__(self):
        for name in ("gpu_count", "shm_min_mib", "thermal_margin_c"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ProfileError(f"health.{name}: must be a non-negative integer (got {value!r})")
        floor = self.allreduce_floor_gbps
        if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < 1e6):
            raise ProfileError(f"health.allreduce_floor_gbps: must be a positive number of GB/s (got {floor!r})")
        if not isinstance(self.active_load_s, int) or not 1 <= self.active_load_s <= 60:
            raise ProfileError(f"health.active_load_s: must be 1-60 seconds (got {self.active_load_s!r})")
        if self.gpus is not None:
            _cpus(self.gpus, "health.gpus")


@dataclass(frozen=True)
class Profile:
    """The desired state of one host."""

    name: str
    description: str = ""
    driver: DriverSpec = field(default_factory=DriverSpec)
    cuda: CudaSpec = field(default_factory=CudaSpec)
    gpu: GpuSpec = field(default_factory=GpuSpec)
    cpu: CpuSpec = field(default_factory=CpuSpec)
    kernel: KernelSpec = field(default_factory=KernelSpec)
    irq: IrqSpec = field(default_factory=IrqSpec)
    numa: NumaSpec = field(default_factory=NumaSpec)
    memory: MemorySpec = field(default_factory=MemorySpec)
    nvme: NvmeSpec = field(default_factory=NvmeSpec)
    tools: ToolsSpec = field(default_factory=ToolsSpec)
    health: HealthSpec = field(default_factory=HealthSpec)
    monitor: MonitorSpec = field(default_factory=MonitorSpec)


_SECTION_TYPES = {
    "driver": DriverSpec, "cuda": CudaSpec, "gpu": GpuSpec, "cpu": CpuSpec, "kernel": KernelSpec,
    "irq": IrqSpec, "numa": NumaSpec, "memory": MemorySpec, "nvme": NvmeSpec, "tools": ToolsSpec,
    "health": HealthSpec, "monitor": MonitorSpec,
}


def _flags(spec: Any, section: str, *names: str) -> None:
    """Switches are true, false or null: "no" or 0 would read as on, or as off, without a word."""
    for name in names:
        value = getattr(spec, name)
        if value is not None and not isinstance(value, bool):
            raise ProfileError(f"{section}.{name}: must be true, false or null (got {value!r})")


def _version(value: Any, where: str, kind: str) -> str | None:
    """A version pin as text. A YAML number has lost its trailing zeros already (3.10 reads as 3.1)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if value is None or isinstance(value, str):
        if value is not None and (problem := pin_problem(kind, value)):
            raise ProfileError(f"{where}: {problem} (got {value!r})")
        return value
    if isinstance(value, float):
        raise ProfileError(f"{where}: YAML read {value!r} as a number, which drops trailing zeros (3.10 becomes 3.1); "
                           "write the version in quotes")
    raise ProfileError(f"{where}: must be a version in quotes, e.g. '12.4' (got {value!r})")


def _choice(value: Any, choices: tuple, where: str) -> None:
    if value is not None and value not in choices:
        raise ProfileError(f"{where}: must be one of {', '.join(choices)} (got {value!r})")


def _names(value: Any, where: str) -> tuple[str, ...] | None:
    """A list of package names; each must look like one (it is passed to apt/dnf as argv)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ProfileError(f"{where}: must be a list of package names (got {value!r})")
    for name in value:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9+._-]*", name):
            raise ProfileError(f"{where}: {name!r} is not a package name")
    return tuple(value)


def _cpus(value: Any, where: str) -> None:
    if value is None:
        return
    try:
        cpulist.parse(str(value))
    except ValueError:
        raise ProfileError(f"{where}: must be a CPU list like 0-3,8 (got {value!r})") from None


def playbook_dirs() -> list[Path]:
    """Where playbooks live: inside the wheel, or beside the package in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    return [d for d in (package / "playbooks", package.parent / "playbooks") if d.is_dir()]


def find_playbook(name: str, base: Path | None = None) -> Path:
    """A playbook by name (`inference-latency`) or by path (`./my.yaml`); a relative path is relative to
    `base` (the inventory or playbook that names it), else to the working directory."""
    as_path = Path(name)
    if as_path.suffix in (".yaml", ".yml"):
        as_path = base / as_path if base is not None and not as_path.is_absolute() else as_path
        if as_path.exists():
            return as_path
    for directory in playbook_dirs():
        candidate = directory / f"{name}.yaml"
        if candidate.exists():
            return candidate
    known = sorted({p.stem for d in playbook_dirs() for p in d.glob("*.yaml")})
    if as_path.suffix in (".yaml", ".yml"):
        looked = f" {as_path}" if str(as_path) != name else ""  # where a relative path was looked for
        raise ProfileError(f"unknown profile {name!r}: no such file{looked}; give the path of a playbook file, "
                           f"or one of {', '.join(known) or 'none'}")
    if "/" in name:  # a path, to a folder or a file not named as a playbook: no name of a known profile has a slash
        raise ProfileError(f"unknown profile {name!r}: a playbook file's name ends in .yaml or .yml; give one, or one "
                           f"of {', '.join(known) or 'none'}")
    raise ProfileError(f"unknown profile {name!r}; known profiles: {', '.join(known) or 'none'}")


def _read_settings(name: str, base: Path | None = None, seen: tuple[tuple[str, Path], ...] = ()) -> tuple[dict, str]:
    """The merged `settings` of a playbook and everything it extends (named relative to the playbook's folder)."""
    path = find_playbook(name, base)
    if path.resolve() in [p for _, p in seen]:
        cycle = " -> ".join([n for n, _ in seen] + [name])
        raise ProfileError(f"profile {name!r} extends itself (cycle: {cycle})")
    doc = load(path, ProfileError)
    if not isinstance(doc, LocatedDict):
        raise ProfileError(f"{path}:1: a playbook must be a mapping with 'name' and 'settings'")
    for key in doc:
        if key not in ("name", "extends", "description", "settings"):
            raise ProfileError(f"{path}:{doc.line_of(key)}: {key}: unknown key (expected name, extends, description, settings)")
    settings = doc.get("settings") or {}
    if not isinstance(settings, dict):
        raise ProfileError(f"{path}:{doc.line_of('settings')}: settings: must be a mapping")
    _check_sections(settings, str(path))
    _anchor_paths(settings, path.parent)
    _check_values(settings, str(path), "settings")
    base_settings = _extended(doc, path, seen + ((name, path.resolve()),)) if doc.get("extends") is not None else {}
    return merge(base_settings, settings), str(doc.get("description", ""))


def _extended(doc: LocatedDict, path: Path, seen: tuple[tuple[str, Path], ...]) -> dict:
    """The settings of the playbook `extends:` names; a bad name is an error at its line."""
    where = f"{path}:{doc.line_of('extends')}: extends"
    parent = doc["extends"]
    if not isinstance(parent, str) or not parent.strip():
        raise ProfileError(f"{where}: must be a profile name or a playbook path (got {parent!r})")
    try:
        find_playbook(parent, path.parent)
    except ProfileError as exc:
        raise ProfileError(f"{where}: {exc}") from None
    return _read_settings(parent, path.parent, seen)[0]


def _check_sections(settings: dict, where: str, label: str = "settings") -> None:
    for section, values in settings.items():
        line = settings.line_of(section) if isinstance(settings, LocatedDict) else 0
        if section not in _SECTION_TYPES:
            raise ProfileError(f"{where}:{line}: {label}.{section}: unknown section (expected one of: {', '.join(_SECTION_TYPES)})")
        if not isinstance(values, dict):
            raise ProfileError(f"{where}:{line}: {label}.{section}: must be a mapping")
        known = {f.name for f in dataclasses.fields(_SECTION_TYPES[section])}
        for key in values:
            if key not in known:
                kline = values.line_of(key) if isinstance(values, LocatedDict) else line
                raise ProfileError(f"{where}:{kline}: {label}.{section}.{key}: unknown setting (expected one of: {', '.join(sorted(known))})")


# Settings naming a folder on the controller: relative to the file that names them, as playbook paths are.
CONTROLLER_PATHS = (("monitor", "wheels"),)


def _anchor_paths(settings: dict, folder: Path) -> None:
    """Make each controller path in settings absolute: `~` expanded, a relative one joined to `folder`."""
    for section, key in CONTROLLER_PATHS:
        values = settings.get(section)
        value = values.get(key) if isinstance(values, dict) else None
        if isinstance(value, str) and value:
            values[key] = str(folder / os.path.expanduser(value))  # an absolute one stays as it is


def _check_values(settings: dict, where: str, label: str) -> None:
    """Each setting on its own against its section's dataclass, so an error names its line."""
    for section, values in settings.items():
        for key, value in values.items():
            line = values.line_of(key) if isinstance(values, LocatedDict) else 0
            try:
                _SECTION_TYPES[section](**{key: value})
            except (ProfileError, TypeError, ValueError) as exc:
                message = str(exc).removeprefix(f"{section}.{key}: ")
                raise ProfileError(f"{where}:{line}: {label}.{section}.{key}: {message}") from None


def merge(base: dict, override: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in override.items():
        out.setdefault(section, {}).update(values)
    return out


def host_overrides(host: Host) -> dict:
    """What the inventory says for this host, as profile settings."""
    over: dict[str, dict] = {}
    if host.pins.driver:
        over.setdefault("driver", {})["version"] = host.pins.driver
    if host.pins.cuda:
        over.setdefault("cuda", {})["toolkit"] = host.pins.cuda
    if host.pins.python:
        over.setdefault("tools", {})["python"] = host.pins.python
    if host.irq_cores:
        over.setdefault("irq", {})["gpu_affinity"] = host.irq_cores
    if host.rcu_nocbs:
        over.setdefault("kernel", {})["rcu_nocbs"] = host.rcu_nocbs
    if host.gpus != "all":
        over.setdefault("health", {})["gpus"] = host.gpus
    _check_sections(host.tune, host.path, "tune")
    _anchor_paths(host.tune, Path(host.path).parent)
    _check_values(host.tune, host.path, "tune")
    return merge(over, host.tune)


def build(name: str, settings: dict, description: str = "") -> Profile:
    """A validated Profile from merged settings."""
    sections = {}
    for section, cls in _SECTION_TYPES.items():
        values = settings.get(section, {})
        try:
            sections[section] = cls(**values)
        except TypeError as exc:
            raise ProfileError(f"profile {name}: settings.{section}: {exc}") from None
    return Profile(name=name, description=description, **sections)


def load_profile(name: str) -> Profile:
    settings, description = _read_settings(name)
    return build(name, settings, description)


def profile_for(host: Host) -> Profile:
    """The host's playbook with the inventory's pins and `tune:` applied; a playbook path is relative to the inventory."""
    base = None if host.source == "<built-in>" else Path(host.path).parent
    try:
        find_playbook(host.profile, base)
    except ProfileError as exc:
        raise ProfileError(f"{host.profile_source or host.source}: profile: {exc}") from None
    settings, description = _read_settings(host.profile, base)
    return build(host.profile, merge(settings, host_overrides(host)), description)
