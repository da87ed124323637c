"""`hosttune status`: every host's monitor status files in one small read-only round trip, judged here.

The host's own passes did the probing (`hosttune monitor`, run by apply's timers); the controller reads
what they wrote and says which hosts drift, which are stale and which cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from hosttune.checks.findings import Status
from hosttune.checks.service_monitor import ACTIVE_TIMER, CHECKS, STATUS_DIR, STATUS_FILES, TIMER, stale, version_fault
from hosttune.config.inventory import Host, Inventory, local_inventory
from hosttune.errors import HosttuneError, TransportError
from hosttune.fleet_runner import DEFAULT_FORKS, EXIT_DRIFT, EXIT_ERROR, EXIT_UNREACHABLE, FleetRunner
from hosttune.probes.machine import MachineIdentity, gpu_uuids, is_transient, other_machine, persistent_id
from hosttune.probes.sections import Section, keyed, split
from hosttune.status_file import FindingBrief, StatusDoc, StatusError, parse_status
from hosttune.transport import open_transport
from hosttune.transport.base import bundled_script

READ_TIMEOUT_S = 20.0
NOT_WRITTEN_RC = 3  # status_read.sh: no such file
_TIMERS = {"regular": TIMER, "active": ACTIVE_TIMER}
INSTALLED = next(c for c in CHECKS if c.id == "monitor.installed")
UNNAMED = local_inventory().hosts[0].name  # the host a pass names when its probe read no hostname


@dataclass(frozen=True)
class HostStatus:
    """One host as its status files say, with the staleness judged against the host's own clock."""

    host: Host
    reachable: bool
    error: str = ""
    docs: tuple[StatusDoc, ...] = ()  # the regular pass first, then the active one, where written
    stale: tuple[FindingBrief, ...] = ()
    now: float | None = None  # the host's clock when read
    version: tuple[FindingBrief, ...] = ()  # the monitor runs another hosttune than this controller

    @property
    def findings(self) -> tuple[FindingBrief, ...]:
        """What fails: staleness first, the monitor's version, then each pass's failing findings and the checks it
        could not judge."""
        return self.stale + self.version + tuple(f for d in self.docs for f in (*d.failing, *d.check_errors))

    @property
    def age_s(self) -> float | None:
        """Since the regular pass (else the active one) last wrote its status."""
        return None if not self.docs or self.now is None else max(0.0, self.now - self.docs[0].when)

    @property
    def is_error(self) -> bool:
        """The read failed, a pass could not probe its host, or it could not judge a check."""
        return bool(self.error or any(d.error or d.check_errors for d in self.docs))

    @property
    def exit_bits(self) -> int:
        if not self.reachable:
            return EXIT_UNREACHABLE
        bits = EXIT_ERROR if self.is_error else 0
        return bits | (EXIT_DRIFT if self.stale or self.version or any(d.failing for d in self.docs) else 0)


def parse_read(host: Host, output: str) -> HostStatus:
    """status_read.sh's output → the host's status, judged against the host's clock."""
    sections = split(output)
    if "now" not in sections:
        raise StatusError("the status read printed no clock")
    try:
        now = float(sections["now"].text.strip())
    except ValueError:
        raise StatusError(f"the host's clock read {sections['now'].text.strip()[:40]!r}, not Unix seconds "
                          "(`date +%s` on the host must print them)") from None
    here = read_identity(sections)
    docs = tuple(_parse_pass(p, sections[p], here) for p in _TIMERS
                 if p in sections and sections[p].rc != NOT_WRITTEN_RC)
    return HostStatus(host, True, docs=docs, stale=judge_stale(docs, now), now=now, version=judge_version(docs))


@dataclass(frozen=True)
class Identity:
    """Which host the status read ran on ("": not read)."""

    hostname: str = ""
    machine: MachineIdentity = MachineIdentity()

    def stranger(self, doc: StatusDoc) -> str | None:
        """Where `doc` was written, in words, when that was another host; None when it is this one's or unknown.
        A pass whose probe failed names UNNAMED and no machine-id."""
        if self.hostname and doc.host not in (self.hostname, UNNAMED):
            return f"{doc.host}, not on this host ({self.hostname})"
        if other_machine(self.machine, doc.machine):
            gpus = ", and other GPUs" if self.machine.gpus and doc.gpus else ""
            return (f"{doc.host} of machine-id {doc.machine_id}, not on this host ({self.hostname or doc.host}, "
                    f"machine-id {self.machine.machine_id}{gpus})")
        return None


