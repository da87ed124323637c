"""The start of a multi-node vLLM group over Ray, as data and its walk: Ray on the head, on the workers once the
head's Ray answers, the head's server once `ray status` counts every node, then its gate. A deploy
(multinode.py), a --rollback (group_rollback.py) and a group put back after either fails all start a group so.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Callable

from hosttune.actions.base import Op, describe
from hosttune.deploy import plan as dplan
from hosttune.deploy.errors import DeployError
from hosttune.deploy.gate import GateResult, run_gate
from hosttune.deploy.release import Release
from hosttune.deploy.restore import settings_of
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.state import read_state
from hosttune.deploy.units import RAY_UNIT, SERVE_UNIT
from hosttune.errors import HosttuneError
from hosttune.execute.perform import run_ops
from hosttune.fleet_runner import FleetRunner
from hosttune.presets import load_preset

RAY_WAIT_S = 300.0
_RAY_NODE = re.compile(r"^\s*\d+\s+node_[0-9a-f]+", re.M)


@dataclass(frozen=True)
class Phase:
    description: str
    ops: dict[str, list[Op]]  # host name → operations, run in parallel across hosts
    wait: str = ""  # "ray-head" | "ray-cluster" | "gate": what must hold before the next phase


def start_phases(head: str, workers: list[str], activate: Callable[[str, tuple[str, ...] | None], list[Op]]) -> list[Phase]:
    """The group's start, in order: Ray on the head, Ray on the workers once the head's answers, the head's server
    once `ray status` counts every node, then its gate. activate(host, units): the host's operations that make its
    release live and (re)start those units (None: all of them); deploy, --rollback and a group put back share it."""
    return [
        Phase("start the Ray head", {head: activate(head, (RAY_UNIT,))}, "ray-head"),
        Phase("start the Ray workers", {name: activate(name, None) for name in workers}, "ray-cluster"),
        Phase("start the server on the head", {head: dplan.start_ops([SERVE_UNIT])}, "gate"),
    ]


@dataclass(frozen=True)
class RayCheck:
    """Where `ray status` is asked, on the head, and how many nodes the group's cluster has."""

    head: str  # the head's host name
    release_dir: str  # the release whose ray runs it
    port: int
    num_nodes: int


def start_group(phases: list[Phase], transports, ray: RayCheck, gate: Callable[[], GateResult]) -> GateResult:
    """Walk start_phases: each phase on its hosts at once, then its wait (the head's Ray, every node, the gate);
    the gate's result, or the phase that failed as a failed one."""
    together = FleetRunner(forks=max(len(transports), 1))
    for phase in phases:
        try:
            together.map(lambda item: run_ops(transports[item[0]], item[1]), list(phase.ops.items()))
            if phase.wait in ("ray-head", "ray-cluster"):
                wait_ray(transports[ray.head], ray, 1 if phase.wait == "ray-head" else ray.num_nodes)
            elif phase.wait == "gate":
                return gate()
        except HosttuneError as exc:
            return GateResult(False, phase.description, str(exc))
    return GateResult(True, "done")


def ray_notes(phases: list[Phase], ray: RayCheck) -> dict[str, str]:
    """The waits on the head's Ray, as a plan shows them after their phases."""
    wanted = {"ray-head": 1, "ray-cluster": ray.num_nodes}
    return {p.description: f"wait until `ray status` on {ray.head} counts {wanted[p.wait]} "
                           f"node{'' if wanted[p.wait] == 1 else 's'} (at most {RAY_WAIT_S:g} s)"
            for p in phases if p.wait in wanted}


def phase_lines(phases: list[Phase], name: str, notes: dict[str, str | None]) -> tuple[str, ...]:
    """What the run does on this host, phase by phase; notes: a line after a phase's operations (a check, a gate)."""
    lines = []
    for phase in phases:
        lines += [f"[{phase.description}] {describe(op)}" for op in phase.ops.get(name, [])]
        note = notes.get(phase.description)
        lines += [f"[{phase.description}] {note}"] if note else []
    return tuple(lines)


def parse_ray_nodes(text: str) -> int:
    """Active nodes in `ray status` output."""
    active = text.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in text else ""
    return len(_RAY_NODE.findall(active))


def wait_ray(transport, ray: RayCheck, num_nodes: int, timeout: float = RAY_WAIT_S) -> None:
    """Until `ray status` on the head counts num_nodes active nodes."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        result = transport.read([f"{ray.release_dir}/bin/ray", "status", f"--address=127.0.0.1:{ray.port}"], timeout=60)
        seen = parse_ray_nodes(result.stdout) if result.ok else 0
        if seen >= num_nodes:
            return
        time.sleep(2.0)
    raise DeployError(f"{ray.head}: the Ray cluster has {seen} of {num_nodes} nodes after {timeout:.0f}s")


@dataclass(frozen=True)
class Comeback:
    """A release a host had, to make live again, and what `previous` names once it is."""

    host: str
    release: Release
    link: tuple[Op, ...]


def is_ray_group(releases: list[Release]) -> bool:
    """One Ray head (Ray and the server) and Ray workers."""
    heads = [r for r in releases if SERVE_UNIT in r.units]
    return len(heads) == 1 and all(RAY_UNIT in r.units for r in releases)


def ray_check(head: str, release: Release, num_nodes: int) -> RayCheck:
    return RayCheck(head, release.dir, load_preset(release.engine).multinode.ray_port, num_nodes)


def gate_head(transport, release: Release, settings: ServeSettings) -> GateResult:
    """The head's server, gated as a release brought back is: no warmup."""
    health = load_preset(release.engine).serve.health
    return run_gate(transport, SERVE_UNIT, replace(settings, warmup=0), health, warmup=0, key_file=release.key_file)


def start_again(comebacks: list[Comeback], transports, base: ServeSettings) -> GateResult:
    """Releases that were a Ray group (is_ray_group) live again in the group's order, gated on the head; base: the
    run's deadlines (each release's port is its own)."""
    head = next(c for c in comebacks if SERVE_UNIT in c.release.units)
    by_name = {c.host: c for c in comebacks}

    def activate(name: str, start: tuple[str, ...] | None) -> list[Op]:
        c = by_name[name]
        now = read_state(transports[name], c.release.id, [])
        return dplan.activate_ops(c.release, now, keep_previous=True, start=start) + list(c.link)

    phases = start_phases(head.host, [c.host for c in comebacks if c is not head], activate)
    settings = settings_of(head.release, base)
    return start_group(phases, transports, ray_check(head.host, head.release, len(comebacks)),
                       lambda: gate_head(transports[head.host], head.release, settings))

