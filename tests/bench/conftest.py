"""Fixtures: a scripted test server in its own process, on 127.0.0.1 only."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager

import pytest


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
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def server_factory():
    """Start scripted servers with the given arguments; all stop after the test."""
    stack = []

    def start(*args: str) -> str:
        manager = scripted_server(*args)
        url = manager.__enter__()
        stack.append(manager)
        return url

    yield start
    for manager in reversed(stack):
        manager.__exit__(None, None, None)
