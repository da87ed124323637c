"""A host's replicas onto a release, one at a time: out of the host's nginx, drained (SIGTERM: the
engine finishes in-flight requests within its shutdown timeout), started on the release, gated,
back in; then the next. While one replica restarts the others serve, and nginx resends a request
that found a replica draining or gone (non_idempotent retries), so clients see no error.

Operations are data (switch_ops, out/in, retire_ops); `roll` walks the replicas with the gate.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Callable

from hosttune.actions.base import Command, FileWrite, Op, Remove, Symlink, describe
from hosttune.actions.needs import Need
from hosttune.deploy.gate import GateResult, gate_line, run_gate
from hosttune.deploy.release import CURRENT, PREVIOUS, UNIT_DIR, Release, meta_dir
from hosttune.deploy.front import unfront_ops
from hosttune.deploy.replicas import LB_SCRIPT, SEVERAL_MARK
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.state import HostState
from hosttune.execute.perform import run_ops
from hosttune.deploy.units import (PROBE_TIMER, RAY_UNIT, REPLICA_TEMPLATE, REPLICA_UNITS, ROUTER_UNIT, SERVE_UNIT,
                                   replica_unit)
from hosttune.transport.base import Transport

NGINX = "nginx.service"


def lb_op(release: Release, command: str, *indices: int) -> Command:
    """The release's replica_lb.py on the host: out/in/sync of the host-local upstream."""
    return Command(("python3", f"{meta_dir(release.id)}/{LB_SCRIPT}", command, *map(str, indices)), timeout=120.0)


def lb_ops(release: Release, command: str, *indices: int) -> list[Command]:
    """lb_op over several replicas: one call, or one call each for a release whose replica_lb.py (an older hosttune's)
    marks only the first replica it is given."""
    if len(indices) > 1 and SEVERAL_MARK not in release.meta.get(LB_SCRIPT, b""):
        return [lb_op(release, command, index) for index in indices]
    return [lb_op(release, command, *indices)]


def indices(release: Release) -> list[int]:
    return [int(r["index"]) for r in release.replicas]


def switch_ops(release: Release, state: HostState, *, keep_previous: bool = False,
               requires: tuple[Need, ...] = ()) -> list[Op]:
    """The release's units and host files in place, `current` linked, nothing restarted: replicas not
    running yet are marked out of nginx until their gate passes; nginx and the probe timer enabled
    (requires: what they need to serve, checked before anything is sent)."""
    ops: list[Op] = []
    single = [n for n in (SERVE_UNIT, RAY_UNIT) if n in state.units]
    if single:  # the one service held the service port, which nginx takes now
        ops += [Command(("systemctl", "disable", "--now", *single)), *(Remove(f"{UNIT_DIR}/{n}") for n in single)]
    ops += [FileWrite(f"{UNIT_DIR}/{name}", body) for name, body in release.units.items()]
    ops += [FileWrite(path, body) for path, body in release.files.items()]
    if not keep_previous and state.current and state.current != release.dir:
        ops.append(Symlink(PREVIOUS, state.current))
    ops += [Symlink(CURRENT, release.dir), Command(("systemctl", "daemon-reload"))]
    ops += router_start_ops(release, state)
    new = [i for i in indices(release) if state.instances.get(replica_unit(i)) != "active"]
    ops += lb_ops(release, "out", *new) if new else [lb_op(release, "sync")]
    units = [replica_unit(i) for i in indices(release)]
    ops += [Command(("systemctl", "enable", "--quiet", NGINX, *units), requires=requires),
            Command(("systemctl", "enable", "--now", "--quiet", PROBE_TIMER))]
    return ops + router_front_ops(release, state)


def router_start_ops(release: Release, state: HostState) -> list[Op]:
    """The router up before nginx sends to it: started, or restarted when its unit changed (a new router
    or new settings; a redeploy of the engine alone leaves it running, its prefix table warm)."""
    if ROUTER_UNIT not in release.units:
        return []
    unit = state.units.get(ROUTER_UNIT)
    same = unit is not None and unit.sha256 == hashlib.sha256(release.units[ROUTER_UNIT]).hexdigest()
    start = "start" if same and unit.active == "active" else "restart"  # start: a no-op on a running unit
    return [Command(("systemctl", "enable", "--quiet", ROUTER_UNIT)), Command(("systemctl", start, ROUTER_UNIT), timeout=120.0)]


def router_front_ops(release: Release, state: HostState) -> list[Op]:
    """nginx onto the router (its config checked first); leaving the router, nginx onto the replicas again,
    then the router stopped."""
    if ROUTER_UNIT not in release.units and ROUTER_UNIT not in state.units:
        return []
    ops: list[Op] = [Command(("nginx", "-t", "-q")), Command(("systemctl", "reload-or-restart", NGINX))]
    if ROUTER_UNIT not in release.units:
        ops += [Command(("systemctl", "disable", "--now", ROUTER_UNIT)), Remove(f"{UNIT_DIR}/{ROUTER_UNIT}")]
    return ops


