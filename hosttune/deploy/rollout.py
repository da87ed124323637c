"""Deploy across a fleet: decide each host's release from its declared shape, roll hosts in batches
(--serial) within a failure budget (--max-fail-percent), start multi-node vLLM groups in order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hosttune.actions.platform import select
from hosttune.deploy import multinode
from hosttune.deploy.access import access_for
from hosttune.deploy.entry import pick_entry
from hosttune.deploy.errors import DeployError, PlacementError
from hosttune.deploy.front import LOOPBACK, on_loopback
from hosttune.deploy.host import HostDeploy, HostJob, deploy_host, guarded
from hosttune.deploy.group_rollback import rollback_group
from hosttune.deploy.groups import is_multinode, rollout_units
from hosttune.deploy.rollback import rollback_one
from hosttune.deploy.model import ModelShape, context_problem, read_model
from hosttune.deploy.placement import (CPU_DEVICE, PER_GPU, Layout, LayoutRequest, host_abi, plan_layout, preflight,
                                       preflight_host)
from hosttune.deploy.plan import Role, check_sharing, make_release
from hosttune.deploy.ports import check_ports, listeners
from hosttune.deploy.replicas import make_layout_release
from hosttune.deploy.request import DeployRequest, for_host, kept_note
from hosttune.deploy.router import router_ports
from hosttune.deploy.settings import ServeSettings, Timeouts, flag_source, inventory_vars, resolve
from hosttune.deploy.shape import Guard, read_live, record
from hosttune.deploy.state import read_cordon
from hosttune.deploy.units import ROUTER_UNIT
from hosttune.deploy import tune
from hosttune.errors import HosttuneError, TransportError
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host, Inventory
from hosttune.fleet_runner import DEFAULT_FORKS, FleetRunner, Outcome
from hosttune.presets import load_preset
from hosttune.probes.gather import gather
from hosttune.transport import open_transport


# -- deciding --------------------------------------------------------------------------


def make_job(host: Host, facts: Facts, request: DeployRequest, role: Role = Role(), model: ModelShape | None = None) -> HostJob:
    """Everything about one host's deploy, decided from its facts; raises DeployError if it cannot run."""
    preset = load_preset(request.engine)
    settings = _settings(host, preset, request)
    pinned = None if request.ref or _device(settings) == CPU_DEVICE else preset.release_for(facts.gpu.cuda_driver_version,
                                                                                             host.name)
    if pinned:  # the release for this host's CUDA, with the flags it has
        preset = replace(preset, serve=replace(preset.serve, flags={**preset.serve.flags, **pinned.flags}))
        settings = _settings(host, preset, request)
        request = replace(request, ref=pinned.ref)
    if request.gpus and _device(settings) == CPU_DEVICE:
        raise DeployError(f"{host.name}: --gpus {request.gpus}: the engine runs on CPU (device cpu) and would use no "
                          f"GPU; drop --gpus, or the device flag")
    preflight_host(facts, host.name, _device(settings))
    read = model
    model = model or ModelShape(request.model, True)
    if model.path.startswith("/") and not model.exists:
        raise DeployError(f"{host.name}: the model folder {model.path} does not exist on the host; copy it there "
                          f"or fix --model")
    if preset.is_bundled and not model.path.startswith("/"):  # vLLM and SGLang also take a Hugging Face model id
        raise DeployError(f"{host.name}: the bundled engine serves a model folder: give --model its absolute path on "
                          f"the host (got {model.path!r})")
    _check_context(host, preset, settings, request, read)
    if role.kind == "single":
        try:
            layout = plan_layout(LayoutRequest(request.gpus or host.gpus, request.tensor_parallel,
                                               request.replicas or PER_GPU, _device(settings),
                                               request.replicas_per_gpu or 1), facts, model, host.name, settings.port)
        except PlacementError as exc:
            raise PlacementError(f"{exc}{kept_note(request)}") from None
        check_sharing(preset, layout, host.name)
    else:  # a multi-node group: every GPU of the host is one rank set of vLLM's Ray runtime
        layout = multinode.group_layout(host, facts, request, model)
    placement = layout.replicas[0]
    if role.kind != "single":  # multinode.py writes neither the key file nor the front (and makes no key)
        _refuse_guarded_group(host)
    access = access_for(host, request.keys_dir, makes_keys=request.makes_keys)
    if access.front or layout.is_balanced:
        _refuse_exposed_host(host, preset.name, request)
    if access.front:  # one service behind the host's nginx (replicas always are: make_layout_release)
        settings = on_loopback(settings)
    preflight(facts, host.name, layout, _device(settings))
    python, abi = _python(host, facts)
    used = {g for r in layout.replicas for g in r.gpus}
    archs = tuple(sorted({g.compute_cap for g in facts.gpu.gpus if g.index in used and g.compute_cap}))
    entry = pick_entry(request, abi, archs, host.name, facts.gpu.cuda_driver_version if archs else None)
    guard = Guard(len(layout.replicas), bool(access.key), access.front.port if access.front else None)
    shape = record(preset.name, request.model, settings.port, len(layout.replicas), layout.tensor_parallel, guard,
                   layout.replicas_per_gpu)
    release = make_layout_release(preset, settings, layout, entry, host.name, access, shape) \
        if role.kind == "single" else make_release(preset, settings, placement, entry, role, access, shape)
    _check_listeners(host, layout, settings, access, release)
    return HostJob(host, preset, settings, placement, entry, release, python, layout, access, read,
                   select(facts).packages, guard=guard, tune_s=request.tune_s, keep_releases=request.keep_releases)


