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

With --engine, also our own engine (`python -m hosttune_engine serve`, the tiny Qwen2
test model on CPU; needs torch and the engine installed, as scripts/test.sh does):

    hosttune bench --url ENGINE --users 4 --duration 20s --warmup 5s \
        --prompts uniform:16-256 --max-tokens uniform:8-32 --slo ttft=250ms,e2e=1s \
        --out docs/bench-example/engine-cpu
    hosttune bench --url ENGINE --sweep --sweep-start 2 --duration 10s --warmup 3s \
        --prompts uniform:16-256 --max-tokens uniform:8-32 --slo e2e=1s \
        --out docs/bench-example/engine-cpu-sweep

Run: python benchmarks/bench_example_report.py [--engine] [--only-engine] [--sweeps]
(about eight minutes for the scripted part; --sweeps runs only the two sweeps).

A sweep's results.json (8-17 MB of timings) is not kept: each sweep folder keeps steps.json.gz, the
same document with every step's per-request timings left out (each step's settings and summary).

With --from-results it runs nothing: the report.md of each folder that keeps its results.json.gz
(compare, engine-cpu) is written again from those recorded timings by the current report code,
under the run's own command and date; a sweep folder's report.md and latency_vs_rate.png from its
steps.json.gz, by the current report and plot code (its steps' figures as they were measured).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench-example"
FAST = ["--ttft", "0.02", "--ttft-per-prompt-token", "0.00002", "--itl", "0.01", "--capacity", "32"]
SLOW = ["--ttft", "0.04", "--ttft-per-prompt-token", "0.00003", "--itl", "0.012",
        "--capacity", "16", "--max-queue", "16"]
LOAD = ["--prompts", "chat-docs", "--max-tokens", "uniform:32-128"]

sys.path.insert(0, str(ROOT))  # this checkout's hosttune, for --from-results
sys.path.insert(0, str(ROOT / "tests" / "support"))
from scripted_server import launch  # noqa: E402  (test support, not part of the package)


def bench(*args: str) -> None:
    command = [sys.executable, "-m", "hosttune", "bench", *args]
    print("+ hosttune bench " + " ".join(args), flush=True)
    code = subprocess.run(command, cwd=ROOT).returncode
    print(f"exit code {code}", flush=True)


def start_engine(folder: Path) -> tuple[subprocess.Popen, str]:
    """The tiny Qwen2 on CPU, as tests/bench/test_engine_server.py serves it."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_models", ROOT / "engine" / "scripts" / "make_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.make_tiny_models(folder)["qwen2"]
    log_path = folder / "server.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "hosttune_engine", "serve", "--model", str(model), "--port", "0",
         "--device", "cpu", "--served-model-name", "tiny-qwen2"],
        stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log_path.read_text())
        if match and _healthy(match.group(1)):
            return process, match.group(1)
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.terminate()
    raise RuntimeError(f"engine did not start:\n{log_path.read_text()}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def engine_runs(is_sweep_only: bool = False) -> None:
    engine_load = ["--prompts", "uniform:16-256", "--max-tokens", "uniform:8-32"]
    with tempfile.TemporaryDirectory() as folder:
        process, url = start_engine(Path(folder))
        try:
            if not is_sweep_only:
                bench("--url", url, "--users", "4", "--duration", "20s", "--warmup", "5s", *engine_load,
                      "--slo", "ttft=250ms,e2e=1s", "--out", "docs/bench-example/engine-cpu")
            bench("--url", url, "--sweep", "--sweep-start", "2", "--duration", "10s", "--warmup", "3s",
                  *engine_load, "--slo", "e2e=1s", "--out", "docs/bench-example/engine-cpu-sweep")
            keep_steps(OUT / "engine-cpu-sweep")
        finally:
            process.terminate()
            process.wait(timeout=60)


def _request(doc: dict):
    from hosttune.bench.record import RequestRecord

    fields = {k: v for k, v in doc.items() if k not in ("ttft", "e2e")}  # derived from sent, chunks and end
    return RequestRecord(**{**fields, "chunks": array("d", doc["chunks"])})


def _run(doc: dict):
    from hosttune.bench.record import LagSample, RunRecord, ServerSample

    fields = {k: v for k, v in doc.items() if k not in ("summary", "requests", "loop_lag", "server_metrics")}
    return RunRecord(**{**fields, "window": tuple(doc["window"])},
                     requests=tuple(_request(r) for r in doc["requests"]),
                     loop_lag=tuple(LagSample(at, lag) for at, lag in doc["loop_lag"]),
                     server_metrics=tuple(ServerSample(**s) for s in doc["server_metrics"]))


def _option(argv: list[str], name: str, default: str | None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def rendered(folder: Path) -> str:
    """The folder's report.md as the current report code writes it from its results.json.gz, summarized under
    the run's own --slo options."""
    from hosttune.bench import report
    from hosttune.bench.metrics import summarize
    from hosttune.bench.plot import CDF_FILE, TIMELINE_FILE
    from hosttune.bench.units import parse_duration, parse_slo

    doc = json.loads(gzip.decompress((folder / "results.json.gz").read_bytes()))
    argv = shlex.split(doc["command"])
    slo_text = _option(argv, "--slo", None)
    slo = parse_slo(slo_text, float(_option(argv, "--slo-percentile", "95")),
                    float(_option(argv, "--max-error-rate", "0.01"))) if slo_text else None
    lag_limit = parse_duration(_option(argv, "--max-client-lag", "5ms"), "--max-client-lag")
    runs = tuple((run, summarize(run, slo, lag_limit)) for run in map(_run, doc["runs"]))
    return report.markdown(report.Outcome(runs, (), doc["command"], doc["created"]), [CDF_FILE, TIMELINE_FILE])


def keep_steps(folder: Path) -> None:
    """steps.json.gz: the sweep's results.json without its per-request timings, loop lag and server samples."""
    doc = json.loads((folder / "results.json").read_text())
    for sweep in doc["sweeps"]:
        for point in sweep["points"]:
            point.update(requests=[], loop_lag=[], server_metrics=[])
    (folder / "steps.json.gz").write_bytes(gzip.compress(json.dumps(doc, indent=1).encode() + b"\n", mtime=0))


def _summary(doc: dict):
    from hosttune.bench.metrics import ClientLag, LatencyStats, Summary

    stats = {name: doc[name] and LatencyStats(**doc[name]) for name in ("ttft", "itl", "tpot", "e2e")}
    return Summary(**{**doc, **stats, "lag": ClientLag(**doc["lag"])})


def kept_sweeps(folder: Path) -> tuple[dict, list]:
    """A sweep folder's steps.json.gz: the document, and its sweeps as the report and plot code take them."""
    from hosttune.bench.metrics import Slo
    from hosttune.bench.sweep import SweepPoint, SweepResult

    doc = json.loads(gzip.decompress((folder / "steps.json.gz").read_bytes()))
    sweeps = [SweepResult(s["url"], Slo(**s["slo"]),
                          tuple(SweepPoint(p["rate"], _summary(p["summary"]), _run(
                              {k: v for k, v in p.items() if k not in ("is_held", "is_client_bound")}))
                                for p in s["points"]),
                          s["max_rate"], s["first_broken"], s["is_capped"], s["stopped_by"]) for s in doc["sweeps"]]
    return doc, sweeps


def rendered_sweep(folder: Path) -> str:
    """The sweep folder's report.md as the current report code writes it from its steps.json.gz."""
    from hosttune.bench import report
    from hosttune.bench.plot import CDF_FILE, SWEEP_FILE, TIMELINE_FILE

    doc, sweeps = kept_sweeps(folder)
    outcome = report.Outcome((), tuple(sweeps), doc["command"], doc["created"])
    return report.markdown(outcome, [CDF_FILE, TIMELINE_FILE, SWEEP_FILE])


def kept_steps() -> list[Path]:
    """The sweep folders, each with its steps.json.gz."""
    return sorted(steps.parent for steps in OUT.glob("*/steps.json.gz"))


def kept_results() -> list[Path]:
    """The folders whose results.json.gz is committed (the single runs)."""
    return sorted(results.parent for results in OUT.glob("*/results.json.gz"))


def main() -> None:
    if "--from-results" in sys.argv:
        for folder in kept_results():
            (folder / "report.md").write_text(rendered(folder))
            print(f"wrote {folder / 'report.md'}", flush=True)
        for folder in kept_steps():
            from hosttune.bench.plot import SWEEP_FILE, latency_vs_rate

            (folder / "report.md").write_text(rendered_sweep(folder))
            latency_vs_rate(kept_sweeps(folder)[1], folder / SWEEP_FILE)
            print(f"wrote {folder / 'report.md'} and {SWEEP_FILE}", flush=True)
        return
    is_sweep_only = "--sweeps" in sys.argv
    if "--engine" in sys.argv or "--only-engine" in sys.argv:
        engine_runs(is_sweep_only)
    if "--only-engine" in sys.argv:
        return
    servers = [launch.start("--fast", *FAST, lifetime=900), launch.start("--fast", *SLOW, lifetime=900)]
    fast, slow = (url for _, url in servers)
    try:
        if not is_sweep_only:
            bench("--url", fast, "--url", slow, "--users", "32", "--duration", "20s", "--warmup", "5s",
                  *LOAD, "--slo", "ttft=1s,e2e=2s", "--out", str((OUT / "compare").relative_to(ROOT)))
        bench("--url", fast, "--url", slow, "--sweep", "--sweep-start", "4", "--duration", "15s",
              "--warmup", "3s", *LOAD, "--slo", "e2e=2s", "--out", str((OUT / "sweep").relative_to(ROOT)))
        keep_steps(OUT / "sweep")
    finally:
        for process, _ in servers:
            launch.stop(process, timeout=10)


if __name__ == "__main__":
    main()
