"""One host's deploy: read, install the release beside the live one, verify, switch, gate; on failure, switch back.

The live service changes only at activation. Until then a failure (upload, pip, a unit
that does not verify) leaves the host serving what it served; after it, a failed gate
prints the unit's journal tail and activates the release that was live before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable

from hosttune.build.wheelhouse import Entry
from hosttune.deploy import plan as dplan
from hosttune.deploy.access import Access
from hosttune.deploy.front import front_ops, key_ops
from hosttune.deploy.errors import DeployError
from hosttune.deploy.executor import run_ops
from hosttune.deploy.gate import GateResult, journal_tail, run_gate
from hosttune.deploy.placement import Placement
from hosttune.deploy.release import CURRENT, PREVIOUS, UNIT_DIR, Release, manifest_path, meta_dir, wheel_path
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.state import HostState, read_state
from hosttune.deploy.units import SERVE_UNIT, UNIT_NAMES
from hosttune.errors import HosttuneError, TransportError
from hosttune.inventory import Host
from hosttune.presets import EnginePreset, load_preset
from hosttune.transport.base import Transport


@dataclass(frozen=True)
class HostDeploy:
    """What deploy did on one host."""

    host: Host
    state: str  # deployed | unchanged | rolled-back | failed | unreachable | skipped | planned
    release: str | None = None  # the release this run was about
    serving: str | None = None  # the release live when it finished (None: nothing serving)
    gate: GateResult | None = None
    error: str | None = None
    journal: str = ""  # the unit's last log lines, when it failed
    restored: str | None = None  # what a failed deploy went back to
    ops: tuple[str, ...] = field(default=(), hash=False)  # what was (or would be) done

    @property
    def ok(self) -> bool:
        return self.state in ("deployed", "unchanged", "rolled-back", "planned")


@dataclass(frozen=True)
class HostJob:
    """Everything decided for one host before it is touched."""

    host: Host
    preset: EnginePreset
    settings: ServeSettings
    placement: Placement
    entry: Entry
    release: Release
    python: str = "python3"
    access: Access = Access()


def deploy_one(transport: Transport, job: HostJob, *, dry_run: bool = False,
               on_op: Callable[[dplan.Op], None] | None = None) -> HostDeploy:
    release = job.release
    state = read_state(transport, release.id, [wheel_path(w) for w in release.wheels])
    serves = SERVE_UNIT in release.units
    front = front_ops(job.access, job.preset.name, (job.settings.port,)) if serves else []
    if dplan.is_unchanged(release, state):
        gate = run_gate(transport, SERVE_UNIT, job.settings, job.preset.serve.health, warmup=0, just_started=False,
                        key_file=job.access.env_file) if serves and not dry_run else None
        if gate is None or gate.ok:
            return _fronted(transport, job, state, HostDeploy(job.host, "unchanged", release.id, release.id, gate),
                            front if not dry_run else [])
    install = dplan.install_ops(release, job.entry, state, job.python) + dplan.verify_ops(release)
    activate = key_ops(job.access, job.preset) + dplan.activate_ops(release, state)
    if dry_run:
        return HostDeploy(job.host, "planned", release.id, _name(state.current),
                          ops=tuple(dplan.describe(op) for op in install + activate + front))
    try:
        run_ops(transport, install, on_op)
    except DeployError as exc:  # nothing live has changed yet
        return HostDeploy(job.host, "failed", release.id, _name(state.current), error=str(exc))
    try:
        run_ops(transport, activate, on_op)
    except DeployError as exc:
        return _restore(transport, job, state, GateResult(False, "activate", str(exc)))
    if not serves:  # a Ray worker: the head's gate judges the cluster
        return HostDeploy(job.host, "deployed", release.id, release.id)
    gate = run_gate(transport, SERVE_UNIT, job.settings, job.preset.serve.health, key_file=job.access.env_file)
    if gate.ok:
        return _fronted(transport, job, state, HostDeploy(job.host, "deployed", release.id, release.id, gate), front)
    return _restore(transport, job, state, gate)


def _fronted(transport: Transport, job: HostJob, before: HostState, outcome: HostDeploy, front: list) -> HostDeploy:
    """The engine serves: now the host's nginx in front of it (a config nginx refuses puts the old release back)."""
    try:
        run_ops(transport, front)
    except DeployError as exc:
        if outcome.state == "unchanged":
            return _with(outcome, state="failed", error=f"nginx: {exc}")
        return _restore(transport, job, before, GateResult(False, "nginx", str(exc)))
    return outcome


def key_file(release: Release) -> str | None:
    """The key file a release's service reads (its gate reads the key there too)."""
    return (release.settings.get("api_key") or {}).get("file")


def _name(release_dir: str | None) -> str | None:
    return release_dir.rstrip("/").rsplit("/", 1)[-1] if release_dir else None


