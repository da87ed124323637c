"""`hosttune remediate` and `hosttune uncordon`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hosttune.cli.app import app
from hosttune.cli.apply import Output
from hosttune.cli.common import AcceptKeysOpt, DryRunOpt, ForksOpt, InventoryOpt, LimitOpt, ReadForksOpt, YesOpt, go_ahead, inventory_arg, load, plural, user_errors
from hosttune.cli.progress import Progress
from hosttune.execute.journal import new_run_id
from hosttune.fleet import profiles
from hosttune.fleet_runner import exit_code
from hosttune.remediate import render
from hosttune.remediate.breaker import BreakerPolicy
from hosttune.remediate.climb import Context, HostRemediation, planned
from hosttune.remediate.cordon import Uncordon, uncordon_host
from hosttune.remediate.fleet import breaker_for, remediate_fleet, state_fleet, survey_fleet
from hosttune.remediate.steps import LadderOptions
from hosttune.remediate.survey import Survey
from hosttune.remediate.xid import XidPolicy


@app.command()
@user_errors
def remediate(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    dry_run: bool = DryRunOpt,
    yes: bool = YesOpt,
    reboot: bool = typer.Option(False, "--reboot", help="Let the ladder reboot a host (and wait for it) before it cordons it."),
    max_cordoned_percent: float = typer.Option(10.0, "--max-cordoned-percent", help="Stop the ladder on every host once more than this percentage of the fleet (0 to 100; 0: the first cordon stops it) would be cordoned within --breaker-window."),
    breaker_window: int = typer.Option(60, "--breaker-window", min=1, help="Minutes over which cordoned hosts count against --max-cordoned-percent."),
    drain_wait: int = typer.Option(60, "--drain-wait", min=0, help="Seconds a drained replica gets to finish its in-flight requests."),
    xid_window: int = typer.Option(24, "--xid-window", min=1, help="Hours over which repeated Xids on a GPU are counted."),
    forks: int = ForksOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
    fmt: Output = typer.Option(Output.text, "--format", help="Plan and recap as text or JSON (with --yes, the recap alone)."),
) -> None:
    """Fix GPU and service faults that `check` finds: for each, the lowest rung of the ladder (restart, drain, diagnose, reset, reboot, cordon), re-checking after each rung before going higher.

    The plan (each fault, its ladder and its first step) is printed first; --dry-run stops there, --yes or a terminal's answer acts on it.

    Exit code bits as for check: 1 a fault left (cordoned, stopped by the breaker), 2 an error, or a host remediate
    cannot see all of (a check its faults come from not judged, a part the probe could not read: the plan names it),
    4 unreachable.

    Example: hosttune remediate -i inventories/example.yaml --max-cordoned-percent 10 --yes
    """
    breaker_policy = BreakerPolicy(max_cordoned_percent, breaker_window * 60.0)
    inv, inv_path = load(inventory, limit, accept_new_host_keys), inventory_arg(inventory)
    wanted, policy = profiles(inv), XidPolicy(window_s=xid_window * 3600.0)
    options = LadderOptions(drain_wait_s=drain_wait, reboot=reboot)
    with Progress("surveying", total=len(inv.hosts)) as progress:
        surveys = survey_fleet(inv, wanted, policy, forks, on_host_done=lambda name, s: progress.advance(name, "done"))
    plans, breaker = [planned(s) for s in surveys], breaker_for(surveys, breaker_policy)
    due = [s for s in surveys if s.faults and not s.is_cordoned and not s.error]
    if fmt is Output.text or dry_run or not yes or not due:  # with --yes, JSON is the recap alone
        typer.echo(render.render_json(plans, None, room=breaker.room, dry_run=dry_run or not yes, options=options)
                   if fmt is Output.json else render.render_plan(plans, options, inv_path))
    if fmt is Output.text and due:
        typer.echo(breaker.summary())
    if not due or not go_ahead(f"Remediate {len(due)} {plural(len(due), 'host')}?", yes=yes, dry_run=dry_run):
        raise typer.Exit(exit_code(plans))
    ctx = Context(wanted, options, policy, breaker, new_run_id())
    results = _climb(plans, due, ctx, forks)
    typer.echo(render.render_json(results, ctx.run, ctx.breaker.why) if fmt is Output.json else render.render_recap(results, ctx.run, inv_path))
    if ctx.breaker.is_open:
        typer.secho(f"hosttune: {ctx.breaker.why}", err=True, fg="red")
    raise typer.Exit(exit_code(results))


def _climb(plans: list[HostRemediation], due: list[Survey], ctx: Context, forks: int) -> list[HostRemediation]:
    """The due hosts' ladders climbed; every host's result in inventory order (the others as planned)."""
    with Progress("remediating", total=len(due)) as progress:
        done = remediate_fleet(due, ctx, forks, on_host_done=lambda name, r: progress.advance(name, "done"))
    by_name = {r.survey.host.name: r for r in done}
    return [by_name.get(p.survey.host.name, p) for p in plans]


@app.command()
@user_errors
def uncordon(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    dry_run: bool = DryRunOpt,
    yes: bool = YesOpt,
    forks: int = ReadForksOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
) -> None:
    """Take cordoned hosts back: the cordon removed, their replicas started, healthy and back in their front.

    The plan (each cordoned host and the operations that take it back) is printed first; --dry-run stops there, --yes or a terminal's answer acts on it.

    Exit code bits: 2 an error, 4 an unreachable host.

    Example: hosttune uncordon -i inventories/example.yaml -l gpu-a100-01 --yes
    """
    inv = load(inventory, limit, accept_new_host_keys)
    surveys = state_fleet(inv, forks)
    due = [s for s in surveys if s.is_cordoned and s.reachable and not s.error]
    typer.echo(render.render_uncordon_plan(surveys))
    if not due or not go_ahead(f"Uncordon {len(due)} {plural(len(due), 'host')}?", yes=yes, dry_run=dry_run):
        raise typer.Exit(exit_code([Uncordon(s) for s in surveys]))  # an unreachable host: 4, whatever else
    run = new_run_id()
    due_names = {s.host.name for s in due}
    results = [uncordon_host(s, run) if s.host.name in due_names else Uncordon(s) for s in surveys]
    for r in results:
        if r.survey.host.name in due_names:
            typer.echo(f"{r.survey.host.name}: " + (f"uncordoned (run {run})" if r.done else f"not uncordoned: {r.error}"))
    raise typer.Exit(exit_code(results))