def _check_context(host: Host, preset, settings: ServeSettings, request: DeployRequest, model: ModelShape | None) -> None:
    """A context length the engine refuses at start (past the model's positions) is refused here, before any change."""
    flag = preset.serve.context_flag
    value = settings.flags.get(flag) if flag else None
    if model is None or isinstance(value, bool) or not isinstance(value, int) or preset.serve.context_env in settings.env:
        return
    problem = context_problem(model, value)
    if problem:
        engine = "the bundled engine" if preset.is_bundled else preset.name
        raise DeployError(f"{host.name}: {flag_source(host, preset, request.overrides, flag, value)}: {problem}, which "
                          f"{engine} refuses at start; give {flag} {model.max_positions} or less")


def _refuse_guarded_group(host: Host) -> None:
    doc = host.deploy
    named = next((k for k in ("api_key", "api_key_file", "nginx") if doc.get(k) not in (None, False)), None)
    if named:
        raise DeployError(f"{host.name}: deploy.{named}: a multi-node vLLM group gets neither the API key file nor "
                          f"the host's nginx front (its units would not start, or not be reachable); leave it out for "
                          f"group {host.group}")


def _refuse_exposed_host(host: Host, engine: str, request: DeployRequest) -> None:
    """Behind the host's nginx the engine listens on 127.0.0.1 (on_loopback): a host flag that says otherwise is
    refused rather than overridden without a word."""
    given = ((f"{host.source}: deploy.{engine}.", inventory_vars(host).get(engine) or {}),
             ("--set ", request.overrides.flags))
    for where, flags in given:
        value = next((flags[k] for k in ("host", "--host") if k in flags), None)
        if value is not None and str(value) != LOOPBACK:
            raise DeployError(f"{where}host={value}: behind the host's nginx (deploy.nginx, or several replicas) the "
                              f"engine listens on 127.0.0.1 only, so callers cannot go around the front: drop it")


def _check_listeners(host: Host, layout: Layout, settings: ServeSettings, access, release) -> None:
    router = router_ports(layout) if ROUTER_UNIT in release.units else None
    check_ports(host.name, listeners(layout, settings.port, access.front.port if access.front else None, router))


def _settings(host: Host, preset, request: DeployRequest) -> ServeSettings:
    settings = resolve(host, preset, request.model, request.port, request.overrides, request.timeouts)
    if request.session_affinity is not None:
        settings = replace(settings, session_affinity=request.session_affinity)
    if request.router is not None:
        settings = replace(settings, router=request.router)
    if settings.router and settings.session_affinity:
        raise DeployError(f"{host.name}: session affinity and the prefix router each choose the replica (by X-Session-Id, "
                          "by prompt prefix): keep one (--no-router or --no-session-affinity, or the inventory's "
                          "deploy.router / deploy.session_affinity)")
    if request.tune_s:
        settings = tune.with_cache(settings, preset.name)
    return settings


def _device(settings: ServeSettings) -> str | None:
    device = settings.flags.get("device")
    return str(device) if device is not None else None


def _python(host: Host, facts: Facts) -> tuple[str, str | None]:
    """The interpreter of the release venv: the inventory's pinned python if the host has it, else python3."""
    pin = host.pins.python
    if pin and f"python{pin}" in facts.pythons:
        major, minor = pin.split(".")[:2]
        return f"python{pin}", f"cp{major}{minor}"
    return "python3", host_abi(facts)


# -- doing ------------------------------------------------------------------------------


