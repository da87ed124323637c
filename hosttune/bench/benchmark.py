"""One benchmark: its configuration, and running it against one endpoint.

`measure()` finds the model, makes prompts exact with the best tokenizer it can get,
runs the load generator and returns a `RunRecord`. Nothing here prints.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import aiohttp

from hosttune.bench import prompts
from hosttune.bench.client import CHAT, COMPLETIONS, Client, Target, discover_model
from hosttune.bench.distributions import LengthDistribution, parse_distribution
from hosttune.bench.loadgen import Load, LoadGenerator, Progress
from hosttune.bench.metrics import Slo
from hosttune.bench.record import RunRecord
from hosttune.errors import BenchError

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
    prompt_dist: LengthDistribution = field(init=False, repr=False, compare=False)
    output_dist: LengthDistribution = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.api not in (COMPLETIONS, CHAT):
            raise BenchError(f"--api {self.api}: choose {COMPLETIONS} or {CHAT}")
        if self.timeout <= 0 or self.lag_limit <= 0:
            raise BenchError("--timeout and --max-client-lag must be positive")
        object.__setattr__(self, "prompt_dist", parse_distribution(self.prompt_lengths))
        object.__setattr__(
            self, "output_dist", parse_distribution(self.output_lengths, jsonl_field="output_tokens")
        )

    def with_load(self, **changes: object) -> "BenchSpec":
        return replace(self, load=replace(self.load, **changes))


def check_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise BenchError(f"--url {url!r}: give a base URL like http://127.0.0.1:8000")
    return url.rstrip("/")


async def measure(spec: BenchSpec, url: str,
                  on_progress: Callable[[Progress], None] | None = None) -> RunRecord:
    """Run the benchmark `spec` against the endpoint at `url`."""
    url = check_url(url)
    model = spec.model or await discover_model(url, headers=spec.headers)
    builder = await prompt_builder(spec, url)
    target = Target(url, model, spec.api, spec.timeout, spec.is_ignore_eos, spec.headers)
    async with Client(target) as client:
        generator = LoadGenerator(client, spec.load, builder, spec.prompt_dist,
                                  spec.output_dist, on_progress)
        result = await generator.run()
    load = spec.load
    return RunRecord(
        url=url, model=model, mode=load.mode, users=load.users, rate=load.rate,
        burstiness=load.burstiness if load.rate else None, clock_origin=result.clock_origin,
        warmup_end=result.warmup_end,
        window=result.window, requests=result.requests, loop_lag=result.loop_lag,
        client_cpu=result.client_cpu, tokenizer=builder.calibration.source,
        prompt_lengths=spec.prompt_dist.describe(), output_lengths=spec.output_dist.describe(),
    )


async def prompt_builder(spec: BenchSpec, url: str) -> prompts.PromptBuilder:
    """Calibrate words against the best tokenizer available, then check a few prompts."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, headers=spec.headers) as session:
        if spec.tokenizer is not None:
            count = prompts.local_counter(spec.tokenizer)
            source = f"local tokenizer {spec.tokenizer}"
        elif await prompts.has_tokenize(session, url, spec.api == CHAT):
            count = prompts.remote_counter(session, url, spec.api == CHAT)
            source = f"{url}/tokenize" + (" (chat template applied)" if spec.api == CHAT else "")
        else:
            calibration = prompts.approximate_calibration()
            return prompts.PromptBuilder(calibration, spec.prompt_dist.high, spec.load.seed)
        calibration = await prompts.calibrate(count, source)
        builder = prompts.PromptBuilder(calibration, spec.prompt_dist.high, spec.load.seed)
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
