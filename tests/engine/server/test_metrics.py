"""Metrics text, admission counting and the throughput window, as data (no server needed)."""

import re
from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from hosttune_engine.core.messages import EngineStats
from hosttune_engine.server.admission import Admission
from hosttune_engine.server.health import Health, Phase, TokenRate
from hosttune_engine.server.metrics import BASELINED, Metrics, SequenceTiming

STATS = EngineStats(num_running=3, num_waiting=1, kv_usage=0.25, num_kv_blocks=100, num_free_kv_blocks=75,
                    prefix_cache_queries_total=50, prefix_cache_hits_total=16, num_preemptions_total=2,
                    prompt_tokens_total=120, generation_tokens_total=300, num_finished_total=4)
NO_WARMUP = replace(STATS, **{field: 0 for field in BASELINED})  # a baseline that takes nothing off

VLLM_NAMES = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_queue_time_seconds", "vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
              "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
              "vllm:request_success_total", "vllm:num_requests_rejected_total"]


def _samples(text: str) -> dict:
    """(name, labels without model_name) -> value, read back with prometheus-client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))] = s.value
    return out


def test_histogram_buckets_are_cumulative_with_vllm_buckets():
    m = Metrics("m")
    for e2e in (0.2, 0.3, 0.9, 9000.0):
        m.observe(SequenceTiming(10, 1, "stop", e2e=e2e, ttft=None, queue_time=None, inter_token=()))
    samples = _samples(m.render(STATS))
    name = "vllm:e2e_request_latency_seconds"
    assert [samples[f"{name}_bucket", (("le", le),)] for le in ("0.3", "0.5", "1.0", "7680.0", "+Inf")] == \
        [2, 2, 3, 3, 4]
    assert samples[f"{name}_sum", ()] == 9001.4 and samples[f"{name}_count", ()] == 4


def test_render_has_vllm_names_and_valid_lines():
    m = Metrics('my "model"')
    m.observe(SequenceTiming(10, 5, "stop", e2e=1.0, ttft=0.2, queue_time=0.01, inter_token=(0.2,) * 4))
    m.observe(SequenceTiming(10, 0, "abort", e2e=0.5, ttft=None, queue_time=None, inter_token=()))
    m.reject("overload")
    m.set_baseline(NO_WARMUP)  # ready: the engine's series are shown
    text = m.render(STATS)
    for name in VLLM_NAMES:
        assert re.search(rf"^{re.escape(name)}(_bucket|_count)?{{", text, re.M), name
    sample = re.compile(r'^[a-z0-9_:]+\{([a-z_]+="(\\.|[^"\\])*",?)+\} -?[0-9.e+-]+$')
    for line in text.splitlines():
        assert line.startswith("# ") or (sample.match(line) and 'model_name="my \\"model\\""' in line), line
    samples = _samples(text)
    assert samples["vllm:request_success_total", (("finished_reason", "stop"),)] == 1
    assert samples["vllm:request_success_total", (("finished_reason", "abort"),)] == 1
    assert samples["vllm:request_success_total", (("finished_reason", "length"),)] == 0
    assert samples["vllm:num_requests_rejected_total", (("reason", "overload"),)] == 1
    assert samples["vllm:kv_cache_usage_perc", ()] == 0.25
    assert samples["vllm:prefix_cache_hits_total", ()] == 16
    assert samples["vllm:time_to_first_token_seconds_count", ()] == 1
    assert samples["vllm:inter_token_latency_seconds_count", ()] == 4
    assert samples["vllm:time_per_output_token_seconds_count", ()] == 4
    assert samples["vllm:request_time_per_output_token_seconds_sum", ()] == 0.2


def test_baseline_hides_warmup_tokens():
    m = Metrics("m")
    m.set_baseline(STATS)
    samples = _samples(m.render(STATS))
    assert samples["vllm:generation_tokens_total", ()] == 0
    assert samples["vllm:num_requests_running", ()] == 3  # gauges are not offset


def test_engine_counters_never_fall_when_warmup_ends():
    """A scrape while the model loads or warms up shows the server's own counters and no engine counter,
    so none of them falls when warmup's tokens become the baseline."""
    m = Metrics("m")
    m.reject("starting")
    loading = _samples(m.render(None))
    assert loading["vllm:num_requests_rejected_total", (("reason", "starting"),)] == 1
    warming = _samples(m.render(STATS))
    m.set_baseline(STATS)
    ready = _samples(m.render(replace(STATS, generation_tokens_total=305)))
    assert ready["vllm:generation_tokens_total", ()] == 5
    for key, value in {**loading, **warming}.items():
        if key[0].endswith("_total"):
            assert ready[key] >= value, key


def test_kernel_compiles_count_from_ready_and_only_where_counted():
    """Warmup's compiles are the baseline; the ones after it show a shape warmup missed. An engine that
    cannot count them (no Triton hooks) exposes no such series rather than a 0."""
    m = Metrics("m")
    assert not any(name.startswith("hosttune:kernel_compiles") for name, _ in _samples(m.render(STATS)))
    warm = replace(STATS, kernel_compiles_total=41)
    m.set_baseline(warm)
    assert _samples(m.render(warm))["hosttune:kernel_compiles_total", ()] == 0
    assert _samples(m.render(replace(warm, kernel_compiles_total=43)))["hosttune:kernel_compiles_total", ()] == 2


def test_admission_counts_sequences():
    a = Admission(max_running=4, max_queue=4)
    assert a.admit(6) is None and a.num_in_flight == 6
    rejected = a.admit(3)
    assert rejected is not None and rejected.retry_after_s == 1 and a.num_rejected_total == 1
    assert a.admit(2) is None and not a.can_admit(1)
    with a.holding(8):
        pass
    assert a.num_in_flight == 0 and a.fits_ever(8) and not a.fits_ever(9)


def test_token_rate_window():
    rate = TokenRate(window_s=10)
    assert rate.rate() == 0.0
    for t in range(0, 30):
        rate.sample(total_tokens=100 * t, now=float(t))
    assert rate.rate() == 100.0
    assert len(rate._samples) <= 12


def test_health_throughput_leaves_out_warmup():
    """/health's tokens_per_second right after ready is traffic's, not warmup's generations."""
    health = Health()
    health.phase = Phase.WARMING_UP
    health.sample_tokens(0, now=0.0)
    health.sample_tokens(500, now=1.0)
    health.phase = Phase.READY
    health.sample_tokens(500, now=2.0)
    assert health.tokens.rate() == 0.0
    health.sample_tokens(510, now=3.0)
    assert health.tokens.rate() == 10.0
