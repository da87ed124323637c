"""bench against a keyed endpoint: --api-key (and $OPENAI_API_KEY) and --header reach every request,
the run measures the keyed engine, and neither the key nor a header value is in what is printed or saved."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hosttune.bench.headers import REDACTED, redact_argv, request_headers
from hosttune.errors import BenchError

from .test_engine_server import serve_tiny_qwen2

ROOT = Path(__file__).resolve().parents[2]
KEY = "ht-bench-key-5f1d8a0c2b9e47d6"
TENANT = "tenant-7c41e9"
needs_engine = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("hosttune_engine.server") is None,
    reason="needs the engine (hosttune_engine.server) and torch: scripts/test.sh installs both")


def test_request_headers_from_header_options_and_the_key():
    assert request_headers(["X-Tenant=a", "X-Trace = b=c"], KEY) == (
        ("X-Tenant", "a"), ("X-Trace", "b=c"), ("Authorization", f"Bearer {KEY}"))
    assert request_headers(["Authorization=Basic eA=="], KEY) == (("Authorization", "Basic eA=="),)
    assert request_headers([], None) == ()
    for bad, message in (("X-Tenant", "NAME=VALUE"), ("Bad Name=x", "NAME=VALUE"), ("Host=x", "sets this header"),
                         ("X-A=line\r\nX-B: injected", "one line"), ("X-A=\u4e2d", "Latin-1")):
        with pytest.raises(BenchError, match=message):
            request_headers([bad], None)


def test_redact_argv_hides_key_and_header_values():
    argv = ["--url", "http://h:8000", "--api-key", KEY, f"--api-key={KEY}", "--header", f"X-Tenant={TENANT}",
            f"--header=Authorization=Bearer {KEY}", "--users", "2"]
    assert redact_argv(argv) == ["--url", "http://h:8000", "--api-key", REDACTED, f"--api-key={REDACTED}",
                                 "--header", f"X-Tenant={REDACTED}", f"--header=Authorization={REDACTED}",
                                 "--users", "2"]


@pytest.fixture(scope="module")
def keyed_engine(tmp_path_factory):
    """The tiny Qwen2 served on CPU, with an API key."""
    yield from serve_tiny_qwen2(tmp_path_factory.mktemp("bench-keyed"), [], {"HOSTTUNE_ENGINE_API_KEY": KEY})


def _bench(url: str, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "hosttune", "bench", "--url", url, "--users", "2", "--requests", "6",
            "--warmup", "0s", "--prompts", "16", "--max-tokens", "4", "--timeout", "60s", "--max-client-lag", "1s", "--out", str(out), *extra]
    environ = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**environ, **(env or {})},
                          cwd=ROOT)


@needs_engine
def test_bench_with_api_key_measures_the_keyed_engine_and_saves_no_key(keyed_engine, tmp_path):
    result = _bench(keyed_engine, tmp_path, "--api-key", KEY, "--header", f"X-Tenant={TENANT}")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    (run,) = doc["runs"]
    assert run["summary"]["num_ok"] == 6, run["summary"]
    assert "/tokenize" in run["tokenizer"]  # exact prompt lengths: the key reached /tokenize as well
    assert f"--api-key {REDACTED}" in doc["command"] and f"X-Tenant={REDACTED}" in doc["command"]
    for path in tmp_path.iterdir():
        if path.suffix in (".json", ".md"):
            text = path.read_text()
            assert KEY not in text and TENANT not in text, path.name
    assert KEY not in result.stdout + result.stderr


@needs_engine
def test_bench_reads_openai_api_key(keyed_engine, tmp_path):
    result = _bench(keyed_engine, tmp_path, env={"OPENAI_API_KEY": KEY})
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["runs"][0]["summary"]["num_ok"] == 6
    assert KEY not in (tmp_path / "results.json").read_text()


@needs_engine
def test_bench_without_the_key_says_to_pass_it(keyed_engine, tmp_path):
    result = _bench(keyed_engine, tmp_path)
    assert result.returncode == 2 and "answered 401: pass the endpoint's key with --api-key" in result.stderr


def test_a_bad_header_is_a_usage_error():
    from typer.testing import CliRunner

    from hosttune.cli import app

    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--header", "X-Tenant"])
    assert result.exit_code == 2 and "write NAME=VALUE" in result.output


def test_a_header_given_twice_is_a_usage_error_naming_it_not_its_values():
    """Sent twice, a field that is no list means nothing certain (and a second Authorization is refused by most
    servers); --help says so and says to join a list's values."""
    from typer.testing import CliRunner

    from hosttune.cli import app

    with pytest.raises(BenchError, match=r"^--header x-tenant: given twice \(as X-Tenant too\): give each header once"):
        request_headers([f"X-Tenant={TENANT}", "X-Other=1", "x-tenant=b"], None)
    with pytest.raises(BenchError, match=r"^--header A: given twice: "):
        request_headers(["A=1", "A=2"], None)
    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--header", f"X-Tenant={TENANT}",
                                      "--header", "X-Tenant=b"])
    assert result.exit_code == 2 and TENANT not in result.output
    assert result.stderr == ("hosttune: --header X-Tenant: given twice: give each header once; for a list, join its "
                             "values with commas in one --header (X-Tenant=a,b)\n")
    help_text = " ".join(CliRunner().invoke(app, ["bench", "--help"]).stdout.replace("│", " ").split())
    assert "a name given twice is an error" in help_text



def test_api_key_beside_a_header_authorization_is_a_usage_error_saying_which_to_drop():
    """Typed together, one of the two would be dropped without a word; a key from $OPENAI_API_KEY yields to the
    header the command line gives."""
    from typer.testing import CliRunner

    from hosttune.cli import app

    args = ["bench", "--url", "http://127.0.0.1:9", "--requests", "2", "--header", f"Authorization=Bearer {TENANT}"]
    result = CliRunner().invoke(app, [*args, "--api-key", KEY], env={"OPENAI_API_KEY": None})
    assert result.exit_code == 2 and KEY not in result.output and TENANT not in result.output
    assert result.stderr == ("hosttune: --api-key and --header Authorization both set the Authorization header: give "
                             "one (--api-key KEY sends 'Authorization: Bearer KEY'; drop it to send the header's "
                             "value)\n")
    assert request_headers([f"Authorization=Bearer {TENANT}"], KEY) == (("Authorization", f"Bearer {TENANT}"),)
    result = CliRunner().invoke(app, args, env={"OPENAI_API_KEY": KEY})
    assert result.exit_code == 2 and "cannot reach" in result.stderr


def test_an_empty_api_key_is_a_usage_error_not_a_run_without_the_key():
    """`--api-key "$KEY"` with KEY unset would otherwise send no key, and the server's 401 would ask for --api-key."""
    from typer.testing import CliRunner

    from hosttune.cli import app

    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--requests", "1", "--api-key", ""],
                                env={"OPENAI_API_KEY": None})
    assert result.exit_code == 2 and "--api-key: '' names nothing" in result.output, result.output
