"""`hosttune bench`: production-shaped load against OpenAI-compatible endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hosttune.bench.extra import require_bench_extra
from hosttune.cli.app import app
from hosttune.cli.common import given_text, path_option, text_option, user_errors


@app.command()
@user_errors
def bench(
    ctx: typer.Context,
    url: List[str] = typer.Option(..., "--url", help="Endpoint base URL, e.g. http://gpu-01:8000 (without /v1); repeat to compare endpoints side by side."),
    users: Optional[int] = typer.Option(None, "--users", help="Closed loop: this many users (1 to 100000), each sending its next request when the last one ends (default: 128 without --rate, --trace or --sweep)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Open loop: requests per second, arriving whatever the server does."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape of arrival gaps: 1 Poisson, <1 burstier, >1 steadier."),
    duration: Optional[str] = typer.Option(None, "--duration", help="Measured time after the warm-up, e.g. 10m (default 60s; a sweep's step: 30s)."),
    requests: Optional[int] = typer.Option(None, "--requests", help="Measured requests after the warm-up, instead of --duration."),
    warmup: Optional[str] = text_option(None, "--warmup", help="Requests sent in this first period are not measured (default 10s; with --trace 0s)."),
    prompts: str = typer.Option("chat-docs", "--prompts", help="Prompt lengths in tokens, a distribution: N, uniform:A-B, normal:MEAN,SIGMA[,MIN-MAX], mix:..., chat-docs, jsonl:PATH."),
    max_tokens: str = typer.Option("512", "--max-tokens", help="Output lengths in tokens (the max_tokens asked for), same syntax (jsonl field output_tokens)."),
    dataset: Optional[Path] = path_option(None, "--dataset", help="Prompts from a file: ShareGPT JSON, or JSONL (or a JSON list) of {\"prompt\"} or {\"messages\"} (optional \"output_tokens\")."),
    shared_prefix: Optional[str] = text_option(None, "--shared-prefix", help="NxM: N system prompts, each shared by M users (closed loop: N*M users)."),
    prefix_tokens: int = typer.Option(1024, "--prefix-tokens", help="Length of each shared system prompt, tokens."),
    turns: Optional[int] = typer.Option(None, "--turns", help="Multi-turn conversations: each user's history (with the real answers) grows for this many turns."),
    trace: Optional[Path] = path_option(None, "--trace", help="Replay a JSONL trace of arrival (s) or timestamp (ms), input_length, output_length."),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", help="With --rate or --trace: at most this many requests in flight; later arrivals wait."),
    metrics_interval: str = typer.Option("1s", "--metrics-interval", help="Sample the server's /metrics this often (0: never)."),
    priority: Optional[int] = typer.Option(None, "--priority", help="Send this priority with every request (lower runs first, as in vLLM)."),
    api: str = typer.Option("completions", "--api", help="completions (/v1/completions) or chat (/v1/chat/completions)."),
    model: Optional[str] = text_option(None, "--model", help="Model name to send (default: the first one /v1/models lists)."),
    tokenizer: Optional[Path] = path_option(None, "--tokenizer", help="tokenizer.json (or its folder) to make prompt lengths exact, when the target has no /tokenize."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Limits, e.g. ttft=500ms,tpot=50ms,e2e=2s: goodput, the SLO verdict and the sweep use them."),
    slo_percentile: float = typer.Option(95, "--slo-percentile", help="Percentile the SLO limits apply to: 50, 90, 95 or 99."),
    max_error_rate: float = typer.Option(0.01, "--max-error-rate", help="Largest share of failed or rejected requests the SLO allows (a fraction: 0.01 is 1%)."),
    sweep: bool = typer.Option(False, "--sweep", help="Find the highest open-loop rate that meets the SLO (default SLO: e2e=2s)."),
    sweep_start: float = typer.Option(1.0, "--sweep-start", help="First rate of the sweep, requests/s."),
    sweep_max: float = typer.Option(10_000.0, "--sweep-max", help="Highest rate the sweep tries, requests/s."),
    sweep_growth: float = typer.Option(2.0, "--sweep-growth", help="Rate factor between steps until the SLO breaks."),
    sweep_precision: float = typer.Option(0.05, "--sweep-precision", help="Stop when the bracket is this narrow (fraction)."),
    out: Optional[Path] = path_option(None, "--out", help="Folder for results.json, report.md, CSV files and PNG plots; made, and checked writable, before the run. It holds one run: result files an earlier run left there that this run does not write are removed (other files stay)."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Ask for exactly --max-tokens tokens (vLLM/SGLang/hosttune extension)."),
    timeout: str = typer.Option("10m", "--timeout", help="Longest a single request may take."),
    max_client_lag: str = typer.Option("5ms", "--max-client-lag", help="Flag the run when the client's P99 lag exceeds this."),
    seed: int = typer.Option(0, "--seed", help="Seed for lengths, prompts and arrivals."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", show_envvar=True, parser=given_text, metavar="<str>", help="Sent as 'Authorization: Bearer KEY' (from the environment, a --header Authorization takes its place); redacted in printed and saved command lines."),
    header: Optional[List[str]] = typer.Option(None, "--header", help="NAME=VALUE, an extra request header; repeatable for other names (a name given twice is an error: join a list's values with commas in one); its value is redacted in reports."),
    cacert: Optional[Path] = path_option(None, "--cacert", help="https: trust the CA certificates in this PEM file (a private CA) instead of the system's."),
    insecure: bool = typer.Option(False, "--insecure", help="https: check no certificate at all (a test endpoint only)."),
) -> None:
    """Load-test OpenAI-compatible endpoints the way production traffic does.

    Streams every request, reports TTFT/ITL/TPOT/E2E percentiles, throughput, errors by
    status, goodput under the SLO, and flags runs where the client fell behind. Several
    --url are measured one after another with the same lengths, prompts and arrivals.

    Workloads: random prompts of --prompts lengths (default), --dataset, --shared-prefix,
    --turns (conversations; with --dataset its user turns) or --trace.

    --out writes
    results.json, report.md, CSV files and PNG plots (latencies over time beside the
    server's queue, batch, KV-cache use and preemptions, when it has /metrics); the folder
    then holds this run's results only: an earlier run's result files are replaced, or
    removed where this run writes none of that name, and files of other names stay.

    Ctrl-C (or SIGTERM) ends a run early and still reports it, over the time it ran; a
    second one (or the first, once every request is sent) also cancels those in flight. It ends a sweep too (the step it cut
    short judges no rate), and the endpoints after the one it stopped are not measured.

    Exit code bits: 1 SLO missed (or no rate held in a sweep), 2 usage error (or a run
    measured nothing: every request failed, or none was sent after the warm-up; or a sweep's
    step had every request fail, which ends that sweep, its steps before kept), 4 the
    client fell behind.

    Example: hosttune bench --url http://gpu-01:8000 --users 128 --duration 10m --slo e2e=2s --out bench/
    """
    require_bench_extra()
    from hosttune.cli import bench_run  # aiohttp/uvloop load only when benchmarking

    # what the user wrote (command line or environment), not typer's defaults; typer's vendored click has its own enum
    given = {name for name in ctx.params if ctx.get_parameter_source(name).name in ("COMMANDLINE", "ENVIRONMENT")}
    bench_run.run(given=given, url=url, users=users, rate=rate, burstiness=burstiness, duration=duration, requests=requests, warmup=warmup, prompts=prompts, max_tokens=max_tokens, dataset=dataset, shared_prefix=shared_prefix, prefix_tokens=prefix_tokens, turns=turns, trace=trace, max_concurrency=max_concurrency, metrics_interval=metrics_interval, priority=priority, api=api, model=model, tokenizer=tokenizer, slo=slo, slo_percentile=slo_percentile, max_error_rate=max_error_rate, sweep=sweep, sweep_start=sweep_start, sweep_max=sweep_max, sweep_growth=sweep_growth, sweep_precision=sweep_precision, out=out, ignore_eos=ignore_eos, timeout=timeout, max_client_lag=max_client_lag, seed=seed, api_key=api_key, header=header or [], cacert=cacert, insecure=insecure, api_key_typed=ctx.get_parameter_source("api_key").name == "COMMANDLINE")
