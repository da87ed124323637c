"""`hosttune deploy`: an engine as a systemd service per host, with warmup, a health gate and a way back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from hosttune.build.wheelhouse import default_wheelhouse
from hosttune.cli.app import app
from hosttune.cli.build import Engine, WheelhouseOpt
from hosttune.cli.common import (AcceptKeysOpt, ForksOpt, InventoryOpt, LimitOpt, YesOpt, go_ahead, load, only, path_option,
                                 plural, text_option, user_errors)
from hosttune.cli.progress import Progress
from hosttune.deploy import recap
from hosttune.deploy.balancer import check_balancers, plan_lines, upstreams, write_upstreams
from hosttune.deploy.bundled_flags import check_bundled_flags
from hosttune.deploy.canary import CanaryBench, canary_check
from hosttune.deploy.errors import DeployError
from hosttune.deploy.host import HostDeploy
from hosttune.deploy.placement import parse_gpus, parse_replicas
from hosttune.deploy.prune import DEFAULT_KEEP, MIN_KEEP
from hosttune.deploy.request import DeployRequest
from hosttune.deploy.groups import check_whole_groups, check_whole_ray_groups, rollout_units
from hosttune.deploy.rollout import deploy_fleet, rollback_fleet
from hosttune.deploy.settings import Timeouts, parse_sets
from hosttune.deploy.shape import is_one_line
from hosttune.fleet_runner import Outcome, exit_code

# What --rollback uses, and the local folders a wrapper may pass every time; any other option is refused with it.
ROLLBACK_OPTIONS = {"rollback", "inventory", "limit", "dry_run", "yes", "forks", "accept_new_host_keys", "warmup",
                    "health_timeout", "gate_timeout", "wheelhouse", "nginx_dir", "keys_dir"}
WRITTEN = {".service": "router unit", ".py": "router script"}  # what --nginx-dir gets, by suffix; else nginx


@app.command()
@user_errors
def deploy(
    ctx: typer.Context,
    engine: Optional[Engine] = typer.Option(None, "--engine", "-e", help="custom, vllm or sglang, built first with hosttune build (default: the inventory's deploy.engine, else what the host serves)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU indices for the service, e.g. 0-3 (default: the inventory's gpus, all)."),
    tensor_parallel: Optional[int] = typer.Option(None, "--tensor-parallel", "--tp", min=1, help="GPUs per replica (default: the inventory's deploy.tensor_parallel, else what the host serves, else the smallest TP that divides the model's heads and fits its weights)."),
    replicas: Optional[str] = text_option(None, "--replicas", help="Replicas per host: per-gpu (as many as the GPUs hold at that TP) or a number (default: the inventory's deploy.replicas, else what the host serves, else per-gpu)."),
    replicas_per_gpu: Optional[int] = typer.Option(None, "--replicas-per-gpu", min=1, help="Replicas sharing each GPU (each group of TP GPUs), each given that fraction of the engine's memory flag, e.g. 4 small-model replicas on one GPU (default: the inventory's deploy.replicas_per_gpu, else what the host serves, else 1)."),
    session_affinity: Optional[bool] = typer.Option(None, "--session-affinity/--no-session-affinity", help="Host-local nginx: one X-Session-Id keeps its replica (default: the inventory's deploy.session_affinity)."),
    router: Optional[bool] = typer.Option(None, "--router/--no-router", help="Several replicas: a prefix router between the host's nginx and them, so requests that share a prefix reach the replica holding it; a group of several hosts in plain HTTP gets one in front of its hosts too, written to --nginx-dir (default: the inventory's deploy.router)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model folder on the hosts (default: the inventory's deploy.model, else what the host serves)."),
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    port: Optional[int] = typer.Option(None, "--port", "-p", min=1, max=65535, help="Service port (default: the inventory's deploy.port, else what the host serves, else 8000)."),
    serial: Optional[int] = typer.Option(None, "--serial", min=1, help="Hosts per batch (default: all at once)."),
    max_fail_percent: Optional[float] = typer.Option(None, "--max-fail-percent", min=0, max=100, help="Stop starting batches once more than this share of hosts failed (default: no limit; needs --serial)."),
    canary: int = typer.Option(0, "--canary", min=0, help="Deploy the first N hosts first; the rest only when they succeed (and meet --canary-slo)."),
    canary_slo: Optional[str] = text_option(None, "--canary-slo", help="With --canary: a hosttune bench against each canary (needs the bench extra), e.g. e2e=2s,ttft=500ms; a miss stops the rollout."),
    canary_rate: float = typer.Option(1.0, "--canary-rate", min=0.01, help="With --canary-slo: requests per second of the canary bench."),
    canary_duration: str = typer.Option("30s", "--canary-duration", help="With --canary-slo: how long the canary bench runs."),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="FLAG=VALUE for an engine flag, env.NAME=VALUE for the environment; repeatable."),
    rollback: bool = typer.Option(False, "--rollback", help="Make each host's previous release live again, on every host at once (a multi-node group in deploy's order: Ray head, workers, server; options that shape or batch a deploy are refused with it)."),
    wheelhouse: Optional[Path] = WheelhouseOpt,
    ref: Optional[str] = text_option(None, "--ref", help="Deploy the wheels built from this ref (default: the newest build)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", min=0, help="Warmup requests before the gate (default: the inventory's deploy.warmup, else 3)."),
    health_timeout: Optional[float] = typer.Option(None, "--health-timeout", min=1, help="Seconds for the service to load and report healthy (default: the inventory's deploy.health_timeout, else 600)."),
    gate_timeout: Optional[float] = typer.Option(None, "--gate-timeout", min=1, help="Seconds the one-token generation may take (default: the inventory's deploy.gate_timeout, else 60)."),
    nginx_dir: Path = path_option(Path("hosttune-nginx"), "--nginx-dir", help="Where each group of several hosts gets its balancer: hosttune-GROUP.conf for nginx (and, with --router, the router's unit and scripts)."),
    keys_dir: Path = path_option(Path("hosttune-keys"), "--keys-dir", help="Where a group with deploy.api_key: true keeps its generated key (GROUP.key, mode 0600; made by the first deploy, not by --dry-run)."),
    keep_releases: int = typer.Option(DEFAULT_KEEP, "--keep-releases", min=MIN_KEEP, help="Release folders each host keeps under /opt/hosttune/releases once a new one serves: the live one, the one --rollback goes back to, and the newest others; older ones are removed, with the wheel sets under /opt/hosttune/wheels no kept release uses."),
    tune: float = typer.Option(0, "--tune", min=0, help="Seconds the bundled engine (--engine custom) may tune its kernels on each host before its release starts; skipped where the host's GPU, driver and Triton already have a table (0: no tune step)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print each host's release and operations; change nothing."),
    yes: bool = YesOpt,
    forks: int = ForksOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
) -> None:
    """Install an engine release on each host and switch its systemd service to it, gated on a real generation.

    Each host gets /opt/hosttune/releases/<id> (a virtualenv from the wheelhouse) and its
    GPUs placed as replicas × tensor parallel: one replica is hosttune-serve.service on the
    service port; several are hosttune-engine@N.service on the ports after it, each bound to
    its GPUs' NUMA node, behind a host-local nginx on the service port, restarted one at a
    time on a redeploy (out of nginx, drained, gated, back in). A release that fails the gate
    is replaced by the previous one again, with the service's journal tail shown.

    The shape (engine, model, replicas, TP, port, key, nginx front) is the inventory's deploy:;
    an option overrides it for this run, and what neither says keeps what the host serves.
    Each host's plan is printed first; --yes deploys it (or an answer on a terminal),
    --dry-run only prints it. A plan that takes replicas, the front or the key away says so
    and needs --yes.
    Exit code bits: 2 a host failed or was skipped (or nothing was confirmed), 4 unreachable.

    Example: hosttune deploy -i inventories/example.yaml --canary 1 --canary-slo e2e=2s --yes
    """
    _check_gpus(gpus)
    _check_model(model)
    everyone = load(inventory, None, accept_new_host_keys)
    inv = everyone.limit(limit)
    timeouts = Timeouts(warmup, health_timeout, gate_timeout)
    if rollback:
        _rollback_alone(ctx)
        check_whole_groups(everyone, inv, None, limit)
        check_whole_ray_groups(everyone, inv, limit)
        _rollback(inv, timeouts, forks, yes=yes, dry_run=dry_run)
    check_whole_groups(everyone, inv, engine.value if engine else None, limit)
    if max_fail_percent is not None and serial is None:
        raise DeployError("--max-fail-percent stops starting batches once too many hosts failed, and without --serial "
                          "every host is in one batch: give --serial N too")
    _bench_alone(ctx, canary_slo)
    check_balancers(inv, nginx_dir, router)
    request = DeployRequest(
        engine=engine.value if engine else None, model=model, wheelhouse=wheelhouse or default_wheelhouse(), gpus=gpus,
        port=port, overrides=parse_sets(set_ or ()), ref=ref, serial=serial, max_fail_percent=max_fail_percent,
        forks=forks, timeouts=timeouts, tensor_parallel=tensor_parallel,
        replicas=parse_replicas(replicas) if replicas else None, canary=canary, session_affinity=session_affinity,
        router=router, keys_dir=keys_dir, tune_s=tune, replicas_per_gpu=replicas_per_gpu,
        keep_releases=keep_releases, makes_keys=not dry_run)
    flag_check = check_bundled_flags(inv, request.engine, request.overrides, request.ref)
    check = canary_check(CanaryBench(canary_slo, canary_rate, canary_duration) if canary_slo else None, request)
    with Progress("planning", total=len(inv.hosts)) as progress:
        plans = deploy_fleet(inv, replace(request, dry_run=True, serial=None, canary=0),
                             on_host_done=lambda name, d: progress.advance(name, d.state))
    ready = {o.host.name for o in plans if o.state in (Outcome.PLANNED, Outcome.UNCHANGED)}
    order = recap.rollout_line([[h.name for h in unit] for unit in rollout_units(only(inv, ready), request.engine)]
                               if ready else [], serial, canary, max_fail_percent, canary_slo)
    checked = [flag_check] if flag_check and ready else []  # where the flags are checked: for a run to come
    lines = [*checked, *([order] if order else []), *plan_lines(inv, plans, router, nginx_dir), recap.plan_line(plans)]
    typer.echo(recap.render(plans) + "\n" + "\n".join(lines))
    due = [o for o in plans if o.state is Outcome.PLANNED or recap.is_refresh(o)]
    if dry_run or (due and not go_ahead(f"Deploy to {len(due)} {plural(len(due), 'host')}?", yes=yes,
                                        dry_run=dry_run, needs_yes=_taking_away(due))):
        raise typer.Exit(exit_code(plans))
    outcomes = plans  # no host to deploy: the balancer the plan names is written all the same
    if due:
        with Progress("deploying", total=len(ready)) as progress:
            done = deploy_fleet(only(inv, ready), request, canary_check=check,
                                on_batch=lambda batch: progress.note(recap.batch_line(batch)) if serial or canary else None,
                                on_host_done=lambda name, d: progress.advance(name, d.state))
        outcomes = after(plans, done)
        typer.echo(recap.render(outcomes))
    found = upstreams(inv, outcomes, router)
    deployed = tuple(o.host.name for o in outcomes if o.state is Outcome.DEPLOYED)
    for path in write_upstreams(found, nginx_dir, deployed) if found else []:
        typer.echo(f"{WRITTEN.get(path.suffix, 'nginx upstream')}: {path}", err=True)
    raise typer.Exit(exit_code(outcomes))


def _check_gpus(gpus: str | None) -> None:
    """--gpus is read before any host: a CPU deployment never places it, and a typo must not pass unseen."""
    if gpus is None:
        return
    if not gpus.strip():  # "$GPUS" unset: not every GPU, as --gpus left out would be
        raise DeployError("--gpus '': give GPU indices such as 0-3 or 0,2, or leave --gpus out for the inventory's gpus")
    if gpus != "all":
        parse_gpus(gpus)


def _check_model(model: str | None) -> None:
    """--model reaches the units' command line: a line break there (a model id is never read on the host) is refused
    before any host, as the inventory's deploy.model is."""
    if model is not None and not is_one_line(model):
        raise DeployError(f"--model {model!r}: give the model folder on the hosts (or a model id for vLLM and SGLang), "
                          f"on one line")


