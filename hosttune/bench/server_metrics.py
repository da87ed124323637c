"""The server's own view during a run: its Prometheus `/metrics`, sampled at an interval.

Read by vLLM's metric names, which hosttune's engine exports too (SGLang's names are
read where vLLM's are missing): requests waiting and running, the KV cache's use, the
preemptions so far, and the prefix cache's hit and queried prompt tokens (or SGLang's hit
rate), from which metrics.prefix_hit_rate gives a run's share of prompt tokens served from the cache.
Values of one name are summed over its label sets (several models or engines behind one
endpoint). A server without `/metrics` gives no samples; the run is measured all the same.
Behind a host's front (nginx, a router) `/metrics` reaches one replica, so the rate is that
replica's.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace

import aiohttp

from hosttune.bench.client import session as client_session
from hosttune.bench.record import ServerSample

NAMES = {
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hit_rate": ("sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"),
}
WANTED = {name for names in NAMES.values() for name in names}


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of each wanted metric's samples in Prometheus text exposition format."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        name = line[:name_end]
        if name_end < 0 or name not in WANTED:
            continue
        after_labels = line.rsplit("}", 1)[-1] if line[name_end] == "{" else line[name_end:]
        try:
            value = float(after_labels.split()[0])  # a timestamp may follow
        except (ValueError, IndexError):
            continue
        if math.isfinite(value):  # NaN is valid Prometheus text but no JSON number
            totals[name] = totals.get(name, 0.0) + value
    return totals


def sample_of(at: float, totals: dict[str, float]) -> ServerSample:
    values = {key: next((totals[n] for n in names if n in totals), None) for key, names in NAMES.items()}
    return ServerSample(at=at, **values)


class MetricsSampler:
    """Polls `url/metrics` every `interval` seconds while a run is under way."""

    def __init__(self, url: str, interval: float, headers: tuple[tuple[str, str], ...] = (), tls=None) -> None:
        self.endpoint = url.rstrip("/") + "/metrics"
        self.interval = interval
        self.headers = dict(headers)  # the API key, for a server that protects /metrics too
        self.tls = tls  # https: the context the streams trust
        self.samples: list[ServerSample] = []  # times on the perf_counter clock

    async def run(self) -> None:
        """Sample until cancelled; stop early at a server that has no /metrics."""
        async with client_session(max(self.interval, 1.0), self.headers, self.tls) as session:
            while await self._sample(session):
                await asyncio.sleep(self.interval)

    async def sample_once(self) -> None:
        """One more sample, at the run's end: the counters' increase then covers the whole run."""
        async with client_session(max(self.interval, 1.0), self.headers, self.tls) as session:
            await self._sample(session)

    async def _sample(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(self.endpoint) as resp:
                if resp.status == 404:
                    return False
                text = await resp.text() if resp.status == 200 else ""
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
            return True  # a busy server may miss one; the next sample comes on time
        totals = parse_metrics(text)
        if totals:
            self.samples.append(sample_of(time.perf_counter(), totals))
        return bool(totals) or bool(self.samples)

    def relative_to(self, origin: float) -> tuple[ServerSample, ...]:
        return tuple(replace(s, at=s.at - origin) for s in self.samples)
