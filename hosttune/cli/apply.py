"""`hosttune apply`, `hosttune rollback` and `hosttune verify`."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from hosttune.plan import render as plan_render
from hosttune.plan.host_plan import HostPlan
from hosttune.plan.state import rooted
from hosttune.cli.app import app
from hosttune.cli.common import (AcceptKeysOpt, DryRunOpt, ForksOpt, InventoryOpt, LimitOpt, YesOpt,
                                 check_writable, emit, go_ahead, image_root, inventory_arg, load, named, only,
                                 path_option, plural, user_errors)
from hosttune.cli.progress import Progress
from hosttune.execute import recap
from hosttune.errors import HosttuneError
from hosttune.execute.journal import RUNS_DIR, new_run_id
from hosttune.execute.rollout import ApplyOptions, apply_plans, dry_run_outcome, plan_fleet, rollback_fleet
from hosttune.fleet import profiles
from hosttune.fleet_runner import Outcome, exit_code
from hosttune.verify import run_verify

RootOpt = typer.Option(None, "--root", help="Write files under this directory (a mounted image or chroot); no live kernel writes.")


class Output(str, Enum):
    text = "text"
    json = "json"


@app.command()
@user_errors
def apply(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (steps, commands, file diffs) and change nothing."),
    yes: bool = YesOpt,
    root: Optional[str] = RootOpt,
    prune_cuda: bool = typer.Option(False, "--prune-cuda", help="Also move stale /usr/local/cuda-* toolkits aside."),
    serial: Optional[int] = typer.Option(None, "--serial", min=1, help="Hosts per batch (default: all at once)."),
    max_fail_percent: Optional[float] = typer.Option(None, "--max-fail-percent", min=0, max=100, help="Stop starting batches once more than this share of hosts failed (default: no limit; needs --serial)."),
    reboot: bool = typer.Option(False, "--reboot", help=(
        "Reboot hosts that need it, a batch at a time; wait for SSH; re-check. Never this machine (the local "
        "transport): hosttune could not wait for its own boot, so the recap says to reboot it by hand.")),
    forks: int = ForksOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
    fmt: Output = typer.Option(Output.text, "--format", help="Plan and recap as text or JSON (with --yes, the recap alone)."),
    output: Optional[Path] = path_option(None, "--output", "-o", help="Write the report to this file (-: standard output)."),
) -> None:
    """Fix what `hosttune check` reports: plan per host, confirm once, then change hosts with backups and a journal.

    Exit code bits as for check: 1 drift left (unfixable or pending reboot; with --dry-run, anything the plan
    would change), 2 a step failed, 4 unreachable.

    Example: hosttune apply --inventory inventories/example.yaml --serial 5 --max-fail-percent 20 --reboot
    """
    check_writable(output)  # the recap of a real run must not be lost after the hosts changed
    root = image_root(root)
    root = None if root == "/" else root  # the running system, as without --root
    if reboot and root:
        raise HosttuneError(f"--reboot reboots running hosts, and --root {root} is an image: leave one of them out")
    if max_fail_percent is not None and serial is None:
        raise HosttuneError("--max-fail-percent stops starting batches once too many hosts failed, and without --serial "
                            "every host is in one batch: give --serial N too")
    inv = load(inventory, limit, accept_new_host_keys)
    wanted = profiles(inv)
    options = ApplyOptions(root, prune_cuda, serial, max_fail_percent, reboot, forks)
    with Progress("planning", total=len(inv.hosts)) as progress:
        plans = plan_fleet(inv, wanted, options,
                           on_host_done=lambda name, plan: progress.advance(name, plan_state(plan)))
    # the hosts apply reboots itself (not this machine: hosttune could not wait for its own boot)
    rebooting = recap.reboot_plan(plans) if reboot and not root else None
    reboots = len(rebooting.rebooted) if rebooting else 0
    if dry_run or not (any(p.steps and not p.error for p in plans) or reboots):
        outcomes = [dry_run_outcome(p) for p in plans]
        text = recap.render_json(outcomes, None, True, reboot=rebooting) if fmt is Output.json else plan_render.render(plans)
        if rebooting and fmt is Output.text:
            text += "\n" + recap.reboot_note(rebooting)
        emit(text, output)
        raise typer.Exit(exit_code(outcomes))
    if fmt is Output.text:
        typer.echo(plan_render.render(plans))
    elif not yes:  # the question is about the plan it shows; with --yes, JSON is the recap alone
        typer.echo(recap.render_json([dry_run_outcome(p) for p in plans], None, True, reboot=rebooting))
    changing = sum(1 for p in plans if p.steps and not p.error)
    question = f"Apply these changes to {changing} {plural(changing, 'host')}" + (f" and reboot {reboots}" if reboots else "") + "?"
    go_ahead(question, yes=yes, dry_run=False)
    run = new_run_id()
    with Progress("applying", total=len(plans)) as progress:
        outcomes = apply_plans(plans, wanted, run, options, on_host_done=lambda name, o: progress.advance(name, o.state))
    inv_path = inventory_arg(inventory)
    emit(recap.render_json(outcomes, run, False, inv_path) if fmt is Output.json else recap.render(outcomes, run, inv_path), output)
    raise typer.Exit(exit_code(outcomes))


def plan_state(plan: HostPlan) -> str:
    if not plan.reachable:
        return "unreachable"
    return "error" if plan.error else "to change" if plan.steps else "ok"


@app.command()
@user_errors
def rollback(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    run: Optional[str] = typer.Option(None, "--run", help="The run to undo, as apply's recap names it (default: each host's latest apply not yet rolled back; a remediate or uncordon step only by its id); one no host has is an error."),
    root: Optional[str] = RootOpt,
    dry_run: bool = DryRunOpt,
    yes: bool = YesOpt,
    forks: int = typer.Option(50, "--forks", "-f", min=1, help="Hosts read and rolled back in parallel."),
    accept_new_host_keys: bool = AcceptKeysOpt,
) -> None:
    """Undo an apply from the journal on each host: files back byte for byte, units and kernel values as they were.

    What each host gets back is printed first; --yes (or an answer on the terminal) acts on it.

    Example: hosttune rollback --inventory inventories/example.yaml --run 20250102T030405Z-1a2b3c --yes
    """
    root = image_root(root)
    run = named(run, "--run", "run", "give a run apply's recap printed, or leave --run out for each host's latest")
    inv = load(inventory, limit, accept_new_host_keys)
    inv_path = inventory_arg(inventory)
    with Progress("reading journals", total=len(inv.hosts)) as progress:
        plans = rollback_fleet(inv, run, root, forks, on_host_done=lambda name, r: progress.advance(name, r.status),
                               dry_run=True, inventory_path=inv_path)
    typer.echo(recap.render_rollback(plans))
    if run and plans and all(p.is_unknown_run for p in plans):  # a mistyped run is not "nothing to do"
        where = f"{rooted(root, RUNS_DIR)} in the image" if root and root != "/" else f"{RUNS_DIR} on each host"
        raise HosttuneError(f"no host has run {run}: give a run apply's recap printed (its journals are under "
                            f"{where}), or leave --run out for each host's latest")
    due = [p for p in plans if p.status is Outcome.PLANNED]
    if not due or not go_ahead(f"Roll back {len(due)} {plural(len(due), 'host')}?", yes=yes, dry_run=dry_run):
        raise typer.Exit(exit_code(plans))
    with Progress("rolling back", total=len(due)) as progress:
        results = rollback_fleet(only(inv, {p.host.name for p in due}), run, root, forks,
                                 on_host_done=lambda name, r: progress.advance(name, r.status), inventory_path=inv_path)
    typer.echo(recap.render_rollback(results))
    raise typer.Exit(exit_code(results + [p for p in plans if p not in due]))


@app.command()
@user_errors
def verify(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    junit_xml: Optional[Path] = path_option(None, "--junit-xml", help="Write a JUnit XML report here."),
    accept_new_host_keys: bool = AcceptKeysOpt,
    pytest_args: Optional[List[str]] = typer.Argument(None, help="Extra pytest arguments (after --)."),
) -> None:
    """Check tuned hosts with the testinfra suite (tests/host), independently of hosttune's probes.

    Exit code: 0 when every host passes, 1 when a test failed; 2 when a host cannot be reached or an input is
    wrong (pytest's arguments too, or ones that select no test), and then nothing is verified.

    Example: hosttune verify --inventory inventories/example.yaml --junit-xml verify.xml
    """
    check_writable(junit_xml, "--junit-xml")
    inv = load(inventory, limit, accept_new_host_keys)
    code = run_verify(inv, profiles(inv), junit_xml=junit_xml, accept_new_host_keys=accept_new_host_keys,
                      pytest_args=tuple(pytest_args or ()))
    raise typer.Exit(code)
