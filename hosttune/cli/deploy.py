"""`hosttune deploy`: an engine as a systemd service per host, with warmup, a health gate and a way back."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hosttune.build.wheelhouse import default_wheelhouse
from hosttune.cli.app import app
from hosttune.cli.build import Engine, WheelhouseOpt
from hosttune.cli.common import AcceptKeysOpt, ForksOpt, InventoryOpt, LimitOpt, load, user_errors
from hosttune.deploy import recap
from hosttune.deploy.errors import DeployError
from hosttune.deploy.rollout import DeployRequest, deploy_fleet, rollback_fleet, upstreams, write_upstreams
from hosttune.deploy.settings import parse_sets


@app.command()
@user_errors
def deploy(
    engine: Optional[Engine] = typer.Option(None, "--engine", "-e", help="custom, vllm or sglang (built first with hosttune build)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU indices for the service, e.g. 0-3 (default: the inventory's gpus, all)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model folder on the hosts."),
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    port: Optional[int] = typer.Option(None, "--port", "-p", help="Service port (default: the inventory's deploy.port, else 8000)."),
    serial: Optional[int] = typer.Option(None, "--serial", min=1, help="Hosts per batch (default: all at once)."),
    max_fail_percent: Optional[float] = typer.Option(None, "--max-fail-percent", min=0, max=100, help="Stop starting batches once more than this share of hosts failed."),
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

    Each host gets /opt/hosttune/releases/<id> (a virtualenv from the wheelhouse) and
    hosttune-serve.service pinned to --gpus and their NUMA node. A release that fails the
    gate is replaced by the previous one again, with the service's journal tail shown.
    Exit code bits: 2 a host failed or was skipped, 4 unreachable.

    Example: hosttune deploy --engine vllm --gpus 0-3 --model /models/qwen2.5-7b -i inventories/example.yaml --serial 2
    """
    inv = load(inventory, limit, accept_new_host_keys)
    timeouts = {"warmup": warmup, "health_timeout_s": health_timeout, "gate_timeout_s": gate_timeout}
    if rollback:
        outcomes = rollback_fleet(inv, timeouts, forks)
    else:
        if engine is None or not model:
            raise DeployError("--engine and --model are required (or --rollback)")
        request = DeployRequest(engine.value, model, wheelhouse or default_wheelhouse(), gpus, port,
                                parse_sets(set_ or ()), ref, serial, max_fail_percent, forks, timeouts, dry_run, keys_dir)
        outcomes = deploy_fleet(inv, request, on_batch=lambda done: typer.echo(recap.render(done), err=True) if serial else None)
        found = upstreams(inv, request, outcomes) if not dry_run else []
        for path in write_upstreams(found, nginx_dir) if found else []:
            typer.echo(f"nginx upstream: {path}", err=True)
    typer.echo(recap.render(outcomes))
    raise typer.Exit(recap.exit_code(outcomes))
