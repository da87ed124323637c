"""The load generator: closed-loop users, an open-loop arrival process or a replayed
trace, bounded by time or request count, with a warm-up period and a measurement of its
own lag.

- Closed loop (`users=N`): N users each send a request, wait for the whole response,
  and send the next one at once. A request the server refuses (429 or 503) is sent again
  by its user after a wait: the Retry-After it gave, else an exponential one (backoff.py); after a
  request whose connection failed (the server is down) the user waits so too, and sends a new one.
- Open loop (`rate=R`): requests arrive at R per second whatever the server does;
  inter-arrival gaps are gamma-distributed with shape `burstiness` (1 is a Poisson
  process; below 1 burstier, above 1 more regular), mean 1/R. The first arrival comes after
  a wait, not at 0, as in a process already running: any span holds R x its length on average.
- Trace (`arrivals=[...]`): requests arrive at the trace's times; the run ends after the
  last one unless a duration or request count ends it first.
- `max_concurrency` caps the requests in flight of an open loop or a trace: an arrival
  past the cap waits for a request to end, and is then sent at once (its `scheduled`
  time is that moment, so the wait shows in neither latency nor send lag); arrivals
  that come due after the run's end are not sent.

What each request says comes from a `Workload` (workload.py).

The run sends requests for `warmup` seconds (not measured), then for `duration`
seconds or until `num_requests` measured requests have been sent, then waits up to
`drain_timeout` (and a second's grace, for their own timeouts to end them as failures) for
the requests still running and cancels the rest. It always stops.
The measured window runs from the warm-up's end to where sending ended (with `num_requests`,
an open loop's or a trace's arrival after its last measured one, unless no request had ended by
then), so requests offered and requests served cover the same time; a closed loop, or a trace
whose arrivals ran out before its count or duration, ends it at its last measured response instead (a closed loop's runs
from its first measured request, counts only the requests that began in it, and its rates divide by
its users' mean busy time: metrics.py).
A server that takes no connection for `gone_after` seconds (30) is gone: the sending ends there too, and
the run says so. SIGINT or SIGTERM ends the sending early, as the end of its duration would (the throughput
window ends there); a second one cancels the requests still running, as the first does once
the sending has ended.
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import signal
import time
from array import array
from dataclasses import dataclass
from typing import Callable, Coroutine, Iterator

from hosttune.bench.backoff import REFUSALS, is_lost, wait_after
from hosttune.bench.client import Client, StreamResult
from hosttune.bench.record import CANCELLED, OK, LagSample, RequestRecord
from hosttune.bench.workload import Prompt, Workload
from hosttune.errors import BenchError

LAG_INTERVAL = 0.005  # seconds between two loop-lag samples
MAX_IN_FLIGHT = 4096  # open loop without a cap: past this, arrivals wait (and show as send lag)
MAX_USERS = 100_000  # closed loop: each user is a task and a connection; millions would exhaust memory first
# The drain outwaits a request's own timeout by this much: a request past --timeout ends as a timeout failure, not
# cancelled by a drain of the same length whose timer fires in the same loop turn (uvloop rounds timers to 1 ms).
DRAIN_GRACE = 1.0
# A server that took no connection for this long is gone (stopped, crashed): a run bounded by --requests sent one lost
# request per user and back-off (up to 8 s) until its count was spent, an hour for 1,000 requests of a few users.
GONE_AFTER_S = 30.0


@dataclass(frozen=True)
class Load:
    """How much load to offer and for how long."""

    users: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    duration: float | None = None  # measured seconds, after the warm-up
    num_requests: int | None = None  # measured requests, after the warm-up
    warmup: float = 0.0
    drain_timeout: float = 60.0
    max_concurrency: int | None = None  # open loop or trace: requests in flight at most
    arrivals: tuple[float, ...] | None = None  # a trace's arrival times, seconds from the start
    seed: int = 0
    gone_after: float = GONE_AFTER_S  # no connection for this long: the server is gone, and sending stops

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.users, self.rate, self.arrivals)) != 1:
            raise BenchError("give either --users N (closed loop), --rate R (open loop) or --trace FILE")
        if self.max_concurrency is not None and (self.users is not None or self.max_concurrency < 1):
            raise BenchError("--max-concurrency caps an open loop (--rate or --trace) and must be positive")
        if self.users is not None and not 1 <= self.users <= MAX_USERS:
            raise BenchError(f"--users {self.users}: give 1 to {MAX_USERS} users")
        if self.rate is not None and not 0 < self.rate < math.inf:  # NaN too: it would send every request at once
            raise BenchError(f"--rate {self.rate:g}: the rate must be a positive number")
        if not 0 < self.burstiness < math.inf:
            raise BenchError(f"--burstiness {self.burstiness:g}: must be a positive number")
        if self.duration is not None and self.num_requests is not None:
            raise BenchError("give either --duration or --requests, not both")
        if self.arrivals is None and self.duration is None and self.num_requests is None:
            raise BenchError("give either --duration or --requests, to bound the run")
        if self.duration is not None and self.duration <= 0:
            raise BenchError(f"--duration {self.duration:g}s measures nothing: give a positive time, e.g. 60s")
        if self.num_requests is not None and self.num_requests < 1:
            raise BenchError(f"--requests {self.num_requests} measures nothing: give at least 1")
        if self.warmup < 0:
            raise BenchError(f"--warmup {self.warmup:g}s: give 0 or a positive time")

    @property
    def mode(self) -> str:
        return "users" if self.users is not None else "rate" if self.rate is not None else "trace"


@dataclass(frozen=True)
class Progress:
    """The run so far. The counts of done requests are of its phase: the warm-up's during it, then the measured
    ones (the table's), not the warm-up's that end after it; sent and in flight are of every request."""

    elapsed: float
    num_sent: int
    num_done: int
    num_ok: int
    num_errors: int
    num_in_flight: int
    is_warmup: bool
    is_draining: bool = False  # sending has ended: the run waits (up to its drain timeout) for those in flight


@dataclass(frozen=True)
class LoadResult:
    requests: tuple[RequestRecord, ...]
    loop_lag: tuple[LagSample, ...]
    clock_origin: float
    warmup_end: float
    window: tuple[float, float]
    client_cpu: float
    stopped_by: str | None = None  # the signal that ended the run before its duration or count did
    gone_at: float | None = None  # the last answer of a server that then took no connection for `gone_after`


class LoadGenerator:
    """Runs one load pattern through one client; see the module docstring."""

    def __init__(self, client: Client, load: Load, workload: Workload,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        self.client = client
        self.load = load
        self.workload = workload
        self.on_progress = on_progress
        # Separate streams, so request i gets the same lengths whatever the timing.
        self.rng = random.Random(load.seed)
        self.arrival_rng = random.Random(f"arrivals-{load.seed}")
        self.records: list[RequestRecord] = []
        self.lag: list[LagSample] = []
        self.tasks: set[asyncio.Task] = set()
        self.num_sent = 0
        self.num_measured_sent = 0
        self.next_arrival = 0.0  # open loop: the arrival it is about to send, or the first it did not
        self.t0 = 0.0
        self.is_stopping = False
        self.stopped_by: str | None = None
        self.last_answer = 0.0  # when a request last got a connection (any answer, or none in time)
        self.gone_at: float | None = None
        self.stop_requested = asyncio.Event()
        self.all_sent = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.crashes: list[BaseException] = []  # a bug, not a failed request: re-raised

    async def run(self) -> LoadResult:
        self.t0 = time.perf_counter()
        cpu0 = time.process_time()
        gc.freeze()  # setup objects never need collecting again: shorter GC pauses
        watchers = [asyncio.create_task(self._sample_lag())]
        if self.on_progress:
            watchers.append(asyncio.create_task(self._report_progress()))
        caught = self._catch_signals()
        try:
            await (self._closed_loop() if self.load.mode == "users" else self._open_loop())
            stop = self._now()
            await self._drain()
        finally:
            for watcher in watchers:
                watcher.cancel()
            for sig, previous in caught:
                asyncio.get_running_loop().remove_signal_handler(sig)  # which leaves Python's default handler
                if previous is not None:
                    signal.signal(sig, previous)  # the caller's, for a signal between two runs
            gc.unfreeze()
        if self.crashes:
            raise self.crashes[0]
        cpu = (time.process_time() - cpu0) / max(self._now(), 1e-9)
        return LoadResult(tuple(sorted(self.records, key=lambda r: r.index)), tuple(self.lag),
                          self.t0, self.load.warmup, self._window(stop), cpu, self.stopped_by, self.gone_at)

    def _catch_signals(self) -> list[tuple[signal.Signals, object]]:
        """SIGINT or SIGTERM ends the run early, its report intact (where this loop may take signals); each with
        the handler it had before, to put back after."""
        caught = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            try:
                asyncio.get_running_loop().add_signal_handler(sig, self.request_stop, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread's loop
                continue
            caught.append((sig, previous))
        return caught

    def request_stop(self, sig: signal.Signals) -> None:
        """Send nothing more and let what is in flight finish; a second signal cancels that too, as does the first
        once everything is sent (the run was not cut short, only the wait for its last responses)."""
        if self.stop_requested.is_set() or self.is_stopping:
            for task in list(self.tasks):
                task.cancel()
            return
        self.stopped_by = sig.name
        self.stop_requested.set()
        self.slot_freed.set()

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _window(self, stop: float) -> tuple[float, float]:
        """Warm-up end to where sending ended: an open loop or a trace bounded by a count, at the arrival after its
        last measured one (N arrivals from the warm-up's end span N gaps; its last response would make the window
        short by a gap less the last request's latency, or long by its latency less a gap). A closed loop, or a
        trace whose arrivals ran out first (before its count, or its duration: an idle tail would dilute its
        rates), ends at its last measured response instead. A closed loop's then starts at its first measured
        request: its users in step end a round of warm-up requests just after the warm-up, which a window from
        there would count as well (twice the rate); metrics.py counts only the requests that began in such a
        window, over its users' mean busy time."""
        start = self.load.warmup
        is_counted_open = self.load.users is None and self.load.num_requests is not None
        if self.gone_at is not None and self.stopped_by is None:  # its rates are of the time it answered
            return start, max(start, self.gone_at)
        if self.stopped_by is not None:
            return start, max(start, stop)
        if is_counted_open and self.next_arrival < math.inf and self._has_ended_within(start, self.next_arrival):
            return start, max(start, self.next_arrival)
        if self.load.duration is not None and self.next_arrival < math.inf:
            return start, start + self.load.duration
        measured = [r for r in self.records if not r.is_warmup and r.outcome != CANCELLED]
        if self.load.users is not None and measured:  # its requests only: see the docstring
            start = min(r.sent for r in measured)
        return start, max((r.end for r in measured), default=stop)

    def _has_ended_within(self, start: float, stop: float) -> bool:
        """Some request ended between the warm-up's end and the arrival not sent: else (a few requests, each longer
        than their arrivals took) a window ending there would count none served, and the last response ends it."""
        return any(start <= r.end <= stop for r in self.records if r.outcome != CANCELLED)

    def _may_send(self, now: float) -> bool:
        if self.is_stopping or self.stop_requested.is_set():
            return False
        if now < self.load.warmup:
            return True
        if self.load.duration is not None:
            return now < self.load.warmup + self.load.duration
        if self.load.num_requests is None:
            return True  # a trace, replayed to its end
        return self.num_measured_sent < self.load.num_requests

    # Phase: offering load.

    async def _closed_loop(self) -> None:
        for user in range(self.load.users):
            self._spawn(self._user(user))
        stop = asyncio.create_task(self.stop_requested.wait())
        if self.load.duration is not None:
            await asyncio.wait({stop}, timeout=max(0.0, self.load.warmup + self.load.duration - self._now()))
            stop.cancel()
            return
        all_sent = asyncio.create_task(self.all_sent.wait())
        # Users end only once everything is sent, unless one crashed or a signal came: then stop too.
        await asyncio.wait({all_sent, stop, *self.tasks}, return_when=asyncio.FIRST_COMPLETED)
        all_sent.cancel()
        stop.cancel()

    async def _user(self, user: int) -> None:
        waits, again, attempt = 0, None, 0  # back-offs in a row; the prompt a refusal refused, and its try
        while self._may_send(self._now()):
            record, prompt = await self._send(self._now(), user, again, attempt)
            wait = wait_after(record.status, record.retry_after, waits + 1, is_connection_lost=is_lost(record))
            is_refused = bool(wait) and record.status in REFUSALS  # sent again; after a lost one, a new one
            waits = waits + 1 if wait else 0
            again, attempt = (prompt, attempt + 1) if is_refused else (None, 0)
            if wait:
                await self._sleep_unless_stopped(self._wait_within_run(wait))

    def _wait_within_run(self, wait: float) -> float:
        """A backoff that would outlast a timed run ends with it."""
        if self.load.duration is None:
            return wait
        return max(0.0, min(wait, self.load.warmup + self.load.duration - self._now()))

    async def _open_loop(self) -> None:
        cap = self.load.max_concurrency or MAX_IN_FLIGHT
        for arrival in self._arrivals():
            self.next_arrival = arrival
            if not self._may_send(arrival):
                return
            await self._sleep_unless_stopped(arrival - self._now())
            while len(self.tasks) >= cap and not self.stop_requested.is_set():
                self.slot_freed.clear()
                await self.slot_freed.wait()
            if self.load.max_concurrency:  # late because of the cap: due now, if still in time
                arrival = self.next_arrival = max(arrival, self._now())
            if not self._may_send(arrival):
                return
            self._spawn(self._send(arrival, None))
        self.next_arrival = math.inf  # a trace replayed to its end: no arrival after its last

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        """Sleep, or less when a signal comes first: a trace may leave minutes between two arrivals, a refusal ask
        for a long back-off."""
        if seconds > 0 and not self.stop_requested.is_set():
            stop = asyncio.create_task(self.stop_requested.wait())
            await asyncio.wait({stop}, timeout=seconds)
            stop.cancel()

    def _arrivals(self):
        if self.load.arrivals is not None:
            yield from self.load.arrivals
            return
        yield from arrival_times(self.load.rate, self.load.burstiness, self.arrival_rng)

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self.slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            self.crashes.append(task.exception())

    def _send(self, scheduled: float, user: int | None, prompt: Prompt | None = None,
              attempt: int = 0) -> Coroutine[object, object, tuple[RequestRecord, Prompt]]:
        """Count one request now, and return what sends it (`prompt` again, when a refusal is retried). Counted here,
        not once its task runs: an open loop whose arrivals are already due spawns the next before it would have
        run, and a count seen late sent past --requests."""
        index = self.num_sent
        is_warmup = scheduled < self.load.warmup
        self.num_sent += 1
        self.num_measured_sent += not is_warmup
        if self.load.num_requests is not None and self.num_measured_sent >= self.load.num_requests:
            self.all_sent.set()
        return self._stream(index, scheduled, is_warmup, user, prompt, attempt)

    async def _stream(self, index: int, scheduled: float, is_warmup: bool, user: int | None,
                      prompt: Prompt | None, attempt: int) -> tuple[RequestRecord, Prompt]:
        """Send request `index`; its record, and what it said."""
        prompt = prompt or self.workload.next(self.rng, index, user)
        sent = self._now()
        try:
            result = await self.client.stream(prompt.messages, prompt.max_tokens,
                                              self.workload.is_keep_text)
        except asyncio.CancelledError:
            self.records.append(_cancelled(index, scheduled, sent, self._now(), prompt, is_warmup, user, attempt))
            raise
        if result.outcome == OK:
            self.workload.answered(user, prompt, result.text, result.output_tokens)
        record = self._record(result, index, scheduled, prompt, is_warmup, user, attempt)
        self.records.append(record)
        self._note_connection(record)
        return record, prompt

    def _note_connection(self, record: RequestRecord) -> None:
        """A request that got a connection moves the last answer on; one lost past `gone_after` since then ends the
        sending, as the end of the run would."""
        if not is_lost(record):
            self.last_answer = max(self.last_answer, record.end)
        elif self.gone_at is None and record.end - self.last_answer >= self.load.gone_after:
            self.gone_at = self.last_answer
            self.stop_requested.set()
            self.slot_freed.set()

    def _record(self, result: StreamResult, index: int, scheduled: float, prompt: Prompt,
                is_warmup: bool, user: int | None = None, attempt: int = 0) -> RequestRecord:
        t0 = self.t0
        return RequestRecord(
            index=index, scheduled=scheduled, sent=result.sent - t0, end=result.end - t0,
            chunks=array("d", (t - t0 for t in result.chunks)), outcome=result.outcome,
            status=result.status, error=result.error, prompt_tokens=prompt.num_tokens,
            max_tokens=prompt.max_tokens, output_tokens=result.output_tokens,
            reported_prompt_tokens=result.reported_prompt_tokens, is_warmup=is_warmup,
            cached_tokens=result.cached_tokens, conversation=prompt.conversation,
            turn=prompt.turn, group=prompt.group, user=user, attempt=attempt, retry_after=result.retry_after,
        )

    # Phase: letting the last requests finish.

    async def _drain(self) -> None:
        self.is_stopping = True
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.load.drain_timeout + DRAIN_GRACE)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks))

    # Watchers.

    async def _sample_lag(self) -> None:
        while True:
            due = self._now() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            now = self._now()
            self.lag.append(LagSample(now, max(0.0, now - due)))

    async def _report_progress(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.on_progress(self.progress())

    def progress(self) -> Progress:
        now = self._now()
        is_warmup = now < self.load.warmup
        done = [r for r in self.records if r.is_warmup == is_warmup]
        num_ok = sum(r.outcome == OK for r in done)
        return Progress(now, self.num_sent, len(done), num_ok, len(done) - num_ok,
                        self.num_sent - len(self.records), is_warmup, self.is_stopping)


def arrival_times(rate: float, shape: float, rng: random.Random) -> Iterator[float]:
    """Arrivals at `rate`, gaps gamma-distributed with shape `shape`, of a process already running at the start:
    the first comes after the wait from a random moment to the next arrival (a uniform part of a gap drawn by its
    length, Gamma(shape + 1); exponential for a Poisson process), so any span holds rate x its length on average.
    An arrival at 0 would add one to every run: a 1 s step at 0.5/s offered 1.5/s."""
    scale = 1.0 / (rate * shape)
    arrival = rng.random() * rng.gammavariate(shape + 1, scale)
    while True:
        yield arrival
        arrival += rng.gammavariate(shape, scale)


def _cancelled(index: int, scheduled: float, sent: float, end: float, prompt: Prompt,
               is_warmup: bool, user: int | None, attempt: int) -> RequestRecord:
    return RequestRecord(
        index=index, scheduled=scheduled, sent=sent, end=end, chunks=array("d"),
        outcome=CANCELLED, status=0, error="cancelled: still running when the run stopped",
        prompt_tokens=prompt.num_tokens, max_tokens=prompt.max_tokens, output_tokens=0,
        reported_prompt_tokens=None, is_warmup=is_warmup, conversation=prompt.conversation,
        turn=prompt.turn, group=prompt.group, user=user, attempt=attempt,
    )
