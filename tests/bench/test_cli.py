"""`hosttune bench` through typer's CliRunner against scripted servers, and in its own process where a signal must reach it."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.bench import console, plot
from hosttune.cli import app
from hosttune.cli.bench_run import EXIT_CLIENT_BEHIND

from .servers import loopback_http, realtime

REPO = Path(__file__).resolve().parents[2]

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_compare_two_endpoints_and_write_every_output(server_factory, tmp_path):
    fast = server_factory("--realtime", "--ttft", "0.01", "--itl", "0.002")
    slow = server_factory("--realtime", "--ttft", "0.04", "--itl", "0.006", "--error-every", "10")
    out = tmp_path / "report"
    with realtime():  # the slow endpoint's TTFT P50 is checked to 5 ms below
        result = runner.invoke(app, [
            "bench", "--url", fast, "--url", slow, "--users", "4", "--requests", "30",
            "--warmup", "0", "--prompts", "uniform:16-64", "--max-tokens", "8",
            "--slo", "ttft=30ms,e2e=100ms", "--out", str(out),
        ])
    # Bit 1: the slow endpoint misses the TTFT SLO. Bit 4 (client behind) may be set too
    # when other processes keep this machine's two cores busy.
    assert result.exit_code in (1, 5), result.output
    assert fast in result.output and slow in result.output
    assert "TTFT P95 (ms)" in result.output and "stream-error: 3" in result.output

    data = json.loads((out / "results.json").read_text())
    fast_run, slow_run = data["runs"]
    assert fast_run["url"] == fast and len(fast_run["requests"]) == 30
    request = fast_run["requests"][0]
    assert len(request["chunks"]) == 8 and request["ttft"] >= 0.01 and request["outcome"] == "ok"
    assert fast_run["summary"]["slo_met"] is True and slow_run["summary"]["slo_met"] is False
    assert slow_run["summary"]["errors_by_status"] == {"stream-error": 3}
    assert 0.04 <= slow_run["summary"]["ttft"]["p50"] < 0.045

    markdown = (out / "report.md").read_text()
    assert "| TTFT P95 (ms) |" in markdown and "![latency_cdf.png](latency_cdf.png)" in markdown
    assert "## Definitions" in markdown
    assert (out / "latency_cdf.png").read_bytes().startswith(PNG_MAGIC)


def test_an_endpoint_that_does_not_answer_fails_before_the_first_is_measured(server_factory, tmp_path):
    """Measuring the first endpoint for a minute and then stopping at the second, down one, would throw that minute
    away: every endpoint lists its model first."""
    url = server_factory("--ttft", "0.01", "--itl", "0.002")
    start = time.monotonic()
    result = runner.invoke(app, ["bench", "--url", url, "--url", "http://127.0.0.1:9", "--duration", "60s",
                                 "--warmup", "0s", "--users", "1", "--prompts", "8", "--max-tokens", "2"])
    assert result.exit_code == 2 and "cannot reach http://127.0.0.1:9/v1/models" in result.output, result.output
    assert time.monotonic() - start < 30


def test_sweep_through_the_cli(server_factory, tmp_path):
    url = server_factory("--ttft", "0.01", "--itl", "0.002", "--capacity", "1")
    out = tmp_path / "sweep"
    # One slot, 24 ms per request: about 40 requests/s at most.
    result = runner.invoke(app, [
        "bench", "--url", url, "--sweep", "--sweep-start", "10", "--sweep-max", "20",
        "--duration", "1.5s", "--warmup", "0.3s", "--prompts", "8", "--max-tokens", "8",
        "--slo", "e2e=200ms", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    assert "20.00 (ceiling)" in result.output
    data = json.loads((out / "results.json").read_text())
    assert [p["rate"] for p in data["sweeps"][0]["points"]] == [10, 20]
    assert (out / "latency_vs_rate.png").read_bytes().startswith(PNG_MAGIC)
    assert "## Rate sweep" in (out / "report.md").read_text()


def test_out_holds_one_run_an_earlier_runs_result_files_go_and_other_files_stay(server_factory, tmp_path):
    url = server_factory("--ttft", "0.002", "--itl", "0.001")
    out = tmp_path / "bench"
    out.mkdir()
    earlier = {"latency_vs_rate.png": b"old sweep", "server_metrics.csv": b"old", "summary.csv": b"old"}
    for name, data in {**earlier, "notes.txt": b"mine"}.items():
        (out / name).write_bytes(data)
    result = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "3", "--warmup", "0",
                                 "--prompts", "8", "--max-tokens", "2", "--metrics-interval", "0", "--out", str(out)])
    assert result.exit_code == expected_exit(out), result.output
    assert sorted(p.name for p in out.iterdir()) == ["latency_cdf.png", "notes.txt", "report.md", "requests.csv",
                                                     "results.json", "summary.csv", "timeline.png"]
    assert (out / "notes.txt").read_bytes() == b"mine" and (out / "summary.csv").read_bytes() != b"old"
    assert ("removed server_metrics.csv, latency_vs_rate.png: an earlier run's, which this run does not replace"
            in result.stderr)


def test_bad_options_are_user_errors():
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--prompts", "normal:x"])
    assert result.exit_code == 2 and "normal:MEAN,SIGMA" in result.output
    result = runner.invoke(app, ["bench", "--url", "gpu-01:8000"])
    assert result.exit_code == 2 and "base URL" in result.output
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "2", "--rate", "3"])
    assert result.exit_code == 2 and "either --users" in result.output


@pytest.mark.parametrize("args, message", [
    (["--users", "2", "--slo", ""], "SLO '' names no limit"),
    (["--sweep", "--slo", " "], "SLO ' ' names no limit"),
    (["--sweep", "--sweep-growth", "1"], "--sweep-growth 1: give a factor > 1"),
    (["--sweep", "--sweep-growth", "nan"], "--sweep-growth nan: give a factor > 1"),
    (["--sweep", "--sweep-precision", "5"], "--sweep-precision 5: give a fraction between 0 and 1"),
    (["--users", "2", "--timeout", "0s"], "--timeout 0s: give a positive time"),
    (["--users", "2", "--max-client-lag", "0ms"], "--max-client-lag 0ms: give a positive time"),
])
def test_a_bad_value_is_named_with_its_option(args, message):
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", *args])
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output


def test_duration_and_requests_together_is_a_user_error():
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--duration", "5s",
                                 "--requests", "10"])
    assert result.exit_code == 2 and "not both" in result.output


def expected_exit(out) -> int:
    """0, or 4 where the run's own measurement says the client fell behind (a busy machine): the exit code
    must agree with the report."""
    with open(out / "summary.csv", newline="") as f:
        behind = any(row["client_behind"] == "1" for row in csv.DictReader(f))
    return EXIT_CLIENT_BEHIND if behind else 0


def test_without_tokenize_prompt_lengths_are_approximate_and_the_report_says_so(server_factory, tmp_path):
    url = server_factory("--no-tokenize", "--ttft", "0.005", "--itl", "0.001")
    out = tmp_path / "approx"
    result = runner.invoke(app, ["bench", "--url", url, "--users", "2", "--requests", "10",
                                 "--warmup", "0", "--prompts", "uniform:20-40", "--max-tokens", "4",
                                 "--out", str(out)])
    assert result.exit_code == expected_exit(out), result.output
    assert "prompt lengths are approximate" in result.output
    markdown = (out / "report.md").read_text()
    assert "Prompt lengths for" in markdown
    # The scripted server counts a BOS plus one token per word, as the approximation does.
    assert "differ from the intended lengths by 0.0% on average" in markdown
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["tokenizer"].startswith("approximate")
    # The server's usage numbers show the real counts next to the intended ones.
    assert all(r["reported_prompt_tokens"] is not None for r in run["requests"])


def test_trace_shared_prefix_and_conversations_through_the_cli(server_factory, tmp_path):
    url = server_factory("--ttft", "0.005", "--itl", "0.001")
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival": i * 0.05, "input_length": 12, "output_length": 2}) + "\n"
                             for i in range(10)))
    out = tmp_path / "trace"
    result = runner.invoke(app, ["bench", "--url", url, "--trace", str(trace), "--out", str(out)])  # no warm-up
    assert result.exit_code in (0, 4), result.output
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["mode"] == "trace" and len(run["requests"]) == run["summary"]["num_requests"] == 10
    assert "trace replay (10 requests)" in (out / "report.md").read_text()

    out = tmp_path / "prefix"
    result = runner.invoke(app, ["bench", "--url", url, "--shared-prefix", "2x3", "--prefix-tokens", "64",
                                 "--requests", "12", "--warmup", "0", "--prompts", "8", "--max-tokens", "2",
                                 "--out", str(out)])
    assert result.exit_code in (0, 4), result.output
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["users"] == 6 and {r["group"] for r in run["requests"]} == {0, 1}

    result = runner.invoke(app, ["bench", "--url", url, "--users", "2", "--turns", "3", "--requests", "6",
                                 "--warmup", "0", "--prompts", "8", "--max-tokens", "2"])
    assert result.exit_code in (0, 4), result.output


def test_bad_workload_options_are_user_errors(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival": 0, "input_length": 10, "output_length": 4}\n')
    for args, message in ((["--shared-prefix", "3"], "write NxM"),
                          (["--shared-prefix", "2x2", "--users", "5"], "means 4 users"),
                          (["--rate", "2", "--turns", "3"], "--turns needs closed-loop users"),
                          (["--requests", "2", "--turns", "0"], "--turns 0: a conversation needs at least one turn"),
                          (["--sweep", "--trace", "T"], "--trace gives the arrivals, and --sweep offers its own rates"),
                          (["--users", "2", "--max-concurrency", "2"], "--max-concurrency caps an open loop"),
                          (["--trace", str(tmp_path / "none.jsonl")], "does not exist"),
                          (["--dataset", str(tmp_path / "none.json")], "does not exist"),
                          (["--requests", "1", "--tokenizer", str(tmp_path)], f"tokenizer file {tmp_path}/tokenizer.json "
                                                                              "does not exist")):
        args = [str(trace) if a == "T" else a for a in args]
        result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)


@pytest.mark.parametrize("args, message", [
    (["--dataset", "D", "--prompts", "16"], "--prompts changes nothing with --dataset, which gives the prompts"),
    (["--dataset", "D", "--tokenizer", "D"], "--tokenizer changes nothing with --dataset, which gives the prompts"),
    (["--trace", "T", "--prompts", "16"], "--prompts changes nothing with --trace, which gives the prompt lengths"),
    (["--trace", "T", "--max-tokens", "16"], "--max-tokens changes nothing with --trace, which gives the output lengths")])
def test_an_option_a_dataset_or_trace_replaces_is_a_user_error_not_silently_ignored(tmp_path, args, message):
    """A run with --prompts 16 beside --dataset must not look as if its prompts had 16 tokens."""
    dataset, trace = tmp_path / "d.jsonl", tmp_path / "t.jsonl"
    dataset.write_text('{"prompt": "hello"}\n')
    trace.write_text('{"arrival": 0, "input_length": 10, "output_length": 4}\n')
    args = [{"D": str(dataset), "T": str(trace)}.get(a, a) for a in args]
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--requests", "1", *args])
    assert result.exit_code == 2 and result.output == f"hosttune: {message}; leave it out\n", result.output


@pytest.mark.parametrize("option", ["--trace", "--dataset", "--prompts", "--max-tokens"])
def test_an_input_file_that_is_a_folder_or_not_utf8_is_named_in_one_line(tmp_path, option):
    """Each file the bench reads is refused before any request: a folder as a folder, bytes that are not UTF-8 text
    as such, never an internal error."""
    binary = tmp_path / "prompts.jsonl"
    binary.write_bytes(b'\xff\xfe{"prompt": "a", "prompt_tokens": 3}\n')
    for path, message in ((tmp_path, "is a folder; give a file"), (binary, "is not UTF-8 text")):
        value = f"jsonl:{path}" if option in ("--prompts", "--max-tokens") else str(path)
        result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "2", option, value])
        assert result.exit_code == 2 and message in result.output and "internal error" not in result.output, \
            (option, result.output)
        assert result.output.count("\n") == 1, result.output


def _running(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        line = next(l for l in r.read().decode().splitlines() if l.startswith("vllm:num_requests_running"))
    return float(line.split()[-1])


def _bench_sending(url: str, *args: str, stderr=subprocess.STDOUT) -> subprocess.Popen:
    """`hosttune bench ARGS` in a process of its own, returned once a request of it runs on `url` (the run prints
    nothing to a pipe: its requests on the server say it is sending), it ended, or a minute passed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    bench = subprocess.Popen([sys.executable, "-m", "hosttune", "bench", *args], env=env, stdout=subprocess.PIPE,
                             stderr=stderr, text=True)
    deadline = time.monotonic() + 60
    while _running(url) < 1 and time.monotonic() < deadline and bench.poll() is None:
        time.sleep(0.05)
    return bench


