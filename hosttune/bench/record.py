"""What a run records: one `RequestRecord` per request and a `RunRecord` per run.

All times are seconds on the client's monotonic clock (`time.perf_counter`), relative
to the start of the run, so records of one run compare directly.
"""

from __future__ import annotations

import json
import re
from array import array
from dataclasses import dataclass, field

OK = "ok"
REJECTED = "rejected"  # HTTP 429: the server shed load on purpose
FAILED = "failed"  # any other status, a transport error, a timeout, an error in a stream
CANCELLED = "cancelled"  # still running when the run stopped; no latency recorded


@dataclass(frozen=True)
class RequestRecord:
    """One request, as the client saw it."""

    index: int
    scheduled: float  # when the load generator meant to send it
    sent: float  # when the client started sending it
    end: float  # when the response ended (last byte, [DONE], or the failure)
    chunks: array = field(repr=False)  # arrival time of every chunk that carried output
    outcome: str  # OK, REJECTED, FAILED or CANCELLED
    status: int  # HTTP status; 0 when no response came
    error: str  # "" when the request succeeded
    prompt_tokens: int  # length the prompt was built to
    max_tokens: int
    output_tokens: int  # usage.completion_tokens when reported, else the chunk count
    reported_prompt_tokens: int | None  # usage.prompt_tokens when reported
    is_warmup: bool  # sent during the warm-up period: kept, but not in the statistics
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens when reported
    conversation: int | None = None  # the conversation a turn belongs to (--turns)
    turn: int | None = None  # 1 for a conversation's first request
    group: int | None = None  # the shared system prompt it starts with (--shared-prefix)
    user: int | None = None  # the closed-loop user that sent it
    attempt: int = 0  # 0: a request's first try; N: its Nth retry after the server refused it (429, 503)
    retry_after: float | None = None  # the refusal's Retry-After, in seconds

    @property
    def ttft(self) -> float | None:
        return self.chunks[0] - self.sent if self.chunks else None

    @property
    def e2e(self) -> float:
        return self.end - self.sent

    @property
    def reason(self) -> str:
        return reason_of(self.error)


def reason_of(error: str) -> str:
    """A failure in one line: an error body's OpenAI `message` where it has one, after the status."""
    head, sep, body = error.partition(": ")
    if not (sep and head.startswith("http ")):
        return _one_line(error)
    return f"{head.removeprefix('http ')}: {_one_line(_message(body))}"

_MESSAGE = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)')  # in a body cut short too


def _message(body: str) -> str:
    found = _MESSAGE.search(body)
    if not found:
        return body
    try:
        return json.loads(f'"{found.group(1)}"')
    except ValueError:  # an escape cut in half at the body's end
        return found.group(1)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:299] + "…"


@dataclass(frozen=True)
class LagSample:
    """The event loop woke `lag` seconds after it was due to, at time `at`."""

    at: float
    lag: float


@dataclass(frozen=True)
class ServerSample:
    """The server's own gauges at time `at` (vLLM metric names; see server_metrics.py);
    None where the server does not export one."""

    at: float
    waiting: float | None
    running: float | None
    kv_usage: float | None  # fraction of the KV cache in use, 0..1
    preemptions: float | None  # cumulative count
    prefix_hits: float | None = None  # prompt tokens found in the prefix cache, cumulative
    prefix_queries: float | None = None  # prompt tokens looked up in it, cumulative
    prefix_hit_rate: float | None = None  # a server that exports only the rate (SGLang), 0..1


@dataclass(frozen=True)
class RunRecord:
    """Everything one run against one endpoint recorded."""

    url: str
    model: str
    mode: str  # "users" (closed loop) or "rate" (open loop)
    users: int | None
    rate: float | None
    burstiness: float | None
    clock_origin: float  # time.perf_counter() at the run's start (CLOCK_MONOTONIC on Linux)
    warmup_end: float  # requests sent before this are warm-up
    window: tuple[float, float]  # throughput window: warm-up end (or first measured send) to stop (or last end)
    requests: tuple[RequestRecord, ...]
    loop_lag: tuple[LagSample, ...]
    client_cpu: float  # client process CPU seconds over the run, divided by wall seconds
    tokenizer: str  # how prompt lengths were made exact (or that they are approximate)
    prompt_lengths: str  # description of the prompt length distribution (or the workload)
    output_lengths: str
    max_concurrency: int | None = None
    server_metrics: tuple[ServerSample, ...] = ()  # /metrics sampled through the run
    stopped_by: str | None = None  # the signal (SIGINT, SIGTERM) that ended the run early
    server_gone_at: float | None = None  # the server's last answer, after which it took no connection: the run stopped

    def stop_note(self) -> str:
        """What the signal (or a server gone) that ended the run early cut short, for the terminal and the report ('' if
        nothing did)."""
        if self.server_gone_at is not None and not self.stopped_by:
            return (f"the server took no connection after {self.server_gone_at:.1f} s, so the run stopped sending; the "
                    "figures cover it until then")
        if not self.stopped_by:
            return ""
        if self.window[1] <= self.warmup_end:  # the window is empty: it would start where the warm-up ends
            return f"{self.stopped_by} ended the run during its {self.warmup_end:g} s warm-up, before anything was measured"
        return f"{self.stopped_by} ended the run after {self.window[1]:.1f} s; the figures cover it until then"
