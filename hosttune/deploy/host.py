"""One host's deploy: read, install the release beside the live one, verify, switch, gate; on failure, switch back.

The live service changes only at activation. Until then a failure (upload, pip, a unit
that does not verify) leaves the host serving what it served; after it, a failed gate
prints the unit's journal tail and activates the release that was live before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Callable

from hosttune.build.wheelhouse import Entry
from hosttune.actions.base import Command, FileWrite, Op, Remove, Symlink, describe
from hosttune.actions.platform import PackageFlavour
from hosttune.deploy import plan as dplan
from hosttune.deploy import rolling
from hosttune.deploy.access import Access
from hosttune.deploy.front import (front_ops, front_paths, front_removals, key_ops, refresh_tls_ops, stale_front_ops,
                                   tls_ops)
from hosttune.deploy.errors import DeployError
from hosttune.deploy.gate import GateResult, gate_line, journal_tail, run_gate
from hosttune.deploy.model import ModelShape
from hosttune.deploy.placement import Layout, Placement
from hosttune.deploy.preconditions import check_job, refuse, serve_needs
from hosttune.deploy.prune import DEFAULT_KEEP, prune, prune_lines
from hosttune.deploy.release import CURRENT, PREVIOUS, UNIT_DIR, Release, release_name, wheel_path
from hosttune.deploy.restore import Back, bring_back, fallback_dir, load_release, read_back
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.shape import Guard, Shape
from hosttune.deploy.state import HostState, read_state
from hosttune.deploy.flagcheck import check_flags, check_line
from hosttune.deploy.tune import tune_ops
from hosttune.deploy.units import SERVE_UNIT, UNIT_NAMES, replica_unit
from hosttune.execute.perform import OperationFailed, run_ops
from hosttune.errors import HosttuneError, TransportError
from hosttune.config.inventory import Host
from hosttune.fleet_runner import EXIT_ERROR, Outcome
from hosttune.presets import EnginePreset
from hosttune.transport.base import Transport


@dataclass(frozen=True)
class HostDeploy:
    """What deploy did on one host."""

    host: Host
    state: Outcome  # DEPLOYED, UNCHANGED, ROLLED_BACK, PLANNED, FAILED, UNREACHABLE or SKIPPED
    release: str | None = None  # the release this run was about
    serving: str | None = None  # the release live when it finished (None: nothing serving)
    gate: GateResult | None = None
    error: str | None = None
    journal: str = ""  # the unit's last log lines, when it failed
    restored: str | None = None  # what a failed deploy went back to
    ops: tuple[str, ...] = field(default=(), hash=False)  # what was (or would be) done
    checks: tuple[str, ...] = field(default=(), hash=False)  # its preconditions, checked before anything was sent
    shape: Shape | None = None  # what this run asked the host to serve
    removals: tuple[str, ...] = ()  # what it takes away from the live shape (replicas, the front, the key)

    @property
    def ok(self) -> bool:
        return self.state in (Outcome.DEPLOYED, Outcome.UNCHANGED, Outcome.ROLLED_BACK, Outcome.PLANNED)

    @property
    def exit_bits(self) -> int:
        return EXIT_ERROR if self.state is Outcome.SKIPPED else self.state.exit_bits


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
    layout: Layout | None = None  # the host's replicas (None: one service over placement)
    access: Access = Access()
    model: ModelShape | None = None  # the model folder as read on the host (None: not a folder there)
    packages: PackageFlavour | None = None  # the host's package manager, for what the plan installs
    guard: Guard = Guard()  # replicas, key and front, as the release records them
    tune_s: float = 0.0  # `hosttune-engine tune` on the host before the release starts, this long (0: none)
    keep_releases: int = DEFAULT_KEEP  # release folders left on the host once the new one serves (prune.py)


def deploy_one(transport: Transport, job: HostJob, *, dry_run: bool = False,
               on_op: Callable[[Op], None] | None = None) -> HostDeploy:
    release = job.release
    state = read_state(transport, release.id, [wheel_path(w) for w in release.wheels] + list(release.files)
                       + front_paths(job.access))
    if state.cordoned:  # its front serves nothing: the group balancer leaves it out (serving None)
        return HostDeploy(job.host, Outcome.FAILED, None, None, error=f"nothing changed: {job.host.name} is {state.cordoned}")
    serves = SERVE_UNIT in release.units
    front = _front(job, state) if serves else []
    removals = front_removals(front, state)
    unchanged = _unchanged(transport, job, state, dry_run)
    if unchanged:
        refront = _refront_ops(job, front, state)
        unchanged = replace(unchanged, removals=removals)
        if dry_run:
            return replace(unchanged, ops=tuple(describe(op) for op in refront))
        return _fronted(transport, job, state, unchanged, refront, on_op)
    try:
        refuse(transport, job, state)
    except DeployError as exc:  # one line, and the host as it was
        return HostDeploy(job.host, Outcome.FAILED, None, release_name(state.current), error=f"nothing changed: {exc}")
    install = dplan.install_ops(release, job.entry, state, job.python) + dplan.verify_ops(release) + _tune_ops(job)
    # the key file before any unit (re)starts, so every replica starts with its key
    keys = key_ops(job.access, job.preset) + (tls_ops(job.access) if release.replicas else [])
    needs = serve_needs(job, state) if serves or release.replicas else ()
    switch = rolling.switch_ops(release, state, requires=needs) if release.replicas else \
        rolling.leave_ops(state) + dplan.activate_ops(release, state, requires=needs)
    checked = check_job(transport, job, [install, keys + switch, front], state)
    if checked.error:  # one line, nothing sent
        return HostDeploy(job.host, Outcome.FAILED, None, release_name(state.current),
                          error=f"nothing changed: {job.host.name}: {checked.error}", checks=checked.lines)
    install, activate, front = (list(g) for g in checked.groups)
    if dry_run:
        back = not read_back(transport, fallback_dir(state, release))[1]  # what a failed gate can put back
        return HostDeploy(job.host, Outcome.PLANNED, release.id, release_name(state.current),
                          ops=_plan_lines(job, state, install, keys, activate, front, back), checks=checked.lines,
                          removals=removals)
    try:
        run_ops(transport, install, on_op)
        check_flags(transport, job, release.dir)
    except (DeployError, OperationFailed) as exc:  # nothing live has changed yet
        return HostDeploy(job.host, Outcome.FAILED, release.id, release_name(state.current), error=str(exc))
    try:
        run_ops(transport, activate, on_op)
    except (DeployError, OperationFailed) as exc:
        return _restore(transport, job, state, GateResult(False, "activate", str(exc)))
    if release.replicas:
        return _roll(transport, job, state, on_op)
    if not serves:  # a Ray worker: the head's gate judges the cluster
        return HostDeploy(job.host, Outcome.DEPLOYED, release.id, release.id)
    gate = run_gate(transport, SERVE_UNIT, job.settings, job.preset.serve.health, key_file=release.key_file)
    if gate.ok:
        done = _fronted(transport, job, state, HostDeploy(job.host, Outcome.DEPLOYED, release.id, release.id, gate,
                                                          removals=removals), front, on_op)
        return _pruned(transport, job, state, done, on_op)
    return _restore(transport, job, state, gate)


def _plan_lines(job: HostJob, state: HostState, install: list[Op], keys: list[Op], activate: list[Op],
                front: list[Op], back: bool = True) -> tuple[str, ...]:
    """What the run does, in its order: install, the flag check, the switch (a roll: each replica gated), the
    gate of one service, its front. back: the release live before can be read back, so a failed gate restores it."""
    release = job.release
    check = check_line(job, release.dir)
    lines = [describe(op) for op in install] + ([check] if check else [])
    prune = prune_lines(state, release, job.keep_releases)
    if release.replicas:
        return tuple(lines + [describe(op) for op in keys] + rolling.plan_lines(release, state, job.settings, back)
                     + prune)
    lines += [describe(op) for op in activate]
    if SERVE_UNIT in release.units:
        fallback = rolling.fallback_text(back) if state.current else "the service is stopped and disabled"
        lines.append(gate_line(SERVE_UNIT, job.settings, fallback))
    return tuple(lines + [describe(op) for op in front] + prune)


def _tune_ops(job: HostJob) -> list[Op]:
    if not job.tune_s or not job.placement.gpus:
        return []
    return tune_ops(job.release.dir, job.settings, job.placement.gpus[0], job.tune_s, job.placement.tp)


def _unchanged(transport: Transport, job: HostJob, state: HostState, dry_run: bool) -> HostDeploy | None:
    """The release is live and serving: nothing to do (a failed gate means: deploy it again)."""
    release, health = job.release, job.preset.serve.health
    if release.replicas:
        if not rolling.is_unchanged(release, state):
            return None
        gate = None if dry_run else rolling.gate_all(transport, release, job.settings, health)
    else:
        if not dplan.is_unchanged(release, state):
            return None
        gate = run_gate(transport, SERVE_UNIT, job.settings, health, warmup=0, just_started=False,
                        key_file=release.key_file) if SERVE_UNIT in release.units and not dry_run else None
    return HostDeploy(job.host, Outcome.UNCHANGED, release.id, release.id, gate) if gate is None or gate.ok else None


def _roll(transport: Transport, job: HostJob, state: HostState, on_op) -> HostDeploy:
    release = job.release
    try:
        gate, failed = rolling.roll(transport, release, job.settings, job.preset.serve.health, on_op=on_op)
        if failed is None:
            run_ops(transport, rolling.retire_ops(release, state), on_op)
            return _pruned(transport, job, state, HostDeploy(job.host, Outcome.DEPLOYED, release.id, release.id, gate),
                           on_op)
    except (DeployError, OperationFailed) as exc:
        gate, failed = GateResult(False, "roll", str(exc)), None
    return _restore(transport, job, state, gate, failed)


def _fronted(transport: Transport, job: HostJob, before: HostState, outcome: HostDeploy, front: list,
             on_op: Callable[[Op], None] | None = None) -> HostDeploy:
    """The engine serves: now the host's nginx in front of it (a config nginx refuses puts the old release back)."""
    try:
        run_ops(transport, front, on_op)
    except (DeployError, OperationFailed) as exc:
        if outcome.state is Outcome.UNCHANGED:
            return replace(outcome, state=Outcome.FAILED, error=f"nginx: {exc}")
        return _restore(transport, job, before, GateResult(False, "nginx", str(exc)))
    return outcome


