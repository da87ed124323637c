"""Gather a host's facts in one round trip: ship the probe script, parse its sections."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import lru_cache

from hosttune.errors import CommandTimeout, ProbeError
from hosttune.quoting import quote
from hosttune.probes.facts import Facts
from hosttune.probes import engine_access, gpu, health, monitor_state, pci, serve_health, software, system
from hosttune.probes.sections import Section, split
from hosttune.transport.base import Transport, bundled_script, image_script

PROBE_TIMEOUT_S = 60.0
ACTIVE_EXTRA_S = 480.0  # DCGM's quick diagnostic, the all-reduce and their start-up, at most


_EMBEDDED = (
    ("HOSTTUNE_NVML_PROBE", "nvml_probe.py"),
    ("HOSTTUNE_CUDA_PROBE", "cuda_probe.py"),
    ("HOSTTUNE_ALLREDUCE_PROBE", "allreduce_probe.py"),
    ("HOSTTUNE_ACCESS_PROBE", "engine_access_probe.py"),
    ("HOSTTUNE_SERVE_PROBE", "serve_probe.py"),
)
# Sent in front of an embedded probe: the functions it calls from another bundled script.
_PRELUDES = {"serve_probe.py": ("hosttune.deploy", "host_key.py")}


@lru_cache(maxsize=2)
def probe_script(active_s: int = 0) -> bytes:
    """The shell script sent to every host, with the Python probes embedded as variables.

    active_s > 0 adds the active probes: a GPU load of that many seconds (`check --active`).
    """
    lines = [f"{var}={quote(embedded(name))}" for var, name in _EMBEDDED]
    lines.append(f"HOSTTUNE_ACTIVE={active_s or ''}")
    body = image_script("hosttune.probes", "script.sh")
    return ("\n".join(lines) + "\n" + body).encode()


def embedded(name: str) -> str:
    """The Python a probe section runs with `python3 -c` on the host, its prelude in front."""
    code = bundled_script("hosttune.probes", name)
    return bundled_script(*_PRELUDES[name]) + "\n\n" + code if name in _PRELUDES else code


@dataclass(frozen=True)
class ProbeRun:
    """The facts of one host and where the time went."""

    facts: Facts
    connect_s: float
    probe_s: float
    parse_s: float


def gather(transport: Transport, active_s: int = 0, timeout: float = PROBE_TIMEOUT_S, root: str | None = None) -> ProbeRun:
    """Run the probe script on the host and parse it (at most `timeout` seconds). Never changes a setting of the host.

    active_s > 0 also runs the bounded GPU load of `check --active` for that many seconds.
    root: probe the image under that directory instead (apply --root): its files only.
    """
    start = time.monotonic()
    connect = getattr(transport, "connect", None)
    if connect is not None:
        connect()
    connected = time.monotonic()
    timeout = timeout + (active_s + ACTIVE_EXTRA_S if active_s else 0)
    argv = ["sh", "-s"] if not root or root == "/" else ["sh", "-s", "--", root]
    try:
        result = transport.read(argv, stdin=probe_script(active_s), timeout=timeout)
    except CommandTimeout:
        raise CommandTimeout(f"{transport.host_name}: the probe did not finish within {timeout:g}s: a command on the "
                             "host may hang (nvidia-smi, a stale mount), or raise the inventory's probe_timeout") from None
    probed = time.monotonic()
    if not result.ok:
        raise ProbeError(f"{transport.host_name}: probe script exited {result.rc}: {result.stderr.strip()[-500:]}")
    facts = parse_probe_output(result.stdout)
    return ProbeRun(facts, connected - start, probed - connected, time.monotonic() - probed)


def parse_probe_output(output: str) -> Facts:
    """All sections → Facts. A section that fails to parse becomes a probe error, not a crash."""
    sections = split(output)
    if "meta" not in sections:
        raise ProbeError("probe output has no 'meta' section; is /bin/sh a POSIX shell?")
    errors: list[str] = []
    facts = Facts(**system.parse_meta(sections["meta"].text))
    for name, apply in _STEPS:
        if name in sections:
            try:
                facts = apply(facts, sections[name])
            except (ValueError, KeyError, TypeError, IndexError, AttributeError, ProbeError) as exc:
                errors.append(f"{name}: {exc}")
    facts = _with_gpus(facts, sections, errors)
    facts = health.with_health(facts, sections, errors)
    unread = tuple(n for n in (IMAGE_SECTIONS if facts.image else HOST_SECTIONS) if n not in sections)
    errors += [f"{name}: not in the probe's output (cut short, or written by another hosttune's probe): what it "
               "reads is unknown" for name in unread]
    return replace(facts, probe_errors=tuple(errors), unread=unread)


def _bootloader(facts: Facts, sec: Section) -> Facts:
    configured, source = system.parse_bootloader(sec.text)
    return replace(facts, cmdline_configured=configured, cmdline_source=source,
                   grub_overrides=system.grub_overrides(sec.text))


def _system(facts: Facts, sec: Section) -> Facts:
    parsed = system.parse_system(sec.text)
    gpu_facts = replace(
        facts.gpu,
        kernel_module_version=gpu.parse_module_version(parsed.pop("module_version_text")),
        library_version=gpu.library_version(parsed.pop("nvml_libs")),
    )
    return replace(facts, gpu=gpu_facts, **parsed)


def _pci(facts: Facts, sec: Section) -> Facts:
    devices = pci.parse_gpu_pci(sec.text)
    return replace(facts, pci=devices, gpu=replace(facts.gpu, pci_devices=tuple(d.bdf for d in devices)))


def _packages(facts: Facts, sec: Section) -> Facts:
    manager, installed, held = software.parse_packages(sec.text)
    return replace(facts, package_manager=manager, packages=installed, held=held)


def _sysctl(facts: Facts, sec: Section) -> Facts:
    value, source = system.parse_sysctl_conf(sec.text)
    return replace(facts, numa_balancing_configured=value, numa_balancing_source=source,
                   numa_balancing_files=system.sysctl_files(sec.text))


def _interrupt_counts(sec: Section) -> dict[int, tuple[int, ...]]:
    return {irq: tuple(v["counts"]) for irq, v in pci.parse_interrupts(sec.text).items()}


# The sections script.sh prints on every running host, and on every image (`--root`), whatever the host has.
HOST_SECTIONS = ("bootloader", "system", "gpu-pci", "cuda", "packages", "services", "sysctl", "tools", "monitor",
                 "health-host", "kernel-log", "pci-health")
IMAGE_SECTIONS = ("bootloader", "system", "cuda", "packages", "services", "sysctl", "tools")

_STEPS = (
    ("bootloader", _bootloader),
    ("system", _system),
    ("gpu-pci", _pci),
    ("interrupts", lambda f, s: replace(f, gpu_interrupts=_interrupt_counts(s))),
    ("interrupts-2", lambda f, s: replace(f, gpu_interrupts_later=_interrupt_counts(s))),
    ("cuda", lambda f, s: replace(f, cuda=software.parse_cuda(s.text))),
    ("packages", _packages),
    ("services", lambda f, s: replace(f, services=software.parse_services(s.text))),
    ("sysctl", _sysctl),
    ("tools", lambda f, s: replace(f, **software.parse_tools(s.text))),
    ("engine-access", lambda f, s: replace(f, engine_endpoints=engine_access.parse_engine_access(s.text))),
    ("serve", lambda f, s: replace(f, serve=serve_health.parse_serve(s.text))),
    ("monitor", lambda f, s: replace(f, monitor=monitor_state.parse_monitor(s.text))),
)

_GPU_SOURCES = (
    ("nvml", gpu.parse_nvml_json),
    ("smi-xml", gpu.parse_smi_xml),
    ("smi-csv", gpu.parse_smi_csv),
)


def _with_gpus(facts: Facts, sections: dict[str, Section], errors: list[str]) -> Facts:
    """NVML first, then nvidia-smi XML, then CSV; the first that parses wins."""
    failures = []
    for name, parse in _GPU_SOURCES:
        sec = sections.get(name)
        if sec is None:
            continue
        if sec.rc != 0:
            failures.append(f"{name} exited {sec.rc}" + (f": {sec.text.strip()[:200]}" if sec.text.strip() else ""))
            continue
        try:
            info, gpus = parse(sec.text)
        except ProbeError as exc:
            failures.append(f"{name}: {exc}")
            continue
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # output this parser does not know
            failures.append(f"{name}: unreadable ({type(exc).__name__}: {exc})")
            continue
        if name == "smi-xml":
            gpus = _with_compute_caps(gpus, sections.get("smi-csv"))
        return replace(facts, gpu=replace(
            facts.gpu, source=name.replace("smi-", "nvidia-smi-"), gpus=gpus,
            driver_version=info["driver_version"], cuda_driver_version=info["cuda_driver_version"],
        ))
    error = "; ".join(failures) if failures else None
    if error and facts.gpu.pci_devices:
        errors.append(f"gpu: NVIDIA devices on the PCI bus, but neither NVML nor nvidia-smi listed them: {error}")
    return replace(facts, gpu=replace(facts.gpu, error=error))


def _with_compute_caps(gpus, csv_section: Section | None):
    """nvidia-smi's XML has no compute capability; its CSV query does."""
    if csv_section is None or csv_section.rc != 0:
        return gpus
    try:
        caps = {g.bdf: g.compute_cap for g in gpu.parse_smi_csv(csv_section.text)[1]}
    except ProbeError:
        return gpus
    return tuple(replace(g, compute_cap=g.compute_cap or caps.get(g.bdf)) for g in gpus)
