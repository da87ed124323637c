from array import array
from dataclasses import replace

import numpy as np
import pytest

from hosttune.bench.metrics import (Slo, errors_by_status, latency_stats, percentile,
                                    summarize, tpot)
from hosttune.bench.record import (CANCELLED, FAILED, OK, REJECTED, LagSample,
                                   RequestRecord, RunRecord)
from hosttune.errors import BenchError


def record(index, sent, chunks, end, outcome=OK, status=200, error="", tokens=None,
           is_warmup=False, scheduled=None, prompt_tokens=100):
    return RequestRecord(
        index=index, scheduled=sent if scheduled is None else scheduled, sent=sent, end=end,
        chunks=array("d", chunks), outcome=outcome, status=status, error=error,
        prompt_tokens=prompt_tokens, max_tokens=len(chunks),
        output_tokens=len(chunks) if tokens is None else tokens,
        reported_prompt_tokens=None, is_warmup=is_warmup,
    )


def run_of(requests, window=(0.0, 10.0), lag=(), cpu=0.1):
    return RunRecord(
        url="http://127.0.0.1:1", model="m", mode="users", users=1, rate=None,
        burstiness=None, clock_origin=0.0, warmup_end=window[0], window=window, requests=tuple(requests),
        loop_lag=tuple(lag), client_cpu=cpu, tokenizer="t", prompt_lengths="p",
        output_lengths="o",
    )


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 100])
def test_percentile_is_numpy_linear(q):
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.5]
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_latency_stats():
    stats = latency_stats([float(i) for i in range(1, 101)])
    assert (stats.count, stats.mean, stats.max) == (100, 50.5, 100.0)
    assert stats.p50 == pytest.approx(50.5)
    assert stats.p99 == pytest.approx(99.01)
    assert latency_stats([]) is None


def test_ttft_itl_tpot_e2e_of_one_request():
    r = record(0, sent=1.0, chunks=[1.2, 1.25, 1.35], end=1.36)
    assert r.ttft == pytest.approx(0.2)
    assert r.e2e == pytest.approx(0.36)
    assert tpot(r) == pytest.approx((0.36 - 0.2) / 2)
    assert tpot(record(1, 0.0, [0.1], 0.1)) is None


def test_summary_counts_and_excludes_warmup_and_failures_from_latency():
    requests = [
        record(0, 0.0, [0.5, 0.6], 0.6, is_warmup=True),  # warm-up: not measured
        record(1, 1.0, [1.1, 1.2, 1.3], 1.3),
        record(2, 2.0, [2.2, 2.3], 2.3),
        record(3, 3.0, [], 3.01, outcome=REJECTED, status=429, error="http 429: full"),
        record(4, 4.0, [4.1], 4.2, outcome=FAILED, error="stream-error: boom"),
        record(5, 5.0, [], 5.5, outcome=FAILED, status=500, error="http 500: x"),
        record(6, 6.0, [], 9.0, outcome=CANCELLED, status=0, error="cancelled: stop"),
    ]
    s = summarize(run_of(requests, window=(1.0, 11.0)))
    assert (s.num_requests, s.num_ok, s.num_rejected, s.num_failed, s.num_cancelled,
            s.num_warmup) == (6, 2, 1, 2, 1, 1)
    assert s.errors_by_status == {"429": 1, "500": 1, "stream-error": 1}
    assert s.ttft.count == 2 and s.ttft.p50 == pytest.approx(0.15)
    assert s.e2e.max == pytest.approx(0.3)
    assert sorted([s.itl.p50, s.itl.max]) == pytest.approx([0.1, 0.1])
    assert s.request_throughput == pytest.approx(2 / 10)
    assert s.output_token_throughput == pytest.approx(5 / 10)
    assert s.input_token_throughput == pytest.approx(200 / 10)
    assert s.error_rate == pytest.approx(3 / 6)
    assert s.goodput is None and s.slo_met is None


def test_throughput_counts_completions_inside_the_window_only():
    requests = [record(i, float(i), [i + 0.5], i + 1.0) for i in range(10)]
    s = summarize(run_of(requests, window=(2.0, 6.0)))
    # Ends at 3, 4, 5, 6 fall in [2, 6]; the end at 2.0 too (from a request sent at 1).
    assert s.request_throughput == pytest.approx(5 / 4)


def test_streamed_throughput_counts_the_tokens_that_arrived_inside_the_window():
    """Chunks count at their arrival, from requests of any outcome; a chunk of a request that reported more
    tokens than it had chunks weighs accordingly."""
    requests = [
        record(0, 0.0, [0.5, 1.5, 2.5, 3.5], 3.6),  # two chunks inside [1, 3]
        record(1, 1.0, [1.2, 1.4], 1.5, tokens=6),  # two chunks of three tokens each
        record(2, 2.0, [2.5, 3.5], 4.0, outcome=CANCELLED, status=0, error="cancelled: stop"),  # one inside
        record(3, 2.0, [], 2.1, outcome=REJECTED, status=429),
    ]
    s = summarize(run_of(requests, window=(1.0, 3.0)))
    assert s.streamed_token_throughput == pytest.approx((2 + 6 + 1) / 2)
    assert s.output_token_throughput == pytest.approx(6 / 2)  # only request 1 finished inside