def _pruned(transport: Transport, job: HostJob, before: HostState, outcome: HostDeploy,
            on_op: Callable[[Op], None] | None = None) -> HostDeploy:
    """The new release serves: release folders past the ones kept go (one that cannot is said; the deploy stands)."""
    why = prune(transport, before, job.release, job.keep_releases, on_op) if outcome.state is Outcome.DEPLOYED else ""
    return replace(outcome, error=why) if why else outcome


def _front(job: HostJob, state: HostState) -> list[Op]:
    """The host's nginx front over the one service, once it serves: written; or, where the release has none and the
    host still has this deployment's (hosttune-local.conf, over one service), removed, as the plan's removals say."""
    if job.access.front is not None:
        return front_ops(job.access, job.preset.name, (job.settings.port,))
    return [] if job.release.replicas else stale_front_ops(state)


def _refront_ops(job: HostJob, front: list[Op], state: HostState) -> list[Op]:
    """An unchanged release: its nginx front again (replicas: their nginx config is the release's, the TLS files not),
    where a file of it differs from the host's or goes; else nothing, and nginx is not reloaded."""
    ops = refresh_tls_ops(job.access) if job.release.replicas else front
    return ops if any(_differs(op, state) for op in ops) else []


def _differs(op: Op, state: HostState) -> bool:
    """A file the host lacks or holds otherwise (hashes read with the state; the front's config goes up as .new)."""
    if isinstance(op, Remove):
        return True
    if not isinstance(op, FileWrite):
        return False
    return state.wheels.get(op.path.removesuffix(".new")) != hashlib.sha256(op.content).hexdigest()


