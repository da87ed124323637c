"""The typer application every command module registers on."""

import inspect

import typer

from hosttune import __version__
from hosttune.cli.usage_error import OneLineErrorGroup


class HosttuneGroup(OneLineErrorGroup):
    """The command group: a bad command line is one line on stderr, exit 2 (OneLineErrorGroup), and a command's help
    flows each paragraph of its docstring to the terminal's width. typer keeps a docstring's single line breaks, so
    at 80 columns each source line broke twice, and on a wide terminal where the source did."""

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.help:
            command.help = flowed(command.help)
        return command


def flowed(text: str) -> str:
    """Each paragraph (blank-line separated) on one line; a paragraph click marks verbatim (\\b) is kept."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)


app = typer.Typer(
    name="hosttune",
    cls=HosttuneGroup,
    help="Tune GPU hosts for LLM serving: check, apply, build, deploy, bench, verify.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"hosttune {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print hosttune's version and exit."),
) -> None:
    pass
