"""Fixtures: scripted test servers in their own processes, on 127.0.0.1 only."""

from __future__ import annotations

import pytest

from scripted_server.launch import running


@pytest.fixture
def server_factory():
    """Start scripted servers with the given arguments; all stop after the test."""
    stack = []

    def start(*args: str) -> str:
        manager = running(*args)
        url = manager.__enter__()
        stack.append(manager)
        return url

    yield start
    for manager in reversed(stack):
        manager.__exit__(None, None, None)


@pytest.fixture
def tls_server(server_factory, tmp_path):
    """A scripted server speaking https with a self-signed certificate for localhost: its URL and the certificate."""
    pytest.importorskip("cryptography.x509")
    from .test_tls import self_signed

    cert, key = self_signed(tmp_path)
    return server_factory("--ttft", "0.01", "--itl", "0.002", "--tls-cert", str(cert), "--tls-key", str(key)), cert
