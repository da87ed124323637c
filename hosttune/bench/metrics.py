"""Pure functions from recorded timings to the numbers a report shows.

Definitions (every time is measured by the client, in seconds):

- **TTFT** (time to first token): from the moment the client starts sending the request
  (opening a connection first when no kept-alive one is idle) to the arrival of the first
  chunk that carries output text (a chat stream's opening role-only chunk does not count; a
  reasoning model's thinking, `reasoning` or `reasoning_content`, does).
  Arrival times are taken in the socket callback, as the bytes are read.
- **ITL** (inter-token latency): every gap between two consecutive output chunks of
  one request, pooled over all requests. A server that packs several tokens into one
  chunk shows one gap for them.
- **TPOT** (time per output token), per request: (E2E - TTFT) / (output tokens - 1),
  for requests with at least two output tokens.
- **E2E** (end-to-end latency): from the start of sending to the end of the response
  (the `[DONE]` event or the end of the body).
- Percentiles use linear interpolation between the two nearest ranks (numpy's default,
  Hyndman & Fan type 7).
- Latency statistics cover *measured* requests: those sent after the warm-up period
  that succeeded. Throughput counts measured and warm-up requests alike that finished
  inside the throughput window (warm-up end to where sending stopped: the duration's end,
  or, with --requests, an open loop's or a trace's arrival after its last measured one, unless
  none had ended by then; a closed loop bounded by a count, a trace whose arrivals ran out
  before its count or duration, or that open loop, its last measured response), divided by
  its length; so it describes the steady state, not the
  ramp-up or the drain. A closed loop bounded by a count is the exception: its window runs
  from its first measured request's start to its last one's end, and counts only the
  requests that began in it (its users in step end a round of warm-up requests just after
  the warm-up, which a window from the warm-up's end would count as well: twice the rate).
  Its rates divide by its users' mean busy time (each user's first measured request's start
  to its last one's end), not by the window's length: its users end at different times, and
  the drain after its last request is sent, fewer and fewer users busy, read low by about
  users / requests. A window no request ended in (shorter than a request, with no warm-up)
  measures no rate served: the report shows none (null in results.json) and says why.
- **Offered rate**: the measured requests sent in the window, per second of it. An open
  loop's arrivals are random around its target rate, so this is what a step offered; the
  requests served in the window exceed it only by a backlog the window began with and
  cleared (then its backlog growth is negative).
- **Streamed output tokens/s**: the output tokens that *arrived* inside the throughput
  window, whatever became of their request, over its length (each chunk counted at its
  arrival, weighing its request's output tokens over its chunks). Counting finished
  requests instead, a closed-loop run whose users all ask for the same output length
  finishes them in waves, and one wave more or less in the window moves the figure by
  users x output length / window (64 x 512 tokens over 60 s: 550 tokens/s).
- A request **succeeded** when it got HTTP 200 and a complete stream with no error
  event. 429 responses are **rejections**, counted apart; everything else (other
  statuses, transport errors, timeouts, an error event inside a 200 stream, a stream
  cut short) is a **failure**. A closed-loop user sends a refused request (429 or 503)
  again after backing off; each try is a request of its own, and **retries** counts the
  tries after the first. Latency percentiles cover only the requests that succeeded:
  a refusal's quick answer is no latency of the server's.
- **Backlog growth**: requests in flight at the end of the window minus at its start
  (arrivals minus completions). A server past saturation builds a queue that a short
  run may not yet show in its percentiles; it shows here. The server **kept up** when the
  growth is within 3 sigma of chance, taking the number in flight as Poisson around its
  time-average: growth <= 3 * sqrt(2 * mean in flight) + 1.
- **Goodput**: of the requests that requests/s counts (measured and warm-up requests alike that
  succeeded and finished inside the window), those that met every SLO on their own (their TTFT,
  TPOT and E2E each within the limit), per second of the window: never more than requests/s,
  and equal to it when every one met the SLO. Beside it, the share of *measured* requests
  (failed and rejected ones included) that met the SLO.
- **Client lag**: how late the client's event loop woke for a timer it set (sampled
  every few milliseconds through the run), and how late each open-loop request was
  sent after its scheduled time. The run is flagged when the P99 of either exceeds the
  limit: then the client, not the server, may have set the pace.
- **Prefix-cache hit rate** (the server's, from its `/metrics`): the prompt tokens it found in
  its prefix cache over those it looked up: the counters' increase from the measured window's
  start to the end of the run (a server that exports only a hit rate: its mean). Behind a
  host's front, one replica's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from hosttune.errors import BenchError
from hosttune.bench.record import CANCELLED, FAILED, OK, REJECTED, RequestRecord, RunRecord, ServerSample

PERCENTILES = (50, 90, 95, 99)
# What a window measures only where some request ended in it (Summary.is_rate_measured).
SERVED_RATES = ("request_throughput", "output_token_throughput", "input_token_throughput", "goodput")


@dataclass(frozen=True)
class LatencyStats:
    """Distribution of one latency metric, in seconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    def at(self, percentile: float) -> float:
        return {50: self.p50, 90: self.p90, 95: self.p95, 99: self.p99, 100: self.max}[percentile]


