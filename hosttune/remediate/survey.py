"""One host as the ladder sees it: facts and findings (the probe), its serving state and ledger, and the
faults they make. Read-only; a survey is both the plan and every re-check between rungs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from hosttune.actions.base import FileWrite
from hosttune.actions.remediate import CORDON_FILE, ledger_op
from hosttune.checks import run_checks
from hosttune.checks.findings import Finding, Status
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile
from hosttune.errors import HosttuneError, TransportError
from hosttune.plan.host_plan import journal_error
from hosttune.probes.facts import Facts
from hosttune.probes.gather import gather
from hosttune.probes.machine import identity
from hosttune.remediate.faults import WATCHED, Fault, find_faults
from hosttune.remediate.history import Ledger, observe
from hosttune.remediate.state import HostSnapshot, read_snapshot
from hosttune.remediate.xid import XidPolicy
from hosttune.transport import open_transport
from hosttune.transport.base import Transport


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

    @property
    def unjudged(self) -> tuple[tuple[str, str], ...]:
        """What remediate cannot see on this host, as (check id, why): the checks faults come from that could not be
        judged, and ("probe", why) for each part of the host the probe could not read (it may hide a fault)."""
        checks = tuple((f.check_id, f.detail or "") for f in self.findings
                       if f.check_id in WATCHED and f.status is Status.ERROR)
        return checks + tuple(("probe", e) for e in (self.facts.probe_errors if self.facts else ()))


def _read(host: Host, profile: str, read: Callable[[Transport], Survey]) -> Survey:
    """read(transport) on the host's read-only connection; what stops it is this host's error only."""
    try:
        with open_transport(host.connection, read_only=True) as transport:
            return read(transport)
    except TransportError as exc:
        return Survey(host, profile, reachable=False, error=str(exc))
    except HosttuneError as exc:  # the probe, or a file of the host's that cannot be read
        return Survey(host, profile, error=str(exc))


def survey_host(host: Host, profile: Profile, policy: XidPolicy, ledger: Ledger | None = None,
                now: float | None = None, is_plan: bool = False) -> Survey:
    """Probe and read the host; `ledger`: the one this run keeps (else the host's own); is_plan: the survey
    a run is planned from, whose faults need the run's journal folder (a re-check's do not ask again)."""
    now = time.time() if now is None else now

    def read(transport: Transport) -> Survey:
        facts = gather(transport, 0, timeout=host.probe_timeout_s).facts
        snapshot = read_snapshot(transport)
        findings = tuple(run_checks(facts, profile))
        seen = observe(snapshot.ledger if ledger is None else ledger, snapshot.boot, facts.health.kernel_log.events, now,
                       identity(facts))
        faults = tuple(find_faults(facts, findings, snapshot, seen, now, policy))
        error = journal_error(transport, CLIMB_WRITES) if is_plan and faults and snapshot.cordon is None else None
        return Survey(host, profile.name, True, error, facts, findings, snapshot, seen, faults)

    return _read(host, profile.name, read)


# the files a climb writes beside its journal: its ledger, and the cordon a rung may take
CLIMB_WRITES = (ledger_op(b""), FileWrite(CORDON_FILE, b"", 0o644))


def survey_state(host: Host) -> Survey:
    """The host's serving state and cordon alone, without the probe: what uncordon needs, so a host whose GPUs
    hang the probe can still be taken back; a cordoned one, with its run's journal folder checked."""

    def read(transport: Transport) -> Survey:
        snapshot = read_snapshot(transport, False)
        return Survey(host, host.profile, error=journal_error(transport) if snapshot.cordon else None, snapshot=snapshot)

    return _read(host, host.profile, read)
