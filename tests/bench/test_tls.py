"""Streams over https: the client's own HTTP/1.1 connections on an asyncio TLS transport."""

import asyncio
import datetime as dt
import ssl
import time

import pytest

from hosttune.bench.benchmark import run_async
from hosttune.bench.client import Client, Target
from hosttune.bench.record import OK
from scripted_server.stream import STREAM_HEAD, TEXT_EVENT, event

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def self_signed(folder):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_streams_over_https_with_a_trusted_certificate(tmp_path, monkeypatch):
    cert_path, key_path = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_path))  # the default context trusts it

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(STREAM_HEAD)
        for _ in range(3):
            writer.write(TEXT_EVENT)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(event("[DONE]") + b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def go():
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_path, key_path)
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        async with Client(Target(f"https://localhost:{port}", "m", timeout=10)) as client:
            result = await client.stream("hello", 3)
        server.close()
        return result

    result = run_async(go())
    assert result.outcome == OK, result.error
    assert len(result.chunks) == 3
    assert result.chunks[2] - result.chunks[0] >= 0.015  # timed as they arrived, not at the end


RUN_ARGS = ["--model", "m", "--users", "2", "--prompts", "8", "--max-tokens", "4", "--max-client-lag", "1s"]


def _bench_within(url: str, seconds: float, *args: str):
    """`hosttune bench` on `url` with --model (which skips /v1/models): its result, and that it ended in time."""
    from typer.testing import CliRunner

    from hosttune.cli import app

    start = time.monotonic()
    result = CliRunner().invoke(app, ["bench", "--url", url, *RUN_ARGS, *args])
    assert time.monotonic() - start < seconds, result.output
    return result


def test_an_https_url_to_a_plain_http_port_fails_in_seconds_saying_to_use_http(server_factory):
    """The handshake hung for asyncio's 60 s a request, through a warm-up and a minute's run, before the run said
    every request had failed: about two and a half minutes to learn the scheme was wrong."""
    plain = server_factory("--ttft", "0.01", "--itl", "0.002")
    port = plain.rpartition(":")[2]
    result = _bench_within(f"https://127.0.0.1:{port}", 10)
    assert result.exit_code == 2
    assert result.output == (f"hosttune: the server at https://127.0.0.1:{port} answered plain HTTP to a TLS "
                             f"handshake; use http://127.0.0.1:{port}\n")


def test_an_http_url_to_a_tls_port_fails_in_seconds_saying_to_use_https(tls_server):
    url, _ = tls_server
    plain_url = url.replace("https://", "http://")
    result = _bench_within(plain_url, 10)
    assert result.exit_code == 2
    assert result.output == (f"hosttune: the server at {plain_url} closed a plain HTTP request unanswered and took a "
                             f"TLS handshake; use {url}\n")


def test_a_certificate_this_machine_does_not_trust_fails_in_seconds_naming_cacert(tls_server):
    """With --model every request failed its handshake for the minute's run, and the line said to check that the
    server was up."""
    url, _ = tls_server
    result = _bench_within(url, 10)
    assert result.exit_code == 2
    assert result.output == (f"hosttune: the server at {url} presented a certificate this machine does not trust "
                             "(certificate verify failed: self-signed certificate); give its CA with --cacert, or "
                             "--insecure for a test endpoint\n")
