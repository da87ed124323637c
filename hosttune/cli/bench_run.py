"""What `hosttune bench` does once its options are parsed (imported only when benchmarking:
aiohttp and uvloop cost ~0.3 s of start-up that `hosttune check` should not pay)."""

from __future__ import annotations

import shlex
import sys
from typing import Optional

import typer

from hosttune.bench import console, report
from hosttune.bench.benchmark import BenchSpec, check_url, measure, run_async
from hosttune.bench.client import Target, discover_model
from hosttune.bench.connection import tls_context
from hosttune.bench.file_limit import allow_load
from hosttune.bench.headers import redact_argv, request_headers
from hosttune.bench.loadgen import MAX_USERS, Load, Progress as LoadProgress
from hosttune.bench.metrics import Slo, summarize
from hosttune.bench.scheme import check_scheme
from hosttune.bench.served_models import check_model
from hosttune.bench.sweep import SweepConfig, result_of as sweep_result_of, sweep as run_sweep
from hosttune.bench.trace import load_trace
from hosttune.bench.units import parse_duration, parse_positive_duration, parse_shared_prefix, parse_slo
from hosttune.cli import bench_out, bench_stop
from hosttune.cli.bench_failures import partly_failed, sweep_unanswered, unanswered
from hosttune.cli.progress import Progress
from hosttune.cli.tables import table_renderer
from hosttune.errors import BenchError

EXIT_SLO_MISSED = 1
EXIT_NOTHING_MEASURED = 2  # every request (of a run, or of a sweep's step) failed, or none was sent
EXIT_CLIENT_BEHIND = 4
DEFAULT_SWEEP_SLO = "e2e=2s"  # a sweep finds the highest rate whose E2E P95 stays under 2 s


def run(url, users, rate, burstiness, duration, requests, warmup, prompts, max_tokens, dataset, shared_prefix, prefix_tokens, turns, trace, max_concurrency, metrics_interval, priority, api, model, tokenizer, slo, slo_percentile, max_error_rate, sweep, sweep_start, sweep_max, sweep_growth, sweep_precision, out, ignore_eos, timeout, max_client_lag, seed, api_key=None, header=(), cacert=None, insecure=False, given=frozenset(), api_key_typed=False) -> None:
    _check_used(given, slo=slo, sweep=sweep, rate=rate, shared_prefix=shared_prefix)
    _check_overridden(given, dataset=dataset, trace=trace)
    url = [check_url(u) for u in url]  # every endpoint's URL before the first run, not after it
    if twice := next((u for i, u in enumerate(url) if u in url[:i]), None):
        raise BenchError(f"--url {twice} is given twice: give each endpoint once (its two runs would share one name "
                         "in every report)")
    if (cacert or insecure) and not any(u.startswith("https://") for u in url):
        raise BenchError(f"{'--cacert' if cacert else '--insecure'} is about https certificates, and every --url here is "
                         "http://; leave it out, or give the https:// URL")
    config = SweepConfig(sweep_start, sweep_max, sweep_growth, sweep_precision) if sweep else None
    slo_value = _slo(slo if slo is not None else (DEFAULT_SWEEP_SLO if sweep else None), slo_percentile,
                     max_error_rate)  # --slo '' is refused as naming no limit, not taken for no SLO
    grid = parse_shared_prefix(shared_prefix) if shared_prefix else None
    replay = load_trace(trace) if trace is not None else None
    users = _users(users, rate, grid, replay is not None or sweep)
    interval = parse_duration(metrics_interval, "--metrics-interval")
    spec = BenchSpec(
        load=_load(users, rate, burstiness, duration, requests, warmup, timeout, seed, sweep, sweep_start,
                   max_concurrency, replay.arrivals if replay else None),
        prompt_lengths=prompts, output_lengths=max_tokens, api=api, model=model,
        tokenizer=tokenizer, timeout=parse_positive_duration(timeout, "--timeout"), slo=slo_value,
        lag_limit=parse_positive_duration(max_client_lag, "--max-client-lag"), is_ignore_eos=ignore_eos,
        headers=request_headers(header, api_key, is_key_typed=api_key_typed),
        dataset=dataset, shared_prefix=grid, prefix_tokens=prefix_tokens, turns=turns, trace=replay,
        metrics_interval=interval or None, priority=priority,
        tls=tls_context(str(cacert) if cacert else None, insecure) if cacert or insecure else None,
    )
    allow_load(spec.load)
    if out is not None:
        bench_out.check_out(out)
    with bench_stop.before_measuring():
        _check_answering(spec, url)
    command = "hosttune bench " + " ".join(shlex.quote(a) for a in redact_argv(sys.argv[2:]))
    if config is not None:
        sweeps = bench_stop.until_stopped(url, lambda u: _sweep_one(spec, u, slo_value, config), lambda s: s.stopped_by)
        outcome = report.Outcome((), sweeps, command, report.now_text())
        typer.echo(console.sweep_table(list(outcome.sweeps), table_renderer(console.table)))
    else:
        runs = bench_stop.until_stopped(url, lambda u: _run_one(spec, u), lambda r: r[0].stopped_by)
        outcome = report.Outcome(runs, (), command, report.now_text())
        typer.echo(console.summary_table(list(outcome.runs), table_renderer(console.table)))
    if out is not None:
        bench_out.write(outcome, out)
    for message in partly_failed(outcome) + _tpot_unmeasured(outcome, slo_value):
        typer.secho(f"hosttune: {message}", err=True, fg="yellow")
    for message in unanswered(outcome, spec.headers) + sweep_unanswered(outcome, spec.headers):
        typer.secho(f"hosttune: {message}", err=True, fg="red")
    raise typer.Exit(_exit_code(outcome))


