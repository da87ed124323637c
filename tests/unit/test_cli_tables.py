"""Terminal tables: rich's on a terminal, the command's own plain renderer anywhere else."""

from __future__ import annotations

import io

from hosttune.bench import console
from hosttune.cli import tables


def test_a_terminal_table_holds_every_cell_in_bordered_columns():
    text = tables.terminal_table(["metric", "http://a:8000"], [["TTFT P50 (ms)", "12.5"], ["SLO met", "yes"]])
    lines = text.splitlines()
    assert lines[0].startswith("┏") and lines[-1].startswith("└")
    assert "TTFT P50 (ms)" in text and "12.5 │" in text and "yes │" in text  # values right-aligned


def test_the_plain_renderer_is_kept_when_stdout_is_not_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert tables.table_renderer(console.table) is console.table
    monkeypatch.setattr("sys.stdout", Terminal())
    assert tables.table_renderer(console.table) is tables.terminal_table