def _restore(transport: Transport, job: HostJob, before: HostState, gate: GateResult,
             failed_replica: int | None = None) -> HostDeploy:
    """The gate failed: keep the evidence, then put back what was live before (or stop, if nothing was)."""
    failed = gate_failure(transport, job.host, job.release.id, gate, failed_replica)
    # The release live before; when this was a restart of the live release itself, the one before that.
    target = fallback_dir(before, job.release)
    try:
        if target is None:
            now = read_state(transport, job.release.id, [])
            run_ops(transport, rolling.leave_ops(now) + _stop_ops(job.release))
            return failed
        previous = load_release(transport, target)
        # `previous` goes back to what it named before this deploy (never to the release now live again)
        keep = before.previous if before.previous not in (None, target) else None
        link = [Symlink(PREVIOUS, keep)] if keep else [Remove(PREVIOUS)]
        check = bring_back(transport, Back(previous, job.release, job.settings, job.access), link, failed_replica)
    except HosttuneError as exc:
        return replace(failed, error=f"{failed.error}; putting the previous release back failed too: {exc}")
    serving = previous.id if check.ok else None
    note = _front_lost(previous, job) if check.ok else \
        f"; the previous release {previous.id} did not come back healthy: {check.error}"
    return replace(failed, serving=serving, restored=previous.id, error=failed.error + note)


