"""What every command shares: inventory options, error handling, output."""

from __future__ import annotations

import functools
import os
import select
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

from hosttune.errors import HosttuneError
from hosttune.fleet_runner import EXIT_ERROR
from hosttune.config.inventory import Inventory, load_inventory, local_inventory

def given_path(value: str | Path) -> Path:
    """A path option's value: an empty one (an unset shell variable) is an error, never the current folder."""
    if not str(value).strip():
        raise typer.BadParameter(f"{str(value)!r} names no path: give one, or leave the option out")
    return Path(value)


def path_option(default: Any, *decls: str, help: str) -> typer.models.OptionInfo:  # noqa: A002 - typer's name
    """A file or folder option that refuses an empty value (typer would read it as ".")."""
    return typer.Option(default, *decls, parser=given_path, metavar="<path>", help=help)


def given_text(value: str) -> str:
    """An option's value where empty means nothing (an unset shell variable): an error, never the default."""
    if not value.strip():
        raise typer.BadParameter(f"{value!r} names nothing: give a value, or leave the option out")
    return value


def text_option(default: Any, *decls: str, help: str) -> typer.models.OptionInfo:  # noqa: A002 - typer's name
    """A text option that refuses an empty value rather than falling back to its default."""
    return typer.Option(default, *decls, parser=given_text, metavar="<str>", help=help)


InventoryOpt = path_option(None, "--inventory", "-i", help="Inventory YAML (default: this machine over the local transport).")
LimitOpt = typer.Option(None, "--limit", "-l", help="Only these hosts or groups (comma-separated globs).")
ForksOpt = typer.Option(50, "--forks", "-f", min=1, help="Hosts probed in parallel.")
ReadForksOpt = typer.Option(50, "--forks", "-f", min=1, help="Hosts read in parallel.")  # commands that never probe
AcceptKeysOpt = typer.Option(False, "--accept-new-host-keys", help="Trust and record SSH host keys not yet in known_hosts (changed keys are always refused).")
YesOpt = typer.Option(False, "--yes", "-y", help="Make the changes the plan shows without asking.")
DryRunOpt = typer.Option(False, "--dry-run", help="Print the plan and change nothing.")


def load(inventory: Optional[Path], limit: Optional[str], accept_new_host_keys: bool = False) -> Inventory:
    inv = load_inventory(inventory, accept_new_host_keys=accept_new_host_keys) if inventory else local_inventory()
    return inv.limit(limit)


def named(value: Optional[str], option: str, names: str, instead: str) -> Optional[str]:
    """An option given empty (an unset shell variable) is an error, never the same as leaving it out."""
    if value is not None and not value.strip():
        raise HosttuneError(f"{option} {value!r} names no {names}: {instead}")
    return value


ROOT_INSTEAD = "give the folder the image is mounted at, or leave --root out to change the running system"


def inventory_arg(inventory: Optional[Path]) -> Optional[str]:
    """The inventory as the commands hosttune prints name it (undo, uncordon): absolute, so they work from any folder."""
    return os.path.abspath(inventory) if inventory else None


def image_root(value: Optional[str]) -> Optional[str]:
    """A relative --root as an absolute path: the journal and the recap's undo line name it, and are used from any
    folder. An absolute one is kept as given: `/.` is refused as this host's own root, never taken for `/`."""
    value = named(value, "--root", "directory", ROOT_INSTEAD)
    if value is None or value.startswith("/"):
        return value
    absolute = os.path.join(os.getcwd(), value)
    return normal if (normal := os.path.normpath(absolute)) != "/" else absolute


def only(inv: Inventory, names: set[str]) -> Inventory:
    """The inventory's hosts of these names, in its order."""
    return replace(inv, hosts=tuple(h for h in inv.hosts if h.name in names))


def plural(count: int, noun: str) -> str:
    """"host" or "hosts", as the count wants it."""
    return noun if count == 1 else noun + "s"


def is_terminal() -> bool:
    """Whether someone can answer a question: stdin is a terminal."""
    return sys.stdin.isatty()


