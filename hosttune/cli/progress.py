"""A progress bar on stderr while hosts, build steps or requests finish.

On a terminal it is a rich bar that goes away when the work is done, so what the command
prints afterwards stands alone. When stderr is not a terminal (a pipe, a log, a test) it
prints nothing at all: piped, JSON and JUnit output stay byte for byte what they are
without it.

    with Progress("apply", total=len(hosts)) as progress:
        ...
        progress.advance(host.name, "changed")
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from enum import Enum
from typing import IO, TYPE_CHECKING

import typer

if TYPE_CHECKING:  # rich loads only when a bar is shown: piped runs and tests never pay for it
    from rich.progress import Progress as Bar, TaskID


class Progress:
    """A bar of `total` items (None: unknown, the bar pulses) labelled `label`.

    `advance(name, outcome)` counts one item done and tallies its outcome; `update(...)`
    sets the position outright, for work measured in seconds (a timed bench run). With
    `auto_refresh=False` the bar is redrawn only when told, from the caller's thread: for
    callers on a latency-sensitive event loop, where a drawing thread would compete with it.
    """

    def __init__(self, label: str, total: float | None = None, *, unit: str = "hosts",
                 auto_refresh: bool = True, stream: IO[str] | None = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        self.is_shown = self.stream.isatty()
        self.num_done: float = 0
        self.outcomes: Counter[str] = Counter()
        self._auto_refresh = auto_refresh
        self._lock = threading.Lock()  # fleet runners call advance() from their worker threads
        self._bar: Bar | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Progress:
        if self.is_shown:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(bar_width=24), TextColumn("{task.fields[count]}"),
                       TimeElapsedColumn(), TextColumn("{task.fields[status]}"))
            # transient: the bar goes when done; stdout is the command's output, never redirected onto stderr
            self._bar = Bar(*columns, console=Console(file=self.stream), transient=True,
                            auto_refresh=self._auto_refresh, redirect_stdout=False)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, count=self._count(), status="")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def advance(self, name: str, outcome: str | Enum) -> None:
        """One item (a host, a build step) is done: `name` ended `outcome` (a word, or an Enum
        whose value is one). Thread-safe: a fleet runner's `on_host_done` can be this method."""
        outcome = outcome.value if isinstance(outcome, Enum) else str(outcome)
        with self._lock:
            self.num_done += 1
            self.outcomes[outcome] += 1
            self._show(completed=self.num_done, status=f"{self._tally()} (last: {name} {outcome})")

    def note(self, text: str) -> None:
        """A line for stderr: above the bar while it is shown, else as `typer.echo(err=True)` prints it."""
        if self._bar is None:
            typer.echo(text, err=True)
        else:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def update(self, completed: float, *, status: str = "", label: str | None = None) -> None:
        """Set the bar to `completed` of its total, with a status text and optionally a new label."""
        self.num_done = completed
        self._show(completed=completed, status=status, description=label or self.label)

    def _show(self, **fields) -> None:
        if self._bar is None:
            return
        self._bar.update(self._task, count=self._count(), **fields)
        if not self._auto_refresh:
            self._bar.refresh()

    def _count(self) -> str:
        done = _number(self.num_done)
        return f"{done}/{_number(self.total)} {self.unit}" if self.total is not None else f"{done} {self.unit}"

    def _tally(self) -> str:
        return ", ".join(f"{number} {outcome}" for outcome, number in self.outcomes.items())


def _number(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.1f}"
