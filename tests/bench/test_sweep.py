"""A sweep finds the scripted server's saturation rate within 10%."""

import pytest

from hosttune.bench.benchmark import BenchSpec, run_async
from hosttune.bench.loadgen import Load
from hosttune.bench.metrics import Slo, summarize
from hosttune.bench.sweep import SweepConfig, next_rate, sweep

from .servers import realtime

CAPACITY, TTFT, ITL, TOKENS = 32, 0.01, 0.01, 10
SERVICE = TTFT + (TOKENS - 1) * ITL  # 0.1 s per request, whatever the load
SATURATION = CAPACITY / SERVICE  # 320 requests/s


def test_next_rate_grows_then_bisects():
    config = SweepConfig(start_rate=10, growth=2, precision=0.05, max_rate=1000)
    assert next_rate(None, None, config) == 10
    assert next_rate(40, None, config) == 80
    assert next_rate(40, 80, config) == pytest.approx(56.57, rel=1e-3)
    assert next_rate(100, 104, config) is None
    assert next_rate(None, 10, config) == 5  # the first rate broke: look lower
    assert next_rate(1000, None, config) is None  # the ceiling held


def test_sweep_finds_the_saturation_rate(server_factory):
    # Real-time priority where permitted, as in test_known_timings: on a machine whose two
    # cores other work shares, preemption would otherwise look like server latency. A 0.1 s
    # service lets 1.5 s steps see a 10% overload (its queue's wait passes the service time
    # within the step); the first step at 0.75 x saturation, growing by 1.25, brackets it in
    # about six steps.
    url = server_factory("--realtime", "--ttft", str(TTFT), "--itl", str(ITL), "--capacity", str(CAPACITY))
    spec = BenchSpec(load=Load(rate=1, duration=1.5, warmup=0.25, drain_timeout=10, seed=1),
                     prompt_lengths="16", output_lengths=str(TOKENS))
    slo = Slo(e2e=2 * SERVICE)  # P95 E2E at most twice the unloaded service time
    with realtime():
        result = run_async(sweep(spec, url, slo, SweepConfig(start_rate=0.75 * SATURATION, growth=1.25)))

    rates = [p.rate for p in result.points]
    print("sweep:", [(round(p.rate, 1), round(p.summary.request_throughput, 1), p.is_held)
                     for p in result.points])
    assert result.max_rate is not None and result.first_broken is not None
    assert abs(result.max_rate - SATURATION) / SATURATION <= 0.10
    assert result.first_broken / result.max_rate - 1 <= 0.05 + 1e-9
    # Below saturation every request was served as scripted; above, the server fell behind.
    below = [p for p in result.points if p.rate <= 0.8 * SATURATION]
    assert below and all(p.is_held and p.summary.e2e.p50 == pytest.approx(SERVICE, abs=0.005)
                         for p in below)
    above = [p for p in result.points if p.rate >= 1.1 * SATURATION]
    assert above and all(not p.is_held for p in above)
    assert all(p.summary.request_throughput <= SATURATION * 1.03 for p in result.points)
    assert len(rates) <= 10


def test_a_step_reports_the_rate_its_window_offered_beside_the_target_it_drew_from():
    """Arrivals at a rate are random: a step of target 1/s may offer 12 requests in its 10 s. Served, measured on
    those, is compared with what was offered, not with the target."""
    from hosttune.bench.console import sweep_point_line
    from hosttune.bench.report import _sweep_section
    from hosttune.bench.sweep import SweepPoint, SweepResult

    from .test_metrics import record, run_of

    run = run_of([record(i, 0.5 + 0.8 * i, [0.6 + 0.8 * i], 0.7 + 0.8 * i) for i in range(12)])
    slo = Slo(e2e=1.0)
    point = SweepPoint(1.0, summarize(run, slo), run)
    line = sweep_point_line("http://h:8000", point)
    assert "rate     1.00/s: offered 1.20/s, served 1.20/s," in line
    table = _sweep_section(SweepResult("http://h:8000", slo, (point,), 1.0, None, False))
    assert "| target req/s | offered req/s | served req/s |" in "\n".join(table)
    assert any(row.startswith("| 1.00 | 1.20 | 1.20 |") for row in table)


