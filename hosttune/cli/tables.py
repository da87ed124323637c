"""Tables for a terminal: rich's, with borders, sized to the window, values right-aligned.

Commands use them only when stdout is a terminal; anywhere else the plain renderer of
their own module prints, so piped output and files keep their exact format.
"""

from __future__ import annotations

import sys


def terminal_table(header: list[str], rows: list[list[str]]) -> str:
    """The rows as a rich table, rendered with the terminal's colours and width; the first
    column names a row, the others hold its values."""
    from rich.console import Console
    from rich.table import Column, Table

    table = Table(header[0], *(Column(name, justify="right") for name in header[1:]), header_style="bold")
    for row in rows:
        table.add_row(*row)
    console = Console(file=sys.stdout)
    with console.capture() as captured:
        console.print(table)
    return captured.get().rstrip("\n")


def table_renderer(plain):
    """`terminal_table` when stdout is a terminal, else `plain`."""
    return terminal_table if sys.stdout.isatty() else plain
