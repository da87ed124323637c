"""Bench results as JSON (every request's timings) and as a Markdown report."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import platform
from dataclasses import dataclass
from pathlib import Path

from hosttune import __version__
from hosttune.bench import metrics
from hosttune.bench.metrics import LatencyStats, Summary
from hosttune.bench.notes import unmeasured_note, usage_note
from hosttune.bench.plot import CDF_FILE, TIMELINE_FILE
from hosttune.bench.record import RequestRecord, RunRecord
from hosttune.bench.sweep import SweepResult, empty_note
from hosttune.bench.units import rate_text

METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E"))


@dataclass(frozen=True)
class Outcome:
    """Everything one `hosttune bench` invocation measured, for the writers."""

    runs: tuple[tuple[RunRecord, Summary], ...]  # one per endpoint (empty for a sweep)
    sweeps: tuple[SweepResult, ...]  # one per endpoint (empty without --sweep)
    command: str
    created: str = ""

    def all_runs(self) -> list[tuple[RunRecord, Summary]]:
        return list(self.runs) + [(p.run, p.summary) for s in self.sweeps for p in s.points]


def definitions() -> str:
    """The metric definitions: metrics.py's docstring after its first line."""
    return metrics.__doc__.strip().split("\n\n", 1)[1]


def now_text() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# JSON.

def to_json(outcome: Outcome) -> dict:
    return {
        "tool": f"hosttune bench {__version__}",
        "created": outcome.created or now_text(),
        "command": outcome.command,
        "client": {"python": platform.python_version(), "machine": platform.machine()},
        "definitions": definitions(),
        "runs": [_run_json(run, summary) for run, summary in outcome.runs],
        "sweeps": [_sweep_json(s) for s in outcome.sweeps],
    }


def _run_json(run: RunRecord, summary: Summary) -> dict:
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)
              if f.name not in ("requests", "loop_lag", "server_metrics")}
    return {
        **fields,
        "summary": {**_plain(summary), **{name: None for name in metrics.SERVED_RATES if not summary.is_rate_measured}},
        "server_metrics": [_plain(s) for s in run.server_metrics],
        "loop_lag": [[round(s.at, 6), round(s.lag, 7)] for s in run.loop_lag],
        "requests": [_request_json(r) for r in run.requests],
    }


def _request_json(r: RequestRecord) -> dict:
    return {
        "index": r.index, "scheduled": round(r.scheduled, 6), "sent": round(r.sent, 6),
        "end": round(r.end, 6), "outcome": r.outcome, "status": r.status, "error": r.error,
        "prompt_tokens": r.prompt_tokens, "reported_prompt_tokens": r.reported_prompt_tokens,
        "max_tokens": r.max_tokens, "output_tokens": r.output_tokens, "is_warmup": r.is_warmup,
        "cached_tokens": r.cached_tokens, "conversation": r.conversation, "turn": r.turn,
        "group": r.group, "user": r.user, "attempt": r.attempt, "retry_after": r.retry_after,
        "ttft": None if r.ttft is None else round(r.ttft, 6), "e2e": round(r.e2e, 6),
        "chunks": [round(t, 6) for t in r.chunks],
    }


def _sweep_json(sweep: SweepResult) -> dict:
    return {
        "url": sweep.url, "slo": _plain(sweep.slo), "max_rate": sweep.max_rate,
        "first_broken": sweep.first_broken, "is_capped": sweep.is_capped, "stopped_by": sweep.stopped_by,
        "points": [{"rate": p.rate, "is_held": p.is_held, "is_client_bound": p.is_client_bound,
                    **_run_json(p.run, p.summary)} for p in sweep.points],
    }


def _plain(value: object) -> object:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def write_json(outcome: Outcome, path: Path) -> None:
    path.write_text(json.dumps(to_json(outcome), indent=1) + "\n")


# Markdown.

