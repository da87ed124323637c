"""A server subprocess for tests, and small HTTP helpers (stdlib only, 127.0.0.1 only)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 90


class ServerProcess:
    """`python -m hosttune_engine serve` on a free port, its log in a file."""

    def __init__(self, model: Path, log_dir: Path, extra_args: list[str] = (), env: dict[str, str] | None = None):
        self.log_path = log_dir / "server.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}  # a tiny model gains nothing from more threads
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hosttune_engine", "serve", "--model", str(model), "--port", "0",
             "--device", "cpu", *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.url = self._wait_for_port()

    def log(self) -> str:
        return self.log_path.read_text()

    def _wait_for_port(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", self.log())
            if match:
                return match.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise TimeoutError(f"server did not listen within {START_TIMEOUT_S} s:\n{self.log()}")

    def health(self) -> tuple[int, dict]:
        return get_json(self.url + "/health")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> list[str]:
        """Poll /health until 200; returns the statuses seen on the way."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, body = self.health()
            if not seen or seen[-1] != body.get("status"):
                seen.append(body.get("status"))
            if code == 200:
                return seen
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise TimeoutError(f"server not healthy within {timeout} s:\n{self.log()}")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise
        finally:
            self._log.close()


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post(url: str, body, content_type: str = "application/json", timeout: float = 60,
         headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    """POST raw bytes, a str, or JSON; returns (status, headers, body bytes)."""
    data = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample in Prometheus text, matched by name and a subset of labels."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"{name} {labels} not in metrics")


def wait_idle(server: ServerProcess, timeout: float = 15) -> dict:
    """Wait until no sequence runs or waits and no KV block is held; returns the last /health body."""
    deadline = time.monotonic() + timeout
    body = {}
    while time.monotonic() < deadline:
        _, body = server.health()
        if body["running"] == 0 and body["queued"] == 0 and body["kv_cache_usage"] == 0:
            return body
        time.sleep(0.05)
    raise AssertionError(f"server not idle after {timeout} s: {body}")