def test_a_step_no_request_ended_in_shows_no_rate_served():
    """A step shorter than its requests (no warm-up) ended none in its window: '0.00 served' read as a measured
    server serving nothing, in the step's line, its row and the sweep's highest rate served."""
    from hosttune.bench.console import sweep_point_line, sweep_table
    from hosttune.bench.report import _sweep_section
    from hosttune.bench.sweep import SweepPoint, SweepResult

    from .test_metrics import record, run_of

    run = run_of([record(i, 0.1 * i, [1.5 + 0.1 * i], 1.6 + 0.1 * i) for i in range(3)], window=(0.0, 1.0))
    point = SweepPoint(3.0, summarize(run, Slo(e2e=2.0)), run)
    result = SweepResult("http://h:8000", Slo(e2e=2.0), (point,), 3.0, None, False)
    assert "offered 3.00/s, served -/s," in sweep_point_line("http://h:8000", point)
    assert any(row.startswith("| 3.00 | 3.00 | - |") for row in _sweep_section(result))
    assert "Highest rate served in any step: - requests/s." in "\n".join(_sweep_section(result))
    assert sweep_table([result]).splitlines()[2].split()[3] == "-"


def test_the_latency_vs_rate_plot_puts_each_step_at_the_rate_it_offered(tmp_path, monkeypatch):
    """Steps of targets 1/s and 2/s that offered 1.2/s and 1.7/s: the curves and the held step's dotted line stand
    at 1.2 and 1.7 on an axis labelled offered, where the report's offered column puts them."""
    from hosttune.bench import plot
    from hosttune.bench.sweep import SweepPoint, SweepResult

    from .test_metrics import record, run_of

    def step(target, count):
        run = run_of([record(i, 0.5 + i * 9 / count, [0.6 + i * 9 / count], 0.7 + i * 9 / count) for i in range(count)])
        return SweepPoint(target, summarize(run, Slo(e2e=1.0)), run)

    figures = []
    monkeypatch.setattr(plot, "_save", lambda plt, figure, path, title=None: figures.append(figure))
    points = (step(2.0, 17), step(1.0, 12))
    plot.latency_vs_rate([SweepResult("http://h:8000", Slo(e2e=1.0), points, 2.0, None, True)], tmp_path / "x.png")
    for axis in figures[0].axes:
        curves = [line for line in axis.lines if line.get_marker() == "o"]
        assert len(curves) == 2 and all(list(c.get_xdata()) == pytest.approx([1.2, 1.7]) for c in curves)
        held = [line for line in axis.lines if line.get_linestyle() == ":"]
        assert [list(line.get_xdata()) for line in held] == [pytest.approx([1.7, 1.7])]
        assert "offered" in axis.get_xlabel()


def test_summary_csv_gives_a_steps_offered_rate_beside_its_target():
    """A spreadsheet of summary.csv plots latency against what each step offered, as the report's table does."""
    from dataclasses import replace

    from hosttune.bench.report_csv import SUMMARY_COLUMNS, summary_row

    from .test_metrics import record, run_of

    run = replace(run_of([record(i, 0.5 + 0.8 * i, [0.6 + 0.8 * i], 0.7 + 0.8 * i) for i in range(12)]), rate=1.0)
    row = dict(zip(SUMMARY_COLUMNS, summary_row(run, summarize(run))))
    assert row["rate"] == 1.0 and row["offered_rate"] == 1.2


def test_a_sweeps_distribution_and_timeline_plots_say_they_show_the_held_step(tmp_path, monkeypatch):
    """A sweep's latency_cdf.png and timeline.png hold one step per endpoint, the highest rate held: their legends
    name its rate and the report says which step they show."""
    from dataclasses import replace

    from hosttune.bench import plot, report
    from hosttune.bench.sweep import SweepPoint, SweepResult

    from .test_metrics import record, run_of

    run = replace(run_of([record(i, 0.5 + 0.8 * i, [0.6 + 0.8 * i, 0.65 + 0.8 * i], 0.7 + 0.8 * i)
                          for i in range(12)]), rate=1.0, url="http://h:8000")
    point = SweepPoint(1.0, summarize(run, Slo(e2e=1.0)), run)
    sweep = SweepResult("http://h:8000", Slo(e2e=1.0), (point,), 1.0, None, True)
    figures = []
    monkeypatch.setattr(plot, "_save", lambda plt, figure, path, title=None: figures.append(figure))
    plot.latency_cdfs([(run, point.summary)], tmp_path / "cdf.png")
    assert figures[0].axes[0].get_legend_handles_labels()[1] == ["http://h:8000 at 1.00 req/s"]
    text = report.markdown(report.Outcome((), (sweep,), "hosttune bench --sweep", "now"),
                           [plot.CDF_FILE, plot.TIMELINE_FILE, plot.SWEEP_FILE])
    assert ("latency_cdf.png and timeline.png show each endpoint's step at the highest rate held: http://h:8000 at "
            "1.00 req/s.") in text