@dataclass(frozen=True)
class Slo:
    """Limits in seconds for each metric; None means not limited."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    percentile: float = 95
    max_error_rate: float = 0.01  # failures plus rejections, as a fraction of requests

    def __post_init__(self) -> None:
        if self.percentile not in PERCENTILES:
            raise BenchError(f"SLO percentile {self.percentile:g}: choose one of 50, 90, 95, 99")
        for name, limit in self.limits().items():
            if limit <= 0:
                raise BenchError(f"SLO {name}={limit:g}s: a limit must be positive")
        if not 0 <= self.max_error_rate <= 1:
            raise BenchError(f"SLO error rate {self.max_error_rate:g}: give a fraction in 0..1")

    def limits(self) -> dict[str, float]:
        named = {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}
        return {name: limit for name, limit in named.items() if limit is not None}


@dataclass(frozen=True)
class ClientLag:
    """How far behind its own schedule the client fell."""

    loop_p50: float
    loop_p99: float
    loop_max: float
    send_p50: float
    send_p99: float
    send_max: float
    cpu: float  # fraction of one core the client process used
    limit: float
    is_behind: bool  # the client may have been the bottleneck


@dataclass(frozen=True)
class Summary:
    """The statistics of one run."""

    num_requests: int  # measured requests (sent after warm-up)
    num_ok: int
    num_rejected: int
    num_failed: int
    num_cancelled: int
    num_warmup: int
    num_retried: int  # measured requests that were a refused request sent again
    errors_by_status: dict[str, int]  # "429", "500", "stream-error", "timeout", ...
    ttft: LatencyStats | None
    itl: LatencyStats | None
    tpot: LatencyStats | None
    e2e: LatencyStats | None
    window_s: float
    offered_rate: float  # measured requests sent per second of the window
    mean_in_flight: float  # requests in flight, averaged over the window
    backlog_growth: int  # requests in flight at the window's end minus at its start
    request_throughput: float  # successful requests per second
    output_token_throughput: float
    streamed_token_throughput: float  # output tokens that arrived in the window, per second
    input_token_throughput: float
    goodput: float | None  # of the requests request_throughput counts, those within the SLO, per second
    goodput_fraction: float | None  # measured requests within the SLO / measured requests
    slo_met: bool | None  # whether the run as a whole met the SLO
    lag: ClientLag
    num_ended_in_window: int = 0  # requests (any outcome) that ended inside the window, warm-up ones too

    @property
    def is_rate_measured(self) -> bool:
        """Some request ended inside the window: else (a window shorter than a request, no warm-up) its rates of
        requests and tokens served are no measurement, whatever zero they show."""
        return self.num_ended_in_window > 0

    @property
    def is_kept_up(self) -> bool:
        """The server finished requests as fast as they came: the number in flight grew
        by no more than chance allows (3 sigma, taking it as Poisson around its mean)."""
        return self.backlog_growth <= 3 * math.sqrt(2 * self.mean_in_flight) + 1

    @property
    def error_rate(self) -> float:
        return (self.num_failed + self.num_rejected) / self.num_requests if self.num_requests else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of values, linear between nearest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_stats(values: Sequence[float]) -> LatencyStats | None:
    if not values:
        return None
    ordered = sorted(values)
    p50, p90, p95, p99 = (_sorted_percentile(ordered, q) for q in PERCENTILES)
    return LatencyStats(len(ordered), sum(ordered) / len(ordered), p50, p90, p95, p99, ordered[-1])


def _sorted_percentile(ordered: Sequence[float], q: float) -> float:
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def tpot(record: RequestRecord) -> float | None:
    """(E2E - TTFT) / (output tokens - 1), or None below two output tokens."""
    if record.ttft is None or record.output_tokens < 2:
        return None
    return (record.e2e - record.ttft) / (record.output_tokens - 1)


def streamed_tokens(records: Iterable[RequestRecord], window: tuple[float, float]) -> float:
    """Output tokens whose chunks arrived inside `window`: each chunk weighs its request's output tokens over
    its chunk count (a chunk may carry several tokens)."""
    start, stop = window
    total = 0.0
    for r in records:
        if r.chunks:
            inside = sum(start <= t <= stop for t in r.chunks)
            total += inside * max(r.output_tokens, len(r.chunks)) / len(r.chunks)
    return total


def inter_chunk_gaps(record: RequestRecord) -> list[float]:
    chunks = record.chunks
    return [chunks[i + 1] - chunks[i] for i in range(len(chunks) - 1)]


def in_flight(records: Iterable[RequestRecord], at: float) -> int:
    """Requests sent by `at` that had not ended by then."""
    return sum(r.sent <= at < r.end for r in records)


def mean_in_flight(records: Iterable[RequestRecord], window: tuple[float, float]) -> float:
    """Time-average of the number of requests in flight over the window."""
    start, stop = window
    busy = sum(max(0.0, min(r.end, stop) - max(r.sent, start)) for r in records)
    return busy / max(stop - start, 1e-9)


def measured(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if not r.is_warmup]


def is_good(record: RequestRecord, slo: Slo) -> bool:
    """A successful request whose own TTFT, TPOT and E2E each meet the SLO."""
    if record.outcome != OK:
        return False
    values = {"ttft": record.ttft, "tpot": tpot(record), "e2e": record.e2e}
    return all(values[name] is None or values[name] <= limit for name, limit in slo.limits().items())


def errors_by_status(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Counts of unsuccessful requests, keyed by HTTP status or by error kind."""
    counts: Counter[str] = Counter()
    for r in records:
        if r.outcome in (REJECTED, FAILED):
            counts[str(r.status) if r.status not in (0, 200) else r.error.split(":")[0]] += 1
    return dict(sorted(counts.items()))