def go_ahead(question: str, *, yes: bool, dry_run: bool, needs_yes: str = "") -> bool:
    """The one confirmation of every command that changes hosts, asked once its plan is printed.

    --dry-run: False (only the plan is shown). --yes: True. On a terminal the question is asked;
    without a terminal nothing changes: one line says so and the command exits 2. needs_yes: what
    makes this plan need --yes itself (it takes something away); a terminal's answer is not enough.
    """
    if dry_run:
        return False
    if yes:
        return True
    if needs_yes or not is_terminal():
        why = needs_yes or "no terminal to confirm on"
        typer.secho(f"hosttune: nothing changed: {why}; run again with --yes to make these changes "
                    "(--dry-run only shows them)", err=True, fg="red")
        raise typer.Exit(EXIT_ERROR)
    if not typer.confirm(question, err=True):
        typer.echo("nothing changed", err=True)
        raise typer.Exit(EXIT_ERROR)
    return True


def user_errors(fn):
    """Turn HosttuneError into a one-line message and exit code 2 (usage/probe error).

    Anything else is a bug: one line names it and the file its traceback went to.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HosttuneError as exc:
            typer.secho(f"hosttune: {exc}", err=True, fg="red")
            raise typer.Exit(EXIT_ERROR) from None
        except Exception as exc:  # noqa: BLE001 - the last line of defence against a traceback on the terminal
            if _is_cli_control(exc):
                raise
            if isinstance(exc, BrokenPipeError) and _output_closed():  # `hosttune status | head`: nobody reads on
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at the interpreter's last flush
                raise typer.Exit(EXIT_SIGPIPE) from None
            where = write_traceback(exc)
            typer.secho(f"hosttune: internal error: {type(exc).__name__}: {str(exc)[:200]} (traceback in {where}; "
                        "please report it)", err=True, fg="red")
            raise typer.Exit(EXIT_ERROR) from None

    return wrapper


EXIT_SIGPIPE = 141  # as a command killed by SIGPIPE exits (128 + 13), which shells expect of `| head`


def _output_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (a write to it fails with EPIPE)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (a test runner's buffer)
        return False


def _is_cli_control(exc: Exception) -> bool:
    """typer.Exit, Abort and usage errors: the CLI framework's own control flow, not failures."""
    return isinstance(exc, (typer.Exit, typer.Abort)) or type(exc).__module__.startswith(("click", "typer"))


def crash_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hosttune"


def write_traceback(exc: BaseException) -> str:
    """The traceback in a fresh file under ~/.cache/hosttune (the temp folder if that cannot be written)."""
    text = "".join(traceback.format_exception(exc))
    prefix = f"crash-{time.strftime('%Y%m%dT%H%M%S')}-"
    for directory in (crash_dir(), Path(tempfile.gettempdir())):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=prefix, suffix=".txt", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            return path
        except OSError:
            continue
    return "nowhere: no writable folder"


def why_not_written(exc: OSError) -> str:
    """An OSError of making a file's folder or writing it, as the user can act on it."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):  # mkdir or open met a file where a folder should be
        return "a folder in its path is a file"
    return exc.strerror or str(exc)


def check_writable(path: Optional[Path], option: str = "--output") -> None:
    """A file the command writes when it is done: one that cannot be written fails now, before any host is
    read or changed, not after. Leaves nothing behind."""
    if path is None or is_stdout(path):
        return
    existed = path.exists()
    made = [folder for folder in path.parents if not folder.exists()]  # deepest first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:
            path.unlink()
        for folder in made:  # emit() makes them again once there is something to write
            folder.rmdir()
    except OSError as exc:
        raise HosttuneError(f"cannot write {path}: {why_not_written(exc)}; choose another {option}") from None


def is_stdout(path: Path) -> bool:
    """`-o -`: standard output, as for most tools, not a file named "-"."""
    return str(path) == "-"


def emit(text: str, output: Optional[Path]) -> None:
    if output is None or is_stdout(output):
        typer.echo(text)
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    except OSError as exc:
        raise HosttuneError(f"cannot write {output}: {why_not_written(exc)}; choose another --output") from None
    typer.echo(f"wrote {output}", err=True)


def color_for(output: Optional[Path]):
    """typer.style when printing to a terminal, identity otherwise."""
    if output is None and sys.stdout.isatty():
        return lambda text, c: typer.style(text, fg=c) if c else text
    return None