def load_release(transport: Transport, release_dir: str) -> Release:
    """A release installed on the host, from its release.json and unit files."""
    rid = _name(release_dir)
    text = transport.run(["cat", "--", manifest_path(rid)], timeout=60)
    if not text.ok:
        raise DeployError(f"{transport.host_name}: release {rid} has no readable release.json ({text.stderr.strip()})")
    doc = json.loads(text.stdout)
    units = {}
    for name in doc["units"]:
        body = transport.run(["cat", "--", f"{meta_dir(rid)}/{name}"], timeout=60)
        if not body.ok:
            raise DeployError(f"{transport.host_name}: release {rid} lacks its unit {name}")
        units[name] = body.stdout.encode("utf-8", "surrogateescape")
    return Release(rid, doc["engine"], doc["entry"], (), doc["offline"], units, doc["settings"],
                   tuple(doc.get("programs", ())))


def _restore(transport: Transport, job: HostJob, before: HostState, gate: GateResult) -> HostDeploy:
    """The gate failed: keep the evidence, then put back what was live before (or stop, if nothing was)."""
    journal = journal_tail(transport, SERVE_UNIT)
    failed = HostDeploy(job.host, "failed", job.release.id, None, gate, gate.summary(), journal)
    # The release live before; when this was a restart of the live release itself, the one before that.
    target = before.current if before.current != job.release.dir else before.previous
    try:
        if target is None:
            run_ops(transport, _stop_ops(job.release))
            return failed
        previous = load_release(transport, target)
        after = read_state(transport, previous.id, [])
        # `previous` goes back to what it named before this deploy (never to the release now live again)
        keep = before.previous if before.previous not in (None, target) else None
        link = [dplan.Link(PREVIOUS, keep)] if keep else [dplan.Remove(PREVIOUS)]
        run_ops(transport, dplan.activate_ops(previous, after, keep_previous=True) + link)
    except HosttuneError as exc:
        return _with(failed, error=f"{failed.error}; putting the previous release back failed too: {exc}")
    check = run_gate(transport, SERVE_UNIT, _settings_of(previous, job.settings), load_preset(previous.engine).serve.health,
                     warmup=0, key_file=key_file(previous))
    serving = previous.id if check.ok else None
    note = "" if check.ok else f"; the previous release {previous.id} did not come back healthy: {check.error}"
    return _with(failed, serving=serving, restored=previous.id, error=failed.error + note)


def _stop_ops(release: Release) -> list[dplan.Op]:
    names = [n for n in reversed(UNIT_NAMES) if n in release.units]
    return [dplan.Run(("systemctl", "disable", "--now", *names)),
            *(dplan.Remove(f"{UNIT_DIR}/{n}") for n in names),
            dplan.Remove(CURRENT), dplan.Run(("systemctl", "daemon-reload"))]


def _with(outcome: HostDeploy, **changes) -> HostDeploy:
    return replace(outcome, **changes)


def rollback_one(transport: Transport, host: Host, timeouts: ServeSettings) -> HostDeploy:
    """--rollback: make the previous release live again (the one left becomes `previous`).

    timeouts: the health and gate deadlines; the port comes from the release itself.
    """
    state = read_state(transport, "-", [])
    if state.previous is None:
        raise DeployError(f"{host.name}: no previous release to go back to ({_name(state.current) or 'nothing'} is live)")
    previous = load_release(transport, state.previous)
    run_ops(transport, dplan.verify_ops(previous) + dplan.activate_ops(previous, state))
    if SERVE_UNIT not in previous.units:
        return HostDeploy(host, "rolled-back", previous.id, previous.id)
    settings = _settings_of(previous, timeouts)
    gate = run_gate(transport, SERVE_UNIT, settings, load_preset(previous.engine).serve.health, warmup=0,
                    key_file=key_file(previous))
    if gate.ok:
        return HostDeploy(host, "rolled-back", previous.id, previous.id, gate)
    return HostDeploy(host, "failed", previous.id, None, gate, gate.summary(), journal_tail(transport, SERVE_UNIT))


def _settings_of(release: Release, base: ServeSettings) -> ServeSettings:
    """The deadlines of this run, on the port the release serves on."""
    return replace(base, port=int(release.settings.get("port", base.port)))


def deploy_host(transport: Transport, job: HostJob, **kwargs) -> HostDeploy:
    """deploy_one, with a lost connection or a refused operation as the host's outcome."""
    try:
        return deploy_one(transport, job, **kwargs)
    except TransportError as exc:
        return HostDeploy(job.host, "unreachable", job.release.id, error=str(exc))
    except HosttuneError as exc:
        return HostDeploy(job.host, "failed", job.release.id, error=str(exc))
