"""Scripted test servers in their own processes, and real-time priority for timing tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """Terminate a child process; kill it if it has not exited within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def scripted_server(*args: str, lifetime: float = 300):
    """Start `python -m hosttune.bench.testserver ARGS`; yield its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hosttune.bench.testserver", "--port", "0",
         "--lifetime", str(lifetime), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and "listening on" not in line:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                break
        if "listening on" not in line:
            raise RuntimeError(f"test server did not start: {line!r}")
        yield line.split("listening on ", 1)[1].strip()
    finally:
        stop_process(process, timeout=10)


@contextmanager
def realtime():
    """Run the body at real-time priority when permitted (root on Linux), then restore.

    For timing-accuracy tests on a machine whose cores other processes share: the
    test measures bench's accuracy, not how long the scheduler makes it wait."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, PermissionError, OSError):
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, policy, param)