def read_identity(sections: dict[str, Section]) -> Identity:
    """status_read.sh's name, machine-id and GPUs of the host, as the monitor's probe reads them."""
    text = {k: sections[k].text if k in sections else "" for k in ("hostname", "machine_id", "machine_id_store", "gpus")}
    store = dict(keyed(text["machine_id_store"]))
    transient = is_transient("machine-id-mount" in store, store.get("machine-id-fs", "").strip())
    machine = MachineIdentity(persistent_id(text["machine_id"], transient), gpu_uuids(text["gpus"].split()))
    return Identity(text["hostname"].strip(), machine)


def _parse_pass(pass_name: str, section: Section, here: Identity) -> StatusDoc:
    path = f"{STATUS_DIR}/{STATUS_FILES[_TIMERS[pass_name]]}"
    if section.rc != 0:  # there, but cat could not read it: not the same as a monitor never installed
        raise StatusError(f"{path}: cannot read it: {section.text.strip()[-300:]}")
    try:
        doc = parse_status(section.text)
    except StatusError as exc:
        raise StatusError(f"{path}: {exc}; its monitor pass rewrites it (or remove it)") from None
    if doc.pass_name != pass_name:
        raise StatusError(f"{path}: it holds the {doc.pass_name} pass's status, not the {pass_name} pass's; "
                          "its monitor pass rewrites it (or remove it)")
    stranger = here.stranger(doc)
    if stranger:
        raise StatusError(f"{path}: written on {stranger}: a disk cloned from it? its monitor pass rewrites it "
                          "(or remove it)")
    return doc


def _no_regular(docs: tuple[StatusDoc, ...]) -> list[FindingBrief]:
    if any(d.pass_name == "regular" for d in docs):
        return []
    if not docs:
        return [FindingBrief("monitor.stale", "drift", "warning",
                             "no status file: the monitor is not installed here, or its first pass has not run")]
    return [FindingBrief("monitor.stale", "drift", "warning", "the regular pass never wrote its status, though the "
                         f"active pass did: systemctl status {TIMER}", (TIMER,))]


def judge_stale(docs: tuple[StatusDoc, ...], now: float) -> tuple[FindingBrief, ...]:
    out = _no_regular(docs)
    for doc in docs:
        why = stale(_TIMERS[doc.pass_name], doc.interval_s, now - doc.when, None)
        if why:
            out.append(FindingBrief("monitor.stale", "drift", "warning", why, (_TIMERS[doc.pass_name],)))
    return tuple(out)


def judge_version(docs: tuple[StatusDoc, ...]) -> tuple[FindingBrief, ...]:
    """The hosttune the latest pass ran, by `check`'s rule for monitor.installed (the version column's)."""
    if not docs or not (why := version_fault(docs[0].versions.get("hosttune"))):
        return ()
    return (FindingBrief(INSTALLED.id, Status.DRIFT.value, INSTALLED.severity.value, why, (TIMER,)),)


def read_host(host: Host) -> HostStatus:
    try:
        with open_transport(host.connection, read_only=True) as transport:
            result = transport.read(["sh", "-s"], stdin=bundled_script("hosttune", "status_read.sh").encode(),
                                    timeout=READ_TIMEOUT_S)
        if not result.ok:
            return HostStatus(host, True, f"status read exited {result.rc}: {result.stderr.strip()[-300:]}")
        return parse_read(host, result.stdout)
    except TransportError as exc:
        return HostStatus(host, False, str(exc))
    except HosttuneError as exc:
        return HostStatus(host, True, str(exc))


def read_fleet(inventory: Inventory, *, forks: int = DEFAULT_FORKS, on_host_done=None) -> list[HostStatus]:
    """Every host's status, at most `forks` at a time, in inventory order."""
    return FleetRunner(forks, on_host_done=on_host_done).map(read_host, list(inventory.hosts), name=lambda h: h.name)
