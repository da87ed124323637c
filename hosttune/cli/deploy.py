"""`hosttune deploy`: an engine as a systemd service per host, with warmup, a health gate and a way back."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hosttune.build.wheelhouse import default_wheelhouse
from hosttune.cli.app import app
from hosttune.cli.build import Engine, WheelhouseOpt
from hosttune.cli.common import AcceptKeysOpt, ForksOpt, InventoryOpt, LimitOpt, load, user_errors
from hosttune.cli.progress import Progress
from hosttune.deploy import recap
from hosttune.deploy.canary import CanaryBench, slo_check
from hosttune.deploy.placement import parse_replicas
from hosttune.deploy.errors import DeployError
from hosttune.deploy.rollout import DeployRequest, deploy_fleet, rollback_fleet, upstreams, write_upstreams
from hosttune.deploy.settings import parse_sets
from hosttune.fleet_runner import exit_code


@app.command()
@user_errors
def deploy(
    engine: Optional[Engine] = typer.Option(None, "--engine", "-e", help="custom, vllm or sglang (built first with hosttune build)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU indices for the service, e.g. 0-3 (default: the inventory's gpus, all)."),
    tensor_parallel: Optional[int] = typer.Option(None, "--tensor-parallel", "--tp", min=1, help="GPUs per replica (default: the smallest TP that divides the model's heads and fits its weights)."),
    replicas: str = typer.Option("per-gpu", "--replicas", help="Replicas per host: per-gpu (as many as the GPUs hold at that TP) or a number."),
    session_affinity: Optional[bool] = typer.Option(None, "--session-affinity/--no-session-affinity", help="Host-local nginx: one X-Session-Id keeps its replica (default: the inventory's deploy.session_affinity)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model folder on the hosts."),
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    port: Optional[int] = typer.Option(None, "--port", "-p", help="Service port (default: the inventory's deploy.port, else 8000)."),
    serial: Optional[int] = typer.Option(None, "--serial", min=1, help="Hosts per batch (default: all at once)."),
    max_fail_percent: Optional[float] = typer.Option(None, "--max-fail-percent", min=0, max=100, help="Stop starting batches once more than this share of hosts failed."),
    canary: int = typer.Option(0, "--canary", min=0, help="Deploy the first N hosts first; the rest only when they succeed (and meet --canary-slo)."),
    canary_slo: Optional[str] = typer.Option(None, "--canary-slo", help="After the canaries: a hosttune bench against each, e.g. e2e=2s,ttft=500ms; a miss stops the rollout."),
    canary_rate: float = typer.Option(1.0, "--canary-rate", min=0.01, help="Requests per second of the canary bench."),
    canary_duration: str = typer.Option("30s", "--canary-duration", help="How long the canary bench runs."),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="FLAG=VALUE for an engine flag, env.NAME=VALUE for the environment; repeatable."),
    rollback: bool = typer.Option(False, "--rollback", help="Make each host's previous release live again."),
    wheelhouse: Optional[Path] = WheelhouseOpt,
    ref: Optional[str] = typer.Option(None, "--ref", help="Deploy the wheels built from this ref (default: the newest build)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", min=0, help="Warmup requests before the gate (default 3)."),
    health_timeout: Optional[float] = typer.Option(None, "--health-timeout", min=1, help="Seconds for the service to load and report healthy (default 600)."),
    gate_timeout: Optional[float] = typer.Option(None, "--gate-timeout", min=1, help="Seconds the one-token generation may take (default 60)."),
    nginx_dir: Path = typer.Option(Path("hosttune-nginx"), "--nginx-dir", help="Where nginx upstreams for groups of several replicas are written."),
    keys_dir: Path = typer.Option(Path("hosttune-keys"), "--keys-dir", help="Where a group with deploy.api_key: true keeps its generated key (GROUP.key, mode 0600)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print each host's release and operations; change nothing."),
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
    Exit code bits: 2 a host failed or was skipped, 4 unreachable.

    Example: hosttune deploy --engine vllm --gpus 0-3 --model /models/qwen2.5-7b -i inventories/example.yaml --canary 1 --canary-slo e2e=2s
    """
    inv = load(inventory, limit, accept_new_host_keys)
    timeouts = {"warmup": warmup, "health_timeout_s": health_timeout, "gate_timeout_s": gate_timeout}
    if rollback:
        with Progress("rolling back", total=len(inv.hosts)) as progress:
            outcomes = rollback_fleet(inv, timeouts, forks, on_host_done=lambda name, d: progress.advance(name, d.state))
    else:
        if engine is None or not model:
            raise DeployError("--engine and --model are required (or --rollback)")
        request = DeployRequest(engine.value, model, wheelhouse or default_wheelhouse(), gpus, port,
                                parse_sets(set_ or ()), ref, serial, max_fail_percent, forks, timeouts, dry_run,
                                tensor_parallel, parse_replicas(replicas), canary, session_affinity, keys_dir)
        check = slo_check(CanaryBench(canary_slo, canary_rate, canary_duration), request) \
            if canary and canary_slo and not dry_run else None
        with Progress("deploying", total=len(inv.hosts)) as progress:
            outcomes = deploy_fleet(inv, request, on_batch=lambda done: progress.note(recap.render(done))
                                    if serial or canary else None, canary_check=check,
                                    on_host_done=lambda name, d: progress.advance(name, d.state))
        found = upstreams(inv, request, outcomes) if not dry_run else []
        for path in write_upstreams(found, nginx_dir) if found else []:
            typer.echo(f"nginx upstream: {path}", err=True)
    typer.echo(recap.render(outcomes))
    raise typer.Exit(exit_code(outcomes))