def _check_answering(spec: BenchSpec, urls: list[str]) -> None:
    """Every endpoint speaks its URL's scheme (with a certificate this machine trusts), which takes seconds to tell,
    where a run's every request would fail for its whole duration. Several endpoints: each lists its model before the
    first is measured, so that one that is down or mistyped fails now, not after the runs before it, whose results
    would go unreported. (--model skips the lookup: an endpoint that is down then fails its requests, and its run says
    so beside the others; but a key /v1/models refuses, or a name the endpoint refuses where it lists others, fails
    now.)"""
    for url in urls:
        run_async(check_scheme(url, spec.tls))
        if spec.model is not None:
            run_async(check_model(Target(url, spec.model, spec.api, spec.timeout, spec.is_ignore_eos,
                                         headers=spec.headers, priority=spec.priority, tls=spec.tls)))
    if spec.model is None and len(urls) > 1:
        for url in urls:
            run_async(discover_model(url, headers=spec.headers, tls=spec.tls))


def _check_used(given, *, slo, sweep, rate, shared_prefix) -> None:
    """An option given on the command line whose feature is off would change nothing: say so, rather than run
    as if it had been honoured."""
    needs = {"slo_percentile": ("--slo or --sweep", slo is not None or sweep),
             "max_error_rate": ("--slo or --sweep", slo is not None or sweep),
             "burstiness": ("--rate or --sweep", rate is not None or sweep),
             "prefix_tokens": ("--shared-prefix", shared_prefix is not None),
             **{f"sweep_{part}": ("--sweep", sweep) for part in ("start", "max", "growth", "precision")}}
    for name, (feature, is_on) in needs.items():
        if name in given and not is_on:
            raise BenchError(f"--{name.replace('_', '-')} changes nothing without {feature}; add that, or leave it out")


def _check_overridden(given, *, dataset, trace) -> None:
    """--dataset gives the prompts (and no calibration needs a tokenizer), --trace every length: an option they
    replace would change nothing, so it is refused as an option whose feature is off is."""
    replaced = {"prompts": ("--dataset", "prompts", dataset), "tokenizer": ("--dataset", "prompts", dataset)}
    if trace is not None:
        replaced |= {"prompts": ("--trace", "prompt lengths", trace), "max_tokens": ("--trace", "output lengths", trace)}
    for name, (option, what, value) in replaced.items():
        if name in given and value is not None:
            raise BenchError(f"--{name.replace('_', '-')} changes nothing with {option}, which gives the {what}; "
                             "leave it out")


def _slo(text: Optional[str], percentile: float, max_error_rate: float) -> Optional[Slo]:
    return parse_slo(text, percentile, max_error_rate) if text is not None else None


def _users(users, rate, grid, is_open) -> Optional[int]:
    """Closed-loop users: --users, or N*M for --shared-prefix NxM, or 128."""
    if grid is not None and users is not None and users != grid[0] * grid[1]:
        raise BenchError(f"--shared-prefix {grid[0]}x{grid[1]} means {grid[0] * grid[1]} users; drop --users")
    if users is not None or rate is not None or is_open:
        return users
    if grid and grid[0] * grid[1] > MAX_USERS:
        raise BenchError(f"--shared-prefix {grid[0]}x{grid[1]} means {grid[0] * grid[1]} users, past the {MAX_USERS} "
                         "bench runs: give fewer system prompts or users each")
    return grid[0] * grid[1] if grid else 128


