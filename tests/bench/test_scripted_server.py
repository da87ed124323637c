"""The scripted server itself: it must hold the connections a load test opens."""

import json
import resource
import socket

import pytest

CONNECTIONS = 1100  # past select()'s FD_SETSIZE of 1,024


def test_the_scripted_server_answers_past_a_thousand_connections(server_factory):
    """select() takes no descriptor past 1,024: the server died at about 1,000 connections ('filedescriptor out of
    range in select()'), and every request after failed as a transport error of the endpoint."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CONNECTIONS + 100:
        pytest.skip(f"the open-file limit ({hard}) cannot hold {CONNECTIONS} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, CONNECTIONS + 100), hard))
    host, port = server_factory("--ttft", "0.001", "--itl", "0.001").removeprefix("http://").split(":")
    sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(CONNECTIONS)]
    try:
        body = json.dumps({"model": "scripted", "prompt": "a b", "max_tokens": 2}).encode()
        for sock in (sockets[0], sockets[-1]):
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert sock.recv(64).startswith(b"HTTP/1.1 200 OK")
    finally:
        for sock in sockets:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_scripted_server_selects_where_there_is_no_epoll(monkeypatch):
    """macOS has no epoll: the selector falls back to select(), whose wait it must still call (it named
    selectors.EpollSelector, which is not there, on every wait)."""
    import importlib
    import selectors

    from scripted_server import server

    monkeypatch.delattr(selectors, "EpollSelector")
    try:
        fallback = importlib.reload(server).PreciseSelector()
        assert isinstance(fallback, selectors.SelectSelector) and fallback.select(0.001) == []
        fallback.close()
    finally:
        monkeypatch.undo()
        importlib.reload(server)
