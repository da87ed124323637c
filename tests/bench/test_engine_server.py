"""bench against our own engine's server, on CPU, with the tiny Qwen2 model: a real `python -m hosttune_engine serve` process on 127.0.0.1.

The engine's timings are not scripted, so these tests check what must hold against a
real server: prompts of exactly the asked length through its /tokenize (completions and
chat), every output token seen, 429s counted apart, and bench's latencies agreeing with
the server's own histograms in /metrics.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hosttune.bench.benchmark import BenchSpec, measure, run_async
from hosttune.bench.loadgen import Load
from hosttune.bench.metrics import prefix_hit_rate, summarize
from hosttune.bench.record import OK, REJECTED
from scripted_server.launch import stop

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("hosttune_engine") is None
    or importlib.util.find_spec("hosttune_engine.server") is None,
    reason="needs the engine (hosttune_engine.server) and torch: scripts/test.sh installs both",
)

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    """The tiny Qwen2 served on CPU, 4 sequences at a time and 4 waiting, then 429."""
    yield from serve_tiny_qwen2(tmp_path_factory.mktemp("bench-engine"), ["--max-queue", "4"])


def serve_tiny_qwen2(folder: Path, args: list[str], env: dict | None = None):
    """Make the tiny Qwen2 in `folder`, serve it on CPU (4 sequences at a time), yield its URL, stop it."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_models", ROOT / "engine" / "scripts" / "make_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.make_tiny_models(folder)["qwen2"]
    log_path = folder / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "hosttune_engine", "serve", "--model", str(model), "--port", "0",
             "--device", "cpu", "--max-batch-size", "4", *args],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})
    try:
        url = _wait_listening(log_path, process)
        _wait_healthy(url, process, log_path)
        yield url
    finally:
        stop(process, timeout=60)


def _wait_listening(log_path: Path, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log_path.read_text())
        if match:
            return match.group(1)
        if process.poll() is not None:
            raise RuntimeError(f"engine server exited:\n{log_path.read_text()}")
        time.sleep(0.05)
    raise TimeoutError(f"engine server did not listen:\n{log_path.read_text()}")


def _wait_healthy(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if process.poll() is not None:
            raise RuntimeError(f"engine server exited:\n{log_path.read_text()}")
        time.sleep(0.1)
    raise TimeoutError(f"engine server not healthy:\n{log_path.read_text()}")


def _histogram(url: str, name: str) -> tuple[float, float]:
    """(sum, count) of a Prometheus histogram from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values = {}
    for suffix in ("_sum", "_count"):
        match = re.search(rf"^{re.escape(name + suffix)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        values[suffix] = float(match.group(1)) if match else 0.0
    return values["_sum"], values["_count"]


def test_completions_exact_prompts_every_token_and_latencies_match_the_server(engine_url):
    ttft_before = _histogram(engine_url, "vllm:time_to_first_token_seconds")
    e2e_before = _histogram(engine_url, "vllm:e2e_request_latency_seconds")
    spec = BenchSpec(load=Load(users=2, num_requests=8), prompt_lengths="uniform:16-96",
                     output_lengths="8", timeout=120)
    run = run_async(measure(spec, engine_url))
    summary = summarize(run)

    assert run.tokenizer == f"{engine_url}/tokenize"
    assert summary.num_ok == 8, [r.error for r in run.requests]
    for r in run.requests:
        assert r.reported_prompt_tokens == r.prompt_tokens  # exact, through the engine's tokenizer
        assert r.output_tokens == 8 and 1 <= len(r.chunks) <= 8
        assert 0 < r.ttft <= r.e2e
    # The client measures from before sending to after receiving; the server from
    # arrival to sending. So bench's means are a little larger, never smaller.
    ttft_sum, ttft_count = (a - b for a, b in zip(_histogram(engine_url, "vllm:time_to_first_token_seconds"), ttft_before))
    e2e_sum, e2e_count = (a - b for a, b in zip(_histogram(engine_url, "vllm:e2e_request_latency_seconds"), e2e_before))
    assert ttft_count == 8 and e2e_count == 8
    for client_mean, server_mean in ((summary.ttft.mean, ttft_sum / 8), (summary.e2e.mean, e2e_sum / 8)):
        print(f"client {client_mean * 1e3:.2f} ms, server {server_mean * 1e3:.2f} ms")
        assert server_mean - 0.001 <= client_mean <= server_mean + 0.05


def test_chat_prompts_are_exact_with_the_chat_template(engine_url):
    spec = BenchSpec(load=Load(users=2, num_requests=4), api="chat", prompt_lengths="uniform:40-80",
                     output_lengths="4", timeout=120)
    run = run_async(measure(spec, engine_url))
    assert run.tokenizer == f"{engine_url}/tokenize (chat template applied)"
    assert all(r.outcome == OK for r in run.requests), [r.error for r in run.requests]
    assert all(r.reported_prompt_tokens == r.prompt_tokens for r in run.requests)
    assert all(r.output_tokens == 4 for r in run.requests)


def test_overload_is_rejected_with_429_and_counted_apart(engine_url):
    spec = BenchSpec(load=Load(users=12, num_requests=36), prompt_lengths="16", output_lengths="16",
                     timeout=120)
    run = run_async(measure(spec, engine_url))
    summary = summarize(run)
    rejected = [r for r in run.requests if r.outcome == REJECTED]
    assert rejected and all(r.status == 429 for r in rejected)
    assert summary.num_failed == 0 and summary.num_ok + summary.num_rejected == 36
    assert summary.errors_by_status == {"429": len(rejected)}
    assert rejected[0].error.startswith("http 429")


def _counter(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def test_a_shared_prefix_run_reports_the_servers_prefix_cache_hit_rate(engine_url):
    spec = BenchSpec(load=Load(users=4, num_requests=16), api="chat", shared_prefix=(2, 2), prefix_tokens=96,
                     prompt_lengths="uniform:8-16", output_lengths="2", timeout=120, metrics_interval=0.05)
    before = [_counter(engine_url, f"vllm:prefix_cache_{n}_total") for n in ("hits", "queries")]
    run = run_async(measure(spec, engine_url))
    after = [_counter(engine_url, f"vllm:prefix_cache_{n}_total") for n in ("hits", "queries")]
    assert all(r.outcome == OK for r in run.requests), [r.error for r in run.requests]
    rate = prefix_hit_rate(run.server_metrics)
    hits, queries = after[0] - before[0], after[1] - before[1]
    # 16 requests on 2 system prompts of 96 tokens: all but the first of each find it cached
    assert queries > 16 * 96 and hits / queries > 0.6
    # the samples see the counters' increase between the first and the last of them: at most the whole run's
    assert 0.5 < rate <= 1.0 and abs(rate - hits / queries) < 0.15, (rate, hits, queries)
