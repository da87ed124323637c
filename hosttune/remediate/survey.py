"""One host as the ladder sees it: facts and findings (the probe), its serving state and ledger, and the
faults they make. Read-only; a survey is both the plan and every re-check between rungs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hosttune.checks import run_checks
from hosttune.checks.findings import Finding
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile
from hosttune.errors import HosttuneError, TransportError
from hosttune.probes.facts import Facts
from hosttune.probes.gather import gather
from hosttune.remediate.faults import Fault, find_faults
from hosttune.remediate.history import Ledger, observe
from hosttune.remediate.state import HostSnapshot, read_snapshot
from hosttune.remediate.xid import XidPolicy
from hosttune.transport import open_transport


@dataclass(frozen=True)
class Survey:
    host: Host
    profile: str
    reachable: bool = True
    error: str | None = None
    facts: Facts | None = None
    findings: tuple[Finding, ...] = ()
    snapshot: HostSnapshot = field(default_factory=HostSnapshot)
    ledger: Ledger = field(default_factory=Ledger)  # with this read's Xid lines observed
    faults: tuple[Fault, ...] = ()

    @property
    def is_cordoned(self) -> bool:
        return self.snapshot.cordon is not None


def survey_host(host: Host, profile: Profile, policy: XidPolicy, ledger: Ledger | None = None,
                now: float | None = None) -> Survey:
    """Probe and read the host; `ledger`: the one this run keeps (else the host's own)."""
    now = time.time() if now is None else now
    try:
        with open_transport(host.connection, read_only=True) as transport:
            facts = gather(transport, 0, timeout=host.probe_timeout_s).facts
            snapshot = read_snapshot(transport)
    except TransportError as exc:
        return Survey(host, profile.name, reachable=False, error=str(exc))
    except HosttuneError as exc:  # the probe, or a file of the host's that cannot be read: this host's error only
        return Survey(host, profile.name, error=str(exc))
    findings = tuple(run_checks(facts, profile))
    seen = observe(snapshot.ledger if ledger is None else ledger, snapshot.boot, facts.health.kernel_log.events, now)
    faults = tuple(find_faults(facts, findings, snapshot, seen, now, policy))
    return Survey(host, profile.name, True, None, facts, findings, snapshot, seen, faults)
