"""`hosttune check`, `hosttune facts` and `hosttune explain`."""

from __future__ import annotations

from enum import Enum
from functools import reduce
from operator import or_
from pathlib import Path
from typing import Optional

import typer

from hosttune import report
from hosttune.actions import ACTIONS
from hosttune.checks import get_check
from hosttune.cli.app import app
from hosttune.cli.common import (AcceptKeysOpt, ForksOpt, InventoryOpt, LimitOpt, check_writable, color_for, emit, load,
                                 path_option, user_errors)
from hosttune.cli.progress import Progress
from hosttune.fleet import HostReport, check_fleet
from hosttune.fleet_runner import exit_code
from hosttune.errors import HosttuneError
from hosttune.remediate.rungs import Rung, explain_lines, rung_named
from hosttune.report.jsonout import facts_json


class Format(str, Enum):
    table = "table"
    json = "json"
    junit = "junit"
    prometheus = "prometheus"


@app.command()
@user_errors
def check(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    fmt: Format = typer.Option(Format.table, "--format", help="Report format."),
    output: Optional[Path] = path_option(None, "--output", "-o", help="Write the report to this file (-: standard output)."),
    forks: int = ForksOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Table: each not-applicable check on its own line, in order, with its reason (default: one line per reason)."),
    active: bool = typer.Option(
        False, "--active",
        help="Also load each host's GPUs for a few seconds (DCGM's quick diagnostic where installed, "
             "all-reduce bandwidth on several GPUs) and judge clocks under that load. Changes no setting."),
) -> None:
    """Report how each host differs from its profile (desired / configured / active).

    Exit code bits: 1 drift or pending reboot, 2 probe or usage error, 4 unreachable host.

    Example: hosttune check --inventory inventories/example.yaml --limit a100 --format junit -o check.xml
    """
    check_writable(output)
    inv = load(inventory, limit, accept_new_host_keys)
    with Progress("loading GPUs and checking" if active else "checking", total=len(inv.hosts)) as progress:
        reports = check_fleet(inv, forks=forks, on_host_done=on_report(progress), active=active)
    if fmt is Format.table:
        emit(report.render("table", reports, color=color_for(output), verbose=verbose), output)
    else:
        emit(report.render(fmt.value, reports), output)
    raise typer.Exit(exit_code(reports))


@app.command()
@user_errors
def facts(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    output: Optional[Path] = path_option(None, "--output", "-o", help="Write the JSON to this file (-: standard output)."),
    forks: int = ForksOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
) -> None:
    """Dump the raw facts the probes gathered from each host, as JSON.

    Exit code bits: 2 probe or usage error, 4 unreachable host (drift is check's: facts never sets 1).

    Example: hosttune facts --inventory inventories/example.yaml --limit gpu-a100-01
    """
    check_writable(output)
    inv = load(inventory, limit, accept_new_host_keys)
    with Progress("probing", total=len(inv.hosts)) as progress:
        reports = check_fleet(inv, forks=forks, on_host_done=on_report(progress))
    emit(facts_json(reports), output)
    raise typer.Exit(reduce(or_, (r.probe_exit_bits for r in reports), 0))


def on_report(progress: Progress):
    """check_fleet's callback: each host's report advances the bar."""
    return lambda name, report: progress.advance(name, host_state(report))


def host_state(report: HostReport) -> str:
    if not report.reachable:
        return "unreachable"
    if report.error or report.exit_bits & ~1:
        return "error"
    return "drift" if report.exit_bits else "ok"


@app.command()
@user_errors
def explain(check_id: str = typer.Argument(..., help="A check id, e.g. irq.irqbalance, or a remediation step, e.g. remediate.reset.")) -> None:
    """Say why a check matters for serving and what `hosttune apply` does about it, or what a remediation step does.

    Example: hosttune explain cpu.cstates
    """
    if check_id.strip().lower().startswith("remediate."):  # in any case, as a check id
        typer.echo("\n".join(explain_lines(rung_named(check_id.strip()[len("remediate."):]))))
        return
    try:
        c = get_check(check_id)
    except HosttuneError as exc:  # the argument may name a remediation step too
        raise HosttuneError(f"{exc}; remediation steps: {', '.join(f'remediate.{r}' for r in Rung)}") from None
    typer.echo(f"{c.id}: {c.title} (severity {c.severity.value})")
    typer.echo(f"why: {c.why}")
    typer.echo(f"fix: {c.remediation}" + (" (needs a reboot)" if c.needs_reboot else ""))
    typer.echo(f"apply: {'does this fix (apply --dry-run shows the plan)' if c.id in ACTIONS else NO_APPLY}")
    if c.not_applicable:
        typer.echo(f"not applicable on: {c.not_applicable}")


NO_APPLY = "no automatic fix: it reports the finding and changes nothing for it; the fix is by hand"