def _front_lost(previous: Release, job: HostJob) -> str:
    """A service that served behind the host's front, put back after replicas whose switch took the front's config:
    the front comes back only as the inventory gives it, and where it gives none the service answers on the
    loopback alone, which the outcome says."""
    shape = previous.settings.get("shape")
    port = shape.get("front_port") if isinstance(shape, dict) else None
    if not port or previous.replicas or not job.release.replicas or job.access.front is not None:
        return ""
    return (f"; {previous.id} came back without its nginx front on port {port}, which the inventory's deploy.nginx "
            f"gives no more: it answers on the loopback alone")


def gate_failure(transport: Transport, host: Host, release: str, gate: GateResult,
                 failed_replica: int | None) -> HostDeploy:
    """A release that failed its gate, with the failing unit's journal tail: the evidence kept before anything is
    put back."""
    unit = replica_unit(failed_replica) if failed_replica is not None else SERVE_UNIT
    return HostDeploy(host, Outcome.FAILED, release, None, gate, gate.summary(), journal_tail(transport, unit))


def _stop_ops(release: Release) -> list[Op]:
    names = [n for n in reversed(UNIT_NAMES) if n in release.units]
    return [*([Command(("systemctl", "disable", "--now", *names))] if names else []),
            *(Remove(f"{UNIT_DIR}/{n}") for n in names),
            Remove(CURRENT), Command(("systemctl", "daemon-reload"))]


def guarded(host: Host, attempt: Callable[[], HostDeploy], release: str | None = None) -> HostDeploy:
    """attempt(), with a lost connection (unreachable) or a refused operation (failed) as the host's outcome."""
    try:
        return attempt()
    except TransportError as exc:
        return HostDeploy(host, Outcome.UNREACHABLE, release, error=str(exc))
    except HosttuneError as exc:
        return HostDeploy(host, Outcome.FAILED, release, error=str(exc))


def deploy_host(transport: Transport, job: HostJob, **kwargs) -> HostDeploy:
    """deploy_one, with a lost connection or a refused operation as the host's outcome."""
    return guarded(job.host, lambda: deploy_one(transport, job, **kwargs), job.release.id)
