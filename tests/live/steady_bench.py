"""`hosttune bench` at a steady open-loop rate in a process of its own, for as long as a rolling deploy
or a remediation takes: it runs until stopped (Ctrl-C's SIGINT, which ends a bench run early with its
report intact), so a slow machine never ends the load before the change under it is done."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LONGEST_S = 1800  # far past any change a live test makes under load


def start_bench(port: int, out: Path, key: str | None = None, max_tokens: int = 8, rate: float = 2) -> subprocess.Popen:
    argv = [sys.executable, "-m", "hosttune", "bench", "--url", f"http://127.0.0.1:{port}", "--rate", str(rate),
            "--burstiness", "100", "--duration", f"{LONGEST_S}s", "--warmup", "0s", "--prompts", "uniform:8-24",
            "--max-tokens", str(max_tokens), "--timeout", "120s", "--max-client-lag", "1s", "--out", str(out)]
    if key:
        argv += ["--api-key", key]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "engine"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_bench(bench: subprocess.Popen) -> str:
    """Stop the bench (it must still be running: the load lasted the whole change) and return its output."""
    assert bench.poll() is None, "the bench ended before the change under it did:\n" + bench.communicate()[0][-2000:]
    bench.send_signal(signal.SIGINT)
    out, _ = bench.communicate(timeout=300)
    assert bench.returncode in (0, 4) and "SIGINT ended the run" in out, out[-2000:]
    return out


def bench_run(out: Path) -> dict:
    """The one run a `hosttune bench --out out` wrote: its requests and clock origin, among the rest."""
    return json.loads((out / "results.json").read_text())["runs"][0]
