"""One benchmark: its configuration, and running it against one endpoint.

`measure()` finds the model, makes prompts exact with the best tokenizer it can get,
builds the workload, runs the load generator while sampling the server's /metrics, and
returns a `RunRecord`. Nothing here prints.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse


from hosttune.bench import prompts
from hosttune.bench.client import CHAT, COMPLETIONS, Client, Target, discover_model
from hosttune.bench.client import session as client_session
from hosttune.bench.dataset import Dataset, Entry, dataset_questions, load_dataset
from hosttune.bench.distributions import MAX_LENGTH, LengthDistribution, parse_distribution
from hosttune.bench.loadgen import Load, LoadGenerator, Progress
from hosttune.bench.metrics import Slo
from hosttune.bench.record import RunRecord
from hosttune.bench.server_metrics import MetricsSampler
from hosttune.bench.trace import Trace
from hosttune.bench.workload import Conversations, SharedPrefix, Synthetic, Workload, word_questions
from hosttune.errors import BenchError

DATASET_COUNTS = ("dataset text: prompt lengths estimated at 4 tokens per 3 words; the "
                  "server's usage counts are used where it reports them")

NUM_CHECKED_PROMPTS = 4


@dataclass(frozen=True)
class BenchSpec:
    """Everything a run needs besides the endpoint URL."""

    load: Load
    prompt_lengths: str = "chat-docs"
    output_lengths: str = "512"
    api: str = COMPLETIONS
    model: str | None = None
    tokenizer: Path | None = None
    timeout: float = 600.0
    slo: Slo | None = None
    lag_limit: float = 0.005
    is_ignore_eos: bool = True
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # --header, --api-key
    dataset: Path | None = None  # prompts from a file (dataset.py)
    shared_prefix: tuple[int, int] | None = None  # (system prompts, users per system prompt)
    prefix_tokens: int = 1024
    turns: int | None = None  # multi-turn conversations of this many turns
    trace: Trace | None = None  # lengths from a trace (its arrivals are in `load`)
    metrics_interval: float | None = 1.0  # seconds between /metrics samples; None: none
    priority: int | None = None  # sent with every request (lower runs first on servers that honour it)
    tls: ssl.SSLContext | None = field(default=None, repr=False, compare=False)  # --cacert, --insecure
    prompt_dist: LengthDistribution = field(init=False, repr=False, compare=False)
    output_dist: LengthDistribution = field(init=False, repr=False, compare=False)
    entries: tuple[Entry, ...] | None = field(init=False, repr=False, compare=False)
    local_count: prompts.Counter | None = field(init=False, repr=False, compare=False)  # --tokenizer, loaded

    def __post_init__(self) -> None:
        if self.api not in (COMPLETIONS, CHAT):
            raise BenchError(f"--api {self.api}: choose {COMPLETIONS} or {CHAT}")
        if self.timeout <= 0 or self.lag_limit <= 0:
            raise BenchError("--timeout and --max-client-lag must be positive")
        if self.metrics_interval is not None and self.metrics_interval <= 0:
            raise BenchError("--metrics-interval must be positive")
        self._check_workload()
        prompt_dist = _lengths(self.prompt_lengths, "--prompts", "prompt_tokens")
        output_dist = _lengths(self.output_lengths, "--max-tokens", "output_tokens")
        if self.trace is not None:
            prompt_dist, output_dist = self.trace.prompt_lengths, self.trace.output_lengths
        object.__setattr__(self, "prompt_dist", prompt_dist)
        object.__setattr__(self, "output_dist", output_dist)
        object.__setattr__(self, "entries", load_dataset(self.dataset) if self.dataset is not None else None)
        # loaded now: a --tokenizer that is missing or no tokenizer is refused before any request, as a dataset is
        object.__setattr__(self, "local_count",
                           prompts.local_counter(self.tokenizer) if self.tokenizer is not None else None)

    def _check_workload(self) -> None:
        if self.shared_prefix is not None and (self.turns is not None or self.dataset is not None):
            raise BenchError("--shared-prefix builds its own prompts: drop --turns and --dataset")
        if self.trace is not None and (self.turns, self.dataset, self.shared_prefix) != (None,) * 3:
            raise BenchError("--trace gives the prompt lengths: drop --dataset, --shared-prefix and --turns")
        if self.shared_prefix is not None and not 1 <= self.prefix_tokens <= MAX_LENGTH:
            raise BenchError(f"--prefix-tokens {self.prefix_tokens}: give 1 to {MAX_LENGTH} tokens")
        if self.turns is not None and self.turns < 1:
            raise BenchError(f"--turns {self.turns}: a conversation needs at least one turn")
        if self.turns is not None and self.load.mode != "users":
            raise BenchError("--turns needs closed-loop users (--users): a turn waits for the last answer")
        if (self.trace is None) != (self.load.mode != "trace"):
            raise BenchError("a trace replay needs both the trace's lengths and its arrivals")

    def with_load(self, **changes: object) -> "BenchSpec":
        return replace(self, load=replace(self.load, **changes))


def check_url(url: str) -> str:
    example = f"--url {url!r}: give a base URL like http://127.0.0.1:8000"
    try:
        parsed = urlparse(url)
    except ValueError:  # an IPv6 host without its closing bracket
        raise BenchError(example) from None
    if "@" in parsed.netloc:  # named without its user and password, which this line must not print either
        raise BenchError(f"--url {parsed.scheme}://…@{parsed.netloc.rpartition('@')[2]}: a user or password in the URL "
                         "would be saved in every report; send it with --header 'Authorization=Basic BASE64', which "
                         "reports redact")
    try:
        parsed.port  # noqa: B018 - raises on a port that is no number from 0 to 65535
    except ValueError:
        raise BenchError(example) from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise BenchError(example)
    if parsed.query or parsed.fragment or url.endswith(("?", "#")):
        raise BenchError(f"--url {url!r}: give the server's base URL, without a ?query or #fragment (bench adds "
                         "/v1/completions to it)")
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        raise BenchError(f"--url {url!r}: give the server's base URL, without /v1 (bench adds /v1/completions)")
    if (route := path.rpartition("/v1/")[2]) and "/v1/" in path:  # an endpoint's own URL, pasted whole
        raise BenchError(f"--url {url!r}: give the server's base URL, without /v1/{route} (bench adds "
                         "/v1/completions, or /v1/chat/completions with --api chat)")
    return url.rstrip("/")


async def measure(spec: BenchSpec, url: str,
                  on_progress: Callable[[Progress], None] | None = None) -> RunRecord:
    """Run the benchmark `spec` against the endpoint at `url`."""
    url = check_url(url)
    model = spec.model or await discover_model(url, headers=spec.headers, tls=spec.tls)
    workload, counts = await build_workload(spec, url)
    target = Target(url, model, spec.api, spec.timeout, spec.is_ignore_eos, headers=spec.headers,
                    priority=spec.priority, tls=spec.tls)
    sampler = MetricsSampler(url, spec.metrics_interval, spec.headers, spec.tls) if spec.metrics_interval else None
    sampling = asyncio.create_task(sampler.run()) if sampler else None
    try:
        async with Client(target) as client:
            result = await LoadGenerator(client, spec.load, workload, on_progress).run()
    finally:
        if sampling is not None:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
    if sampler is not None and sampler.samples:
        await sampler.sample_once()
    load = spec.load
    return RunRecord(
        url=url, model=model, mode=load.mode, users=load.users, rate=load.rate,
        burstiness=load.burstiness if load.rate else None, clock_origin=result.clock_origin,
        warmup_end=result.warmup_end,
        window=result.window, requests=result.requests, loop_lag=result.loop_lag,
        client_cpu=result.client_cpu, tokenizer=counts, prompt_lengths=workload.describe(),
        output_lengths=spec.output_dist.describe(), max_concurrency=load.max_concurrency,
        server_metrics=sampler.relative_to(result.clock_origin) if sampler else (), stopped_by=result.stopped_by,
        server_gone_at=result.gone_at,
    )


async def build_workload(spec: BenchSpec, url: str) -> tuple[Workload, str]:
    """The workload `spec` asks for, and how its prompt lengths were counted."""
    entries = spec.entries
    if entries is not None and spec.turns is None:
        return Dataset(entries, spec.output_dist, str(spec.dataset)), DATASET_COUNTS
    if entries is not None:
        return Conversations(spec.turns, dataset_questions(entries), spec.output_dist), DATASET_COUNTS
    longest = spec.prompt_dist.high + (spec.prefix_tokens if spec.shared_prefix else 0)
    builder = await prompt_builder(spec, url, longest)
    questions = word_questions(builder, spec.prompt_dist)
    counts = builder.calibration.source
    if spec.shared_prefix is not None:
        return SharedPrefix(builder, *spec.shared_prefix, spec.prefix_tokens, questions,
                            spec.output_dist), counts
    if spec.turns is not None:
        return Conversations(spec.turns, questions, spec.output_dist,
                             builder.calibration.num_specials), counts
    return Synthetic(questions, spec.output_dist, spec.prompt_dist.describe()), counts


async def prompt_builder(spec: BenchSpec, url: str, longest: int) -> prompts.PromptBuilder:
    """Calibrate words against the best tokenizer available, then check a few prompts."""
    async with client_session(30, spec.headers, spec.tls) as session:
        if spec.local_count is not None:
            count = spec.local_count
            source = f"local tokenizer {spec.tokenizer}"
        elif await prompts.has_tokenize(session, url, spec.api == CHAT):
            count = prompts.remote_counter(session, url, spec.api == CHAT)
            source = f"{url}/tokenize" + (" (chat template applied)" if spec.api == CHAT else "")
        else:
            calibration = prompts.approximate_calibration()
            return prompts.PromptBuilder(calibration, longest, spec.load.seed)
        calibration = await prompts.calibrate(count, source)
        builder = prompts.PromptBuilder(calibration, longest, spec.load.seed)
        rng = random.Random(spec.load.seed)
        lengths = [spec.prompt_dist.sample(rng, i) for i in range(NUM_CHECKED_PROMPTS)]
        await prompts.check(builder, count, lengths + [spec.prompt_dist.high])
        return builder


def measure_sync(spec: BenchSpec, url: str,
                 on_progress: Callable[[Progress], None] | None = None) -> RunRecord:
    """`measure` from synchronous code, on a fresh event loop (uvloop when installed)."""
    return run_async(measure(spec, url, on_progress))


def run_async(coroutine):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _lengths(spec: str, option: str, jsonl_field: str):
    """A length distribution, its error naming the option it came from."""
    try:
        return parse_distribution(spec, jsonl_field=jsonl_field)
    except BenchError as exc:
        raise BenchError(f"{option}: {exc}") from None