def _taking_away(due: list[HostDeploy]) -> str:
    """Why this plan needs --yes itself: it removes replicas, a front or a key (the lines marked !)."""
    removing = [o.host.name for o in due if o.removals]
    return (f"the plan takes replicas, the nginx front or the API key away from {', '.join(removing)} (marked !)"
            if removing else "")


def _rollback_alone(ctx: typer.Context) -> None:
    """--rollback brings back each host's previous release as it was, all hosts at once: an option that would
    shape or batch it is refused rather than ignored."""
    given = [p.opts[0] for p in ctx.command.params
             if p.name not in ROLLBACK_OPTIONS and _given(ctx, p.name)]
    if given:
        raise DeployError(f"--rollback makes each host's previous release live again, as it was and on every host at "
                          f"once; it takes no {', '.join(given)}: drop {'it' if len(given) == 1 else 'them'}")


def _bench_alone(ctx: typer.Context, slo: str | None) -> None:
    """The canary bench's settings without the bench (--canary-slo) would change nothing: refused, not ignored."""
    for name, option in (("canary_rate", "--canary-rate"), ("canary_duration", "--canary-duration")):
        if _given(ctx, name) and not slo:
            raise DeployError(f"{option} sets the canary bench, which only --canary-slo runs: give --canary-slo (and "
                              f"--canary N) too, or drop {option}")


