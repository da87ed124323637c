"""Failures, rejections and open-loop arrivals, against the scripted server."""

import asyncio
import itertools
import random
import re
import socket
import statistics

import pytest

from hosttune.bench.benchmark import BenchSpec, measure, run_async
from hosttune.bench.client import Client, Target, discover_model
from hosttune.bench.loadgen import Load, arrival_times
from hosttune.bench.metrics import Slo, summarize
from hosttune.bench.record import FAILED, OK, REJECTED
from hosttune.errors import BenchError


def spec(**load):
    return BenchSpec(load=Load(**load), prompt_lengths="8", output_lengths="4", timeout=10)


def test_http_errors_and_errors_inside_200_streams_are_failures_and_429_apart(server_factory):
    url = server_factory("--ttft", "0.01", "--itl", "0.002", "--fail-status-every", "5",
                         "--error-every", "7", "--error-after", "2")
    run = run_async(measure(spec(users=2, num_requests=70), url))
    s = summarize(run, Slo(e2e=1.0))
    # The server numbers requests from 1, and /tokenize calls are not requests.
    by_number = {n: (n % 5 == 0, n % 7 == 0 and n % 5 != 0) for n in range(1, 71)}
    want_500 = sum(is_500 for is_500, _ in by_number.values())
    want_stream = sum(is_stream for _, is_stream in by_number.values())
    assert s.errors_by_status == {"500": want_500, "stream-error": want_stream}
    assert s.num_failed == want_500 + want_stream and s.num_rejected == 0
    assert s.num_ok == 70 - want_500 - want_stream
    stream_failures = [r for r in run.requests if r.error.startswith("stream-error")]
    assert all(r.status == 200 and r.outcome == FAILED and len(r.chunks) == 2 for r in stream_failures)
    assert s.slo_met is False  # 30% errors


def test_rejections_are_counted_apart(server_factory):
    url = server_factory("--ttft", "0.05", "--itl", "0.01", "--capacity", "2", "--max-queue", "0")
    run = run_async(measure(spec(users=6, num_requests=60), url))
    s = summarize(run)
    rejected = [r for r in run.requests if r.outcome == REJECTED]
    assert s.num_rejected == len(rejected) > 0 and s.num_failed == 0
    assert s.errors_by_status == {"429": s.num_rejected}
    assert all(r.status == 429 and r.e2e < 0.05 for r in rejected)
    assert s.num_ok + s.num_rejected == 60


def test_a_request_past_its_timeout_fails(server_factory):
    url = server_factory("--ttft", "0.5", "--itl", "0.01")
    slow = BenchSpec(load=Load(users=1, num_requests=2), prompt_lengths="8",
                     output_lengths="4", timeout=0.2)
    run = run_async(measure(slow, url))
    assert [r.error.split(":")[0] for r in run.requests] == ["timeout", "timeout"]
    # uvloop rounds timers to whole milliseconds, so a timeout may fire a millisecond or so early.
    assert all(0.195 <= r.e2e < 0.4 for r in run.requests), [r.e2e for r in run.requests]


def test_a_request_past_its_timeout_at_the_end_of_a_run_fails_rather_than_being_cancelled(server_factory):
    """The run waits for its last requests as long as --timeout (the CLI sets both): each must end by its own
    timeout, a failure the report counts, not by the run's cancelling it first, as if it never mattered."""
    url = server_factory("--ttft", "0.5", "--itl", "0.01")
    slow = BenchSpec(load=Load(users=3, num_requests=3, drain_timeout=0.2), prompt_lengths="8",
                     output_lengths="4", timeout=0.2)
    run = run_async(measure(slow, url))
    assert [r.error.split(":")[0] for r in run.requests] == ["timeout"] * 3
    assert summarize(run).num_failed == 3


def test_unreachable_endpoint_is_a_user_error():
    with pytest.raises(BenchError, match="cannot reach"):
        run_async(measure(spec(users=1, num_requests=1), "http://127.0.0.1:9"))


def test_an_endpoint_that_accepts_but_never_answers_is_a_user_error_naming_the_wait():
    with socket.socket() as silent:  # the kernel completes the connection; nobody ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(BenchError, match=r"/v1/models did not answer within 0.5s; is the server up, and does it "
                                             r"speak https\?$"):
            run_async(discover_model(url, timeout=0.5))


def test_transport_failures_are_recorded_not_raised():
    async def go():
        async with Client(Target("http://127.0.0.1:9", "m", timeout=2)) as client:
            return await client.stream("hello", 4)
    result = run_async(go())
    assert result.outcome == FAILED and result.error.startswith("transport")