@pytest.mark.parametrize("load", [["--rate", "20"], ["--users", "4"]])
def test_ctrl_c_ends_a_run_early_and_still_reports_it(server_factory, tmp_path, load):
    url = server_factory("--ttft", "0.5", "--itl", "0.001")  # each request in flight half a second
    out = tmp_path / "stopped"
    bench = _bench_sending(url, "--url", url, *load, "--duration", "120s", "--warmup", "0s", "--prompts",
                           "uniform:8-16", "--max-tokens", "4", "--out", str(out))
    time.sleep(1)
    bench.send_signal(signal.SIGINT)
    output, _ = bench.communicate(timeout=60)
    assert bench.returncode in (0, 4), output
    assert "SIGINT ended the run after" in output and "Traceback" not in output
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["stopped_by"] == "SIGINT" and run["window"][1] < 60
    assert f"{url}: SIGINT ended the run after" in (out / "report.md").read_text()  # not read as a full run later
    measured = [r for r in run["requests"] if not r["is_warmup"]]
    assert measured and all(r["outcome"] == "ok" for r in measured)  # those in flight finished, not cut


def test_ctrl_c_ends_the_whole_bench_not_only_the_sweep_step_it_came_in(server_factory, tmp_path):
    """Ctrl-C during a sweep's step ends the sweep, and the endpoints after it are not measured: it is not taken for
    the end of one step, after which the sweep (and the next endpoint) would go on for minutes."""
    first, second = server_factory("--ttft", "0.5", "--itl", "0.001"), server_factory()
    out = tmp_path / "stopped"
    bench = _bench_sending(first, "--url", first, "--url", second, "--sweep", "--sweep-start", "20", "--duration",
                           "120s", "--warmup", "0s", "--prompts", "8", "--max-tokens", "2", "--out", str(out),
                           stderr=subprocess.PIPE)
    bench.send_signal(signal.SIGINT)
    try:
        stdout, stderr = bench.communicate(timeout=30)
    finally:
        bench.kill()
    assert "Traceback" not in stderr and f"SIGINT ended the bench: {second} was not measured" in stderr, stderr
    (sweep,) = json.loads((out / "results.json").read_text())["sweeps"]
    assert sweep["stopped_by"] == "SIGINT" and len(sweep["points"]) == 1, sweep["points"]
    assert sweep["max_rate"] is None and sweep["first_broken"] is None  # a step cut short judges no rate
    assert "stopped by SIGINT" in stderr and "SIGINT ended the sweep" in (out / "report.md").read_text()
    assert f"NOTE {first}: SIGINT ended the sweep" in stdout


