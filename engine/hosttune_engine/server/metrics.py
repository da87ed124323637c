"""Prometheus metrics under vLLM's names, so dashboards made for vLLM work unchanged.

Latencies are histograms with vLLM's buckets, observed once per finished
sequence; engine counters and gauges are read from `EngineStats` at scrape
time. Our one addition is `vllm:num_requests_rejected_total{reason}` (429s
while overloaded, 503s while starting or draining). Written in Prometheus text
format 0.0.4 by hand: prometheus-client is not needed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from hosttune_engine.core.messages import EngineStats

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


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [], 0
        for le, count in zip((*map(_number, self.buckets), "+Inf"), self.counts):
            total += count
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
        return out + [f"{name}_sum{{{labels}}} {_number(self.sum)}", f"{name}_count{{{labels}}} {total}"]


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(float(v))


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    def __init__(self, model_name: str):
        self.labels = f'model_name="{_label_value(model_name)}"'
        self.ttft = Histogram(TTFT_BUCKETS)
        self.inter_token = Histogram(ITL_BUCKETS)
        self.per_output_token = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)
        self.prompt_tokens = Histogram(TOKEN_BUCKETS)
        self.output_tokens = Histogram(TOKEN_BUCKETS)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.baseline: EngineStats | None = None

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
        if t.num_output_tokens > 1 and t.ttft is not None:
            self.per_output_token.observe((t.e2e - t.ttft) / (t.num_output_tokens - 1))
        self.prompt_tokens.observe(t.num_prompt_tokens)
        self.output_tokens.observe(t.num_output_tokens)
        self.finished[t.finish_reason] = self.finished.get(t.finish_reason, 0) + 1

    def reject(self, reason: str) -> None:
        self.rejected[reason] += 1

    def _since_baseline(self, stats: EngineStats) -> EngineStats:
        if self.baseline is None:
            return stats
        b = self.baseline
        return replace(stats, prompt_tokens_total=stats.prompt_tokens_total - b.prompt_tokens_total,
                       generation_tokens_total=stats.generation_tokens_total - b.generation_tokens_total,
                       prefix_cache_queries_total=stats.prefix_cache_queries_total - b.prefix_cache_queries_total,
                       prefix_cache_hits_total=stats.prefix_cache_hits_total - b.prefix_cache_hits_total,
                       num_preemptions_total=stats.num_preemptions_total - b.num_preemptions_total)

    def render(self, stats: EngineStats) -> str:
        stats = self._since_baseline(stats)
        out: list[str] = []
        for name, help_, value in (
            ("vllm:num_requests_running", "Sequences in the running batch.", stats.num_running),
            ("vllm:num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting),
            ("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", stats.kv_usage),
            ("vllm:gpu_cache_usage_perc", "Same as vllm:kv_cache_usage_perc (older name).", stats.kv_usage),
        ):
            out += self._family(name, "gauge", help_, [(self.labels, value)])
        for name, help_, value in (
            ("vllm:prompt_tokens", "Prompt tokens processed.", stats.prompt_tokens_total),
            ("vllm:generation_tokens", "Tokens generated.", stats.generation_tokens_total),
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             stats.prefix_cache_queries_total),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits_total),
            ("vllm:num_preemptions", "Sequences preempted (KV blocks freed, recomputed later).",
             stats.num_preemptions_total),
        ):
            out += self._family(name, "counter", help_, [(self.labels, value)], suffix="_total")
        out += self._family("vllm:request_success", "counter", "Finished sequences by finish reason.",
                            [(f'{self.labels},finished_reason="{r}"', n) for r, n in self.finished.items()], "_total")
        out += self._family("vllm:num_requests_rejected", "counter",
                            "Requests turned away: 429 when at capacity, 503 while starting or draining.",
                            [(f'{self.labels},reason="{r}"', n) for r, n in self.rejected.items()], "_total")
        for name, help_, hist in (
            ("vllm:time_to_first_token_seconds", "Time to first token.", self.ttft),
            ("vllm:inter_token_latency_seconds", "Time between consecutive output tokens.", self.inter_token),
            ("vllm:time_per_output_token_seconds", "Time between consecutive output tokens (older name).",
             self.inter_token),
            ("vllm:request_time_per_output_token_seconds", "Mean time per output token after the first, per "
             "request.", self.per_output_token),
            ("vllm:e2e_request_latency_seconds", "End-to-end request latency.", self.e2e),
            ("vllm:request_queue_time_seconds", "Time from arrival to first being scheduled.", self.queue),
            ("vllm:request_prompt_tokens", "Prompt tokens per request.", self.prompt_tokens),
            ("vllm:request_generation_tokens", "Generated tokens per request.", self.output_tokens),
        ):
            out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram", *hist.lines(name, self.labels)]
        return "\n".join(out) + "\n"

    @staticmethod
    def _family(name: str, kind: str, help_: str, samples, suffix: str = "") -> list[str]:
        lines = [f"# HELP {name}{suffix} {help_}", f"# TYPE {name}{suffix} {kind}"]
        return lines + [f"{name}{suffix}{{{labels}}} {_number(value)}" for labels, value in samples]