def test_open_loop_offers_the_asked_rate(server_factory):
    url = server_factory("--ttft", "0.005", "--itl", "0.002")
    run = run_async(measure(spec(rate=100, duration=3.0, warmup=0.5, seed=7), url))
    s = summarize(run)
    assert all(r.outcome == OK for r in run.requests)
    # 300 expected arrivals; Poisson sd is about 17.
    assert 250 <= s.num_requests <= 350
    gaps = [b.scheduled - a.scheduled for a, b in zip(run.requests, run.requests[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.01, rel=0.1)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.15)
    assert s.lag.send_p50 < 0.002


def test_an_open_loop_bounded_by_a_request_count_serves_no_more_than_it_offered(server_factory):
    """The window ends where sending ended, as a duration's does: served and offered cover the same time, and the
    backlog is read while requests still arrive (not after the drain, where nothing is ever in flight)."""
    url = server_factory("--ttft", "0.02", "--itl", "0.02")  # 4 tokens: 0.08 s a request, 8 in flight at 100/s
    run = run_async(measure(spec(rate=100, burstiness=1000, num_requests=60, warmup=0.3, seed=7), url))
    s = summarize(run)
    assert all(r.outcome == OK for r in run.requests)
    assert s.offered_rate == pytest.approx(100, rel=0.1)  # 60 regular arrivals over 0.6 s, not over 0.6 s + the drain
    assert s.request_throughput <= s.offered_rate * 1.05  # the warm-up's last requests no longer count over nothing
    assert abs(s.backlog_growth) <= 3


def test_an_open_loop_of_a_few_requests_all_answered_after_the_last_arrival_reports_what_it_served(server_factory):
    """--rate 100 --requests 5 against a 0.2 s TTFT: nothing ends before the last arrival, so a window ending there
    would show 0 requests/s and 0 tokens/s for a server that served all 5; the window runs to the last response."""
    url = server_factory("--ttft", "0.2", "--itl", "0.01")
    run = run_async(measure(spec(rate=100, burstiness=1000, num_requests=5, seed=7), url))
    s = summarize(run)
    assert s.num_ok == 5 and run.window[1] == pytest.approx(max(r.end for r in run.requests))
    assert s.request_throughput == pytest.approx(5 / run.window[1]) and s.output_token_throughput > 0


@pytest.mark.parametrize("rate, burstiness, span", [(0.5, 1.0, 1.0), (1.0, 0.25, 2.0), (1.0, 4.0, 2.0)])
def test_arrivals_in_any_span_from_the_start_average_the_rate_times_its_length(rate, burstiness, span):
    """A 1 s sweep step at 0.5/s offered 2.00/s: the first arrival came at 0, so a short step always held one more
    request than its rate. A process already running (Poisson: an exponential wait) offers rate x span on average."""
    counts = []
    for seed in range(3000):
        arrivals = arrival_times(rate, burstiness, random.Random(seed))
        counts.append(sum(1 for _ in itertools.takewhile(lambda t: t < span, arrivals)))
    assert statistics.mean(counts) == pytest.approx(rate * span, abs=0.15 * rate * span)


def test_an_open_loop_bounded_by_a_count_ends_its_window_where_the_next_arrival_would_have_come(server_factory):
    """N arrivals span N gaps from the warm-up's end, the last to the arrival not sent: a window ending at the last
    one sent spans N - 1 and offers N / (N - 1) times the rate, and one ending where the loop woke after the next
    arrival, late by the client's lag, less (Poisson: exactly the rate on average at the next arrival)."""
    url = server_factory("--ttft", "0.002", "--itl", "0.001")
    run = run_async(measure(spec(rate=50, burstiness=1000, num_requests=6, seed=7), url))
    arrivals = list(itertools.islice(arrival_times(50, 1000, random.Random("arrivals-7")), 7))
    assert [r.scheduled for r in run.requests] == arrivals[:6]
    assert run.window == (0.0, arrivals[6])
    assert summarize(run).offered_rate == pytest.approx(6 / arrivals[6])


def test_burstiness_above_one_makes_arrivals_steadier(server_factory):
    url = server_factory("--ttft", "0.005", "--itl", "0.002")
    run = run_async(measure(spec(rate=100, burstiness=16, duration=2.0, seed=7), url))
    gaps = [b.scheduled - a.scheduled for a, b in zip(run.requests, run.requests[1:])]
    # Gamma with shape 16: coefficient of variation 1/4.
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(0.25, abs=0.06)


def test_a_closed_loop_bounded_by_a_count_counts_over_its_measured_requests_only(server_factory):
    """--users 3 --requests 3 --warmup 0.3s, the users in step: the warm-up's last round ends just after the warm-up,
    and a window from its end counted that round too, about twice the rate. The window runs from the first measured
    request's start to the last one's end, and counts the requests that began in it, over the users' mean busy time."""
    url = server_factory("--ttft", "0.03", "--itl", "0.01")
    run = run_async(measure(spec(users=3, num_requests=3, warmup=0.3), url))
    s = summarize(run)
    measured = [r for r in run.requests if not r.is_warmup]
    assert s.num_ok == 3 and any(r.end >= 0.3 for r in run.requests if r.is_warmup)
    assert run.window == (min(r.sent for r in measured), max(r.end for r in measured))
    assert s.request_throughput == pytest.approx(3 / statistics.mean(r.e2e for r in measured))  # one each


def test_a_closed_loop_bounded_by_a_count_whose_users_end_apart_reads_their_steady_rate(server_factory):
    """8 users, 24 requests of 1 to 41 output tokens (10 ms + 5 ms a token): the users fall out of step and end
    their last requests apart. Each user busy back to back serves 1 / its mean E2E, so together users / mean E2E;
    a window from the first start to the last end counted the drain too, and read 15-35% low."""
    url = server_factory("--ttft", "0.01", "--itl", "0.005")
    for warmup in (0.0, 0.3):
        run = run_async(measure(BenchSpec(load=Load(users=8, num_requests=24, warmup=warmup), prompt_lengths="8",
                                          output_lengths="uniform:1-41", timeout=10), url))
        measured = [r for r in run.requests if not r.is_warmup]
        steady = 8 / statistics.mean(r.e2e for r in measured)
        assert len(measured) == 24 and summarize(run).request_throughput == pytest.approx(steady, rel=0.03)


def test_warmup_requests_are_kept_but_not_measured(server_factory):
    url = server_factory("--ttft", "0.01", "--itl", "0.002")
    run = run_async(measure(spec(users=2, duration=1.0, warmup=0.5), url))
    s = summarize(run)
    warm = [r for r in run.requests if r.is_warmup]
    assert warm and all(r.scheduled < 0.5 for r in warm)
    assert all(r.scheduled >= 0.5 for r in run.requests if not r.is_warmup)
    assert s.num_warmup == len(warm) and s.num_requests == len(run.requests) - len(warm)
    # The run stops by itself: nothing was sent after warm-up + duration.
    assert max(r.sent for r in run.requests) < 1.5


def test_same_seed_same_requests_whatever_the_server(server_factory):
    fast = server_factory("--ttft", "0.002", "--itl", "0.001")
    slow = server_factory("--ttft", "0.05", "--itl", "0.01")
    lengths = dict(prompt_lengths="uniform:8-64", output_lengths="uniform:2-6")
    runs = [run_async(measure(BenchSpec(load=Load(rate=80, duration=1.0, seed=3), **lengths), url))
            for url in (fast, slow)]
    plans = [[(r.index, round(r.scheduled, 9), r.prompt_tokens, r.max_tokens) for r in run.requests]
             for run in runs]
    assert plans[0] == plans[1] and len(plans[0]) > 40


def test_a_keep_alive_connection_closed_by_the_server_is_retried_once():
    """A server that answers one request per connection and drops the second one
    unanswered, as a server whose keep-alive timeout fires just as a request comes."""
    import asyncio

    from scripted_server.stream import STREAM_HEAD, TEXT_EVENT, event

    seen = []

    async def handle(reader, writer):
        for number in (1, 2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            seen.append(number)
            if number == 2:
                writer.close()
                return
            writer.write(STREAM_HEAD + TEXT_EVENT + event("[DONE]") + b"0\r\n\r\n")
            await writer.drain()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with Client(Target(f"http://127.0.0.1:{port}", "m", timeout=5)) as client:
            results = [await client.stream("hello", 1) for _ in range(3)]
        server.close()
        return results

    results = run_async(go())
    assert [r.outcome for r in results] == [OK, OK, OK]
    assert seen == [1, 2, 1, 2, 1]  # the 2nd and 3rd requests were each sent twice


def test_a_crash_in_the_load_generator_surfaces_instead_of_hanging(server_factory):
    url = server_factory("--ttft", "0.002", "--itl", "0.001")

    class Broken:
        high = 8

        def sample(self, rng, index):
            if index == 3:
                raise ZeroDivisionError("a bug")
            return 8

        def describe(self):
            return "broken"

    spec = BenchSpec(load=Load(users=2, num_requests=20), prompt_lengths="8", output_lengths="2")
    object.__setattr__(spec, "prompt_dist", Broken())
    with pytest.raises(ZeroDivisionError):
        run_async(measure(spec, url))


@pytest.mark.parametrize("field, option", [("prompt_lengths", "--prompts"), ("output_lengths", "--max-tokens")])
def test_a_bad_length_distribution_names_its_option(field, option):
    with pytest.raises(BenchError, match=f"^{option}: length distribution '0': '0' is not a positive integer$"):
        BenchSpec(load=Load(users=1, num_requests=1), **{field: "0"})


def test_a_stream_still_going_at_its_timeout_keeps_its_tokens_and_is_not_said_unanswered(server_factory):
    """A server streaming slowly answered, and its tokens arrived: the timed-out request lost them (streamed tokens/s
    read 0) and the line said the server had answered nothing and might be down."""
    from typer.testing import CliRunner

    from hosttune.cli import app

    url = server_factory("--ttft", "0.05", "--itl", "0.1")
    result = CliRunner().invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "2", "--warmup", "0",
                                      "--prompts", "8", "--max-tokens", "50", "--timeout", "0.4",
                                      "--max-client-lag", "1s"])
    assert result.exit_code == 2
    assert re.search(r"the first failed: timeout: the stream was still going after 0.4s \([1-4] tokens\); the server "
                     "streams too slowly to finish within --timeout: give a longer one, or ask for fewer --max-tokens$",
                     result.stderr.splitlines()[-1]), result.stderr
    streamed = next(line for line in result.stdout.splitlines() if line.startswith("output tokens/s streamed"))
    assert float(streamed.split()[-1]) > 0, result.stdout


