"""--rollback on one host: make the previous release live again; if it fails its gate, the release it replaced
comes back, so a rollback loses nothing."""

from __future__ import annotations

from dataclasses import replace

from hosttune.actions.base import Command, Op, Symlink, describe
from hosttune.config.inventory import Host
from hosttune.deploy import plan as dplan
from hosttune.deploy import rolling
from hosttune.deploy.access import Access, front_for
from hosttune.deploy.errors import DeployError
from hosttune.deploy.front import front_ops, stale_front_ops
from hosttune.deploy.gate import GateResult, gate_line, run_gate
from hosttune.deploy.host import HostDeploy, gate_failure
from hosttune.deploy.release import PREVIOUS, Release, release_name
from hosttune.deploy.restore import Back, bring_back, load_release, out_of_the_way, read_back, settings_of
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.shape import shape_of
from hosttune.deploy.state import HostState, read_state
from hosttune.deploy.units import SERVE_UNIT
from hosttune.errors import HosttuneError
from hosttune.execute.perform import run_ops
from hosttune.fleet_runner import Outcome
from hosttune.presets import load_preset
from hosttune.transport.base import Transport


def rollback_one(transport: Transport, host: Host, timeouts: ServeSettings, dry_run: bool = False) -> HostDeploy:
    """--rollback: make the previous release live again (the one left becomes `previous`).

    timeouts: the health and gate deadlines; the port comes from the release itself.
    dry_run: only which release would come back in place of which (PLANNED), read-only.
    """
    state = read_state(transport, "-", [])
    if state.previous is None and state.current is None:  # a host never deployed to: not a failed rollback
        return HostDeploy(host, Outcome.NOTHING, error=f"{host.name}: nothing deployed by hosttune here, so nothing to "
                                                       "roll back")
    if state.cordoned:  # a rollback starts replicas and puts them in nginx: the cordon keeps them out
        return HostDeploy(host, Outcome.FAILED, None, release_name(state.current),
                          error=f"nothing changed: {host.name} is {state.cordoned}")
    if state.previous is None:
        raise DeployError(f"{host.name}: no previous release to go back to ({release_name(state.current) or 'nothing'} is live)")
    previous = load_release(transport, state.previous)
    settings = settings_of(previous, timeouts)
    front = [] if previous.replicas or SERVE_UNIT not in previous.units else _front(host, previous, state, settings.port)
    live, unreadable = read_back(transport, state.current)
    stop, why = _in_the_way(previous, state, live, unreadable) if previous.replicas else ([], "")
    if dry_run:
        return HostDeploy(host, Outcome.PLANNED, previous.id, release_name(state.current),
                          ops=(*([why] if why else []), *map(describe, stop),
                               *_plan(previous, release_name(state.current), settings, bool(unreadable)),
                               *map(describe, front)), removals=_removals(live, previous))
    health = load_preset(previous.engine).serve.health
    if previous.replicas:
        run_ops(transport, dplan.verify_ops(previous) + stop + rolling.switch_ops(previous, state))
        gate, bad = rolling.roll(transport, previous, settings, health)
        if bad is None:
            run_ops(transport, rolling.retire_ops(previous, state))
            return HostDeploy(host, Outcome.ROLLED_BACK, previous.id, previous.id, gate)
        return _rollback_failed(transport, host, state, previous, timeouts, gate, bad)
    leave = rolling.leave_ops(state)
    run_ops(transport, dplan.verify_ops(previous) + leave + dplan.activate_ops(previous, state))
    if SERVE_UNIT not in previous.units:
        return HostDeploy(host, Outcome.ROLLED_BACK, previous.id, previous.id)
    gate = run_gate(transport, SERVE_UNIT, settings, health, warmup=0, key_file=previous.key_file)
    if gate.ok:
        run_ops(transport, front)
        return HostDeploy(host, Outcome.ROLLED_BACK, previous.id, previous.id, gate)
    return _rollback_failed(transport, host, state, previous, timeouts, gate, None)


