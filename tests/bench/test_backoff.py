"""Refusals and private CAs, through `hosttune bench` against scripted servers: during an outage of
503s each closed-loop user waits the server's Retry-After (else an exponential wait) before it tries
again, the failures and retries are counted in the report, and latency percentiles cover only the
requests that were answered; over https it trusts the CA of --cacert (or nothing, with --insecure)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest
from typer.testing import CliRunner

from hosttune.bench.backoff import MAX_WAIT_S, retry_after_seconds, wait_after
from hosttune.cli import app

runner = CliRunner()
OUTAGE_S = 3.0  # the Retry-After outage: a user ignoring it would send thousands (each 503 comes at once)
DOUBLING_OUTAGE_S = 3.0  # without Retry-After: waits of 0.5, 1 and 2 s fit in it


def test_waits_follow_retry_after_else_double_up_to_a_cap():
    assert wait_after(200, None, 1) == 0 and wait_after(500, 1.0, 1) == 0  # only refusals wait
    assert wait_after(503, 1.0, 5) == 1.0 and wait_after(429, 2.0, 1) == 2.0
    assert [wait_after(503, None, n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert wait_after(503, None, 30) == MAX_WAIT_S
    assert wait_after(0, 3.0, 2, is_connection_lost=True) == 1.0  # no Retry-After came with it
    assert retry_after_seconds("2") == 2.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("soon") is None
    # Headers are read as latin-1: '\xb2' (superscript two) passes str.isdigit but is no number to float().
    assert retry_after_seconds("\xb2") is None and retry_after_seconds("1\xb9") is None
    # 400 digits are an infinite float: results.json would hold Infinity, which is no JSON.
    assert retry_after_seconds("9" * 400) is None


def test_users_wait_after_a_failed_connection_as_after_a_refusal(tmp_path, monkeypatch):
    """A server gone mid-run refuses connections at once: its users sent thousands of failing requests a second
    (21,277 in 1.3 s), the client's loop lagging behind them. Each failure stands; its user waits 0.5, 1, 2 s."""
    import socket

    from hosttune.bench import plot

    monkeypatch.setattr(plot, "write_plots", lambda *args: [])  # not what this checks
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = runner.invoke(app, ["bench", "--url", f"http://127.0.0.1:{port}", "--model", "m", "--users", "2",
                                 "--duration", "1s", "--warmup", "0s", "--prompts", "8", "--max-tokens", "2",
                                 "--max-client-lag", "1s", "--metrics-interval", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    summary = json.loads((tmp_path / "results.json").read_text())["runs"][0]["summary"]
    # Each user sends at 0 and 0.5 s, and may at the end of its 1 s wait, which the run's end cuts to 0.5 s.
    assert 4 <= summary["num_requests"] == summary["num_failed"] <= 6 and summary["num_retried"] == 0
    assert list(summary["errors_by_status"]) == ["transport"]


def bench(url: str, out, *extra: str, seconds: float = 4.5):
    return runner.invoke(app, ["bench", "--url", url, "--users", "2", "--duration", f"{seconds}s", "--warmup", "0s",
                               "--prompts", "8", "--max-tokens", "4", "--metrics-interval", "0", "--out", str(out),
                               *extra])


def tries_by_user(run: dict) -> dict[int, list[dict]]:
    users = defaultdict(list)
    for r in run["requests"]:
        users[r["user"]].append(r)
    return {u: sorted(rs, key=lambda r: r["sent"]) for u, rs in users.items()}


def test_each_user_waits_out_a_503_outage_and_the_report_counts_it(server_factory, tmp_path, monkeypatch):
    from hosttune.bench import plot

    monkeypatch.setattr(plot, "write_plots", lambda *args: [])  # not what this checks; a second or two saved
    url = server_factory("--ttft", "0.01", "--itl", "0.002", "--outage", str(OUTAGE_S), "--retry-after", "1")
    result = bench(url, tmp_path / "out", seconds=OUTAGE_S + 1.5)
    assert result.exit_code in (0, 4), result.output  # 4: the client fell behind on a busy machine
    (run,) = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    refused = [r for r in run["requests"] if r["status"] == 503]
    start = min(r["sent"] for r in run["requests"])
    for user, tries in tries_by_user(run).items():
        in_outage = [r for r in tries if r["sent"] < start + OUTAGE_S]
        assert len(in_outage) <= 2 * OUTAGE_S, (user, [r["sent"] for r in in_outage])  # at most 2 a second
        for i, first in enumerate(in_outage):  # and in any one second of it
            assert sum(r["sent"] < first["sent"] + 1.0 for r in in_outage[i:]) <= 2, (user, first["sent"])
        for before, after in zip(tries, tries[1:]):
            if before["status"] == 503:  # the next try waited the Retry-After, and resent the request
                assert after["sent"] - before["end"] >= 0.95 and after["attempt"] == before["attempt"] + 1
        assert tries[-1]["outcome"] in ("ok", "cancelled")  # served once the outage ended
    summary = run["summary"]
    assert summary["num_failed"] == len(refused) >= 4 and summary["errors_by_status"] == {"503": len(refused)}
    with (tmp_path / "out" / "summary.csv").open() as handle:
        (row,) = csv.DictReader(handle)
    assert (int(row["failed"]), int(row["retried"])) == (len(refused), summary["num_retried"])
    assert summary["num_retried"] == sum(r["attempt"] > 0 for r in run["requests"]) >= len(refused)
    assert summary["num_ok"] >= 10 and summary["ttft"]["count"] == summary["num_ok"]  # percentiles over answers
    assert summary["e2e"]["count"] == summary["num_ok"]  # a 503's quick end is no latency
    assert summary["ttft"]["p99"] >= 0.01
    assert f"503: {len(refused)}" in result.stdout and "of them retries after a 429/503" in result.stdout


def test_without_retry_after_the_wait_doubles(server_factory, tmp_path):
    url = server_factory("--ttft", "0.01", "--itl", "0.002", "--outage", str(DOUBLING_OUTAGE_S), "--retry-after",
                         "none")
    result = bench(url, tmp_path / "out")
    assert result.exit_code in (0, 4), result.output
    (run,) = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    for tries in tries_by_user(run).values():
        refused = [r for r in tries if r["status"] == 503]
        assert 2 <= len(refused) <= 4  # tries at 0, 0.5, 1.5 and 3.5 s
        gaps = [b["sent"] - a["end"] for a, b in zip(refused, refused[1:])]
        assert all(gap >= 0.45 * 2 ** i for i, gap in enumerate(gaps)), gaps


def test_cacert_trusts_a_private_ca(tls_server, tmp_path):
    url, cert = tls_server
    assert url.startswith("https://localhost:")
    result = runner.invoke(app, ["bench", "--url", url, "--cacert", str(cert), "--users", "2", "--requests", "6",
                                 "--warmup", "0s", "--prompts", "8", "--max-tokens", "4", "--out", str(tmp_path / "o")])
    assert result.exit_code in (0, 4), result.output
    (run,) = json.loads((tmp_path / "o" / "results.json").read_text())["runs"]
    assert run["summary"]["num_ok"] == 6 and run["summary"]["ttft"]["p50"] >= 0.01


def test_an_unknown_ca_is_refused_unless_insecure(tls_server, tmp_path):
    url, cert = tls_server
    argv = ["bench", "--url", url, "--users", "1", "--requests", "2", "--warmup", "0s", "--prompts", "8",
            "--max-tokens", "4"]
    refused = runner.invoke(app, argv)
    assert refused.exit_code == 2 and "CERTIFICATE_VERIFY_FAILED" in refused.output.replace(" ", "_").upper()
    assert runner.invoke(app, [*argv, "--insecure"]).exit_code in (0, 4)
    both = runner.invoke(app, [*argv, "--insecure", "--cacert", str(cert)])
    assert both.exit_code == 2 and "give one" in both.output