def client_lag(run: RunRecord, limit: float) -> ClientLag:
    """Loop lag (in the window) and send lag (of measured requests) percentiles;
    `is_behind` when either P99 is over `limit`."""
    start, stop = run.window
    loop = sorted(s.lag for s in run.loop_lag if start <= s.at <= stop) or [0.0]
    sends = sorted(max(0.0, r.sent - r.scheduled) for r in measured(run.requests)) or [0.0]
    loop_p99, send_p99 = _sorted_percentile(loop, 99), _sorted_percentile(sends, 99)
    return ClientLag(
        loop_p50=_sorted_percentile(loop, 50), loop_p99=loop_p99, loop_max=loop[-1],
        send_p50=_sorted_percentile(sends, 50), send_p99=send_p99, send_max=sends[-1],
        cpu=run.client_cpu, limit=limit,
        is_behind=loop_p99 > limit or send_p99 > limit,
    )


def is_counted_by_user(run: RunRecord) -> bool:
    """A closed loop bounded by a count: its window begins at its first measured request, after the warm-up."""
    return run.mode == "users" and run.window[0] > run.warmup_end


def counted(run: RunRecord) -> Sequence[RequestRecord]:
    """The requests whose responses the window's throughput counts: all, when it begins at the warm-up's end (a
    steady state's); those that began in it, when it begins later (a closed loop bounded by a count)."""
    start = run.window[0]
    return [r for r in run.requests if r.sent >= start] if is_counted_by_user(run) else run.requests


def rate_seconds(run: RunRecord) -> float:
    """The seconds the window's rates divide by: its length; for a closed loop bounded by a count, its users' mean
    busy time (each user's first measured request's start to its last one's end). Its users end at different times:
    from the first start to the last end, the drain after the last send (fewer and fewer users busy) read low by
    about users / requests."""
    start, stop = run.window
    if not is_counted_by_user(run):
        return max(stop - start, 1e-9)
    spans: dict[int | None, tuple[float, float]] = {}
    for r in measured(run.requests):
        first, last = spans.get(r.user, (r.sent, r.end))
        spans[r.user] = (min(first, r.sent), max(last, r.end))
    busy = [last - first for first, last in spans.values()]
    return max(sum(busy) / len(busy), 1e-9) if busy else max(stop - start, 1e-9)


