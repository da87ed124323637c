"""PNG plots of bench results: latency CDFs per endpoint, latency against rate, and a
timeline of latencies beside the server's own gauges (from its /metrics)."""

from __future__ import annotations

from pathlib import Path

from hosttune.bench.metrics import Summary, inter_chunk_gaps, percentile, tpot
from hosttune.bench.units import rate_text
from hosttune.bench.record import OK, RunRecord
from hosttune.bench.sweep import SweepResult

CDF_FILE = "latency_cdf.png"
SWEEP_FILE = "latency_vs_rate.png"
TIMELINE_FILE = "timeline.png"
BIN = 1.0  # seconds per point of the ITL P99 line


def run_label(run: RunRecord) -> str:
    """An endpoint's run as the legends name it: its URL, and an open loop's rate (a sweep's step, so)."""
    return run.url if run.rate is None else f"{run.url} at {rate_text(run.rate)} req/s"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def _values(run: RunRecord) -> dict[str, list[float]]:
    ok = [r for r in run.requests if r.outcome == OK and not r.is_warmup]
    return {
        "TTFT": [r.ttft * 1e3 for r in ok if r.ttft is not None],
        "ITL": [g * 1e3 for r in ok for g in inter_chunk_gaps(r)],
        "TPOT": [t * 1e3 for r in ok if (t := tpot(r)) is not None],
        "E2E": [r.e2e * 1e3 for r in ok],
    }


def latency_cdfs(runs: list[tuple[RunRecord, Summary]], path: Path) -> None:
    """One panel per metric; one empirical CDF per endpoint."""
    plt = _pyplot()
    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    right = {}  # x-axis end per metric: the largest P99.9, so a lone outlier cannot squash the plot
    for run, _ in runs:
        for axis, (name, values) in zip(axes.flat, _values(run).items()):
            if values:
                ordered = sorted(values)
                fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
                axis.step(ordered, fractions, where="post", label=run_label(run))
                right[name] = max(right.get(name, 0.0), ordered[int(0.999 * (len(ordered) - 1))])
    for axis, name in zip(axes.flat, ("TTFT", "ITL", "TPOT", "E2E")):
        if right.get(name):
            axis.set_xlim(0, right[name] * 1.05)
        axis.set_title(f"{name} (CDF, x axis to P99.9)")
        axis.set_xlabel("ms")
        axis.set_ylabel("fraction of requests" if name != "ITL" else "fraction of gaps")
        axis.grid(True, alpha=0.3)
        for q in (0.5, 0.95, 0.99):
            axis.axhline(q, color="grey", linewidth=0.5, linestyle=":")
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="lower right")
    _save(plt, figure, path, "hosttune bench: latency distributions (measured requests)")