def _front(host: Host, previous: Release, state: HostState, port: int) -> list[Op]:
    """The host's nginx front as the one service rolled back to had it, once it passed its gate: the inventory's front
    written again where it had one (the replicas' nginx config went with them, or a deploy without nginx: removed
    it), removed where it had none. A release too old to record its front gets the inventory's where replicas go."""
    shape = previous.settings.get("shape")
    access = Access(host.group, front=front_for(host))
    if not isinstance(shape, dict):
        return front_ops(access, previous.engine, (port,)) if state.instances else []
    if shape.get("front_port"):
        if access.front is None:
            raise DeployError(f"{host.name}: release {previous.id} served behind the host's nginx front on port "
                              f"{shape['front_port']}, which the inventory's deploy.nginx no longer gives; give it "
                              f"back to roll back to it")
        return front_ops(access, previous.engine, (port,))
    return stale_front_ops(state)


def _removals(live: Release | None, previous: Release) -> tuple[str, ...]:
    """What going back takes away from the live release (replicas, its nginx front, its API key), in the plan's words,
    marked ! and needing --yes as a deploy that takes them away does."""
    now, back = (shape_of({"engine": r.engine, "settings": r.settings}) if r else None for r in (live, previous))
    return now[1].removals(back[1]) if now and back else ()


def _in_the_way(previous: Release, state: HostState, live: Release | None, unreadable: str) -> tuple[list[Op], str]:
    """The live replicas on ports the previous release takes before its roll restarts them (a deploy that moved the
    ports down): stopped first. A live release that cannot be read leaves which ones unknown: every live replica is
    stopped first, and the second value, the plan's line, says why."""
    if not (state.current and state.instances):
        return [], ""
    if live is None:
        return ([Command(("systemctl", "stop", *sorted(state.instances)), timeout=900.0)],
                f"stop every replica of the live release before the switch (which of them hold the ports "
                f"{previous.id} takes is unknown): {unreadable}")
    return out_of_the_way(previous, live, None), ""


def _plan(previous: Release, now: str | None, settings: ServeSettings, unreadable: bool) -> tuple[str, ...]:
    """What a rollback does, for --dry-run: the switch, then the gate and what a failed one brings back (nothing where
    the live release cannot be read)."""
    if not previous.replicas and SERVE_UNIT not in previous.units:  # the run gates nothing on a Ray worker
        return (f"make {previous.id} live again in place of {now or 'nothing'} (the Ray worker: no gate here, the "
                f"head's server is the group's)",)
    what = f"{len(previous.replicas)} replicas, one at a time" if previous.replicas else "the service"
    fallback = "nothing was live before to come back" if not now else \
        f"{now} cannot come back, its release.json unreadable" if unreadable else f"{now} comes back"
    unit = "each replica" if previous.replicas else SERVE_UNIT
    gated = settings if previous.replicas else replace(settings, warmup=0)  # as the run gates each
    return (f"make {previous.id} live again in place of {now or 'nothing'} ({what})", gate_line(unit, gated, fallback))


def _rollback_failed(transport: Transport, host: Host, before: HostState, previous: Release, timeouts: ServeSettings,
                     gate: GateResult, bad: int | None) -> HostDeploy:
    """The release rolled back to failed its gate: keep the evidence, then make the one it replaced live again,
    with `previous` naming the failed one as before, so nothing is lost."""
    failed = gate_failure(transport, host, previous.id, gate, bad)
    if before.current is None:
        return failed
    try:
        left = load_release(transport, before.current)
        back = Back(left, previous, timeouts, Access(host.group, front=front_for(host)))
        check = bring_back(transport, back, [Symlink(PREVIOUS, previous.dir)], bad)
    except HosttuneError as exc:
        return replace(failed, error=f"{failed.error}; putting {release_name(before.current)} back failed too: {exc}")
    note = "" if check.ok else f"; {left.id} did not come back healthy either: {check.error}"
    return replace(failed, serving=left.id if check.ok else None, restored=left.id, error=failed.error + note)