def markdown(outcome: Outcome, plots: list[str]) -> str:
    lines = ["# hosttune bench report", "", f"Created {outcome.created or now_text()} by "
             f"hosttune {__version__}.", "", "```", outcome.command, "```", ""]
    if outcome.runs:
        lines += _setup([run for run, _ in outcome.runs]) + _results(outcome.runs)
    elif outcome.sweeps and outcome.sweeps[0].points:
        lines += _setup([s.points[0].run for s in outcome.sweeps if s.points], is_sweep=True)
    for sweep in outcome.sweeps:
        lines += _sweep_section(sweep)
    if outcome.sweeps and {CDF_FILE, TIMELINE_FILE} <= set(plots):
        held = ", ".join(f"{s.url} at {rate_text(s.max_rate)} req/s" for s in outcome.sweeps if s.max_rate is not None)
        lines += [f"{CDF_FILE} and {TIMELINE_FILE} show each endpoint's step at the highest rate held: {held}.", ""]
    lines += [f"![{name}]({name})" for name in plots] + ([""] if plots else [])
    lines += ["## Definitions", "", definitions(), ""]
    return "\n".join(lines)


def _setup(runs: list[RunRecord], is_sweep: bool = False) -> list[str]:
    run = runs[0]
    lines = ["## Setup", "", f"- Load: {_load_text(run, is_sweep)}; warm-up {run.warmup_end:g} s, excluded.",
             f"- Prompt lengths: {run.prompt_lengths}.", f"- Output lengths: {run.output_lengths}."]
    lines += [f"- Prompt token counts for {r.url} ({r.model}): {r.tokenizer}." for r in runs]
    lines.append("")
    for r in runs:
        if r.tokenizer.startswith("approximate"):
            lines += [f"> **Prompt lengths for {r.url} are approximate**: it has no `/tokenize` "
                      f"and no `--tokenizer` was given. {_length_error(r)}", ""]
    return lines


def _load_text(run: RunRecord, is_sweep: bool) -> str:
    if run.mode == "users":
        return f"{run.users} closed-loop users"
    cap = f", at most {run.max_concurrency} in flight" if run.max_concurrency else ""
    if run.mode == "trace":
        return f"trace replay ({len(run.requests)} requests){cap}"
    rate = "rate swept" if is_sweep else f"{run.rate:g} requests/s"
    return f"open loop, burstiness {run.burstiness:g}, {rate}{cap}"


def in_window(run: RunRecord) -> list:
    """The server's samples inside the run's measured window (all of them when none is)."""
    return [s for s in run.server_metrics if run.window[0] <= s.at <= run.window[1]] or list(run.server_metrics)


def since_warmup(run: RunRecord) -> list:
    """The server's samples from the measured window's start to the end of the run (its last sample)."""
    return [s for s in run.server_metrics if s.at >= run.window[0]] or list(run.server_metrics)


def server_rows(runs: list[RunRecord]) -> list[tuple[str, list[str]]]:
    """The server's own gauges over each run's window (from its /metrics)."""
    def stat(run: RunRecord, key: str, how) -> str:
        values = [getattr(s, key) for s in in_window(run) if getattr(s, key) is not None]
        return "-" if not values else how(values)
    return [
        ("server: waiting mean / max", [stat(r, "waiting", lambda v: f"{sum(v) / len(v):.1f} / {max(v):g}") for r in runs]),
        ("server: running mean / max", [stat(r, "running", lambda v: f"{sum(v) / len(v):.1f} / {max(v):g}") for r in runs]),
        ("server: KV cache use max", [stat(r, "kv_usage", lambda v: f"{max(v):.0%}") for r in runs]),
        ("server: preemptions", [stat(r, "preemptions", lambda v: f"{v[-1] - v[0]:g}") for r in runs]),
        ("server: prefix-cache hit rate", [_share(metrics.prefix_hit_rate(since_warmup(r))) for r in runs]),
    ]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _length_error(run: RunRecord) -> str:
    pairs = [(r.prompt_tokens, r.reported_prompt_tokens) for r in run.requests
             if r.reported_prompt_tokens]
    if not pairs:
        return "The server reported no usage, so the real lengths are unknown."
    error = sum(abs(real - want) / want for want, real in pairs) / len(pairs)
    return f"The server's usage reports differ from the intended lengths by {error:.1%} on average."


