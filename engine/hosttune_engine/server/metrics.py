"""Prometheus metrics under vLLM's names, so dashboards made for vLLM work unchanged.

Latencies are histograms with vLLM's buckets, observed once per finished
sequence; engine counters and gauges are read from `EngineStats` at scrape
time. Our additions: `vllm:num_requests_rejected_total{reason}` (429s while
overloaded, 503s while starting or draining) and
`hosttune:kernel_compiles_total` (Triton kernel variants built since the server
became ready: each one is a shape warmup missed, and the steps then running
waited for it). Each server has its own prometheus-client registry, written in
the text format at every scrape.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hosttune_engine.core.messages import EngineStats

prometheus_client.disable_created_metrics()  # vLLM's dashboards read no *_created series

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1) + E2E_BUCKETS
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
FINISH_REASONS = ("stop", "length", "abort")
REJECT_REASONS = ("overload", "starting", "draining")


@dataclass(frozen=True)
class SequenceTiming:
    """One finished sequence, as the latency histograms see it (seconds)."""

    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str
    e2e: float
    ttft: float | None  # None: no token came out (aborted early)
    queue_time: float | None
    inter_token: tuple[float, ...]  # gaps between consecutive outputs


GAUGES = (  # (name, help, EngineStats field)
    ("vllm:num_requests_running", "Sequences in the running batch.", "num_running"),
    ("vllm:num_requests_waiting", "Sequences waiting to be scheduled.", "num_waiting"),
    ("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", "kv_usage"),
    ("vllm:gpu_cache_usage_perc", "Same as vllm:kv_cache_usage_perc (older name).", "kv_usage"),
)
COUNTERS = (  # exposed with a _total suffix
    ("vllm:prompt_tokens", "Prompt tokens processed.", "prompt_tokens_total"),
    ("vllm:generation_tokens", "Tokens generated.", "generation_tokens_total"),
    ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries_total"),
    ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits_total"),
    ("vllm:num_preemptions", "Sequences preempted (KV blocks freed, recomputed later).", "num_preemptions_total"),
    ("hosttune:kernel_compiles", "Triton kernel variants built while serving (each one stalled the steps then "
     "running; warmup should leave none).", "kernel_compiles_total"),
)
HISTOGRAMS = (  # (attribute, name, help, buckets)
    ("ttft", "vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS),
    ("inter_token", "vllm:inter_token_latency_seconds", "Time between consecutive output tokens.", ITL_BUCKETS),
    ("inter_token_old", "vllm:time_per_output_token_seconds",
     "Time between consecutive output tokens (older name).", ITL_BUCKETS),
    ("per_output_token", "vllm:request_time_per_output_token_seconds",
     "Mean time per output token after the first, per request.", ITL_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS),
    ("queue", "vllm:request_queue_time_seconds", "Time from arrival to first being scheduled.", QUEUE_BUCKETS),
    ("prompt_tokens", "vllm:request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS),
    ("output_tokens", "vllm:request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS),
)
BASELINED = tuple(field for _, _, field in COUNTERS)


class _EngineStatsCollector:
    """The engine's gauges and counters, from the stats handed to the scrape that is running."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.stats: EngineStats | None = None

    def collect(self):
        if self.stats is None:
            return
        for name, help_, field in GAUGES:
            yield self._family(GaugeMetricFamily, name, help_, field)
        for name, help_, field in COUNTERS:
            if getattr(self.stats, field) is not None:  # None: this engine does not count it
                yield self._family(CounterMetricFamily, name, help_, field)

    def _family(self, kind, name: str, help_: str, field: str):
        family = kind(name, help_, labels=["model_name"])
        family.add_metric([self.model_name], getattr(self.stats, field))
        return family


class Metrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=False)
        self.engine_stats = _EngineStatsCollector(model_name)
        self.registry.register(self.engine_stats)
        self.finished = self._counter("vllm:request_success", "Finished sequences by finish reason.",
                                      "finished_reason", FINISH_REASONS, model_name)
        self.rejected = self._counter("vllm:num_requests_rejected",
                                      "Requests turned away: 429 when at capacity, 503 while starting or draining.",
                                      "reason", REJECT_REASONS, model_name)
        for attr, name, help_, buckets in HISTOGRAMS:
            hist = Histogram(name, help_, ["model_name"], buckets=buckets, registry=self.registry)
            setattr(self, attr, hist.labels(model_name))
        self.model_name = model_name
        self.baseline: EngineStats | None = None

    def _counter(self, name: str, help_: str, label: str, values, model_name: str) -> Counter:
        counter = Counter(name, help_, ["model_name", label], registry=self.registry)
        for value in values:  # every reason is exposed from the start, at 0
            counter.labels(model_name, value)
        return counter

    def set_baseline(self, stats: EngineStats) -> None:
        """Engine counters as of now count as zero: warmup's tokens are not traffic."""
        self.baseline = stats

    def observe(self, t: SequenceTiming) -> None:
        self.e2e.observe(t.e2e)
        if t.ttft is not None:
            self.ttft.observe(t.ttft)
        if t.queue_time is not None:
            self.queue.observe(t.queue_time)
        for gap in t.inter_token:
            self.inter_token.observe(gap)
            self.inter_token_old.observe(gap)
        if t.num_output_tokens > 1 and t.ttft is not None:
            self.per_output_token.observe((t.e2e - t.ttft) / (t.num_output_tokens - 1))
        self.prompt_tokens.observe(t.num_prompt_tokens)
        self.output_tokens.observe(t.num_output_tokens)
        self.finished.labels(self.model_name, t.finish_reason).inc()

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def _since_baseline(self, stats: EngineStats | None) -> EngineStats | None:
        if self.baseline is None or stats is None:  # loading or warming up: no engine series yet
            return None
        return replace(stats, **{f: getattr(stats, f) - (getattr(self.baseline, f) or 0) for f in BASELINED
                                 if getattr(stats, f) is not None})

    def render(self, stats: EngineStats | None) -> str:
        """The Prometheus text format: engine gauges and counters as of `stats`, then the server's own.
        Before the baseline (ready) only the server's own: warmup's tokens shown then would fall at ready,
        and a counter never falls."""
        self.engine_stats.stats = self._since_baseline(stats)
        return generate_latest(self.registry).decode()