def test_ctrl_c_ends_an_open_loop_waiting_for_a_far_arrival(server_factory, tmp_path):
    """A trace (or a low rate) may leave minutes between two arrivals: a signal ends the wait at once, not at the
    next arrival."""
    url = server_factory("--ttft", "0.5", "--itl", "0.001")  # the first request in flight half a second
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival": 0, "input_length": 8, "output_length": 2}\n'
                     '{"arrival": 600, "input_length": 8, "output_length": 2}\n')
    bench = _bench_sending(url, "--url", url, "--trace", str(trace), "--out", str(tmp_path / "o"))  # the first sent
    deadline = time.monotonic() + 60
    while _running(url) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # and answered: the run waits for the second
    started = time.monotonic()
    bench.send_signal(signal.SIGINT)
    try:
        output, _ = bench.communicate(timeout=20)
    finally:
        bench.kill()
    assert time.monotonic() - started < 20 and "SIGINT ended the run after" in output, output
    run = json.loads((tmp_path / "o" / "results.json").read_text())["runs"][0]
    assert [r["outcome"] for r in run["requests"]] == ["ok"]


def test_a_run_that_would_measure_nothing_is_a_user_error():
    for args, message in ((["--users", "2", "--duration", "0s"], "--duration 0s measures nothing"),
                          (["--users", "2", "--requests", "0"], "--requests 0 measures nothing"),
                          (["--users", "2", "--duration", "abc"], "--duration 'abc'"),
                          (["--sweep", "--users", "3"], "drop --users and --rate"),
                          (["--sweep", "--rate", "3"], "drop --users and --rate"),
                          # arrivals held back in the client: a step held 50 req/s having offered 33 and served 27
                          (["--sweep", "--max-concurrency", "2"], "--max-concurrency holds arrivals back in the client"),
                          (["--shared-prefix", "1x2", "--prefix-tokens", "1000000000"],
                           "--prefix-tokens 1000000000: give 1 to 10000000 tokens"),
                          (["--users", "1", "--prompts", "100000000"], "past the 10000000 bench builds"),
                          (["--users", "0"], "--users 0: give 1 to 100000 users"),
                          (["--users", "10000000"], "--users 10000000: give 1 to 100000 users"),  # not a MemoryError
                          (["--rate", "nan"], "--rate nan: the rate must be a positive number"),  # not a flood
                          (["--rate", "inf"], "--rate inf: the rate must be a positive number"),
                          (["--rate", "2", "--burstiness", "nan"], "--burstiness nan: must be a positive number"),
                          (["--sweep", "--sweep-max", "inf"], "at most --sweep-max, a finite rate"),
                          (["--sweep", "--sweep-start", "nan"], "at most --sweep-max, a finite rate")):
        result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)


@pytest.mark.parametrize("args, needs", [(["--slo-percentile", "99"], "--slo or --sweep"),
                                         (["--max-error-rate", "0.05"], "--slo or --sweep"),
                                         (["--burstiness", "0.5"], "--rate or --sweep"),
                                         (["--sweep-max", "50"], "--sweep"),
                                         (["--prefix-tokens", "2000"], "--shared-prefix")])
def test_an_option_whose_feature_is_off_is_a_user_error_not_silently_ignored(args, needs):
    """--max-error-rate 0.05 without --slo would judge nothing; the run must not look as if it had."""
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "1", *args])
    assert result.exit_code == 2
    assert result.output == f"hosttune: {args[0]} changes nothing without {needs}; add that, or leave it out\n"


def test_tls_options_on_plain_http_urls_are_a_user_error_not_silently_ignored(tmp_path):
    (tmp_path / "ca.pem").write_text("")
    for args in (["--insecure"], ["--cacert", str(tmp_path / "ca.pem")]):
        result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "1", *args])
        assert result.exit_code == 2
        assert result.output.startswith(f"hosttune: {args[0]} is about https certificates, and every --url here is http://")


