"""Regenerate docs/bench-example/: a real `hosttune bench` run, side by side and swept.

Two scripted OpenAI-compatible servers on 127.0.0.1 stand in for two engine configs:

- "fast": TTFT 20 ms + 20 us per prompt token, a token every 10 ms, 32 requests at a
  time (more wait in a queue);
- "slow": TTFT 40 ms + 30 us per prompt token, a token every 12 ms, 16 at a time, a
  queue of 16, and 429 beyond that.

Then, exactly as a user would:

    hosttune bench --url FAST --url SLOW --users 32 --duration 20s --warmup 5s \
        --prompts chat-docs --max-tokens uniform:32-128 --slo ttft=1s,e2e=2s \
        --out docs/bench-example/compare
    hosttune bench --url FAST --url SLOW --sweep --sweep-start 4 --duration 15s \
        --warmup 3s --prompts chat-docs --max-tokens uniform:32-128 --slo e2e=2s \
        --out docs/bench-example/sweep

Run: python benchmarks/bench_example_report.py (about eight minutes).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench-example"
FAST = ["--ttft", "0.02", "--ttft-per-prompt-token", "0.00002", "--itl", "0.01", "--capacity", "32"]
SLOW = ["--ttft", "0.04", "--ttft-per-prompt-token", "0.00003", "--itl", "0.012",
        "--capacity", "16", "--max-queue", "16"]
LOAD = ["--prompts", "chat-docs", "--max-tokens", "uniform:32-128"]


def start(args: list[str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "hosttune.bench.testserver", "--fast", "--port", "0",
         "--lifetime", "900", *args], stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"server did not start: {line!r}")
    return process, line.split("listening on ", 1)[1].strip()


def bench(*args: str) -> None:
    command = [sys.executable, "-m", "hosttune", "bench", *args]
    print("+ hosttune bench " + " ".join(args), flush=True)
    code = subprocess.run(command, cwd=ROOT).returncode
    print(f"exit code {code}", flush=True)


def main() -> None:
    servers = [start(FAST), start(SLOW)]
    fast, slow = (url for _, url in servers)
    try:
        bench("--url", fast, "--url", slow, "--users", "32", "--duration", "20s", "--warmup", "5s",
              *LOAD, "--slo", "ttft=1s,e2e=2s", "--out", str((OUT / "compare").relative_to(ROOT)))
        bench("--url", fast, "--url", slow, "--sweep", "--sweep-start", "4", "--duration", "15s",
              "--warmup", "3s", *LOAD, "--slo", "e2e=2s", "--out", str((OUT / "sweep").relative_to(ROOT)))
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait(timeout=10)


if __name__ == "__main__":
    main()
