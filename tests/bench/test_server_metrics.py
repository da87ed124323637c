"""The server's /metrics sampled through a run, written to CSV and plotted, and the
parser against the text vLLM-style servers export."""

import csv
import json

from typer.testing import CliRunner

from hosttune.bench.benchmark import BenchSpec, measure, run_async
from hosttune.bench.loadgen import Load
from hosttune.bench.server_metrics import parse_metrics, sample_of
from hosttune.cli import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ENGINE_TEXT = """\
# HELP vllm:num_requests_running Sequences in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 2.0
vllm:num_requests_waiting{model_name="m"} 7
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:num_preemptions_total{model_name="m"} 4.0
vllm:num_preemptions_created{model_name="m"} 1.7e9
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 12.0
"""


def test_parse_sums_label_sets_and_takes_the_older_kv_name():
    sample = sample_of(1.5, parse_metrics(ENGINE_TEXT))
    assert (sample.at, sample.running, sample.waiting, sample.kv_usage, sample.preemptions) == (1.5, 5.0, 7.0, 0.25, 4.0)


def test_parse_reads_samples_without_labels_or_with_a_timestamp_and_skips_values_json_cannot_hold():
    """Labels are optional in Prometheus text, and so is a sample's timestamp; NaN is a valid value there, but
    results.json would then not be JSON."""
    text = ("vllm:num_requests_running 3\nvllm:num_requests_waiting 7 1700000000000\n"
            "vllm:kv_cache_usage_perc{model_name=\"m\"} NaN\nvllm:num_preemptions_total +Inf\n")
    sample = sample_of(0.0, parse_metrics(text))
    assert (sample.running, sample.waiting, sample.kv_usage, sample.preemptions) == (3.0, 7.0, None, None)


def test_a_server_without_metrics_gives_no_samples():
    sample = sample_of(0.0, parse_metrics("# nothing here\nother_metric 3\n"))
    assert (sample.waiting, sample.running, sample.kv_usage, sample.preemptions) == (None,) * 4


def test_samples_show_the_queue_and_the_batch(server_factory):
    url = server_factory("--ttft", "0.2", "--itl", "0.05", "--capacity", "2")
    spec = BenchSpec(load=Load(users=6, duration=1.5), prompt_lengths="8", output_lengths="4",
                     metrics_interval=0.1)
    record = run_async(measure(spec, url))
    samples = [s for s in record.server_metrics if 0.3 < s.at < 1.4]
    assert len(samples) >= 8
    # Between one request's end and its user's next, a sample may see one fewer waiting.
    assert all(s.running <= 2 and s.waiting <= 4 and s.kv_usage == s.running / 2 for s in samples)
    full = [s for s in samples if s.running == 2 and s.waiting == 4]
    assert len(full) >= 0.7 * len(samples)
    assert all(s.preemptions == 0 for s in record.server_metrics)


def test_csv_and_timeline_through_the_cli(server_factory, tmp_path):
    url = server_factory("--ttft", "0.05", "--itl", "0.01", "--capacity", "2")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "bench", "--url", url, "--rate", "40", "--max-concurrency", "4", "--duration", "1.5s",
        "--warmup", "0", "--prompts", "8", "--max-tokens", "3", "--metrics-interval", "100ms",
        "--out", str(out)])
    assert result.exit_code in (0, 4), result.output
    data = json.loads((out / "results.json").read_text())["runs"][0]
    assert data["max_concurrency"] == 4 and len(data["server_metrics"]) >= 10
    with (out / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(data["requests"]) and {r["outcome"] for r in rows} == {"ok"}
    assert all(float(r["ttft"]) >= 0.05 and r["output_tokens"] == "3" for r in rows)
    with (out / "summary.csv").open() as handle:
        summary, = list(csv.DictReader(handle))
    assert float(summary["ttft_p50"]) >= 0.05 and int(summary["ok"]) == len(rows)
    with (out / "server_metrics.csv").open() as handle:
        samples = list(csv.DictReader(handle))
    assert max(float(s["running"]) for s in samples) == 2 and max(float(s["waiting"]) for s in samples) >= 1
    markdown = (out / "report.md").read_text()
    assert "| server: running mean / max |" in markdown and "at most 4 in flight" in markdown
    assert (out / "timeline.png").read_bytes().startswith(PNG_MAGIC)


def test_the_prefix_cache_counters_give_the_runs_hit_rate_and_sglangs_gauge_stands_in():
    from hosttune.bench.metrics import prefix_hit_rate

    def sample(at, hits, queries):
        text = (f'vllm:prefix_cache_hits_total{{model_name="m"}} {hits}\n'
                f'vllm:prefix_cache_queries_total{{model_name="m"}} {queries}\n')
        return sample_of(at, parse_metrics(text))

    samples = [sample(0.0, 100, 400), sample(1.0, 400, 800), sample(2.0, 1000, 1500)]
    assert (samples[1].prefix_hits, samples[1].prefix_queries) == (400.0, 800.0)
    assert prefix_hit_rate(samples) == 900 / 1100  # the increase, not the totals since the server started
    sglang = [sample_of(t, parse_metrics(f"sglang:cache_hit_rate{{model_name=\"m\"}} {r}\n")) for t, r in ((0, 0.5), (1, 0.7))]
    assert prefix_hit_rate(sglang) == 0.6
    assert prefix_hit_rate(samples[:1]) is None and prefix_hit_rate([sample_of(0, {})]) is None
