"""The one place build commands run: each in turn, all output into the build log.

A failing command stops the build; the error names the step and shows the log's last lines.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable

from hosttune.build.errors import BuildError
from hosttune.build.plan import BuildCommand

TAIL_LINES = 40


def tail(path: Path, num_lines: int = TAIL_LINES) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=num_lines))
    except OSError:
        return ""


def environment(command: BuildCommand) -> dict[str, str]:
    env = {**os.environ, **command.env}
    if command.path_prepend:
        env["PATH"] = ":".join((*command.path_prepend, os.environ.get("PATH", "")))
    return env


def run_commands(commands: Iterable[BuildCommand], log: Path,
                 on_step: Callable[[BuildCommand], None] | None = None) -> None:
    """Run commands in order, appending their output to `log`; raise BuildError at the first failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    for command in commands:
        if on_step:
            on_step(command)
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"\n### {command.description}\n$ {command.render()}\n")
            fh.flush()
            start = time.monotonic()
            try:
                rc = subprocess.run(command.argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=environment(command), check=False).returncode
            except OSError as exc:
                fh.write(f"cannot run {command.argv[0]}: {exc}\n")
                rc = 127
            fh.write(f"### exit {rc} after {time.monotonic() - start:.1f}s\n")
        if rc != 0:
            raise BuildError(f"build step '{command.description}' failed (exit {rc}); full log: {log}\n"
                             f"--- last lines of the log ---\n{tail(log).rstrip()}")