def _results(runs: tuple[tuple[RunRecord, Summary], ...]) -> list[str]:
    head = "| | " + " | ".join(f"{run.url} ({run.model})" for run, _ in runs) + " |"
    rows = [head, "|---|" + "---|" * len(runs)]
    server = server_rows([run for run, _ in runs]) if any(run.server_metrics for run, _ in runs) else []
    for label, values in summary_rows([s for _, s in runs]) + server:
        rows.append(f"| {label} | " + " | ".join(values) + " |")
    return ["## Results", ""] + rows + [""] + _warnings(runs)


def summary_rows(summaries: list[Summary]) -> list[tuple[str, list[str]]]:
    rows = [("requests measured (ok / 429 / failed)",
             [f"{s.num_requests} ({s.num_ok} / {s.num_rejected} / {s.num_failed})" for s in summaries]),
            ("of them retries after a 429/503", [str(s.num_retried) for s in summaries])]
    for name, label in METRICS:
        for q in metrics.PERCENTILES:
            rows.append((f"{label} P{q} (ms)", [_ms(getattr(s, name), q) for s in summaries]))
    rows += [
        ("requests/s", [served_rate(s) for s in summaries]),
        ("goodput: of them within the SLO (req/s)",
         ["-" if s.goodput is None else _served(s, rate_text(s.goodput)) for s in summaries]),
        ("measured requests within the SLO",
         ["-" if s.goodput_fraction is None else f"{s.goodput_fraction:.0%}" for s in summaries]),
        ("output tokens/s", [_served(s, f"{s.output_token_throughput:.1f}") for s in summaries]),
        ("output tokens/s streamed", [f"{s.streamed_token_throughput:.1f}" for s in summaries]),
        ("input tokens/s", [_served(s, f"{s.input_token_throughput:.1f}") for s in summaries]),
        ("errors by status", [_errors(s) for s in summaries]),
        ("SLO met", [{None: "-", True: "yes", False: "no"}[s.slo_met] for s in summaries]),
        ("client lag P99 loop / send (ms)",
         [f"{s.lag.loop_p99 * 1e3:.2f} / {s.lag.send_p99 * 1e3:.2f}" for s in summaries]),
        ("client CPU (cores)", [f"{s.lag.cpu:.2f}" for s in summaries]),
    ]
    return rows


def served_rate(s: Summary) -> str:
    """Requests/s served, or '-' where no request ended in the window (see notes.unmeasured_note)."""
    return rate_text(s.request_throughput) if s.is_rate_measured else "-"


def max_served(sweep: SweepResult) -> str:
    """The highest rate any step of the sweep served, of those that measured one."""
    rates = [p.summary.request_throughput for p in sweep.points if p.summary.is_rate_measured]
    return rate_text(max(rates)) if rates else "-"


def _served(s: Summary, text: str) -> str:
    """A rate of what the window served, or '-' where no request ended in it (see unmeasured_note)."""
    return text if s.is_rate_measured else "-"


def _ms(stats: LatencyStats | None, q: int) -> str:
    return "-" if stats is None else f"{stats.at(q) * 1e3:.1f}"


def _errors(s: Summary) -> str:
    return ", ".join(f"{k}: {v}" for k, v in s.errors_by_status.items()) or "none"


def _warnings(runs: tuple[tuple[RunRecord, Summary], ...]) -> list[str]:
    lines = []
    for run, s in runs:
        if s.lag.is_behind:
            lines.append(f"> **{run.url}: the client fell behind** (loop lag P99 "
                         f"{s.lag.loop_p99 * 1e3:.1f} ms, send lag P99 {s.lag.send_p99 * 1e3:.1f} ms, "
                         f"limit {s.lag.limit * 1e3:.0f} ms): latencies may be the client's, not the server's.")
        if run.stop_note():
            lines.append(f"> **{run.url}: {run.stop_note()}**.")
        if s.num_cancelled:
            lines.append(f"> {run.url}: {s.num_cancelled} requests were still running at the stop and were cancelled.")
        if note := unmeasured_note(run, s):
            lines.append(f"> **{run.url}: {note}**.")
        if note := usage_note(run):
            lines.append(f"> {run.url}: {note}.")
    return lines + ([""] if lines else [])