def test_every_url_and_the_out_folder_are_checked_before_the_first_run(tmp_path):
    # Port 9 has no server: had the first endpoint been run, the error would be "cannot reach".
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--url", "ftp://x", "--users", "1"])
    assert result.exit_code == 2 and "--url 'ftp://x'" in result.output and "cannot reach" not in result.output
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9/v1", "--users", "1"])
    assert result.exit_code == 2 and "without /v1" in result.output
    for route in ("chat/completions", "completions", "models"):  # it asked http://host/v1/chat/completions/v1/models
        result = runner.invoke(app, ["bench", "--url", f"http://127.0.0.1:9/v1/{route}/", "--users", "1"])
        assert result.exit_code == 2, result.output
        assert f"without /v1/{route} (bench adds /v1/completions" in result.output, result.output
    for url in ("http://127.0.0.1:9?x=1", "http://127.0.0.1:9/#a", "http://127.0.0.1:9?"):
        result = runner.invoke(app, ["bench", "--url", url, "--users", "1"])
        assert result.exit_code == 2 and "without a ?query or #fragment" in result.output, result.output
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--url", "http://u:pw-7f3a@127.0.0.1:8", "--users", "1"])
    assert result.exit_code == 2 and "pw-7f3a" not in result.output and "cannot reach" not in result.output
    assert result.output.startswith("hosttune: --url http://…@127.0.0.1:8: a user or password in the URL would be saved "
                                    "in every report; send it with --header 'Authorization=Basic BASE64'"), result.output
    (tmp_path / "file").write_text("")
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "1",
                                 "--out", str(tmp_path / "file" / "report")])
    assert result.exit_code == 2 and "cannot write to --out" in result.output and "cannot reach" not in result.output
    assert result.output.count("\n") == 1
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "1", "--out", str(tmp_path / "file")])
    assert result.exit_code == 2 and result.output == (f"hosttune: --out {tmp_path / 'file'} is a file: give a folder, "
                                                       "which the run fills with its result files\n")


def test_an_out_folder_holding_a_folder_by_a_result_files_name_is_refused_before_the_run(tmp_path):
    """A folder named report.md in --out: writing after the run would fail half-way ('Is a directory'), the run's
    report lost; it is found before the run (port 9 has no server: a run would say "cannot reach")."""
    (tmp_path / "report.md").mkdir()
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and result.output == (
        f"hosttune: --out {tmp_path} holds a folder named report.md, where the run writes its report.md; move it, "
        "or choose another folder\n")


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://:80",
                                 "http://127.0.0.1:-1"])
def test_a_url_without_a_host_or_with_a_bad_port_is_a_user_error_naming_the_url(url):
    """Not an internal error (an unclosed IPv6 bracket), nor "cannot reach URL: URL; is the server up?"."""
    result = runner.invoke(app, ["bench", "--url", url, "--users", "1"])
    assert result.exit_code == 2
    assert result.output.startswith(f"hosttune: --url {url!r}: give a base URL like http://127.0.0.1:8000"), result.output


def test_one_endpoint_given_twice_is_a_user_error_not_a_comparison_with_itself():
    # Port 9 has no server: had a run started, the error would be "cannot reach".
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--url", "http://127.0.0.1:9/", "--users", "1"])
    assert result.exit_code == 2
    assert result.output == ("hosttune: --url http://127.0.0.1:9 is given twice: give each endpoint once (its two "
                             "runs would share one name in every report)\n")


@pytest.mark.parametrize("status, body, message", [
    (404, b"File not found", "/v1/models answered 404: not an OpenAI-compatible server?"),
    (200, b"<html>hello</html>", "did not answer an OpenAI model list"),
    (200, b"[]", "did not answer an OpenAI model list"),
    (200, b'{"data": null}', "did not answer an OpenAI model list"),
    (200, b'{"data": []}', "lists no model; pass --model NAME"),
])
def test_an_endpoint_that_is_not_openai_compatible_is_one_line(status, body, message):
    with not_openai(status, body) as url:
        result = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "1"])
    assert result.exit_code == 2 and message in result.output and "internal error" not in result.output
    assert result.output.count("\n") == 1


def test_a_run_in_which_every_request_failed_is_reported_and_exits_2(tmp_path):
    with not_openai(404, b"File not found") as url:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "2", "--requests", "3",
                                     "--warmup", "0", "--prompts", "8", "--max-tokens", "2", "--out", str(tmp_path),
                                     "--max-client-lag", "1s"])  # a loaded CI runner's loop lag is not this test's
    assert result.exit_code == 2 and "404: 3" in result.stdout  # the report is printed and written all the same
    assert result.stderr.splitlines()[-1] == (f"hosttune: all 3 measured requests to {url} failed (404: 3), so nothing "
                                              "was measured; the first answered 404: File not found; check --model "
                                              "and --api, and that it is an OpenAI-compatible server")
    assert json.loads((tmp_path / "results.json").read_text())["runs"][0]["summary"]["num_failed"] == 3


def test_a_run_in_which_every_request_failed_quotes_the_servers_reason():
    """A server that refuses each request (a prompt past its context, say) says why in its error body: the line
    quotes that, whitespace folded, not only the status."""
    body = b'{"error": {"message": "This model\'s maximum context length is 1024 tokens.\\nHowever you asked for 5008"}}'
    with not_openai(400, body) as url:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "1", "--requests", "2",
                                     "--warmup", "0", "--prompts", "8", "--max-tokens", "5000",
                                     "--max-client-lag", "1s"])
    assert result.exit_code == 2
    assert ("failed (400: 2), so nothing was measured; the first answered 400: This model's maximum context length "
            "is 1024 tokens. However you asked for 5008; check that --prompts and --max-tokens fit the model's context, "
            "or leave out") in result.stderr.splitlines()[-1]


def test_a_run_refused_for_a_field_the_server_does_not_take_points_at_the_option_that_sends_it():
    """OpenAI's own API answers 400 to ignore_eos (a vLLM extension bench sends by default): the hint must name
    --no-ignore-eos, not only the context length."""
    body = b'{"error": {"message": "Unrecognized request argument supplied: ignore_eos"}}'
    with not_openai(400, body) as url:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "1", "--requests", "1",
                                     "--warmup", "0", "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].endswith(
        "Unrecognized request argument supplied: ignore_eos; check that --prompts and --max-tokens fit the model's "
        "context, or leave out a field the server does not take: --no-ignore-eos, no --priority"), result.stderr


def test_a_server_that_answers_whole_json_bodies_is_said_not_to_stream():
    """A server that ignores stream: true answers 200 with a JSON body: 'the stream ended without [DONE]' hides
    that there was no stream at all."""
    with not_openai(200, b'{"choices": [{"text": "hello"}], "usage": {"completion_tokens": 1}}') as url:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "1", "--requests", "1",
                                     "--warmup", "0", "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s"])
    assert result.exit_code == 2
    assert ("failed (not-a-stream: 1), so nothing was measured; the first answered not-a-stream: the server answered "
            "no Content-Type, not an event stream: bench needs one that streams (stream: true)") in result.stderr


def test_a_stream_without_usage_says_its_output_tokens_are_counted_as_events():
    """No usage event, four tokens an event: output tokens/s read a quarter of the truth, and TPOT four times it,
    with nothing to say so."""
    body = b'data: {"choices":[{"text":" a b c d"}]}\n\ndata: {"choices":[{"text":" e f g h"}]}\n\ndata: [DONE]\n\n'
    with not_openai(200, body) as url:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "1", "--requests", "2",
                                     "--warmup", "0", "--prompts", "8", "--max-tokens", "8", "--max-client-lag", "1s"])
    assert result.exit_code == 0, result.output
    assert (f"NOTE {url}: 2 of 2 requests streamed no usage (stream_options.include_usage), so their output tokens "
            "are counted as the events that carried text") in result.stdout


