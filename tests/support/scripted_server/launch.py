"""Start the scripted server in its own process, with this folder's parent on its path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent.parent  # tests/support: where `scripted_server` imports from
START_TIMEOUT = 30.0


def command(*args: str, lifetime: float) -> list[str]:
    """The argv that runs the server on a free port of 127.0.0.1 for at most `lifetime` seconds."""
    return [sys.executable, "-m", "scripted_server", "--port", "0", "--lifetime", str(lifetime), *args]


def environment() -> dict[str, str]:
    paths = [str(SUPPORT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def start(*args: str, lifetime: float = 300, **popen) -> tuple[subprocess.Popen, str]:
    """Start the server; return the process and its base URL once it accepts connections.

    Extra keyword arguments go to `subprocess.Popen` (a `preexec_fn` pinning a core, say)."""
    # stderr is inherited, not piped: nobody reads the pipe after the first line, and a
    # server writing errors into a full pipe would stall.
    process = subprocess.Popen(command(*args, lifetime=lifetime), env=environment(), stdout=subprocess.PIPE,
                               text=True, **popen)
    deadline, line = time.monotonic() + START_TIMEOUT, ""
    while time.monotonic() < deadline and "listening on" not in line:
        line = process.stdout.readline()  # `priority: ...` comes first with --realtime
        if not line and process.poll() is not None:
            break
    if "listening on" not in line:
        stop(process, timeout=10)
        raise RuntimeError(f"scripted server did not start: {line!r}")
    return process, line.split("listening on ", 1)[1].strip()


def stop(process: subprocess.Popen, timeout: float) -> None:
    """Terminate a child process; kill it if it has not exited within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def running(*args: str, lifetime: float = 300):
    """The server for the body of a `with`; yields its base URL and stops it after."""
    process, url = start(*args, lifetime=lifetime)
    try:
        yield url
    finally:
        stop(process, timeout=10)