def test_progress_while_measuring_counts_the_measured_requests_not_the_warm_ups(server_factory):
    """The bar said 'measuring: 22 done' of a run of 16 measured requests: the warm-up's were counted as measured,
    and --requests N showed a count past N that the table then did not."""
    from hosttune.cli.bench_run import _planned

    url = server_factory("--ttft", "0.1", "--itl", "0.01")
    seen = []
    load = Load(users=2, num_requests=16, warmup=0.7)
    run = run_async(measure(BenchSpec(load=load, prompt_lengths="8", output_lengths="4", timeout=10), url,
                            seen.append))
    measuring = [p for p in seen if not p.is_warmup]
    assert measuring and all(p.num_done <= 16 and p.num_ok + p.num_errors == p.num_done for p in measuring), seen
    assert [p.num_done for p in seen if p.is_warmup][-1] > 0  # the warm-up shows its own
    assert summarize(run).num_requests == 16
    assert _planned(load) == (16, "requests")  # the bar's length: the measured requests


def test_progress_after_the_sending_ends_says_it_waits_for_the_last_responses(server_factory):
    """Past its duration a run waits (up to --timeout) for the requests still streaming: the bar stood full at
    'measuring', as if the run were ending, through a wait that may last minutes."""
    from hosttune.bench.console import progress_status

    url = server_factory("--ttft", "0.05", "--itl", "0.1")  # one request streams for about 1.5 s
    seen = []
    run_async(measure(BenchSpec(load=Load(users=1, duration=0.3), prompt_lengths="8", output_lengths="15",
                                timeout=10), url, seen.append))
    waiting = [p for p in seen if p.elapsed > 0.6]
    assert waiting and all(p.is_draining for p in waiting), seen
    assert progress_status(waiting[0]).startswith("waiting for the last responses (up to --timeout): 1 in flight")
    assert not any(p.is_draining for p in seen if p.elapsed < 0.25)