def restart_ops(release: Release, index: int) -> list[Op]:
    """Out of nginx, then the restart: systemd's SIGTERM drains it, and it starts on the release."""
    return [lb_op(release, "out", index), Command(("systemctl", "restart", replica_unit(index)), timeout=900.0)]


def stale_instances(release: Release, state: HostState) -> list[str]:
    keep = {replica_unit(i) for i in indices(release)}
    return sorted(name for name in state.instances if name not in keep)


def retire_ops(release: Release, state: HostState) -> list[Op]:
    """Replicas the release no longer has (a smaller layout): stopped once the others serve."""
    stale = stale_instances(release, state)
    return [Command(("systemctl", "disable", "--now", *stale), timeout=900.0)] if stale else []


def leave_ops(state: HostState) -> list[Op]:
    """From replicas back to one service (or nothing): the replicas, the probe and the host-local nginx go."""
    ops: list[Op] = []
    if state.instances:
        ops.append(Command(("systemctl", "disable", "--now", *sorted(state.instances)), timeout=900.0))
    present = [n for n in REPLICA_UNITS if n in state.units]
    running = [n for n in present if n != REPLICA_TEMPLATE]  # a template has no state of its own, its instances do
    if running:
        ops.append(Command(("systemctl", "disable", "--now", *running)))
    ops += [Remove(f"{UNIT_DIR}/{n}") for n in present]
    if state.instances or present:
        ops += unfront_ops()
    return ops


def fallback_text(back: bool, how: str = "") -> str:
    """What a failed gate brings back, in the plan's words (back: the release live before can be read back)."""
    if not back:
        return "the release live before cannot come back, its release.json unreadable"
    return f"the release live before comes back{how}"


def plan_lines(release: Release, state: HostState, settings: ServeSettings, back: bool = True) -> list[str]:
    """What a roll does, for --dry-run: each replica's gate with its deadlines and what a failed one leads to."""
    fallback = "the replica stays out of nginx and " + (
        fallback_text(back, " on the replicas that moved, one at a time") if state.current
        else "the replicas are stopped and disabled")
    lines = [describe(op) for op in switch_ops(release, state)]
    for index in indices(release):
        replica = replica_settings(release, settings, index)
        lines += [describe(op) for op in restart_ops(release, index)]
        lines += [gate_line(f"{replica_unit(index)} on port {replica.port}", replica, fallback),
                  describe(lb_op(release, "in", index))]
    return lines + [describe(op) for op in retire_ops(release, state)]


def replica_settings(release: Release, settings: ServeSettings, index: int) -> ServeSettings:
    port = next(int(r["port"]) for r in release.replicas if int(r["index"]) == index)
    return replace(settings, port=port)


def roll(transport: Transport, release: Release, settings: ServeSettings, health: str, only: list[int] | None = None,
         on_op: Callable[[Op], None] | None = None) -> tuple[GateResult | None, int | None]:
    """Each replica in turn; stops at the first whose gate fails: (its gate, its index), else (last gate, None)."""
    gate = None
    for index in indices(release):
        if only is not None and index not in only:
            continue
        run_ops(transport, restart_ops(release, index), on_op)
        gate = run_gate(transport, replica_unit(index), replica_settings(release, settings, index), health,
                        key_file=release.key_file)
        if not gate.ok:
            return gate, index
        run_ops(transport, [lb_op(release, "in", index)], on_op)
    return gate, None


def gate_all(transport: Transport, release: Release, settings: ServeSettings, health: str) -> GateResult | None:
    """A release already live: every replica still generates (no warmup, restarts before now are history)."""
    gate = None
    for index in indices(release):
        gate = run_gate(transport, replica_unit(index), replica_settings(release, settings, index), health,
                        warmup=0, just_started=False, key_file=release.key_file)
        if not gate.ok:
            return gate
    return gate


def is_unchanged(release: Release, state: HostState) -> bool:
    """The same balanced release is live: unit and host files as rendered, every replica active."""
    if state.current != release.dir or not state.is_complete:
        return False
    units = all(n in state.units and state.units[n].sha256 == hashlib.sha256(b).hexdigest() for n, b in release.units.items())
    files = all(state.wheels.get(p) == hashlib.sha256(b).hexdigest() for p, b in release.files.items())
    running = all(state.instances.get(replica_unit(i)) == "active" for i in indices(release))
    router = ROUTER_UNIT not in release.units or state.units[ROUTER_UNIT].active == "active"
    return units and files and running and router and not stale_instances(release, state)
