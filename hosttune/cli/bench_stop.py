"""How a signal ends `hosttune bench`: Ctrl-C or SIGTERM during a run ends that run early (loadgen.py) and the
bench with it; between two runs (the next endpoint's or sweep step's model and prompts), where no run catches it, it
ends the bench the same way. Either way the endpoints measured so far are reported and written, and those not
measured are named."""

from __future__ import annotations

import contextlib
import signal
from typing import NoReturn

import typer


def until_stopped(urls: list[str], measure_one, stopped_by) -> tuple:
    """Each endpoint's result in turn; a signal that ended one (or came between two) ends the bench: the endpoints
    after it are not measured (Ctrl-C means stop, not skip to the next endpoint), and stderr names them."""
    results = []
    with _sigterm_interrupts():
        for url in urls:
            try:
                results.append(measure_one(url))
            except KeyboardInterrupt as exc:  # between runs (the next one's model, its prompts): no run caught it
                if not results:
                    _exit_unmeasured(exc)
                _say_not_measured(getattr(exc, "signal_name", "SIGINT"), urls[len(results):])
                break
            if (signal_name := stopped_by(results[-1])) and (rest := urls[len(results):]):
                _say_not_measured(signal_name, rest)
                break
    return tuple(results)


@contextlib.contextmanager
def before_measuring():
    """Checks before the first run (every endpoint's model, say): a signal there ends the bench, which says so."""
    with _sigterm_interrupts():
        try:
            yield
        except KeyboardInterrupt as exc:
            _exit_unmeasured(exc)


def _exit_unmeasured(exc: KeyboardInterrupt) -> NoReturn:
    signal_name = getattr(exc, "signal_name", "SIGINT")
    typer.secho(f"hosttune: {signal_name} ended the bench before anything was measured; nothing was written",
                err=True, fg="yellow")
    raise typer.Exit(128 + signal.Signals[signal_name]) from None


class _Terminated(KeyboardInterrupt):
    """SIGTERM outside a run (whose own handler ends it early): handled as Ctrl-C is there."""

    signal_name = "SIGTERM"


@contextlib.contextmanager
def handling(signum: signal.Signals, handler):
    """`handler` for `signum` inside the block, the caller's again after it (nothing off the main thread, which no
    signal reaches)."""
    try:
        previous = signal.signal(signum, handler)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _sigterm_interrupts():
    def interrupt(*_) -> None:
        raise _Terminated()

    return handling(signal.SIGTERM, interrupt)


def _say_not_measured(signal_name: str, rest: list[str]) -> None:
    typer.secho(f"hosttune: {signal_name} ended the bench: {', '.join(rest)} "
                f"{'was' if len(rest) == 1 else 'were'} not measured", err=True, fg="yellow")
