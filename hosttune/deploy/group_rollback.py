"""--rollback of a multi-node vLLM group: every host's previous release live again in deploy's order and with its
waits (ray_start.start_phases: the Ray head, the workers once the head's Ray answers, the head's server once
`ray status` counts every node, then its gate), where each host went back on its own and at once. A phase or gate
that fails brings back, in the same order, the releases the rollback left, `previous` naming the ones it tried, as
a rollback of one host does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace

from hosttune.actions.base import Symlink
from hosttune.config.inventory import Host
from hosttune.deploy import plan as dplan
from hosttune.deploy import rolling
from hosttune.deploy.access import Access, front_for
from hosttune.deploy.errors import DeployError
from hosttune.deploy.gate import GateResult, gate_line, journal_tail
from hosttune.deploy.host import HostDeploy, guarded
from hosttune.deploy.ray_start import (Comeback, gate_head, is_ray_group, phase_lines, ray_check, ray_notes, start_again,
                                       start_group, start_phases)
from hosttune.deploy.release import PREVIOUS, Release, release_name
from hosttune.deploy.restore import Back, bring_back, load_release, read_back, settings_of
from hosttune.deploy.rollback import rollback_one
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.state import HostState, read_state
from hosttune.deploy.units import RAY_UNIT, SERVE_UNIT
from hosttune.errors import HosttuneError, TransportError
from hosttune.fleet_runner import Outcome
from hosttune.transport import open_transport

FALLBACK = "every host of the group goes back to the release it left"


@dataclass(frozen=True)
class Member:
    """One host of the group: what it has now, the release that comes back and the one it leaves."""

    host: Host
    state: HostState
    previous: Release
    left: Release | None  # None: nothing live, or its release.json unreadable (`unreadable` says why)
    unreadable: str = ""


def rollback_group(hosts: list[Host], base: ServeSettings, dry_run: bool = False) -> list[HostDeploy]:
    """--rollback of the group's hosts; base: the run's deadlines (each release's port is its own)."""
    with ExitStack() as stack:
        transports, lost = {}, {}
        for h in hosts:
            try:
                transports[h.name] = stack.enter_context(open_transport(h.connection))
            except TransportError as exc:
                lost[h.name] = exc
        if lost:  # the group goes back whole or not at all: the others wait for those hosts, unchanged
            why = f"nothing changed on group {hosts[0].group}: {', '.join(lost)} did not answer"
            return [HostDeploy(h, Outcome.UNREACHABLE, error=str(lost[h.name])) if h.name in lost
                    else HostDeploy(h, Outcome.FAILED, error=why) for h in hosts]
        try:
            members = _members(hosts, transports)
        except HosttuneError as exc:
            return [HostDeploy(h, Outcome.FAILED, error=f"nothing changed on group {hosts[0].group}: {exc}") for h in hosts]
        if members is None:  # nothing deployed here, or releases that served host by host: each goes back alone
            with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
                return list(pool.map(lambda h: guarded(h, lambda: rollback_one(transports[h.name], h, base, dry_run=dry_run)),
                                     hosts))
        return _go_back(members, transports, base, dry_run)


def refuse_split(group: str, kept: list[Host], left_out: list[str], limit: str | None) -> None:
    """--limit took some of the group's hosts: DeployError where a kept host's live or rollback release is part of a
    Ray group (a head and its workers go back as one, the hosts left out with them)."""
    for host in kept:
        with open_transport(host.connection) as transport:
            state = read_state(transport, "-", [])
            releases = [read_back(transport, d)[0] for d in (state.current, state.previous)]
        if any(r is not None and RAY_UNIT in r.units for r in releases):
            raise DeployError(f"--limit {limit} leaves {', '.join(left_out)} out of group {group}, whose releases are "
                              f"a multi-node vLLM group (a Ray head and its workers) that goes back as one: limit to "
                              f"all of its hosts or to none")


def _go_back(members: list[Member], transports, base: ServeSettings, dry_run: bool) -> list[HostDeploy]:
    """Every host's previous release live again in deploy's order (dry_run: the plan of it, read-only)."""
    head = members[0]
    phases = _phases(head, members[1:], lambda m, start: rolling.leave_ops(m.state) + dplan.activate_ops(
        m.previous, m.state, start=start))
    settings = replace(settings_of(head.previous, base), warmup=0)  # as a rollback of one host gates it
    ray = ray_check(head.host.name, head.previous, len(members))
    if dry_run:
        notes = {**ray_notes(phases, ray), phases[-1].description: gate_line(SERVE_UNIT, settings, _fallback(members))}
        return [HostDeploy(m.host, Outcome.PLANNED, m.previous.id, release_name(m.state.current),
                           ops=phase_lines(phases, m.host.name, notes if m is head else {})) for m in members]
    gate = start_group(phases, transports, ray, lambda: gate_head(transports[head.host.name], head.previous, settings))
    if not gate.ok:
        return _put_back(members, transports, base, gate)
    return [HostDeploy(m.host, Outcome.ROLLED_BACK, m.previous.id, m.previous.id, gate if m is head else None)
            for m in members]


def _members(hosts: list[Host], transports) -> list[Member] | None:
    """Each host's releases, the Ray head first; None where the group has nothing deployed or its previous releases
    are no Ray group (they served host by host); DeployError where one host cannot go back."""
    states = {h.name: read_state(transports[h.name], "-", []) for h in hosts}
    if not any(s.current or s.previous for s in states.values()):
        return None
    members = []
    for host in hosts:
        state, transport = states[host.name], transports[host.name]
        if state.cordoned:  # a rollback starts the group's units: the cordon keeps them stopped
            raise DeployError(f"{host.name} is {state.cordoned}")
        if state.previous is None:
            raise DeployError(f"{host.name}: no previous release to go back to "
                              f"({release_name(state.current) or 'nothing'} is live)")
        left, unreadable = read_back(transport, state.current)
        members.append(Member(host, state, load_release(transport, state.previous), left, unreadable))
    if not any(RAY_UNIT in m.previous.units for m in members):
        return None
    heads = [m for m in members if SERVE_UNIT in m.previous.units]
    if len(heads) != 1 or not all(RAY_UNIT in m.previous.units for m in members):
        roles = ", ".join(f"{m.host.name}: {m.previous.settings.get('role', '?')}" for m in members)
        raise DeployError(f"the previous releases of group {hosts[0].group} are not one Ray head and its workers "
                          f"({roles}): a multi-node group goes back as one, its Ray head with all of its workers")
    return heads + [m for m in members if m is not heads[0]]


def _phases(head: Member, workers: list[Member], activate) -> list:
    """deploy's start phases, activate(member, units) on each host."""
    by_name = {m.host.name: m for m in (head, *workers)}
    return start_phases(head.host.name, [m.host.name for m in workers],
                        lambda name, start: activate(by_name[name], start))


def _fallback(members: list[Member]) -> str:
    """What a failed gate leads to, as the plan says it."""
    lost = [m for m in members if m.left is None]
    if not lost:
        return FALLBACK
    why = "; ".join(f"{m.host.name}: {m.unreadable or 'nothing was live before'}" for m in lost)
    return f"nothing comes back, the group stays as the failed gate left it ({why})"


def _put_back(members: list[Member], transports, base: ServeSettings, gate: GateResult) -> list[HostDeploy]:
    """The group failed to come back: keep the head's journal, then bring back what each host left, in deploy's
    order where those releases are a Ray group, with `previous` naming the release each tried."""
    head = members[0]
    journal = journal_tail(transports[head.host.name], SERVE_UNIT)
    cannot = _cannot_put_back(members)
    try:
        back = GateResult(False, "put back", cannot) if cannot else _put_back_group(members, transports, base)
    except HosttuneError as exc:
        back = GateResult(False, "put back", str(exc))
    tried = not cannot
    failed = []
    for m in members:
        restored = m.left.id if m.left and tried else None
        note = "" if back.ok else f"; putting back the releases it left failed too: {back.error}"
        failed.append(HostDeploy(m.host, Outcome.FAILED, m.previous.id, restored if back.ok else None, gate,
                                 gate.summary() + note, journal if m is head else "", restored))
    return failed


def _cannot_put_back(members: list[Member]) -> str:
    """Why the releases the rollback left cannot come back as the group they were (nothing is tried then), or ""."""
    lost = ", ".join(m.host.name for m in members if m.left is None)
    if lost:
        return f"{lost} had no readable release live before, so the group cannot come back as it was"
    if any(RAY_UNIT in m.left.units for m in members) and not is_ray_group([m.left for m in members]):
        return "the releases it left are not one Ray head and its workers"
    return ""


def _put_back_group(members: list[Member], transports, base: ServeSettings) -> GateResult:
    """The releases left, live again: a Ray group in deploy's order; releases that served host by host, each on its
    own as a failed rollback of one host puts it back."""
    if not any(RAY_UNIT in m.left.units for m in members):
        return _put_back_each(members, transports, base)
    return start_again([Comeback(m.host.name, m.left, (Symlink(PREVIOUS, m.previous.dir),)) for m in members],
                       transports, base)


def _put_back_each(members: list[Member], transports, base: ServeSettings) -> GateResult:
    """Each host's own release back on its own, as a failed rollback of one host puts it back."""
    bad = None
    for m in members:
        back = Back(m.left, m.previous, base, Access(m.host.group, front=front_for(m.host)))
        result = bring_back(transports[m.host.name], back, [Symlink(PREVIOUS, m.previous.dir)], None)
        bad = bad or (None if result.ok else result)
    return bad or GateResult(True, "done")
