"""`hosttune status` (the fleet as its hosts' monitors last saw it) and `hosttune monitor` (one pass on this host,
what apply's timers run)."""

from __future__ import annotations

import os
import tempfile
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from hosttune.checks.service_monitor import ACTIVE_TIMER, METRICS_FILES, STATUS_DIR, STATUS_FILES, TIMER
from hosttune.cli.app import app
from hosttune.cli.common import (AcceptKeysOpt, InventoryOpt, LimitOpt, ReadForksOpt, check_writable, emit, load,
                                 path_option, user_errors, why_not_written)
from hosttune.cli.progress import Progress
from hosttune.errors import HosttuneError
from hosttune.fleet_runner import exit_code
from hosttune.monitor_pass import run_pass
from hosttune.report import status_metrics
from hosttune.report.status_table import render_json, render_table, state
from hosttune.status import read_fleet
from hosttune.status_file import to_json


class StatusFormat(str, Enum):
    table = "table"
    json = "json"


@app.command()
@user_errors
def status(
    inventory: Optional[Path] = InventoryOpt,
    limit: Optional[str] = LimitOpt,
    fmt: StatusFormat = typer.Option(StatusFormat.table, "--format", help="Report format."),
    output: Optional[Path] = path_option(None, "--output", "-o", help="Write the report to this file (-: standard output)."),
    forks: int = ReadForksOpt,
    accept_new_host_keys: bool = AcceptKeysOpt,
) -> None:
    """Print the fleet as each host's monitor last saw it: one small read per host, no probing.

    A host is STALE when a pass has not written its status within two of its intervals plus the time a pass may take (on the host's clock), or never has.

    Exit code bits: 1 drift or stale, 2 error, 4 unreachable host.

    Example: hosttune status --inventory inventories/example.yaml
    """
    check_writable(output)  # before a fleet's worth of reads, not after
    inv = load(inventory, limit, accept_new_host_keys)
    with Progress("reading status", total=len(inv.hosts)) as progress:
        statuses = read_fleet(inv, forks=forks, on_host_done=lambda name, s: progress.advance(name, state(s).lower()))
    emit(render_table(statuses) if fmt is StatusFormat.table else render_json(statuses), output)
    raise typer.Exit(exit_code(statuses))


def write_atomically(path: Path, text: str) -> None:
    """A reader (node_exporter, `hosttune status`) sees the old file or the new one, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise HosttuneError(f"cannot write {path}: {why_not_written(exc)}") from None


def write_each(files: dict[Path, str]) -> None:
    """Every file written on its own: one that cannot be written (its folder broken) leaves the others fresh."""
    problems = []
    for path, text in files.items():
        try:
            write_atomically(path, text)
        except HosttuneError as exc:
            problems.append(str(exc))
    if problems:
        raise HosttuneError("; ".join(problems))


@app.command()
@user_errors
def monitor(
    profile: Path = path_option(..., "--profile", help="The host's profile (apply writes /etc/hosttune/monitor/profile.yaml)."),
    textfile_dir: Path = path_option(..., "--textfile-dir", help="node_exporter's textfile collector directory."),
    active: bool = typer.Option(False, "--active", help="The bounded active pass: GPU load, DCGM's quick diagnostic (refused where the profile's monitor.active_interval_s is null)."),
    status_dir: Path = path_option(Path(STATUS_DIR), "--status-dir", help="Where the status files go; hosttune status reads them only from the default."),
) -> None:
    """Check this host once and write its metrics and status file (what apply's monitor timers run).

    Exit code bits as check's: 1 drift, 2 error.

    Example: hosttune monitor --profile /etc/hosttune/monitor/profile.yaml --textfile-dir /var/lib/node_exporter/textfile_collector
    """
    for option, folder in (("--textfile-dir", textfile_dir), ("--status-dir", status_dir)):
        if not folder.is_absolute():  # an unset "$DIR" reads as the working folder, where nothing reads the files
            raise HosttuneError(f"{option} '{folder}' is not an absolute folder: give the full path (the timers apply installs do)")
    result = run_pass(str(profile), active)
    timer = ACTIVE_TIMER if active else TIMER
    write_each({textfile_dir / METRICS_FILES[timer]: status_metrics.render(result.report, result.doc),
                status_dir / STATUS_FILES[timer]: to_json(result.doc)})
    counts = ", ".join(f"{n} {s}" for s, n in result.doc.counts.items() if n)
    typer.echo(f"{result.doc.host}: " + (f"probe failed: {result.doc.error}" if result.doc.error else counts), err=True)
    raise typer.Exit(exit_code([result.report]))