def test_a_low_rate_keeps_its_significant_digits_wherever_a_sweep_prints_it():
    """A sweep that searched below 0.005 req/s (a slow model, a strict SLO) must not print its rates as 0.00/s."""
    from dataclasses import replace

    from hosttune.bench import report
    from hosttune.bench.console import sweep_point_line, sweep_table
    from hosttune.bench.sweep import SweepPoint, SweepResult
    from hosttune.bench.units import rate_text

    from .test_metrics import record, run_of

    assert [rate_text(r) for r in (0.0, 0.004, 0.00126, 0.05, 0.1, 1.0, 12.346)] == \
        ["0.00", "0.0040", "0.0013", "0.050", "0.10", "1.00", "12.35"]
    run = replace(run_of([record(i, 0.5 + 0.8 * i, [0.6 + 0.8 * i], 0.7 + 0.8 * i) for i in range(12)]),
                  rate=0.004, url="http://h:8000")
    point = SweepPoint(0.004, summarize(run, Slo(e2e=1.0)), run)
    assert "rate   0.0040/s: offered 1.20/s" in sweep_point_line("http://h:8000", point)
    sweep = SweepResult("http://h:8000", Slo(e2e=1.0), (point,), 0.004, 0.006, False)
    assert "| http://h:8000 | 0.0040 | 0.0060 |" in sweep_table([sweep], lambda header, rows: "\n".join(
        "| " + " | ".join(row) + " |" for row in rows))
    text = "\n".join(report._sweep_section(sweep))
    assert "**0.0040 requests/s**" in text and "| 0.0040 | 1.20 | 1.20 |" in text


def test_a_step_no_request_arrived_in_judges_no_rate_and_ends_the_sweep(server_factory):
    """A Poisson step at 0.5/s for 0.2 s usually sees no arrival: judged broke, it sent the sweep to ever lower rates,
    each seeing fewer. It judges no rate, ends the sweep and says to lengthen the steps."""
    from hosttune.bench.console import sweep_table
    from hosttune.bench.report import _sweep_section

    url = server_factory("--ttft", "0.002", "--itl", "0.001")
    spec = BenchSpec(load=Load(rate=1, duration=0.2, seed=0), prompt_lengths="8", output_lengths="2")
    result = run_async(sweep(spec, url, Slo(e2e=1.0), SweepConfig(start_rate=0.5, max_rate=0.5)))
    assert [(p.rate, p.verdict) for p in result.points] == [(0.5, "no request arrived")]
    assert result.max_rate is None and result.first_broken is None
    for text in (sweep_table([result]), "\n".join(_sweep_section(result))):
        assert "no request arrived in the step at 0.50 requests/s" in text and "give a longer --duration" in text
    assert "even the lowest rate" not in "\n".join(_sweep_section(result))


def test_a_sweep_that_held_no_rate_names_the_lowest_rate_judged_and_an_slo_below_the_unloaded_latency():
    """The SLO (E2E 50 ms) below what the server takes with no queue (0.3 s): every step broke down to a rate
    that saw no request, and the report said 'even the lowest rate broke the SLO', of a lowest rate that judged
    nothing, with no word that no rate could meet it."""
    from hosttune.bench.console import sweep_table
    from hosttune.bench.report import _sweep_section
    from hosttune.bench.sweep import SweepPoint, SweepResult

    from .test_metrics import record, run_of

    slo = Slo(e2e=0.05)
    run = run_of([record(i, 1.0 * i, [0.3 + i], 0.3 + i) for i in range(5)], window=(0.0, 5.0))
    empty = run_of([], window=(0.0, 5.0))
    points = (SweepPoint(1.0, summarize(run, slo), run), SweepPoint(0.25, summarize(empty, slo), empty))
    result = SweepResult("http://h:8000", slo, points, None, 1.0, False)
    why = ("even the lowest rate judged (1.00 requests/s) broke the SLO, though the server kept up: the SLO asks for "
           "less than its latency with no queue.")
    assert f"Highest rate that held: none, {why}" in "\n".join(_sweep_section(result))
    assert f"NOTE http://h:8000: no rate held: {why}" in sweep_table([result])