def test_a_server_that_redirects_is_named_with_where_it_redirects():
    """An http:// URL a proxy sends on to https://: /v1/models was followed to a host it could not reach ('cannot
    reach .../v1/models'), and with --model every request 'answered 301: ; check --model and --api'."""
    def redirect(method, path, body):
        return 301, b"", {"Location": "https://example.invalid" + path}

    args = ["--users", "1", "--requests", "1", "--warmup", "0", "--prompts", "8", "--max-tokens", "2"]
    with loopback_http(redirect) as url:
        found = runner.invoke(app, ["bench", "--url", url, *args])
        sent = runner.invoke(app, ["bench", "--url", url, "--model", "m", *args, "--max-client-lag", "1s"])
    advice = "give --url the address it redirects to (bench follows no redirect"
    assert found.exit_code == 2 and found.stderr.startswith(
        f"hosttune: {url}/v1/models answered 301, a redirect to https://example.invalid/v1/models: {advice}")
    assert sent.exit_code == 2 and (f"the first answered 301: redirects to https://example.invalid/v1/completions; "
                                    f"{advice}") in sent.stderr


def test_a_server_that_is_down_is_said_to_be_down_not_to_have_the_wrong_model():
    """--model skips the lookup that finds a server down: every request failed to connect, and bench said to check
    --model and --api, beside a note that no request had ended in the window (of failures, each at once)."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "1", "--duration", "0.05s",
                                 "--warmup", "0s", "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s"])
    assert result.exit_code == 2, result.output
    assert result.stderr.rstrip().endswith("; check that the server is up and listens at --url"), result.stderr
    assert "no request ended within" not in result.stdout


def test_an_https_url_to_a_plain_http_port_is_said_to_need_https():
    """The TLS handshake to a plain http port times out after a minute: 'check that the server is up' sent the user
    to a server that was up, on the wrong scheme."""
    from dataclasses import replace

    from hosttune.cli.bench_failures import what_to_check

    from .test_metrics import record

    failed = record(0, 0.0, [], 60.0, outcome="failed", status=0, error=(
        "transport: cannot connect to 127.0.0.1:8000: SSL handshake is taking longer than 60.0 seconds: aborting the "
        "connection"))
    assert what_to_check(failed, ()) == ("check that the server speaks https at --url (a plain http port never "
                                          "answers a TLS handshake)")
    refused = replace(failed, error="transport: cannot connect to 127.0.0.1:8000: [Errno 111] Connection refused")
    assert what_to_check(refused, ()) == "check that the server is up and listens at --url"


def test_a_key_refused_with_model_given_fails_before_the_run():
    """--model skipped /v1/models, where a missing or wrong key is found first: the run sent its requests, each
    refused, for its warm-up and duration (tens of thousands a minute) before the line pointed at --api-key."""
    with not_openai(401, b'{"error": {"message": "Incorrect API key"}}') as url:
        start = time.monotonic()
        missing = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "4", "--prompts", "8",
                                      "--max-tokens", "2"], env={"OPENAI_API_KEY": ""})
        given = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "4", "--prompts", "8",
                                    "--max-tokens", "2", "--api-key", "wrong-key-1"])
    assert time.monotonic() - start < 10 and missing.exit_code == given.exit_code == 2
    assert missing.output == (f"hosttune: {url}/v1/models answered 401: pass the endpoint's key with --api-key (or "
                              "$OPENAI_API_KEY)\n"), missing.output
    assert given.output == (f"hosttune: {url}/v1/models answered 401: it refused the key sent (--api-key, "
                            "$OPENAI_API_KEY or --header Authorization); check that key\n"), given.output


@pytest.mark.parametrize("get_status", [404, 200])
def test_a_key_refused_by_the_completion_routes_alone_fails_before_the_run(get_status):
    """A server whose /v1/models needs no key (or has no such route) refuses the requests: they were sent, each
    answered 401, for the whole warm-up and duration before the line pointed at --api-key."""
    with not_openai(401, b'{"error": {"message": "Incorrect or missing API key"}}', get_status=get_status) as url:
        start = time.monotonic()
        missing = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "4", "--prompts", "8",
                                      "--max-tokens", "2"], env={"OPENAI_API_KEY": ""})
    assert time.monotonic() - start < 10 and missing.exit_code == 2, missing.output
    assert missing.output == (f"hosttune: {url}/v1/completions answered 401: pass the endpoint's key with --api-key "
                              "(or $OPENAI_API_KEY)\n"), missing.output
    with not_openai(403, b'{"error": {"message": "Forbidden"}}', get_status=get_status) as url:
        given = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "4", "--prompts", "8",
                                    "--max-tokens", "2", "--api", "chat", "--api-key", "wrong-key-1"])
    assert given.exit_code == 2 and given.output == (
        f"hosttune: {url}/v1/chat/completions answered 403: it refused the key sent (--api-key, $OPENAI_API_KEY or "
        "--header Authorization); check that key\n"), given.output


def test_a_key_the_endpoint_refuses_is_said_to_be_refused_not_missing():
    """With --api-key (or $OPENAI_API_KEY) given, a 401 means that key is wrong: 'pass the key' would send the user
    looking for an option they already gave."""
    with not_openai(401, b'{"error": {"message": "Incorrect API key"}}') as url:
        given = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "1", "--api-key", "wrong-key-1"])
        missing = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "1"],
                                env={"OPENAI_API_KEY": ""})
    assert given.exit_code == missing.exit_code == 2
    assert given.output == (f"hosttune: {url}/v1/models answered 401: it refused the key sent (--api-key, "
                            "$OPENAI_API_KEY or --header Authorization); check that key\n"), given.output
    assert "answered 401: pass the endpoint's key with --api-key" in missing.output and "wrong-key-1" not in given.output
    with not_openai(401, b"no", get_status=404) as url:  # no /v1/models: the request before the run says the same
        given = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--users", "1", "--requests", "1",
                                    "--warmup", "0", "--prompts", "8", "--max-tokens", "2", "--api-key", "wrong-key-1",
                                    "--max-client-lag", "1s"])
    assert given.exit_code == 2 and given.output == (f"hosttune: {url}/v1/completions answered 401: it refused the key "
                                                     "sent (--api-key, $OPENAI_API_KEY or --header Authorization); "
                                                     "check that key\n"), given.output


def test_a_run_in_which_some_requests_failed_says_why_on_stderr(server_factory):
    """Half the requests failing shows only as 'errors by status 500: 2' in the table; the reason was in no output
    without --out (requests.csv): stderr quotes the first, as it does when all failed, and the exit code is kept."""
    url = server_factory("--ttft", "0.01", "--itl", "0.001", "--fail-status-every", "2")
    result = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "4", "--warmup", "0",
                                 "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-1] == (f"hosttune: 2 of 4 measured requests to {url} failed (500: 2); the "
                                              "first answered 500: scripted failure")


@contextmanager
def not_openai(status: int, body: bytes, get_status: int | None = None):
    """A loopback HTTP server that answers every GET and POST with this status and body (a GET with `get_status`,
    where given)."""
    with loopback_http(lambda method, path, _: ((get_status or status) if method == "GET" else status, body)) as url:
        yield url


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_results_are_written_still_writes_them_all(server_factory, tmp_path, monkeypatch, signum):
    """A second Ctrl-C soon after the first, or a CI job's SIGTERM, lands while the files are written (the plots take
    a second): it must not leave the folder with results.json and no report.md, and exit with no word of it (SIGTERM
    killed the process there)."""
    url = server_factory("--ttft", "0.01", "--itl", "0.001")
    write_plots = plot.write_plots

    def interrupted(*args):
        os.kill(os.getpid(), signum)
        return write_plots(*args)

    monkeypatch.setattr(plot, "write_plots", interrupted)
    result = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "2", "--warmup", "0",
                                 "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"hosttune: writing the results to {tmp_path} first" in result.stderr
    assert {"results.json", "report.md", "requests.csv", "summary.csv"} <= {p.name for p in tmp_path.iterdir()}


def test_ctrl_c_before_the_next_endpoint_is_measured_still_reports_those_measured(server_factory, tmp_path,
                                                                                monkeypatch):
    """Between two endpoints (finding the next one's model, calibrating its prompts) Ctrl-C is no run's to catch:
    the endpoints measured so far are still reported and written, not lost to a KeyboardInterrupt."""
    from hosttune.cli import bench_run

    first, second = server_factory("--ttft", "0.01", "--itl", "0.001"), "http://127.0.0.1:9"
    run_one = bench_run._run_one

    def measure_or_interrupt(spec, url):
        if url == second:
            raise KeyboardInterrupt
        return run_one(spec, url)

    monkeypatch.setattr(bench_run, "_run_one", measure_or_interrupt)
    monkeypatch.setattr(plot, "write_plots", lambda *args: [])  # not what this checks; a second saved
    result = runner.invoke(app, ["bench", "--url", first, "--url", second, "--model", "scripted", "--users", "1",
                                 "--requests", "2", "--warmup", "0", "--prompts", "8", "--max-tokens", "2",
                                 "--max-client-lag", "1s", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"hosttune: SIGINT ended the bench: {second} was not measured" in result.stderr
    assert [run["url"] for run in json.loads((tmp_path / "results.json").read_text())["runs"]] == [first]


def test_help_gives_the_unit_of_every_length_rate_and_share():
    """Lengths are tokens, rates requests/s, the error rate a fraction: the help says so beside each."""
    help_text = " ".join(runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "300"}).stdout.replace("│", " ").split())
    for phrase in ("Prompt lengths in tokens", "Output lengths in tokens (the max_tokens asked for)",
                   "Highest rate the sweep tries, requests/s", "a fraction: 0.01 is 1%"):
        assert phrase in help_text, phrase


@pytest.mark.parametrize("columns", ["80", "200"])
def test_help_flows_each_paragraph_to_the_terminal_width(columns):
    """The docstring's own line breaks were kept: at 80 columns every line broke twice ('errors by' / 'status'), and
    at 200 each broke where the source did."""
    lines = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": columns}).stdout.splitlines()
    prose = [line.strip() for line in lines[:lines.index(next(x for x in lines if "Options" in x))] if line.strip()]
    short = [line for line, after in zip(prose[1:], prose[2:]) if len(line) < int(columns) * 0.6
             and not line.endswith((".", ":")) and after[:1].islower()]
    assert not short, short  # a line ended mid-sentence, well short of the width


def test_a_run_that_sent_no_request_after_its_warm_up_says_nothing_was_measured_and_exits_2(server_factory):
    """One user whose warm-up request outlasts warm-up and duration sends no measured request: a table of zeros
    and exit 0 would pass for a run that measured a server doing nothing."""
    url = server_factory("--ttft", "1.0", "--itl", "0.001")
    result = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--warmup", "0.2s", "--duration", "0.2s",
                                 "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s"])
    assert result.exit_code == 2, result.output
    assert "0 (0 / 0 / 0)" in result.stdout
    assert result.stderr.splitlines()[-1] == (f"hosttune: no request to {url} was sent after its 0.2 s warm-up, so "
                                              "nothing was measured; give a longer --duration (or more --users, or a "
                                              "higher --rate)")


def test_a_window_no_request_ended_in_shows_no_rate_and_says_why(server_factory, tmp_path, monkeypatch):
    """--duration 0.2s --warmup 0s and requests of 0.5 s: nothing ended in the window. 0.00 requests/s read as a
    measured server serving nothing; the rates are '-' (null in results.json), with the reason."""
    url = server_factory("--ttft", "0.5", "--itl", "0.001")
    monkeypatch.setattr(plot, "write_plots", lambda *args: [])  # not what this checks
    result = runner.invoke(app, ["bench", "--url", url, "--users", "2", "--warmup", "0s", "--duration", "0.2s",
                                 "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.splitlines() if "  " in line)
    assert [rows[k] for k in ("requests/s", "output tokens/s", "input tokens/s")] == ["-", "-", "-"]
    assert re.search(rf"NOTE {url}: no request ended within the 0.2 s measured window \(the quickest took 0\.5\d s\), "
                     "so requests/s and tokens/s served are not measured", result.stdout), result.stdout
    summary = json.loads((tmp_path / "results.json").read_text())["runs"][0]["summary"]
    assert summary["num_ok"] == 2 and summary["request_throughput"] is None and summary["output_token_throughput"] is None


def test_ctrl_c_while_the_command_line_loads_exits_130_without_a_traceback():
    """The first second of `hosttune bench` imports the command line; Ctrl-C there printed a KeyboardInterrupt
    traceback. Here the interrupt comes as the deploy commands are imported, as it would from the terminal."""
    interrupted = ("import importlib.abc, runpy, sys\n"
                   "class Interrupt(importlib.abc.MetaPathFinder):\n"
                   "    def find_spec(self, name, path, target=None):\n"
                   "        if name == 'hosttune.cli.deploy':\n"
                   "            raise KeyboardInterrupt\n"
                   "sys.meta_path.insert(0, Interrupt())\n"
                   "sys.argv = ['hosttune', 'bench', '--help']\n"
                   "runpy.run_module('hosttune', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", interrupted], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr


def test_a_trace_whose_arrivals_all_came_in_the_warm_up_says_to_shorten_the_warm_up(server_factory, tmp_path):
    """A 0.5 s trace under --warmup 1s measures nothing: bench said to give a longer --duration, more --users or a
    higher --rate, none of which a trace takes."""
    url = server_factory("--ttft", "0.01", "--itl", "0.001")
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival": 0, "input_length": 8, "output_length": 2}\n'
                     '{"arrival": 0.5, "input_length": 8, "output_length": 2}\n')
    result = runner.invoke(app, ["bench", "--url", url, "--trace", str(trace), "--warmup", "1s", "--max-client-lag", "1s"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (f"hosttune: no request to {url} was sent after its 1 s warm-up, so nothing "
                                              "was measured; its trace's arrivals all came within it: give a shorter "
                                              "--warmup")


def test_ctrl_c_between_two_sweep_steps_still_reports_the_steps_run(server_factory, tmp_path, monkeypatch):
    """Between steps (the next one's model and prompts) no run catches Ctrl-C: the steps already run are still
    reported and written, as a sweep that SIGINT ended, not lost to a KeyboardInterrupt."""
    from hosttune.bench import sweep

    url = server_factory("--ttft", "0.01", "--itl", "0.001")
    measure, calls = sweep.measure, []

    async def measure_or_interrupt(spec, url):
        calls.append(spec.load.rate)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return await measure(spec, url)

    monkeypatch.setattr(sweep, "measure", measure_or_interrupt)
    monkeypatch.setattr(plot, "write_plots", lambda *args: [])  # not what this checks; a second saved
    result = runner.invoke(app, ["bench", "--url", url, "--sweep", "--sweep-start", "5", "--duration", "0.4s",
                                 "--warmup", "0", "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"NOTE {url}: SIGINT ended the sweep" in result.stdout
    (saved,) = json.loads((tmp_path / "results.json").read_text())["sweeps"]
    assert saved["stopped_by"] == "SIGINT" and [p["rate"] for p in saved["points"]] == [5.0] and saved["max_rate"] == 5.0
    assert "SIGINT ended the sweep** after its step at 5.00 requests/s" in (tmp_path / "report.md").read_text()


def test_a_tpot_limit_no_request_could_be_measured_by_says_why_the_slo_is_not_met(server_factory):
    """One output token has no TPOT: every request is 'within the SLO', and the verdict 'no' (exit 1) needs a
    reason, or it reads as a bug."""
    url = server_factory("--ttft", "0.01", "--itl", "0.001")
    result = runner.invoke(app, ["bench", "--url", url, "--users", "1", "--requests", "2", "--warmup", "0",
                                 "--prompts", "8", "--max-tokens", "1", "--slo", "tpot=50ms", "--max-client-lag", "1s"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == (f"hosttune: the SLO limits TPOT, and no request to {url} had the two "
                                              "output tokens it takes to measure, so the SLO is not met; ask for more "
                                              "with --max-tokens")


def test_sigterm_between_two_endpoints_still_reports_those_measured(server_factory, tmp_path, monkeypatch):
    """A CI job's timeout sends SIGTERM: between two runs (after the first, whose own handler is gone) it must end
    the bench as during a run does, the endpoints measured so far written, not kill it with nothing written."""
    from hosttune.cli import bench_run

    first, second = server_factory("--ttft", "0.01", "--itl", "0.001"), "http://127.0.0.1:9"
    run_one = bench_run._run_one

    def measure_or_terminate(spec, url):
        if url == second:
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler), handler  # SIG_DFL would kill this process (and the test run)
            handler(signal.SIGTERM, None)
        return run_one(spec, url)

    monkeypatch.setattr(bench_run, "_run_one", measure_or_terminate)
    monkeypatch.setattr(plot, "write_plots", lambda *args: [])  # not what this checks; a second saved
    before = signal.getsignal(signal.SIGTERM)
    result = runner.invoke(app, ["bench", "--url", first, "--url", second, "--model", "scripted", "--users", "1",
                                 "--requests", "2", "--warmup", "0", "--prompts", "8", "--max-tokens", "2",
                                 "--max-client-lag", "1s", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"hosttune: SIGTERM ended the bench: {second} was not measured" in result.stderr
    assert [run["url"] for run in json.loads((tmp_path / "results.json").read_text())["runs"]] == [first]
    assert signal.getsignal(signal.SIGTERM) == before  # put back once the bench is done


def test_ctrl_c_before_anything_was_measured_says_so(tmp_path, monkeypatch):
    """Ctrl-C while the first endpoint's model is looked up (a slow server) ended the bench with exit 130 and not a
    word: say that nothing was measured or written."""
    from hosttune.cli import bench_run

    def interrupted(spec, url):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_run, "_run_one", interrupted)
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "1", "--requests", "1",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 130
    assert result.output == "hosttune: SIGINT ended the bench before anything was measured; nothing was written\n"


def test_ctrl_c_once_everything_is_sent_ends_the_wait_for_the_last_responses(server_factory):
    """With every request sent, Ctrl-C has no sending left to stop: it ends the wait for those in flight (which may
    last --timeout), and is not taken to have cut the run short at the moment sending ended ('after 0.0 s')."""
    url = server_factory("--ttft", "30", "--itl", "0.001")
    bench = _bench_sending(url, "--url", url, "--users", "1", "--requests", "1", "--warmup", "0s", "--prompts", "8",
                           "--max-tokens", "2")
    bench.send_signal(signal.SIGINT)
    try:
        output, _ = bench.communicate(timeout=20)
    finally:
        bench.kill()
    assert "ended the run after" not in output and "1 measured requests were still running at the stop" in output


def test_ctrl_c_while_several_endpoints_are_checked_says_nothing_was_measured(monkeypatch):
    """Several --url have their models looked up before the first run (a slow one may take seconds): Ctrl-C there
    is said to have ended the bench before anything was measured, as it is during the first run's setup."""
    from hosttune.cli import bench_run

    def interrupted(spec, urls):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_run, "_check_answering", interrupted)
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--url", "http://127.0.0.1:8", "--users", "1",
                                 "--requests", "1"])
    assert result.exit_code == 130
    assert result.output == "hosttune: SIGINT ended the bench before anything was measured; nothing was written\n"