def summarize(run: RunRecord, slo: Slo | None = None, lag_limit: float = 0.005) -> Summary:
    """Compute every statistic of a run (see the module docstring for definitions)."""
    requests = measured(run.requests)
    ok = [r for r in requests if r.outcome == OK]
    start, stop = run.window
    window_s = rate_seconds(run)
    finished = [r for r in counted(run) if r.outcome == OK and start <= r.end <= stop]
    summary = Summary(
        num_requests=len(requests),
        num_ok=len(ok),
        num_rejected=sum(r.outcome == REJECTED for r in requests),
        num_failed=sum(r.outcome == FAILED for r in requests),
        num_cancelled=sum(r.outcome == CANCELLED for r in requests),
        num_warmup=len(run.requests) - len(requests),
        num_retried=sum(r.attempt > 0 for r in requests),
        errors_by_status=errors_by_status(requests),
        ttft=latency_stats([r.ttft for r in ok if r.ttft is not None]),
        itl=latency_stats([gap for r in ok for gap in inter_chunk_gaps(r)]),
        tpot=latency_stats([t for r in ok if (t := tpot(r)) is not None]),
        e2e=latency_stats([r.e2e for r in ok]),
        window_s=window_s,
        offered_rate=len(requests) / window_s,
        mean_in_flight=mean_in_flight(run.requests, run.window),
        backlog_growth=in_flight(run.requests, stop) - in_flight(run.requests, start),
        request_throughput=len(finished) / window_s,
        output_token_throughput=sum(r.output_tokens for r in finished) / window_s,
        streamed_token_throughput=streamed_tokens(counted(run), run.window) / window_s,
        input_token_throughput=sum(_prompt_tokens(r) for r in finished) / window_s,
        goodput=None,
        goodput_fraction=None,
        slo_met=None,
        lag=client_lag(run, lag_limit),
        num_ended_in_window=sum(r.outcome != CANCELLED and start <= r.end <= stop for r in counted(run)),
    )
    return with_slo(summary, requests, finished, slo) if slo else summary


def with_slo(summary: Summary, requests: list[RequestRecord], finished: list[RequestRecord], slo: Slo) -> Summary:
    """Add goodput and the SLO verdict to a summary of `requests` (measured ones). Goodput counts the
    requests that request_throughput counts (`finished`: warm-up ones too), those within the SLO, so it
    never exceeds requests/s and equals it when every one met the SLO."""
    return replace(
        summary,
        goodput=sum(is_good(r, slo) for r in finished) / summary.window_s,
        goodput_fraction=sum(is_good(r, slo) for r in requests) / len(requests) if requests else 0.0,
        slo_met=meets_slo(summary, slo),
    )


def meets_slo(summary: Summary, slo: Slo) -> bool:
    """The run met the SLO: each limited metric's percentile is within its limit and
    failures plus rejections stay within `max_error_rate`."""
    if summary.num_ok == 0 or summary.error_rate > slo.max_error_rate:
        return False
    stats = {"ttft": summary.ttft, "tpot": summary.tpot, "e2e": summary.e2e}
    return all(
        stats[name] is not None and stats[name].at(slo.percentile) <= limit
        for name, limit in slo.limits().items()
    )


def _prompt_tokens(record: RequestRecord) -> int:
    reported = record.reported_prompt_tokens
    return reported if reported is not None else record.prompt_tokens


def prefix_hit_rate(samples: Sequence[ServerSample]) -> float | None:
    """Prompt tokens served from the prefix cache over those looked up, between the first and the last
    sample (the counters' increase); a server with only a rate gauge: its mean; None when neither."""
    counted = [s for s in samples if s.prefix_hits is not None and s.prefix_queries is not None]
    if len(counted) >= 2 and counted[-1].prefix_queries > counted[0].prefix_queries:
        first, last = counted[0], counted[-1]
        return (last.prefix_hits - first.prefix_hits) / (last.prefix_queries - first.prefix_queries)
    rates = [s.prefix_hit_rate for s in samples if s.prefix_hit_rate is not None]
    return sum(rates) / len(rates) if rates else None
