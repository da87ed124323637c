"""Check many hosts in parallel; one unreachable host never stops the others."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from hosttune.checks import run_checks
from hosttune.errors import HosttuneError, ProbeError, TransportError
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Finding, Status
from hosttune.config.inventory import Host, Inventory
from hosttune.probes.gather import gather
from hosttune.config.profile import Profile, profile_for
from hosttune.fleet_runner import DEFAULT_FORKS, EXIT_DRIFT, EXIT_ERROR, EXIT_UNREACHABLE, FleetRunner
from hosttune.transport import open_transport


@dataclass(frozen=True)
class Timings:
    connect_s: float = 0.0
    probe_s: float = 0.0
    parse_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class HostReport:
    host: Host
    profile: str
    reachable: bool
    facts: Facts | None = None
    findings: tuple[Finding, ...] = ()
    error: str | None = None
    timings: Timings = field(default_factory=Timings)

    def count(self, status: Status) -> int:
        return sum(1 for f in self.findings if f.status is status)

    @property
    def exit_bits(self) -> int:
        if not self.reachable:
            return EXIT_UNREACHABLE
        bits = EXIT_ERROR if self.error or self.count(Status.ERROR) or (self.facts and self.facts.probe_errors) else 0
        if any(f.is_failing for f in self.findings):
            bits |= EXIT_DRIFT
        return bits

    @property
    def probe_exit_bits(self) -> int:
        """What the probe alone says, for `facts`: 4 unreachable, 2 a probe error. Verdicts (drift, a check in
        error) are check's."""
        if not self.reachable:
            return EXIT_UNREACHABLE
        return EXIT_ERROR if self.error or (self.facts and self.facts.probe_errors) else 0


def probe(host: Host, active_s: int = 0) -> tuple[Facts, Timings]:
    """Connect, run the probe script, parse. Raises TransportError when unreachable.

    active_s > 0 adds the bounded GPU load of `check --active` (seconds).
    """
    start = time.monotonic()
    with open_transport(host.connection, read_only=True) as transport:
        run = gather(transport, active_s, timeout=host.probe_timeout_s)
    return run.facts, Timings(run.connect_s, run.probe_s, run.parse_s, time.monotonic() - start)


def check_host(host: Host, profile: Profile, active: bool = False) -> HostReport:
    try:
        facts, timings = probe(host, profile.health.active_load_s if active else 0)
    except TransportError as exc:
        return HostReport(host, profile.name, reachable=False, error=str(exc))
    except ProbeError as exc:
        return HostReport(host, profile.name, reachable=True, error=str(exc))
    findings = tuple(run_checks(facts, profile))
    return HostReport(host, profile.name, True, facts, findings, None, timings)


def profiles(inventory: Inventory) -> dict[str, Profile]:
    """Every host's desired state, built before any host is contacted (bad config fails fast)."""
    return {host.name: profile_for(host) for host in inventory.hosts}


def check_fleet(
    inventory: Inventory, *, forks: int = DEFAULT_FORKS,
    on_host_done: Callable[[str, HostReport], None] | None = None, active: bool = False,
) -> list[HostReport]:
    """Check every host, at most `forks` at a time; reports come back in inventory order.

    active: also load each host's GPUs for a few seconds (`check --active`); changes no setting.
    """
    wanted = profiles(inventory)
    return FleetRunner(forks, on_host_done=on_host_done).map(
        lambda h: _safe_check(h, wanted[h.name], active), list(inventory.hosts), name=lambda h: h.name)


def _safe_check(host: Host, profile: Profile, active: bool = False) -> HostReport:
    try:
        return check_host(host, profile, active)
    except HosttuneError as exc:
        return HostReport(host, profile.name, reachable=True, error=str(exc))


# Kernel parameters that name a host's own kernel file, disk or address: they differ across any fleet.
OWN_PARAMS = ("BOOT_IMAGE=", "initrd=", "root=", "resume=", "ip=")

# Facts that should agree across the hosts of one group.
COMPARED: dict[str, Callable[[Facts], str]] = {
    "driver": lambda f: f.gpu.kernel_module_version or f.gpu.driver_version or "-",
    "cuda": lambda f: f.cuda.nvcc_version or "-",
    "kernel": lambda f: f.kernel,
    "os": lambda f: f"{f.os_id} {f.os_version}",
    "cmdline": lambda f: " ".join(w for w in f.cmdline_active if not w.startswith(OWN_PARAMS)),
    "gpus": lambda f: ", ".join(sorted(Counter(g.name for g in f.gpu.gpus).elements())) or "none",
    "vbios": lambda f: ", ".join(sorted({g.vbios or "?" for g in f.health.gpus})) or "none",
}


@dataclass(frozen=True)
class Outlier:
    group: str
    fact: str
    host: str
    value: str
    majority: str | None  # None when the group has no majority value


def outliers(reports: list[HostReport]) -> list[Outlier]:
    """Hosts whose facts differ from the rest of their group."""
    by_group: dict[str, list[HostReport]] = {}
    for r in reports:
        if r.facts is not None:
            by_group.setdefault(r.host.group, []).append(r)
    found = []
    for group, members in by_group.items():
        if len(members) < 2:
            continue
        for name, read in COMPARED.items():
            values = {r.host.name: read(r.facts) for r in members}
            counts = Counter(values.values())
            if len(counts) == 1:
                continue
            top, top_count = counts.most_common(1)[0]
            majority = top if top_count * 2 > len(members) else None
            found += [Outlier(group, name, host, value, majority)
                      for host, value in values.items() if value != majority]
    return found
