"""Plain-text renderings for the terminal: the progress status and the result tables."""

from __future__ import annotations

from typing import Callable

from hosttune.bench.loadgen import Progress
from hosttune.bench.metrics import Summary, prefix_hit_rate
from hosttune.bench.notes import unmeasured_note, usage_note
from hosttune.bench.record import RunRecord
from hosttune.bench.report import max_served, none_held, served_rate, since_warmup, summary_rows
from hosttune.bench.sweep import SweepPoint, SweepResult, empty_note
from hosttune.bench.units import rate_text


def progress_status(progress: Progress) -> str:
    if progress.is_draining:  # the bar stands full while the last streams end, which may take minutes
        return (f"waiting for the last responses (up to --timeout): {progress.num_in_flight} in flight, "
                f"{progress.num_done} done, {progress.num_ok} ok, {progress.num_errors} errors")
    phase = "warm-up" if progress.is_warmup else "measuring"
    return (f"{phase}: {progress.num_done} done, {progress.num_ok} ok, {progress.num_errors} errors, "
            f"{progress.num_in_flight} in flight")


TableRenderer = Callable[[list[str], list[list[str]]], str]


def table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded with spaces, a dashed rule under the header: for logs, pipes and files."""
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def summary_table(runs: list[tuple[RunRecord, Summary]], render: TableRenderer = table) -> str:
    header = ["metric"] + [run.url for run, _ in runs]
    rows = [[label] + values for label, values in summary_rows([s for _, s in runs])]
    rates = [prefix_hit_rate(since_warmup(run)) for run, _ in runs]
    if any(rate is not None for rate in rates):
        rows.append(["prefix-cache hit rate (server)"] + ["-" if r is None else f"{r:.0%}" for r in rates])
    text = render(header, rows)
    for run, s in runs:
        if s.lag.is_behind:
            text += (f"\nWARNING {run.url}: the client fell behind (loop lag P99 "
                     f"{s.lag.loop_p99 * 1e3:.1f} ms, send lag P99 {s.lag.send_p99 * 1e3:.1f} ms); "
                     "latencies may be the client's, not the server's.")
        if run.tokenizer.startswith("approximate"):
            text += f"\nNOTE {run.url}: prompt lengths are approximate (no /tokenize, no --tokenizer)."
        if run.stop_note():
            text += f"\nNOTE {run.url}: {run.stop_note()}."
        if s.num_cancelled:
            text += (f"\nNOTE {run.url}: {s.num_cancelled} measured requests were still running at the stop and were "
                     "cancelled (counted in none of ok, 429 or failed).")
        if note := unmeasured_note(run, s):
            text += f"\nNOTE {run.url}: {note}."
        if note := usage_note(run):
            text += f"\nNOTE {run.url}: {note}."
    return text


def sweep_point_line(url: str, point: SweepPoint) -> str:
    s = point.summary
    e2e = "-" if s.e2e is None else f"{s.e2e.p95 * 1e3:.1f} ms"
    lag = " (client behind)" if point.is_client_bound else ""
    return (f"{url} rate {rate_text(point.rate):>8}/s: offered {rate_text(s.offered_rate)}/s, "
            f"served {served_rate(s)}/s, E2E P95 {e2e}, "
            f"errors {s.error_rate:.1%}, backlog {s.backlog_growth:+d} "
            f"-> {point.verdict}{lag}")


def sweep_table(sweeps: list[SweepResult], render: TableRenderer = table) -> str:
    header = ["endpoint", "max rate held (req/s)", "lowest rate broken", "max served (req/s)", "steps"]
    rows = [[s.url, "-" if s.max_rate is None else rate_text(s.max_rate) + (" (ceiling)" if s.is_capped else ""),
             "-" if s.first_broken is None else rate_text(s.first_broken),
             max_served(s), str(len(s.points))]
            for s in sweeps]
    notes = [f"\nNOTE {s.url}: {s.stopped_by} ended the sweep; its answer is from the steps before it."
             for s in sweeps if s.stopped_by]
    notes += [f"\nNOTE {s.url}: {note}." for s in sweeps if (note := empty_note(s))]
    notes += [f"\nNOTE {s.url}: every request failed in the step at {rate_text(s.points[-1].rate)} requests/s: the "
              "sweep ended there, and the answer above is from the steps before it." for s in sweeps
              if s.points and s.points[-1].is_failed]
    notes += [f"\nNOTE {s.url}: no rate held: {none_held(s)}." for s in sweeps
              if s.max_rate is None and not s.stopped_by]
    return render(header, rows) + "".join(notes)