def _load(users, rate, burstiness, duration, requests, warmup, timeout, seed, is_sweep, sweep_start,
          max_concurrency, arrivals) -> Load:
    if duration is not None and requests is not None:
        raise BenchError("give either --duration or --requests, not both")
    if is_sweep and arrivals is not None:
        raise BenchError("--trace gives the arrivals, and --sweep offers its own rates: give one of them")
    if is_sweep and (users is not None or rate is not None):
        raise BenchError("--sweep offers open-loop rates from --sweep-start up: drop --users and --rate")
    if is_sweep and max_concurrency is not None:
        raise BenchError("--max-concurrency holds arrivals back in the client, where no latency counts their wait: a "
                         "sweep's steps would hold at rates never offered; leave it out with --sweep")
    if is_sweep:
        users, rate = None, sweep_start
    if arrivals is not None and (users is not None or rate is not None):
        raise BenchError("--trace gives the arrivals: drop --users and --rate")
    default = None if arrivals is not None else ("30s" if is_sweep else "60s")
    seconds = None if requests is not None or (duration or default) is None else parse_duration(duration or default, "--duration")
    return Load(users=users, rate=rate, burstiness=burstiness, duration=seconds, num_requests=requests,
                warmup=parse_duration(warmup or ("0s" if arrivals is not None else "10s"), "--warmup"), seed=seed,
                drain_timeout=parse_duration(timeout, "--timeout"), max_concurrency=max_concurrency,
                arrivals=arrivals)


def _run_one(spec: BenchSpec, url: str):
    total, unit = _planned(spec.load)
    # Drawn from the event loop's own progress callback, every 0.5 s: no drawing thread
    # competes with the client for the interpreter while it timestamps tokens.
    with Progress(url, total=total, unit=unit, auto_refresh=False) as bar:
        def show(progress: LoadProgress) -> None:
            position = progress.elapsed if unit == "s" else _position(spec.load, progress)
            bar.update(min(position, total) if total else position, status=console.progress_status(progress))

        run = run_async(measure(spec, url, show if bar.is_shown else None))
    return run, summarize(run, spec.slo, spec.lag_limit)


def _planned(load: Load) -> tuple[float | None, str]:
    """The bar's length: seconds for a timed run, a trace's arrivals, or --requests's measured requests (the
    warm-up's come first, and are not counted in it)."""
    if load.duration:
        return load.warmup + load.duration, "s"
    if load.arrivals is not None:
        return len(load.arrivals), "requests"
    return load.num_requests, "requests"


def _position(load: Load, progress: LoadProgress) -> int:
    """Where a bar of requests is: a trace's arrivals sent, or the measured requests done (none in the warm-up)."""
    if load.arrivals is not None:
        return progress.num_sent
    return 0 if progress.is_warmup else progress.num_done


def _sweep_one(spec: BenchSpec, url: str, slo: Slo, config: SweepConfig):
    points = []

    def show(point) -> None:
        points.append(point)
        typer.echo(console.sweep_point_line(url, point), err=True)
    try:
        return run_async(run_sweep(spec, url, slo, config, on_point=show))
    except KeyboardInterrupt as exc:  # between steps (the next one's model, its prompts): no step caught it
        if not points:
            raise
        return sweep_result_of(url, slo, points, config, getattr(exc, "signal_name", "SIGINT"))


def _tpot_unmeasured(outcome: report.Outcome, slo: Optional[Slo]) -> list[str]:
    """A TPOT limit no request could be measured by (one output token each) fails the SLO: say why."""
    if slo is None or slo.tpot is None:
        return []
    return [f"the SLO limits TPOT, and no request to {run.url} had the two output tokens it takes to measure, so "
            "the SLO is not met; ask for more with --max-tokens" for run, s in outcome.runs if s.num_ok and s.tpot is None]


def _exit_code(outcome: report.Outcome) -> int:
    code = EXIT_NOTHING_MEASURED if unanswered(outcome) or sweep_unanswered(outcome) else 0
    if any(s.slo_met is False for _, s in outcome.runs) or any(s.max_rate is None for s in outcome.sweeps):
        code |= EXIT_SLO_MISSED
    if any(s.lag.is_behind for _, s in outcome.runs):
        code |= EXIT_CLIENT_BEHIND
    return code
