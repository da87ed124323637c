"""`hosttune bench`: production-shaped load against OpenAI-compatible endpoints."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from hosttune.bench import console, plot, report
from hosttune.bench.benchmark import BenchSpec, measure, run_async
from hosttune.bench.loadgen import Load
from hosttune.bench.metrics import Slo, summarize
from hosttune.bench.sweep import SweepConfig, sweep as run_sweep
from hosttune.bench.units import parse_duration, parse_slo
from hosttune.cli.app import app
from hosttune.cli.common import user_errors
from hosttune.errors import BenchError

EXIT_SLO_MISSED = 1
EXIT_CLIENT_BEHIND = 4
DEFAULT_SWEEP_SLO = "e2e=2s"  # the seed's "max RPS while P95 stays under 2 s"


@app.command()
@user_errors
def bench(
    url: List[str] = typer.Option(..., "--url", help="Endpoint base URL; repeat to compare endpoints side by side."),
    users: Optional[int] = typer.Option(None, "--users", help="Closed loop: this many users, each sending its next request when the last one ends."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Open loop: requests per second, arriving whatever the server does."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape of arrival gaps: 1 Poisson, <1 burstier, >1 steadier."),
    duration: Optional[str] = typer.Option(None, "--duration", help="Measured time after the warm-up, e.g. 10m (default 60s; a sweep's step: 30s)."),
    requests: Optional[int] = typer.Option(None, "--requests", help="Measured requests after the warm-up, instead of --duration."),
    warmup: str = typer.Option("10s", "--warmup", help="Requests sent in this first period are not measured."),
    prompts: str = typer.Option("chat-docs", "--prompts", help="Prompt length distribution: N, uniform:A-B, normal:MEAN,SIGMA[,MIN-MAX], mix:..., chat-docs, jsonl:PATH."),
    max_tokens: str = typer.Option("512", "--max-tokens", help="Output length distribution, same syntax (jsonl field output_tokens)."),
    api: str = typer.Option("completions", "--api", help="completions (/v1/completions) or chat (/v1/chat/completions)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to send (default: the first one /v1/models lists)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="tokenizer.json (or its folder) to make prompt lengths exact, when the target has no /tokenize."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Limits, e.g. ttft=500ms,tpot=50ms,e2e=2s: goodput, the SLO verdict and the sweep use them."),
    slo_percentile: float = typer.Option(95, "--slo-percentile", help="Percentile the SLO limits apply to: 50, 90, 95 or 99."),
    max_error_rate: float = typer.Option(0.01, "--max-error-rate", help="Largest share of failed or rejected requests the SLO allows."),
    sweep: bool = typer.Option(False, "--sweep", help="Find the highest open-loop rate that meets the SLO (default SLO: e2e=2s)."),
    sweep_start: float = typer.Option(1.0, "--sweep-start", help="First rate of the sweep, requests/s."),
    sweep_max: float = typer.Option(10_000.0, "--sweep-max", help="Highest rate the sweep tries."),
    sweep_growth: float = typer.Option(2.0, "--sweep-growth", help="Rate factor between steps until the SLO breaks."),
    sweep_precision: float = typer.Option(0.05, "--sweep-precision", help="Stop when the bracket is this narrow (fraction)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for results.json, report.md and PNG plots."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Ask for exactly --max-tokens tokens (vLLM/SGLang/hosttune extension)."),
    timeout: str = typer.Option("10m", "--timeout", help="Longest a single request may take."),
    max_client_lag: str = typer.Option("5ms", "--max-client-lag", help="Flag the run when the client's P99 lag exceeds this."),
    seed: int = typer.Option(0, "--seed", help="Seed for lengths, prompts and arrivals."),
) -> None:
    """Load-test OpenAI-compatible endpoints the way production traffic does.

    Streams every request, reports TTFT/ITL/TPOT/E2E percentiles, throughput, errors by
    status, goodput under the SLO, and flags runs where the client fell behind. Several
    --url are measured one after another with the same lengths, prompts and arrivals.
    Exit code bits: 1 SLO missed (or no rate held in a sweep), 2 usage error,
    4 the client fell behind.

    Example: hosttune bench --url http://gpu-01:8000 --users 128 --duration 10m --slo e2e=2s --out bench/
    """
    slo_value = _slo(slo or (DEFAULT_SWEEP_SLO if sweep else None), slo_percentile, max_error_rate)
    spec = BenchSpec(
        load=_load(users, rate, burstiness, duration, requests, warmup, timeout, seed, sweep, sweep_start),
        prompt_lengths=prompts, output_lengths=max_tokens, api=api, model=model,
        tokenizer=tokenizer, timeout=parse_duration(timeout, "--timeout"), slo=slo_value,
        lag_limit=parse_duration(max_client_lag, "--max-client-lag"), is_ignore_eos=ignore_eos,
    )
    command = "hosttune bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    if sweep:
        config = SweepConfig(sweep_start, sweep_max, sweep_growth, sweep_precision)
        outcome = report.Outcome((), tuple(_sweep_one(spec, u, slo_value, config) for u in url), command, report.now_text())
        typer.echo(console.sweep_table(list(outcome.sweeps)))
    else:
        outcome = report.Outcome(tuple(_run_one(spec, u) for u in url), (), command, report.now_text())
        typer.echo(console.summary_table(list(outcome.runs)))
    if out is not None:
        _write(outcome, out)
    raise typer.Exit(_exit_code(outcome))


def _slo(text: Optional[str], percentile: float, max_error_rate: float) -> Optional[Slo]:
    return parse_slo(text, percentile, max_error_rate) if text else None


def _load(users, rate, burstiness, duration, requests, warmup, timeout, seed, is_sweep, sweep_start) -> Load:
    if duration is not None and requests is not None:
        raise BenchError("give either --duration or --requests, not both")
    if is_sweep:
        users, rate = None, sweep_start
    elif users is None and rate is None:
        users = 128
    seconds = None if requests is not None else parse_duration(duration or ("30s" if is_sweep else "60s"))
    return Load(users=users, rate=rate, burstiness=burstiness, duration=seconds, num_requests=requests,
                warmup=parse_duration(warmup, "--warmup"), seed=seed,
                drain_timeout=parse_duration(timeout, "--timeout"))


def _run_one(spec: BenchSpec, url: str):
    planned = f"{spec.load.warmup + spec.load.duration:g}s" if spec.load.duration else f"{spec.load.num_requests} req"
    run = run_async(measure(spec, url, _progress_printer(url, planned)))
    _clear_progress()
    return run, summarize(run, spec.slo, spec.lag_limit)


def _sweep_one(spec: BenchSpec, url: str, slo: Slo, config: SweepConfig):
    return run_async(run_sweep(spec, url, slo, config,
                               on_point=lambda p: typer.echo(console.sweep_point_line(url, p), err=True)))


def _progress_printer(url: str, planned: str):
    if not sys.stderr.isatty():
        return None
    return lambda progress: (sys.stderr.write("\r" + console.progress_line(url, progress, planned) + "\x1b[K"),
                             sys.stderr.flush())


def _clear_progress() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


def _write(outcome: report.Outcome, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    report.write_json(outcome, folder / "results.json")
    cdf_runs = list(outcome.runs) or [(p.run, p.summary) for s in outcome.sweeps for p in s.points
                                      if s.max_rate is not None and p.rate == s.max_rate]
    names = plot.write_plots(cdf_runs, list(outcome.sweeps), folder)
    report.write_markdown(outcome, folder / "report.md", names)
    typer.echo(f"wrote {folder}/results.json, report.md" + "".join(f", {n}" for n in names), err=True)


def _exit_code(outcome: report.Outcome) -> int:
    code = 0
    if any(s.slo_met is False for _, s in outcome.runs) or any(s.max_rate is None for s in outcome.sweeps):
        code |= EXIT_SLO_MISSED
    if any(s.lag.is_behind for _, s in outcome.runs):
        code |= EXIT_CLIENT_BEHIND
    return code