def latency_vs_rate(sweeps: list[SweepResult], path: Path) -> None:
    """P50 (dashed) and P95 (solid) of E2E and TTFT at the rate each step offered (the
    report's offered column: its window's requests per second, random around the step's
    target), one colour per endpoint; the SLO in red; a dotted line at the rate offered by
    each endpoint's step of the highest target rate held."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, sweep in enumerate(sweeps):
        colour = colours[index % len(colours)]
        points = sorted(sweep.points, key=lambda p: p.summary.offered_rate)
        offered = [p.summary.offered_rate for p in points]
        for axis, name in zip(axes, ("e2e", "ttft")):
            for q, style in ((50, "--"), (95, "-")):
                axis.plot(offered, [_at(p.summary, name, q) for p in points], style, color=colour,
                          marker="o", markersize=3, label=f"{sweep.url} P{q}")
            held = _held_offered(sweep)
            if held is not None:
                axis.axvline(held, color=colour, linewidth=0.8, linestyle=":")
    slo = sweeps[0].slo if sweeps else None
    for axis, name, label in ((axes[0], "e2e", "E2E"), (axes[1], "ttft", "TTFT")):
        limit = slo.limits().get(name) if slo else None
        if limit is not None:
            axis.axhline(limit * 1e3, color="red", linewidth=0.8,
                         label=f"SLO: P{slo.percentile:g} {label} <= {limit * 1e3:g} ms")
        axis.set_title(f"{label} latency vs offered rate (dotted: highest target held)")
        axis.set_xlabel("offered requests/s (each step's measured window)")
        axis.set_ylabel("ms")
        axis.set_yscale("log")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    _save(plt, figure, path)


def _held_offered(sweep: SweepResult) -> float | None:
    """The rate offered by the step of the highest target rate that held."""
    held = [p for p in sweep.points if p.rate == sweep.max_rate]
    return held[-1].summary.offered_rate if held else None


def timeline(runs: list[tuple[RunRecord, Summary]], path: Path) -> None:
    """Over the run's time, one colour per endpoint: TTFT of each request (dots, at its
    send time) and ITL P99 per second (line) on the left; the server's waiting and
    running requests, KV-cache use and preemptions on the right."""
    plt = _pyplot()
    figure, axes = plt.subplots(2, 2, figsize=(13, 7.5), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (run, _) in enumerate(runs):
        colour = colours[index % len(colours)]
        _latency_panels(axes[0][0], axes[1][0], run, colour)
        _server_panels(axes[0][1], axes[1][1], run, colour)
    titles = (("TTFT per request (ms)", "ITL P99 per second (ms)"),
              ("server: waiting (dashed) and running requests", "server: KV cache use (%), preemptions (dotted, right)"))
    for column, (top, bottom) in enumerate(titles):
        axes[0][column].set_title(top)
        axes[1][column].set_title(bottom)
        axes[1][column].set_xlabel("seconds since the run's start")
    for axis in axes.flat:
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="upper left")
    _save(plt, figure, path, "hosttune bench: latencies and the server's state over time")


def _latency_panels(ttft_axis, itl_axis, run: RunRecord, colour: str) -> None:
    ok = [r for r in run.requests if r.outcome == OK and r.ttft is not None]
    ttft_axis.plot([r.sent for r in ok], [r.ttft * 1e3 for r in ok], ".", color=colour,
                   markersize=3, label=run_label(run))
    bins: dict[int, list[float]] = {}
    for r in ok:
        for i in range(len(r.chunks) - 1):
            bins.setdefault(int(r.chunks[i + 1] // BIN), []).append(r.chunks[i + 1] - r.chunks[i])
    keys = sorted(bins)
    itl_axis.plot([(k + 0.5) * BIN for k in keys], [percentile(bins[k], 99) * 1e3 for k in keys],
                  "-", color=colour, label=run_label(run))


def _server_panels(queue_axis, kv_axis, run: RunRecord, colour: str) -> None:
    samples = run.server_metrics
    times = [s.at for s in samples]
    for key, style in (("waiting", "--"), ("running", "-")):
        queue_axis.plot(times, [_nan(getattr(s, key)) for s in samples], style, color=colour,
                        label=f"{run_label(run)} {key}")
    kv_axis.plot(times, [_nan(s.kv_usage) * 100 for s in samples], "-", color=colour, label=run_label(run))
    first = next((s.preemptions for s in samples if s.preemptions is not None), 0.0)
    preemptions = kv_axis.twinx()
    preemptions.plot(times, [_nan(s.preemptions) - first for s in samples], ":", color=colour)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _save(plt, figure, path: Path, title: str | None = None) -> None:
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _at(summary: Summary, name: str, q: int) -> float:
    stats = getattr(summary, name)
    return float("nan") if stats is None else stats.at(q) * 1e3


def write_plots(runs: list[tuple[RunRecord, Summary]], sweeps: list[SweepResult],
                folder: Path) -> list[str]:
    """Write the plots that apply; return their file names."""
    names = []
    if runs:
        latency_cdfs(runs, folder / CDF_FILE)
        timeline(runs, folder / TIMELINE_FILE)
        names += [CDF_FILE, TIMELINE_FILE]
    if sweeps:
        latency_vs_rate(sweeps, folder / SWEEP_FILE)
        names.append(SWEEP_FILE)
    return names
