"""The `hosttune` command line. Each command module registers itself on `app`."""

from hosttune.cli.app import app
from hosttune.cli import check as _check  # noqa: F401  (registers check, facts, explain)


def main() -> None:
    app()
