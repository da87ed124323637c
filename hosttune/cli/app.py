"""The typer application every command module registers on."""

import typer

app = typer.Typer(
    name="hosttune",
    help="Tune GPU hosts for LLM serving: check, apply, build, deploy, bench, verify.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