def _sweep_section(sweep: SweepResult) -> list[str]:
    slo = ", ".join(f"{k} P{sweep.slo.percentile:g} <= {v * 1e3:g} ms" for k, v in sweep.slo.limits().items())
    verdict = (f"none, {none_held(sweep)}" if sweep.max_rate is None else
               f"**{rate_text(sweep.max_rate)} requests/s**" + (" (the sweep's ceiling; it never broke)" if sweep.is_capped else ""))
    lines = [f"## Rate sweep: {sweep.url}", "",
             f"SLO: {slo}, errors <= {sweep.slo.max_error_rate:.0%}; a step also needs the server to "
             "keep up (backlog growth within chance).",
             f"Highest rate that held: {verdict}. Highest rate served in any step: {max_served(sweep)} requests/s.", "",
             *_sweep_stop(sweep),
             "A step's arrivals are random around its target rate: offered is what its window sent per second, served "
             "what ended in that window per second, above offered only by a backlog the step began with and cleared "
             "(its backlog growth is then negative).", "",
             "| target req/s | offered req/s | served req/s | TTFT P95 (ms) | E2E P95 (ms) | errors | backlog growth | held | client lag |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(sweep.points, key=lambda p: p.rate):
        s = p.summary
        lines.append(f"| {rate_text(p.rate)} | {rate_text(s.offered_rate)} | {served_rate(s)} | {_ms(s.ttft, 95)} | {_ms(s.e2e, 95)} | "
                     f"{s.error_rate:.1%} | {s.backlog_growth:+d} | {_held(p)} | "
                     f"{'BEHIND' if p.is_client_bound else 'ok'} |")
    return lines + [""]


def none_held(sweep: SweepResult) -> str:
    """Why a sweep held no rate: none was judged, or every rate judged broke; at the lowest with the server keeping
    up, the SLO asks for less than its latency with no queue, which no lower rate gives."""
    if sweep.first_broken is None:
        return "no step judged a rate"
    lowest = next(p for p in sweep.points if p.rate == sweep.first_broken)
    kept_up = (", though the server kept up: the SLO asks for less than its latency with no queue"
               if lowest.summary.is_kept_up and lowest.summary.num_ok else "")
    return f"even the lowest rate judged ({rate_text(sweep.first_broken)} requests/s) broke the SLO{kept_up}"


def _sweep_stop(sweep: SweepResult) -> list[str]:
    if note := empty_note(sweep):
        return [f"> **A step judged nothing**: {note}.", ""]
    if sweep.points and (last := sweep.points[-1]).is_failed:
        return [f"> **Every request failed** in the step at {rate_text(last.rate)} requests/s: the sweep ended there, "
                "and the answer above is from the steps before it (requests.csv has each failure's reason).", ""]
    if not sweep.stopped_by:
        return []
    last = sweep.points[-1]
    if not last.run.stopped_by:  # it came between two steps
        return [f"> **{sweep.stopped_by} ended the sweep** after its step at {rate_text(last.rate)} requests/s: the "
                "answer above is from the steps run.", ""]
    return [f"> **{sweep.stopped_by} ended the sweep** during its step at {rate_text(last.rate)} "
            "requests/s: that step judges no rate, and the answer above is from the steps before it.", ""]


def _held(point) -> str:
    return {"held": "yes", "broke": "no"}.get(point.verdict, point.verdict)


def write_markdown(outcome: Outcome, path: Path, plots: list[str]) -> None:
    path.write_text(markdown(outcome, plots))
