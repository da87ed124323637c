"""vLLM across several nodes with its own Ray runtime: the group's first host is the Ray head and
serves; the others are Ray workers. Started in order: head Ray, workers' Ray, wait until the
cluster has every node, then the server on the head, then the gate.

The order is data (`group_phases`: the install, then ray_start.start_phases, which --rollback
shares); `deploy_group` walks it. A failure in any phase puts every host of the group back on
the release it had, in the same order, gated on the head again.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from typing import Callable

from hosttune.actions.base import Command, Op, Remove, Symlink, describe
from hosttune.actions.needs import Need, NeedModel, NeedPort
from hosttune.deploy import plan as dplan
from hosttune.deploy.errors import DeployError
from hosttune.deploy.flagcheck import check_flags, check_line
from hosttune.deploy.gate import GateResult, gate_line, journal_tail, run_gate
from hosttune.deploy.host import HostDeploy, HostJob
from hosttune.deploy.plan import Role
from hosttune.deploy.model import ModelShape, read_model
from hosttune.deploy.placement import PER_GPU, Layout, divisors_of_heads, place, quant_problem
from hosttune.deploy.preconditions import NOT_NGINX, check_job, serve_needs
from hosttune.deploy.prune import prune, prune_lines
from hosttune.deploy.ray_start import (Comeback, Phase, RayCheck, is_ray_group, phase_lines, ray_notes, start_again,
                                       start_group, start_phases)
from hosttune.deploy.release import PREVIOUS, Release, release_name, wheel_path
from hosttune.deploy.restore import read_back
from hosttune.deploy.rolling import fallback_text
from hosttune.deploy.state import HostState, read_cordon, read_state
from hosttune.deploy.units import RAY_UNIT, SERVE_UNIT
from hosttune.execute.perform import run_ops
from hosttune.errors import HosttuneError, TransportError
from hosttune.config.inventory import Host
from hosttune.fleet_runner import FleetRunner, Outcome
from hosttune.probes.gather import gather
from hosttune.transport import open_transport

FALLBACK = "every host of the group goes back to the release it had"


def roles(hosts: list[Host]) -> dict[str, Role]:
    head = hosts[0].connection.address
    n = len(hosts)
    return {h.name: Role("head" if i == 0 else "worker", n, h.connection.address, head) for i, h in enumerate(hosts)}


def group_phases(jobs: list[HostJob], states: dict[str, HostState]) -> list[Phase]:
    head, by_name = jobs[0], {j.host.name: j for j in jobs}

    def activate(name: str, start: tuple[str, ...] | None) -> list[Op]:
        job = by_name[name]
        needs = head_needs(job, states[name]) if job is head else model_needs(job)
        return dplan.activate_ops(job.release, states[name], start=start, requires=needs)

    install = Phase("install releases", {j.host.name: dplan.install_ops(j.release, j.entry, states[j.host.name], j.python)
                                         + dplan.verify_ops(j.release) for j in jobs})
    return [install, *start_phases(head.host.name, [j.host.name for j in jobs[1:]], activate)]


def group_layout(host: Host, facts, request, model: ModelShape) -> Layout:
    """The host's part of the group's one replica: tensor parallel over its GPUs, pipeline parallel over the
    hosts. A shape the group would not serve (another TP, several replicas, a TP the heads refuse) is refused."""
    gpus = request.gpus or host.gpus
    placement = place(gpus, facts, host.name)
    tp, given = placement.tp, f"--gpus {gpus} gives {placement.num_gpus}"
    if request.tensor_parallel not in (None, tp):
        raise DeployError(f"{host.name}: --tensor-parallel {request.tensor_parallel}: a multi-node group runs tensor "
                          f"parallel over each host's GPUs ({given}) and pipeline parallel over its hosts; give --gpus "
                          f"of {request.tensor_parallel} GPUs instead, or leave --tensor-parallel out")
    for option, value, alone in (("--replicas", request.replicas, (None, PER_GPU, "1")),
                                 ("--replicas-per-gpu", request.replicas_per_gpu, (None, 1))):
        if value not in alone:
            raise DeployError(f"{host.name}: {option} {value}: a multi-node group serves one replica over all its "
                              f"hosts; leave {option} out")
    fits = divisors_of_heads(model, len(facts.gpu.gpus) or tp)
    if tp not in fits:
        why = quant_problem(tp, model) or (f"{tp} does not divide {model.path}'s {model.num_heads} attention heads "
                                           f"({model.num_kv_heads} KV heads)")
        raise DeployError(f"{host.name}: a multi-node group runs tensor parallel over each host's GPUs ({given}), and "
                          f"{why}; give each host {_either(fits)} GPU{'' if fits == [1] else 's'} with --gpus")
    return Layout((placement,), 0, "multi-node")


def _either(values: list[int]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def model_needs(job: HostJob) -> tuple[Need, ...]:
    """Every host of the group loads the model from its own folder (each Ray worker its part of the weights)."""
    return (NeedModel(job.model.path, job.preset.name),) if job.model is not None else ()


def head_needs(job: HostJob, state: HostState) -> tuple[Need, ...]:
    """The head's model and ports: the server's (and its front's), and Ray's, which the workers join."""
    return serve_needs(job, state) + (NeedPort(job.preset.multinode.ray_port, NOT_NGINX),)


def checked_phases(phases: list[Phase], jobs: list[HostJob], transports) -> tuple[list[Phase], dict[str, tuple[str, ...]]]:
    """Every host's operations with their preconditions checked (and what the plan adds for them), and each
    host's checks as a plan shows them; DeployError naming the first host that cannot meet them, before
    anything is sent to any."""
    out = [replace(p, ops=dict(p.ops)) for p in phases]
    lines: dict[str, tuple[str, ...]] = {}
    for job in jobs:
        name = job.host.name
        checked = check_job(transports[name], job, [p.ops.get(name, []) for p in phases])
        if checked.error:
            raise DeployError(f"{name}: {checked.error}")
        lines[name] = checked.lines
        for phase, ops in zip(out, checked.groups):
            if name in phase.ops:
                phase.ops[name] = list(ops)
    return out, lines


def _model(transport, path: str) -> ModelShape | None:
    """The model folder as read on the host (None: a model id vLLM fetches, not a folder)."""
    return read_model(transport, path) if path.startswith("/") else None


def deploy_group(hosts: list[Host], request, make_job: Callable) -> list[HostDeploy]:
    with ExitStack() as stack:
        transports = {h.name: stack.enter_context(open_transport(h.connection)) for h in hosts}
        return _deploy_group(hosts, request, make_job, transports)


def _deploy_group(hosts, request, make_job, transports) -> list[HostDeploy]:
    group_roles = roles(hosts)
    together = FleetRunner(forks=len(hosts))  # a phase runs on every host of the group at once
    facts = dict(zip([h.name for h in hosts], together.map(lambda h: _facts_or_loss(transports[h.name], h), hosts)))
    lost = [name for name, f in facts.items() if isinstance(f, TransportError)]
    if lost:  # those hosts unreachable; the group's others wait for them, unchanged
        why = f"nothing changed on group {hosts[0].group}: {', '.join(lost)} did not answer"
        return [HostDeploy(h, Outcome.UNREACHABLE, error=str(facts[h.name])) if h.name in lost
                else HostDeploy(h, Outcome.FAILED, error=why) for h in hosts]
    try:
        _refuse_cordoned(hosts, transports)
        jobs = [make_job(h, facts[h.name], request, group_roles[h.name], model=_model(transports[h.name], request.model))
                for h in hosts]
        states = {j.host.name: read_state(transports[j.host.name], j.release.id, [wheel_path(w) for w in j.release.wheels])
                  for j in jobs}
        unchanged = _unchanged(jobs, states, transports, request.dry_run)
        if unchanged:
            return unchanged
        phases, checks = checked_phases(group_phases(jobs, states), jobs, transports)
    except HosttuneError as exc:
        return [HostDeploy(h, Outcome.FAILED, error=f"nothing changed on group {hosts[0].group}: {exc}") for h in hosts]
    if request.dry_run:
        lost = [n for n, s in states.items() if read_back(transports[n], s.current)[1]]  # what a failed gate cannot put back
        return [HostDeploy(j.host, Outcome.PLANNED, j.release.id, ops=_plan_lines(phases, j, j is jobs[0], states, lost)
                           + _prune_lines(j, states[j.host.name]), checks=checks[j.host.name]) for j in jobs]
    head = jobs[0]
    try:  # installed beside the live releases: the head's engine judges its flags; nothing live changed yet
        together.map(lambda item: run_ops(transports[item[0]], item[1]), list(phases[0].ops.items()))
        check_flags(transports[head.host.name], head, head.release.dir)
    except HosttuneError as exc:
        return [HostDeploy(j.host, Outcome.FAILED, j.release.id, release_name(states[j.host.name].current), error=str(exc))
                for j in jobs]
    gate = start_group(phases[1:], transports, _ray_check(head, len(jobs)),
                       lambda: run_gate(transports[head.host.name], SERVE_UNIT, head.settings, head.preset.serve.health))
    if not gate.ok:
        return _restore_group(jobs, states, transports, gate)
    pruned = together.map(lambda j: prune(transports[j.host.name], states[j.host.name], j.release, j.keep_releases), jobs)
    return [HostDeploy(j.host, Outcome.DEPLOYED, j.release.id, j.release.id, gate if j is head else None, why or None)
            for j, why in zip(jobs, pruned)]


def _refuse_cordoned(hosts: list[Host], transports) -> None:
    """A cordoned host (hosttune remediate) serves nothing, and its group cannot serve without it."""
    for host in hosts:
        cordoned = read_cordon(transports[host.name])
        if cordoned:
            raise DeployError(f"{host.name} is {cordoned}")


def _unchanged(jobs: list[HostJob], states: dict[str, HostState], transports, dry_run: bool) -> list[HostDeploy]:
    """Every host's release is live with its units active, and the head serves (a dry run does not ask): nothing to
    do, and nothing restarted; otherwise [] (a failed gate means: deploy the group again)."""
    if not all(dplan.is_unchanged(j.release, states[j.host.name]) for j in jobs):
        return []
    head = jobs[0]
    gate = None if dry_run else run_gate(transports[head.host.name], SERVE_UNIT, head.settings, head.preset.serve.health,
                                         warmup=0, just_started=False, key_file=head.release.key_file)
    if gate is not None and not gate.ok:
        return []
    return [HostDeploy(j.host, Outcome.UNCHANGED, j.release.id, j.release.id, gate if j is head else None) for j in jobs]


def _plan_lines(phases: list[Phase], job: HostJob, is_head: bool, states: dict[str, HostState],
                lost: list[str]) -> tuple[str, ...]:
    """What the run does on this host, phase by phase: the head checks its engine's flags after the install, waits
    for its Ray and then every node's, and its server's gate ends the group's start. lost: the hosts whose live
    release's release.json cannot be read back."""
    if not is_head:
        return phase_lines(phases, job.host.name, {})
    notes = {**ray_notes(phases, _ray_check(job, len(states))), phases[0].description: check_line(job, job.release.dir),
             phases[-1].description: gate_line(SERVE_UNIT, job.settings, _fallback(states, lost))}
    return phase_lines(phases, job.host.name, notes)


def _fallback(states: dict[str, HostState], lost: list[str]) -> str:
    """What a failed gate leads to, as _restore_group does it: the group back as it was, or each host on its own, the
    units stopped on the hosts that had nothing live and the release left unread where its release.json is (lost)."""
    none = [name for name, state in states.items() if not state.current]
    if not none and not lost:
        return FALLBACK
    if len(none) == len(states):
        return "the group's units are stopped and disabled (nothing was live before)"
    text = "each host goes back on its own to the release it had, ungated"
    if none:
        text += f", and {', '.join(none)}, which had none, {'stops its' if len(none) == 1 else 'stop their'} units"
    return text + (f"; on {', '.join(lost)} {fallback_text(False)}" if lost else "")


def _ray_check(head: HostJob, num_nodes: int) -> RayCheck:
    return RayCheck(head.host.name, head.release.dir, head.preset.multinode.ray_port, num_nodes)


def _prune_lines(job: HostJob, state: HostState) -> tuple[str, ...]:
    """The old release folders this host removes once the group serves."""
    return tuple(prune_lines(state, job.release, job.keep_releases))


def _facts_or_loss(transport, host):
    try:
        return gather(transport, timeout=host.probe_timeout_s).facts
    except TransportError as exc:
        return exc


def _restore_group(jobs, states, transports, gate: GateResult) -> list[HostDeploy]:
    """The group's gate (or a phase) failed: keep the head's journal, then put back what each host had. Releases that
    were a Ray group come back in the group's order and are gated on the head, serving only if it passes; else each
    host's comes back on its own (its units stopped where it had none), workers first."""
    journal = journal_tail(transports[jobs[0].host.name], SERVE_UNIT)
    read = {j.host.name: read_back(transports[j.host.name], states[j.host.name].current) for j in jobs}
    had = {name: release for name, (release, _) in read.items() if release is not None}
    if len(had) == len(jobs) and is_ray_group(list(had.values())):
        comebacks = [Comeback(j.host.name, had[j.host.name], _previous_link(states[j.host.name], j.release)) for j in jobs]
        back = start_again(comebacks, transports, jobs[0].settings)
        note = "" if back.ok else f"; the release it had did not come back healthy: {back.error}"
        return [HostDeploy(j.host, Outcome.FAILED, j.release.id, had[j.host.name].id if back.ok else None, gate,
                           gate.summary() + note, journal if j is jobs[0] else "", had[j.host.name].id) for j in jobs]
    outcomes = [_restore_alone(j, states[j.host.name], transports[j.host.name], read[j.host.name], gate,
                               journal if j is jobs[0] else "") for j in reversed(jobs)]  # workers first, the head last
    return list(reversed(outcomes))


def _previous_link(before: HostState, release: Release) -> tuple[Op, ...]:
    """`previous` as it was before the deploy (never the release live again)."""
    keep = before.previous if before.previous not in (None, before.current) else None
    if before.current == release.dir:  # the deploy restarted the live release: it never moved `previous`
        return ()
    return (Symlink(PREVIOUS, keep),) if keep else (Remove(PREVIOUS),)


def _restore_alone(job, before: HostState, transport, read: tuple[Release | None, str], gate: GateResult,
                   journal: str) -> HostDeploy:
    """One host's release back on its own, ungated (what it had was no Ray group), or its units stopped where it had
    none; read: what it had, or why that cannot be read back."""
    had, unreadable = read
    try:
        if unreadable:
            raise DeployError(unreadable)
        if had is not None:
            run_ops(transport, dplan.activate_ops(had, read_state(transport, had.id, []), keep_previous=True)
                    + list(_previous_link(before, job.release)))
            restored = had.id
        else:
            names = [n for n in (SERVE_UNIT, RAY_UNIT) if n in job.release.units]
            run_ops(transport, [Command(("systemctl", "disable", "--now", *names))])
            restored = None
    except HosttuneError as exc:
        restored, gate = None, GateResult(False, gate.phase, f"{gate.error}; restoring failed: {exc}")
    return HostDeploy(job.host, Outcome.FAILED, job.release.id, restored, gate, gate.summary(), journal, restored)