def test_users_past_the_open_file_limit_raise_it_before_the_run():
    """400 users need 400 connections: under `ulimit -n 200` half of them failed as 'Too many open files', counted
    as the endpoint's transport errors. The soft limit is raised (up to the hard one) before the run."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1000:
        pytest.skip(f"the hard open-file limit here, {hard}, is below what 400 users need")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
        result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "400", "--requests", "1"])
        assert "cannot reach" in result.output  # the run went on, to find no server on port 9
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 400
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_users_past_the_hard_open_file_limit_are_a_user_error(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (200, 300))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: None)
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--users", "400", "--requests", "1"])
    assert result.exit_code == 2 and result.output == (
        "hosttune: --users 400 needs a connection each, and this process may open 300 files (ulimit -Hn): raise "
        "that limit, or give fewer --users\n")


@contextmanager
def serving_one_model(name: str, refusal: str = "The model `{model}` does not exist."):
    """A loopback server that lists one model and answers a completion naming any other with vLLM's 404 (or another
    `refusal` message)."""
    def answer(method, path, body):
        if method == "GET":
            return 200, json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}).encode()
        model = json.loads(body)["model"]
        return 404, json.dumps({"error": {"message": refusal.format(model=model)}}).encode()

    with loopback_http(answer) as url:
        yield url


def test_a_model_the_endpoint_does_not_serve_fails_before_the_run_naming_the_ones_it_lists():
    """--model skips /v1/models: a mistyped name sent thousands of requests, each answered 404, for the whole
    warm-up and duration (70 s by default) before the line said to check --model."""
    with serving_one_model("Qwen/Qwen2.5-7B") as url:
        start = time.monotonic()
        result = runner.invoke(app, ["bench", "--url", url, "--model", "qwen2.5-7b", "--users", "4", "--prompts", "8",
                                     "--max-tokens", "2"])
    assert time.monotonic() - start < 10 and result.exit_code == 2, result.output
    assert result.output == (f"hosttune: --model qwen2.5-7b: {url}/v1/completions answered 404: The model "
                             "`qwen2.5-7b` does not exist.; the server lists Qwen/Qwen2.5-7B\n")


def test_a_404_that_does_not_name_the_model_is_left_to_the_run_not_blamed_on_model():
    """A server without the chat route answers 404 whatever the model: that is --api's to fix, and the run's line
    says to check --model and --api, where the check before it blamed --model alone."""
    with serving_one_model("served", refusal="Not Found") as url:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "other", "--api", "chat", "--users", "1",
                                     "--requests", "1", "--warmup", "0", "--prompts", "8", "--max-tokens", "2",
                                     "--max-client-lag", "1s"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].endswith("the first answered 404: Not Found; check --model and --api, and "
                                                   "that it is an OpenAI-compatible server"), result.stderr


def test_a_model_the_endpoint_does_not_list_but_serves_is_measured(server_factory):
    """SGLang serves whatever name a request gives: a name /v1/models does not list is not refused for that."""
    url = server_factory("--ttft", "0.01", "--itl", "0.002")  # lists 'scripted', takes any name
    result = runner.invoke(app, ["bench", "--url", url, "--model", "another-name", "--users", "1", "--requests", "2",
                                 "--warmup", "0", "--prompts", "8", "--max-tokens", "2", "--max-client-lag", "1s"])
    assert result.exit_code == 0, result.output
    assert "requests measured (ok / 429 / failed)    2 (2 / 0 / 0)" in result.stdout


def test_a_signal_before_any_measured_request_says_where_it_came_not_always_in_a_warm_up():
    """A low --rate (or a trace) may send nothing for minutes: Ctrl-C there, with --warmup 0, was said to have come
    during the warm-up, which the run did not have."""
    from dataclasses import replace

    from hosttune.cli.bench_failures import none_sent

    from .test_metrics import run_of

    waited = replace(run_of([], window=(0.0, 57.8)), stopped_by="SIGINT")
    assert none_sent(waited) == ("SIGINT ended the run to http://127.0.0.1:1 57.8 s in, before it sent a measured "
                                  "request, so nothing was measured")
    warming = replace(run_of([], window=(10.0, 10.0)), stopped_by="SIGTERM")
    assert none_sent(warming) == ("SIGTERM ended the run to http://127.0.0.1:1 during its 10 s warm-up, so nothing "
                                   "was measured")


def test_a_sweep_whose_every_request_failed_says_why_and_exits_2():
    """Every request refused (a prompt past the context): each step 'broke' at 100% errors, and the sweep said only
    that no rate held, as of a server too slow, with the server's reason in no output."""
    body = b'{"error": {"message": "This model\'s maximum context length is 1024 tokens."}}'
    with not_openai(400, body) as url:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--sweep", "--sweep-start", "8",
                                     "--duration", "0.5s", "--warmup", "0s", "--prompts", "8", "--max-tokens", "2",
                                     "--max-client-lag", "1s"])
    assert result.exit_code == 3, result.output  # nothing measured, and no rate held
    assert re.fullmatch(rf"hosttune: all \d+ measured requests of the sweep of {url} failed \(400: \d+\), so no rate "
                        r"was measured; the first answered 400: This model's maximum context length is 1024 tokens\.; "
                        r"check that --prompts and --max-tokens fit the model's context, .*",
                        result.stderr.splitlines()[-1]), result.stderr