def test_a_server_gone_mid_run_ends_a_run_bounded_by_a_count():
    """Each user sent one lost request per back-off (up to 8 s) until --requests was spent: 20 requests took a
    minute against a server gone, 1,000 an hour. Past `gone_after` with no connection the sending stops, and the
    run says why it ended early."""
    import time

    from scripted_server.launch import start, stop

    process, url = start("--ttft", "0.05", "--itl", "0.01", lifetime=60)
    try:
        began = time.monotonic()
        load = Load(users=2, num_requests=400, gone_after=1.0)
        task = measure(BenchSpec(load=load, prompt_lengths="8", output_lengths="2", timeout=10), url)

        async def run_and_kill():
            running = asyncio.ensure_future(task)
            await asyncio.sleep(1.0)
            process.kill()  # the server goes mid-run
            return await running
        run = run_async(run_and_kill())
    finally:
        stop(process, timeout=10)
    assert time.monotonic() - began < 20
    s = summarize(run)
    assert 0 < s.num_ok and s.num_requests < 400 and run.server_gone_at is not None
    assert run.stop_note() == (f"the server took no connection after {run.server_gone_at:.1f} s, so the run stopped "
                               "sending; the figures cover it until then")
    assert run.window[1] == max(run.window[0], run.server_gone_at)  # rates of the time it answered, not its absence
    assert summarize(run).request_throughput > 10
