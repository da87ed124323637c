"""The typer application every command module registers on."""

import typer

from hosttune import __version__
from hosttune.cli.usage_error import OneLineErrorGroup

app = typer.Typer(
    name="hosttune",
    cls=OneLineErrorGroup,  # a bad command line is one line on stderr, exit 2
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