def _given(ctx: typer.Context, name: str) -> bool:
    """The option was on the command line (or in the environment), not left to its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _rollback(inv, timeouts: Timeouts, forks: int, *, yes: bool, dry_run: bool) -> None:
    with Progress("reading releases", total=len(inv.hosts)) as progress:
        plans = rollback_fleet(inv, timeouts, forks, dry_run=True, on_host_done=lambda name, d: progress.advance(name, d.state))
    typer.echo(recap.render(plans) + "\n" + recap.plan_line(plans, "roll back"))
    due = [o for o in plans if o.state is Outcome.PLANNED]
    if not due or not go_ahead(f"Roll back {len(due)} {plural(len(due), 'host')}?", yes=yes, dry_run=dry_run,
                               needs_yes=_taking_away(due)):
        raise typer.Exit(exit_code(plans))
    with Progress("rolling back", total=len(due)) as progress:
        done = rollback_fleet(only(inv, {o.host.name for o in due}), timeouts, forks,
                              on_host_done=lambda name, d: progress.advance(name, d.state))
    outcomes = after(plans, done)
    typer.echo(recap.render(outcomes))
    raise typer.Exit(exit_code(outcomes))


def after(plans: list[HostDeploy], done: list[HostDeploy]) -> list[HostDeploy]:
    """Every host in plan order: what was done on it, else its plan (one not due, refused or unchanged)."""
    by_host = {o.host.name: o for o in done}
    return [by_host.get(p.host.name, p) for p in plans]
