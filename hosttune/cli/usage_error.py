"""A bad command line as one line on stderr, exit 2: the command, what is wrong, where its help is.

click and rich would print a usage line, a hint and a boxed message; a script reading stderr, or a person
with a narrow terminal, wants one line that names the option and the value, like every other hosttune error.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import typer
from typer.core import TyperGroup

from hosttune.fleet_runner import EXIT_ERROR
from hosttune.quoting import quote

# The click typer runs on: its own copy in recent typer, the click package in older ones.
click_errors = importlib.import_module(typer.BadParameter.__module__)


def one_line(exc: Any, command: str) -> str:
    """`hosttune deploy: --port 0: input should be greater than or equal to 1 (see hosttune deploy --help)` for a
    click.ClickException; `command` names the command where click's error does not say (`--run` given no value)."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else command
    what = _lower_first(" ".join(_what(exc).split()).rstrip("."))
    return f"{command}: {what} (see {command} --help)"


def _what(exc: Any) -> str:
    """The message, led by the option it is about rather than click's "Invalid value for '--port' / '-p'"."""
    param = getattr(exc, "param", None)
    if type(exc) is not click_errors.BadParameter or param is None:
        return exc.format_message()
    given, message = _validation(exc)
    if given is None or (given and given in message):  # an empty value is in every message, and named nowhere
        return f"{_name(param)}: {message}"
    return f"{_name(param)} {quote(given)}: {_lower_first(message)}"


def _lower_first(text: str) -> str:
    """click's "No such option" and pydantic's "Input should be" read as the middle of a line."""
    return text[:1].lower() + text[1:]


def _validation(exc: Any) -> tuple[str | None, str]:
    """The value given and what is wrong with it, where typer checked it with pydantic (whose message leaves
    the value out); click's own checks already name it."""
    errors = getattr(exc.__cause__, "errors", None)
    if not callable(errors) or not errors():
        return None, exc.message
    first = errors()[0]
    given = first.get("input")
    return (None if given is None else str(given)), exc.message.removeprefix("Value error, ")


def _name(param: Any) -> str:
    """An option's longest flag (--port, not -p); an argument's name (check_id)."""
    if param.param_type_name == "option":
        return max(param.opts, key=len)
    return param.human_readable_name


@contextmanager
def usage_errors_in_one_line(command: Callable[[], str]) -> Iterator[None]:
    """click's usage and parameter errors, printed as one line; the help a bare command asks for is left alone.
    `command()`: the command being parsed when the error came, for errors that do not name it."""
    try:
        yield
    except getattr(click_errors, "NoArgsIsHelpError", ()):
        raise
    except click_errors.ClickException as exc:
        typer.secho(one_line(exc, command()), err=True, fg="red")
        raise typer.Exit(EXIT_ERROR) from None


class OneLineErrorGroup(TyperGroup):
    """The root command: errors in its own options, in a command's name, and in any subcommand's arguments
    (parsed while the root invokes it) all pass through here."""

    def make_context(self, info_name, args, parent=None, **extra):
        with usage_errors_in_one_line(lambda: info_name or "hosttune"):
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx):
        # click names the command being parsed in most errors, not all: the root knows which one it started
        with usage_errors_in_one_line(lambda: " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))):
            return super().invoke(ctx)
