"""What `hosttune bench` does once its options are parsed (imported only when benchmarking:
aiohttp and uvloop cost ~0.3 s of start-up that `hosttune check` should not pay)."""

from __future__ import annotations

import shlex
import sys
from typing import Optional

import typer

from hosttune.bench import console, report
from hosttune.bench.benchmark import BenchSpec, check_url, measure, run_async
from hosttune.bench.client import REDIRECT_ADVICE, Target, discover_model, key_advice
from hosttune.bench.connection import tls_context
from hosttune.bench.file_limit import allow_load
from hosttune.bench.headers import redact_argv, request_headers
from hosttune.bench.loadgen import MAX_USERS, Load, Progress as LoadProgress
from hosttune.bench.metrics import Slo, summarize
from hosttune.bench.record import FAILED
from hosttune.bench.scheme import check_scheme
from hosttune.bench.served_models import check_model
from hosttune.bench.sweep import SweepConfig, result_of as sweep_result_of, sweep as run_sweep
from hosttune.bench.trace import load_trace
from hosttune.bench.units import (parse_duration, parse_positive_duration, parse_shared_prefix, parse_slo,
                                  rate_text)
from hosttune.cli import bench_out, bench_stop
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
    for message in _partly_failed(outcome) + _tpot_unmeasured(outcome, slo_value):
        typer.secho(f"hosttune: {message}", err=True, fg="yellow")
    for message in _unanswered(outcome, spec.headers) + _sweep_unanswered(outcome, spec.headers):
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


def _unanswered(outcome: report.Outcome, headers=()) -> list[str]:
    """One line per run that measured nothing: every measured request failed, or none was sent."""
    return [f"all {s.num_requests} measured requests to {run.url} failed "
            f"({', '.join(f'{k}: {v}' for k, v in s.errors_by_status.items())}), so nothing was measured; "
            f"the first {_first_failure(run)}; {_what_to_check(_first_failed(run), headers)}"
            if s.num_requests else _none_sent(run)
            for run, s in outcome.runs if s.num_failed == s.num_requests]


def _sweep_unanswered(outcome: report.Outcome, headers=()) -> list[str]:
    """One line per sweep that a step whose every measured request failed ended (a server gone or refusing): it
    judges no rate, which reads as a server too slow, or goes unnoticed beside the steps before it, unless the first
    failure says why."""
    lines = []
    for result in outcome.sweeps:
        if not result.points or not (step := result.points[-1]).is_failed:
            continue
        s, before = step.summary, len(result.points) - 1
        where = (f" at {rate_text(step.rate)} requests/s" if before else "")
        ended = (f"so the sweep ended there, its answer from the {before} step{'s' if before > 1 else ''} before it"
                 if before else "so no rate was measured")
        lines.append(f"all {s.num_requests} measured requests of the sweep of {result.url}{where} failed "
                     f"({', '.join(f'{k}: {v}' for k, v in sorted(s.errors_by_status.items()))}), {ended}; "
                     f"the first {_first_failure(step.run)}; {_what_to_check(_first_failed(step.run), headers)}")
    return lines


def _none_sent(run) -> str:
    if run.stopped_by and run.window[1] <= run.warmup_end:
        return (f"{run.stopped_by} ended the run to {run.url} during its {run.warmup_end:g} s warm-up, so nothing "
                "was measured")
    if run.stopped_by:  # a far arrival of a low rate or a trace: no warm-up to name
        return (f"{run.stopped_by} ended the run to {run.url} {run.window[1]:.1f} s in, before it sent a measured "
                "request, so nothing was measured")
    advice = ("its trace's arrivals all came within it: give a shorter --warmup" if run.mode == "trace" else
              "give a longer --duration (or more --users, or a higher --rate)")
    return f"no request to {run.url} was sent after its {run.warmup_end:g} s warm-up, so nothing was measured; {advice}"


def _partly_failed(outcome: report.Outcome) -> list[str]:
    """One line per run in which some measured requests failed, quoting the first: the table counts them by
    status, and the server's reason is otherwise only in requests.csv."""
    return [f"{s.num_failed} of {s.num_requests} measured requests to {run.url} failed "
            f"({', '.join(f'{k}: {v}' for k, v in s.errors_by_status.items() if k != '429')}); "
            f"the first {_first_failure(run)}"
            for run, s in outcome.runs if 0 < s.num_failed < s.num_requests]


def _tpot_unmeasured(outcome: report.Outcome, slo: Optional[Slo]) -> list[str]:
    """A TPOT limit no request could be measured by (one output token each) fails the SLO: say why."""
    if slo is None or slo.tpot is None:
        return []
    return [f"the SLO limits TPOT, and no request to {run.url} had the two output tokens it takes to measure, so "
            "the SLO is not met; ask for more with --max-tokens" for run, s in outcome.runs if s.num_ok and s.tpot is None]


def _first_failed(run):
    return min((r for r in run.requests if not r.is_warmup and r.outcome == FAILED), key=lambda r: r.sent)


def _first_failure(run) -> str:
    first = _first_failed(run)
    is_answered = first.status and not first.error.startswith("timeout:")  # a stream cut at --timeout failed
    return f"{'answered' if is_answered else 'failed:'} {first.reason}"


def _what_to_check(first, headers) -> str:
    """What to fix, by what the first failed request got: no answer (a server down or stuck), a missing key
    (where /v1/models, which finds that first, needs none), a redirect, a prompt or output past the model's context or
    a field the server does not take (ignore_eos, a vLLM extension, is sent by default), or a wrong model, route or
    server."""
    status = first.status
    if status == 0 and "SSL handshake" in first.error:  # an https:// URL to a port that speaks plain http
        return "check that the server speaks https at --url (a plain http port never answers a TLS handshake)"
    if status == 0 and first.error.startswith("transport:"):  # no answer at all: not a model or route to fix
        return "check that the server is up and listens at --url"
    if status == 200 and first.error.startswith("timeout:"):  # it answered, and streamed too slowly
        return ("the server streams too slowly to finish within --timeout: give a longer one, or ask for fewer "
                "--max-tokens")
    if status == 0 and first.error.startswith("timeout:"):
        return "the server answered nothing within --timeout: check that it is up and not stuck, or give a longer one"
    if status in (401, 403):
        return key_advice(headers)
    if 300 <= status < 400:
        return REDIRECT_ADVICE
    if status == 400:
        return ("check that --prompts and --max-tokens fit the model's context, or leave out a field the server does "
                "not take: --no-ignore-eos, no --priority")
    return "check --model and --api, and that it is an OpenAI-compatible server"


def _exit_code(outcome: report.Outcome) -> int:
    code = EXIT_NOTHING_MEASURED if _unanswered(outcome) or _sweep_unanswered(outcome) else 0
    if any(s.slo_met is False for _, s in outcome.runs) or any(s.max_rate is None for s in outcome.sweeps):
        code |= EXIT_SLO_MISSED
    if any(s.lag.is_behind for _, s in outcome.runs):
        code |= EXIT_CLIENT_BEHIND
    return code
