"""Bench results as CSV, for spreadsheets and dataframes: one row per request
(requests.csv), one per run (summary.csv) and one per /metrics sample (server_metrics.csv,
when a server gave any). Times are seconds; a run is named by its endpoint URL, and in a
sweep by its target rate too (`rate`: an open loop's target requests/s; summary.csv's
`offered_rate`: the measured requests its window sent per second, random around it; `stopped_by`: the signal
that ended a run early, blank for a full one; the rates served are blank where no request ended in the window)."""

from __future__ import annotations

import csv
from pathlib import Path

from hosttune.bench.metrics import Summary, tpot
from hosttune.bench.record import RunRecord
from hosttune.bench.report import Outcome

REQUEST_COLUMNS = ("url", "rate", "index", "scheduled", "sent", "end", "outcome", "status", "error",
                   "prompt_tokens", "reported_prompt_tokens", "cached_tokens", "max_tokens",
                   "output_tokens", "ttft", "tpot", "e2e", "conversation", "turn", "group", "is_warmup", "user",
                   "attempt")
SUMMARY_COLUMNS = ("url", "rate", "offered_rate", "requests", "ok", "rejected", "failed", "cancelled", "retried",
                   "ttft_p50", "ttft_p95", "ttft_p99", "itl_p50", "itl_p95", "itl_p99", "tpot_p50", "tpot_p95",
                   "tpot_p99", "e2e_p50", "e2e_p95", "e2e_p99", "request_throughput", "output_token_throughput",
                   "streamed_token_throughput", "input_token_throughput", "goodput", "slo_met", "client_behind",
                   "stopped_by")
REQUESTS_FILE = "requests.csv"
SUMMARY_FILE = "summary.csv"
SERVER_FILE = "server_metrics.csv"
SERVER_COLUMNS = ("url", "rate", "at", "waiting", "running", "kv_usage", "preemptions", "prefix_hits",
                  "prefix_queries", "prefix_hit_rate")


def write_csv(outcome: Outcome, folder: Path) -> list[str]:
    """Write the CSV files that apply; return their names."""
    runs = outcome.all_runs()
    names = [REQUESTS_FILE, SUMMARY_FILE]
    _write(folder / REQUESTS_FILE, REQUEST_COLUMNS, [row for run, _ in runs for row in request_rows(run)])
    _write(folder / SUMMARY_FILE, SUMMARY_COLUMNS, [summary_row(run, s) for run, s in runs])
    samples = [server_row(run, s) for run, _ in runs for s in run.server_metrics]
    if samples:
        _write(folder / SERVER_FILE, SERVER_COLUMNS, samples)
        names.append(SERVER_FILE)
    return names


def _write(path: Path, columns: tuple[str, ...], rows: list[tuple]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)


def request_rows(run: RunRecord) -> list[tuple]:
    return [(run.url, _blank(run.rate), r.index, _round(r.scheduled), _round(r.sent), _round(r.end),
             r.outcome, r.status, r.error, r.prompt_tokens, _blank(r.reported_prompt_tokens),
             _blank(r.cached_tokens), r.max_tokens, r.output_tokens, _round(r.ttft), _round(tpot(r)),
             _round(r.e2e), _blank(r.conversation), _blank(r.turn), _blank(r.group), int(r.is_warmup),
             _blank(r.user), r.attempt)
            for r in run.requests]


def summary_row(run: RunRecord, s: Summary) -> tuple:
    def at(stats, q: int) -> object:
        return "" if stats is None else _round(stats.at(q))
    return (run.url, _blank(run.rate), _round(s.offered_rate), s.num_requests, s.num_ok, s.num_rejected, s.num_failed,
            s.num_cancelled, s.num_retried,
            at(s.ttft, 50), at(s.ttft, 95), at(s.ttft, 99), at(s.itl, 50), at(s.itl, 95), at(s.itl, 99),
            at(s.tpot, 50), at(s.tpot, 95), at(s.tpot, 99), at(s.e2e, 50), at(s.e2e, 95), at(s.e2e, 99),
            _served(s, s.request_throughput), _served(s, s.output_token_throughput),
            _round(s.streamed_token_throughput), _served(s, s.input_token_throughput), _served(s, s.goodput),
            _blank(s.slo_met),
            int(s.lag.is_behind), _blank(run.stopped_by))


def server_row(run: RunRecord, sample) -> tuple:
    return (run.url, _blank(run.rate), _round(sample.at), _blank(sample.waiting), _blank(sample.running),
            _blank(sample.kv_usage), _blank(sample.preemptions), _blank(sample.prefix_hits),
            _blank(sample.prefix_queries), _blank(sample.prefix_hit_rate))


def _served(s: Summary, value: float | None) -> object:
    """A rate of what the window served, blank where no request ended in it."""
    return _round(value) if s.is_rate_measured else ""


def _round(value: float | None) -> object:
    return "" if value is None else round(value, 6)


def _blank(value: object) -> object:
    return "" if value is None else value