def test_streamed_throughput_does_not_see_completion_waves():
    """Closed-loop users that all ask for the same output length finish in waves: a window that catches one
    wave more counts its whole output as finished, while the tokens streamed are the same either way."""
    def users(offset):  # 4 users, each 10 tokens over 1 s, back to back from `offset` on
        return [record(u * 100 + k, offset + k, [offset + k + 0.1 * (i + 1) for i in range(10)], offset + k + 1.0)
                for u in range(4) for k in range(6)]
    early, late = summarize(run_of(users(0.0), window=(1.0, 4.0))), summarize(run_of(users(0.05), window=(1.0, 4.0)))
    assert early.output_token_throughput == pytest.approx(4 * 10 * 4 / 3)  # waves ending at 1, 2, 3, 4
    assert late.output_token_throughput == pytest.approx(4 * 10 * 3 / 3)  # at 1.05, 2.05, 3.05
    assert early.streamed_token_throughput == pytest.approx(late.streamed_token_throughput, rel=0.05)
    assert early.streamed_token_throughput == pytest.approx(4 * 10, rel=0.05)


def test_goodput_and_slo_verdict():
    fast = [record(i, float(i), [i + 0.1, i + 0.2], i + 0.2) for i in range(8)]
    slow = [record(8 + i, 8.0 + i, [8.5 + i, 9.5 + i], 9.5 + i) for i in range(2)]
    run = run_of(fast + slow, window=(0.0, 12.0))
    s = summarize(run, Slo(ttft=0.3, e2e=1.0))
    assert s.goodput == pytest.approx(8 / 12)
    assert s.goodput_fraction == pytest.approx(0.8)
    assert s.slo_met is False  # P95 E2E is 1.5 s
    assert summarize(run, Slo(e2e=1.0, percentile=50)).slo_met is True
    assert summarize(run, Slo(e2e=2.0)).slo_met is True


def test_goodput_counts_the_requests_that_requests_per_second_counts():
    """Warm-up requests that end inside the window count in requests/s; goodput counts the same requests, those
    that met the SLO, so a run whose every request met it shows goodput equal to requests/s."""
    warm = [record(i, 0.1 * i, [0.1 * i + 0.1], 0.1 * i + 1.2, is_warmup=True) for i in range(5)]  # end in 1.2..1.6
    measured = [record(5 + i, 1.0 + i, [1.1 + i], 1.2 + i) for i in range(8)]  # end in 1.2..8.2
    s = summarize(run_of(warm + measured, window=(1.0, 9.0)), Slo(e2e=2.0))
    assert s.request_throughput == pytest.approx(13 / 8)
    assert s.goodput == pytest.approx(s.request_throughput)
    assert s.goodput_fraction == 1.0


def test_the_report_labels_goodput_as_a_rate_of_requests_and_its_share_apart():
    from hosttune.bench.report import summary_rows

    warm = [record(0, 0.5, [0.6], 1.5, is_warmup=True)]
    measured = [record(1 + i, 1.0 + i, [1.1 + i], 1.2 + i) for i in range(4)] + [record(5, 5.0, [5.1], 7.5)]
    rows = dict(summary_rows([summarize(run_of(warm + measured, window=(1.0, 9.0)), Slo(e2e=2.0))]))
    assert rows["requests/s"] == ["0.75"] and rows["goodput: of them within the SLO (req/s)"] == ["0.62"]
    assert rows["measured requests within the SLO"] == ["80%"]


def test_slo_fails_on_too_many_errors_even_with_fast_successes():
    ok = [record(i, float(i), [i + 0.1], i + 0.1) for i in range(95)]
    rejected = [record(95 + i, 95.0 + i, [], 95.01 + i, outcome=REJECTED, status=429)
                for i in range(5)]
    run = run_of(ok + rejected, window=(0.0, 100.0))
    assert summarize(run, Slo(e2e=1.0)).slo_met is False
    assert summarize(run, Slo(e2e=1.0, max_error_rate=0.05)).slo_met is True


def test_client_lag_flags_a_slow_client():
    requests = [record(i, float(i) + 0.0001, [i + 0.1], i + 0.1, scheduled=float(i))
                for i in range(10)]
    quiet = [LagSample(i * 0.005, 0.0002) for i in range(1000)]
    loud = quiet[:980] + [LagSample(5.0, 0.02)] * 20
    assert summarize(run_of(requests, lag=quiet)).lag.is_behind is False
    lag = summarize(run_of(requests, lag=loud)).lag
    assert lag.is_behind is True and lag.loop_p99 == pytest.approx(0.02)
    late = [record(i, float(i) + 0.05, [i + 0.1], i + 0.1, scheduled=float(i)) for i in range(10)]
    assert summarize(run_of(late, lag=quiet)).lag.send_p99 == pytest.approx(0.05)
    assert summarize(run_of(late, lag=quiet)).lag.is_behind is True


