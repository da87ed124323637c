"""The folder `hosttune bench --out` fills: checked writable before the run, written after it (all of its files,
even through a Ctrl-C or SIGTERM), and an earlier run's result files there removed (result_files)."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from pathlib import Path

import typer

from hosttune.bench import plot, report, report_csv, result_files
from hosttune.cli.bench_stop import handling
from hosttune.cli.common import why_not_written
from hosttune.errors import BenchError


def check_out(folder: Path) -> None:
    """--out is made and written to before the run: a folder that cannot be written fails now, not after it.
    An earlier run's result files there are replaced or removed once this run is written (result_files)."""
    if folder.is_file():
        raise BenchError(f"--out {folder} is a file: give a folder, which the run fills with its result files")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise BenchError(f"cannot write to --out {folder}: {why_not_written(exc)}; choose another folder") from None
    if taken := next((n for n in result_files.NAMES if (folder / n).exists() and not (folder / n).is_file()), None):
        raise BenchError(f"--out {folder} holds a folder named {taken}, where the run writes its {taken}; move it, "
                         "or choose another folder")


def write(outcome: report.Outcome, folder: Path) -> None:
    try:
        with _writing(folder):
            _write_files(outcome, folder)
    except OSError as exc:
        raise BenchError(f"cannot write the results to {folder}: {why_not_written(exc)}") from None


@contextlib.contextmanager
def _writing(folder: Path):
    """Ctrl-C or SIGTERM while the files are written (a second one soon after the first that ended the run, a CI
    job's timeout) waits for them: stopped there, the folder would hold some of this run's files beside none of the
    others."""
    def say(*_) -> None:
        typer.secho(f"hosttune: writing the results to {folder} first; a moment", err=True, fg="yellow")

    with handling(signal.SIGINT, say), handling(signal.SIGTERM, say):
        yield


def _write_files(outcome: report.Outcome, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    report.write_json(outcome, folder / result_files.RESULTS_FILE)
    csv_names = report_csv.write_csv(outcome, folder)
    cdf_runs = list(outcome.runs) or [(p.run, p.summary) for s in outcome.sweeps for p in s.points
                                      if s.max_rate is not None and p.rate == s.max_rate]
    names = plot.write_plots(cdf_runs, list(outcome.sweeps), folder)
    report.write_markdown(outcome, folder / result_files.REPORT_FILE, names)
    written = [result_files.RESULTS_FILE, result_files.REPORT_FILE, *csv_names, *names]
    typer.echo(f"wrote {folder}/{', '.join(written)}", err=True)
    earlier = result_files.remove_earlier(folder, written)
    if earlier:
        typer.echo(f"removed {', '.join(earlier)}: an earlier run's, which this run does not replace", err=True)