def _single(host: Host, request: DeployRequest) -> HostDeploy:
    def attempt() -> HostDeploy:
        with open_transport(host.connection) as transport:
            cordoned = read_cordon(transport)
            if cordoned:  # its front serves nothing: the group balancer leaves it out (serving None)
                return HostDeploy(host, Outcome.FAILED, error=f"nothing changed: {host.name} is {cordoned}")
            facts = gather(transport, timeout=host.probe_timeout_s).facts
            live = read_live(transport)
            try:
                wanted = for_host(host, request, live[0] if live else None)
                model = read_model(transport, wanted.model) if wanted.model.startswith("/") else None
                job = make_job(host, facts, wanted, model=model)
            except HosttuneError as exc:
                return HostDeploy(host, Outcome.FAILED, error=f"nothing changed: {exc}")
            removals = live[1].removals(job.guard) if live else ()
            done = deploy_host(transport, job, dry_run=request.dry_run)  # its own: a front left over one service
            return replace(done, shape=wanted.shape, removals=tuple(dict.fromkeys(removals + done.removals)))

    return guarded(host, attempt)


def _skipped(unit: list[Host], why: str) -> list[HostDeploy]:
    return [HostDeploy(h, Outcome.SKIPPED, error=why) for h in unit]


def deploy_fleet(inventory: Inventory, request: DeployRequest,
                 on_batch: Callable[[list[HostDeploy]], None] | None = None,
                 canary_check: Callable[[list[HostDeploy]], str | None] | None = None,
                 on_host_done: Callable[[str, object], None] | None = None) -> list[HostDeploy]:
    """Deploy batch by batch; once more than --max-fail-percent of the hosts tried failed, the rest is skipped.

    --canary N: the first N hosts go first, alone; when one fails, or canary_check (an SLO bench
    against them) gives a reason, the rest is skipped with that reason.
    """
    runner = FleetRunner(request.forks, request.serial, request.max_fail_percent, on_host_done)
    units = rollout_units(inventory, request.engine)
    canaries, rest = units[:request.canary], units[request.canary:]

    def run_batch(batch: list[list[Host]]) -> list[HostDeploy]:
        done = [o for unit in runner.map(lambda unit: _run_unit(unit, request, runner), batch) for o in unit]
        if on_batch:
            on_batch(done)
        return done

    outcomes = run_batch(canaries) if canaries else []
    why = _canary_verdict(outcomes, canary_check) if canaries else None
    if why:
        return outcomes + [o for unit in rest for o in _skipped(unit, f"not run: {why}")]
    return outcomes + runner.rollout(rest, run_batch, _skipped, before=outcomes)


def _canary_verdict(outcomes: list[HostDeploy], check) -> str | None:
    failed = [o.host.name for o in outcomes if not o.ok]
    if failed:
        return f"the canary {', '.join(failed)} failed"
    return check(outcomes) if check else None


def _run_unit(unit: list[Host], request: DeployRequest, runner: FleetRunner) -> list[HostDeploy]:
    if not is_multinode(unit[0], request.engine):
        done = [_single(unit[0], request)]
    else:
        try:
            group_request = for_host(unit[0], request)
        except DeployError as exc:
            return [HostDeploy(h, Outcome.FAILED, error=f"nothing changed: {exc}") for h in unit]
        done = [replace(o, shape=group_request.shape) for o in multinode.deploy_group(unit, group_request, make_job)]
    for outcome in done:
        runner.done(outcome.host.name, outcome)
    return done


def rollback_fleet(inventory: Inventory, timeouts: Timeouts = Timeouts(), forks: int = DEFAULT_FORKS,
                   on_host_done: Callable[[str, object], None] | None = None, dry_run: bool = False) -> list[HostDeploy]:
    """Each host's previous release live again; dry_run: which release each would go back to, read-only. A group
    with deploy.multinode goes back as one, in deploy's order, where its previous releases are a Ray group."""
    base = timeouts.apply(ServeSettings("", "", 1, {}, {}))
    runner = FleetRunner(forks, on_host_done=on_host_done)

    def one(host: Host) -> HostDeploy:
        with open_transport(host.connection) as transport:
            return rollback_one(transport, host, base, dry_run=dry_run)

    def unit(hosts: list[Host]) -> list[HostDeploy]:
        done = [guarded(hosts[0], lambda: one(hosts[0]))] if len(hosts) == 1 and not is_multinode(hosts[0], "vllm") \
            else _group_or_lost(hosts, lambda: rollback_group(hosts, base, dry_run))
        for outcome in done:
            runner.done(outcome.host.name, outcome)
        return done

    return [o for done in runner.map(unit, rollout_units(inventory, "vllm")) for o in done]


def _group_or_lost(hosts: list[Host], attempt: Callable[[], list[HostDeploy]]) -> list[HostDeploy]:
    """attempt(), with a host that does not answer before anything changed as the group's outcome."""
    try:
        return attempt()
    except TransportError as exc:
        return [HostDeploy(h, Outcome.UNREACHABLE, error=f"nothing changed on group {h.group}: {exc}") for h in hosts]