def test_a_shared_prefix_grid_past_the_user_limit_is_named_as_given():
    """--shared-prefix 1000x1000 was refused as '--users 1000000', an option the user had not given."""
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--shared-prefix", "1000x1000",
                                 "--requests", "1"])
    assert result.exit_code == 2
    assert result.output == ("hosttune: --shared-prefix 1000x1000 means 1000000 users, past the 100000 bench runs: "
                             "give fewer system prompts or users each\n")


def test_a_sweep_step_whose_every_request_failed_ends_the_sweep_and_says_why(monkeypatch):
    """The server dies after the first step: each later step failed wholly and 'broke', the sweep bisected down to
    its precision against a dead server, and exited 0 with the reason in no output."""
    from scripted_server.launch import start, stop
    process, url = start("--ttft", "0.002", "--itl", "0.001")
    shown = console.sweep_point_line

    def dies_after_the_first_step(*args):
        process.kill()
        process.wait()
        return shown(*args)

    monkeypatch.setattr(console, "sweep_point_line", dies_after_the_first_step)
    try:
        result = runner.invoke(app, ["bench", "--url", url, "--model", "m", "--sweep", "--sweep-start", "8",
                                     "--duration", "0.5s", "--warmup", "0s", "--prompts", "8", "--max-tokens", "2",
                                     "--max-client-lag", "1s"])
    finally:
        stop(process, timeout=10)
    assert result.exit_code == 2, result.output  # a step measured nothing; the rate before it held
    assert re.search(r"\n\S+ +8\.00 +- +\S+ +2 *\n", result.stdout), result.stdout  # held 8/s, two steps
    assert f"\nNOTE {url}: every request failed in the step at 16.00 requests/s: the sweep ended there, and the " \
           "answer above is from the steps before it.\n" in result.stdout, result.stdout
    assert re.fullmatch(rf"hosttune: all \d+ measured requests of the sweep of {url} at 16\.00 requests/s failed "
                        r"\(transport: \d+\), so the sweep ended there, its answer from the 1 step before it; the first "
                        r"failed: .+; check that the server is up and listens at --url",
                        result.stderr.splitlines()[-1]), result.stderr
