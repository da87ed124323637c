"""The progress bar: drawn on a terminal, absent everywhere else, so piped output is unchanged."""

from __future__ import annotations

import enum
import io
import os
import pty
import subprocess
import sys
from pathlib import Path

from hosttune.cli.progress import Progress

ROOT = Path(__file__).resolve().parents[2]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_counts_hosts_and_tallies_their_outcomes():
    stream = Terminal()
    with Progress("apply", total=3, stream=stream, auto_refresh=False) as progress:
        progress.advance("h1", "changed")
        progress.advance("h2", "failed")
        progress.advance("h3", "changed")
    text = stream.getvalue()
    assert "apply" in text and "1/3 hosts" in text and "3/3 hosts" in text
    assert "2 changed, 1 failed (last: h3 changed)" in text
    assert progress.outcomes == {"changed": 2, "failed": 1}


def test_off_a_terminal_nothing_is_written():
    stream = io.StringIO()
    with Progress("apply", total=2, stream=stream) as progress:
        progress.advance("h1", "ok")
        progress.update(2, status="done")
    assert stream.getvalue() == "" and not progress.is_shown


def test_hosts_advance_one_each_tallied_by_their_outcome_word_or_enum():
    class State(enum.Enum):
        DEPLOYED = "deployed"

    with Progress("deploy", total=3, stream=io.StringIO()) as progress:
        for name, state in (("a", State.DEPLOYED), ("b", "failed"), ("c", "deployed")):
            progress.advance(name, state)
    assert progress.num_done == 3 and progress.outcomes == {"deployed": 2, "failed": 1}


def test_timed_work_shows_seconds_of_its_total():
    stream = Terminal()
    with Progress("http://x", total=70, unit="s", stream=stream, auto_refresh=False) as progress:
        progress.update(12.34, status="warm-up | sent 3")
    assert "12.3/70 s" in stream.getvalue() and "warm-up | sent 3" in stream.getvalue()


def run_check(stderr_on_terminal: bool) -> tuple[bytes, bytes, int]:
    """`hosttune check` on this machine with stdout piped and stderr a pseudo-terminal or a pipe."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    main, side = pty.openpty() if stderr_on_terminal else (None, subprocess.PIPE)
    process = subprocess.Popen([sys.executable, "-m", "hosttune", "check"], stdout=subprocess.PIPE, stderr=side,
                               env=env, cwd=ROOT)
    if main is None:
        out, err = process.communicate(timeout=120)
        return out, err, process.returncode
    os.close(side)
    out = process.stdout.read()
    process.wait(timeout=120)
    err = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other side is closed and drained
            break
        if not chunk:
            break
        err += chunk
    os.close(main)
    return out, err, process.returncode


def test_check_draws_its_bar_on_a_terminal_and_prints_the_same_report():
    piped_out, piped_err, piped_code = run_check(stderr_on_terminal=False)
    shown_out, shown_err, shown_code = run_check(stderr_on_terminal=True)
    assert piped_err == b"" and b"checking" in shown_err and b"1/1 hosts" in shown_err
    assert shown_code == piped_code and b"fleet: 1 host," in piped_out
    # the report is the same, but for the probe's own timing on its summary line
    assert [line for line in shown_out.splitlines() if b"s)" not in line] == \
        [line for line in piped_out.splitlines() if b"s)" not in line]


def test_a_note_goes_above_the_bar_on_a_terminal_and_to_stderr_elsewhere(capsys):
    stream = Terminal()
    with Progress("build", unit="steps", stream=stream, auto_refresh=False) as progress:
        progress.note("- pip wheel engine/")
    assert "- pip wheel engine/" in stream.getvalue()
    with Progress("build", unit="steps", stream=io.StringIO()) as progress:
        progress.note("- pip wheel engine/")
    assert capsys.readouterr().err == "- pip wheel engine/\n"