def test_errors_by_status_uses_the_error_kind_without_a_status():
    rs = [record(0, 0, [], 1, outcome=FAILED, status=0, error="timeout: slow"),
          record(1, 0, [], 1, outcome=FAILED, status=0, error="transport: refused"),
          record(2, 0, [], 1, outcome=FAILED, status=200, error="stream-cut: no [DONE]")]
    assert errors_by_status(rs) == {"stream-cut": 1, "timeout": 1, "transport": 1}


def test_bad_slo_is_a_user_error():
    with pytest.raises(BenchError, match="percentile"):
        Slo(e2e=1.0, percentile=97)
    with pytest.raises(BenchError, match="positive"):
        Slo(ttft=0)


def test_backlog_growth_shows_a_server_falling_behind():
    # One arrival every 0.1 s. Kept up: each takes 0.05 s. Behind: each ends 0.1 s
    # after the previous one ended, plus 0.05 s per request of growing queue.
    steady = [record(i, i * 0.1, [i * 0.1 + 0.01], i * 0.1 + 0.05) for i in range(100)]
    behind = [record(i, i * 0.1, [i * 0.1 + 0.01], i * 0.15 + 0.05) for i in range(100)]
    s = summarize(run_of(steady, window=(1.0, 9.0)))
    assert s.backlog_growth == 0 and s.mean_in_flight == pytest.approx(0.5, abs=0.02)
    assert s.is_kept_up
    b = summarize(run_of(behind, window=(1.0, 9.0)))
    # In flight at t: sent by t (10t+1) minus ended by t ((t-0.05)/0.15+1).
    assert b.backlog_growth == 27 and not b.is_kept_up


def test_the_terminal_table_says_how_many_measured_requests_were_cancelled():
    """A second Ctrl-C cancels the requests in flight: '3 (1 / 0 / 0)' alone does not add up, and report.md says
    why; the terminal must too."""
    from hosttune.bench.console import summary_table

    run = run_of([record(0, 0.0, [0.1], 0.2), record(1, 0.0, [], 0.3, outcome=CANCELLED, status=0),
                  record(2, 0.1, [], 0.3, outcome=CANCELLED, status=0)])
    text = summary_table([(run, summarize(run))])
    assert "3 (1 / 0 / 0)" in text
    assert "NOTE http://127.0.0.1:1: 2 measured requests were still running at the stop and were cancelled" in text


def test_summary_csv_holds_what_the_table_shows_and_whether_the_run_was_cut_short():
    """TPOT P99 is in the table and report.md; a run that a signal ended, or whose requests were cancelled, must be
    told apart from a full one in a summary.csv of many runs."""
    from dataclasses import replace

    from hosttune.bench.report_csv import SUMMARY_COLUMNS, summary_row

    run = replace(run_of([record(0, 0.0, [0.1, 0.2, 0.4], 0.4), record(1, 0.0, [], 0.3, outcome=CANCELLED, status=0)]),
                  stopped_by="SIGINT")
    row = dict(zip(SUMMARY_COLUMNS, summary_row(run, summarize(run))))
    assert len(row) == len(SUMMARY_COLUMNS) == len(summary_row(run, summarize(run)))
    assert (row["tpot_p99"], row["cancelled"], row["stopped_by"]) == (0.15, 1, "SIGINT")


def test_a_run_stopped_in_its_warm_up_is_said_to_have_measured_nothing_not_to_have_run_the_whole_warm_up():
    """Ctrl-C 4 s into a 30 s warm-up: the window is [30, 30], and 'ended the run after 30.0 s' was a wrong number."""
    from dataclasses import replace

    from hosttune.bench import report
    from hosttune.bench.console import summary_table

    run = replace(run_of([record(0, 0.0, [0.1], 0.2, is_warmup=True)], window=(30.0, 30.0)), stopped_by="SIGINT")
    text = summary_table([(run, summarize(run))])
    assert "SIGINT ended the run during its 30 s warm-up, before anything was measured" in text
    assert "after 30.0 s" not in text
    assert "SIGINT ended the run during its 30 s warm-up" in report.markdown(report.Outcome(((run, summarize(run)),), (), "c"), [])


def test_a_window_that_begins_after_the_warm_up_counts_only_requests_that_began_in_it():
    """Users in step: the warm-up's last round ends as the measured one starts. Counted, it doubled requests/s and
    output tokens/s; a window that begins at the warm-up's end still counts its requests (the steady state's)."""
    warm = [record(i, 0.24, [0.29, 0.3052], 0.3052 + i / 1e4, is_warmup=True) for i in range(3)]
    measured = [record(3 + i, 0.3051 + i / 1e4, [0.35, 0.365], 0.365 + i / 1e4) for i in range(3)]
    run = replace(run_of(warm + measured, window=(0.3051, 0.3652)), warmup_end=0.3)
    s = summarize(run, Slo(e2e=1.0))
    assert s.request_throughput == pytest.approx(3 / 0.0601) and s.goodput == s.request_throughput
    assert s.output_token_throughput == s.streamed_token_throughput == pytest.approx(6 / 0.0601)
    from_warmup_end = summarize(replace(run, window=(0.3, 0.3652)))
    assert from_warmup_end.request_throughput == pytest.approx(6 / 0.0652)
