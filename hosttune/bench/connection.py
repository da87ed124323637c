"""HTTP/1.1 connections that timestamp response bytes the moment they arrive.

A general-purpose client (aiohttp, httpx) hands each piece of a streamed body to a
coroutine, which runs one loop iteration later, after every other ready socket has been
served: with 512 streams that each get a token in the same decode step, the last
stream's timestamp would be late by the time it takes to wake 511 coroutines. Here the
asyncio protocol callback itself stamps the bytes with `time.perf_counter()` and stores
them; nothing else happens per chunk, and the waiting coroutine wakes once, when the
response is complete. That keeps timestamps within microseconds of the socket and the
client's CPU cost per chunk to about a microsecond.

Only what a load tester needs: POST with a JSON body, HTTP/1.1 keep-alive, chunked,
Content-Length or close-delimited bodies, http and https.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

MAX_HEAD = 64 * 1024


class HttpError(Exception):
    """The connection failed or the response could not be parsed."""


@dataclass
class Response:
    """A response as it arrives: status, headers, and body pieces with arrival times."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    segments: list[tuple[float, bytes]] = field(default_factory=list)  # (perf_counter, bytes)
    is_complete: bool = False
    is_keep_alive: bool = True

    def body(self) -> bytes:
        return b"".join(data for _, data in self.segments)


class ResponseParser:
    """Incremental HTTP/1.1 response parser (head, then chunked/length/close body)."""

    def __init__(self) -> None:
        self.response = Response()
        self.buffer = b""
        self.state = "head"
        self.remaining = 0  # bytes left in the current chunk or body

    def feed(self, data: bytes, now: float) -> None:
        self.buffer += data
        progress = True
        while progress and self.buffer and not self.response.is_complete:
            progress = getattr(self, f"_{self.state}")(now)

    def feed_eof(self, now: float) -> None:
        if self.state == "until_close":
            self.response.is_complete = True
        elif not self.response.is_complete:
            raise HttpError("connection closed before the response was complete")

    def _head(self, now: float) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                raise HttpError("response head too large")
            return False
        head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + 4:]
        status_line, *lines = head.split("\r\n")
        self._parse_head(status_line, lines)
        return True

    def _parse_head(self, status_line: str, lines: list[str]) -> None:
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP/1.x response: {status_line[:80]!r}")
        response = self.response
        response.status = int(parts[1])
        for line in lines:
            name, _, value = line.partition(":")
            response.headers[name.strip().lower()] = value.strip()
        connection = response.headers.get("connection", "").lower()
        response.is_keep_alive = parts[0] == "HTTP/1.1" and connection != "close"
        if response.status in (204, 304) or 100 <= response.status < 200:
            self.state, response.is_complete = "done", True
        elif "chunked" in response.headers.get("transfer-encoding", "").lower():
            self.state = "chunk_size"
        elif "content-length" in response.headers:
            self.remaining = int(response.headers["content-length"])
            self.state = "length"
            response.is_complete = self.remaining == 0
        else:
            self.state, response.is_keep_alive = "until_close", False

    def _chunk_size(self, now: float) -> bool:
        end = self.buffer.find(b"\r\n")
        if end < 0:
            return False
        size_text = self.buffer[:end].split(b";")[0].strip()
        try:
            self.remaining = int(size_text, 16)
        except ValueError:
            raise HttpError(f"bad chunk size {size_text[:20]!r}") from None
        self.buffer = self.buffer[end + 2:]
        self.state = "chunk_data" if self.remaining else "trailer"
        return True

    def _chunk_data(self, now: float) -> bool:
        take = self.buffer[:self.remaining]
        self._append(now, take)
        self.buffer = self.buffer[len(take):]
        self.remaining -= len(take)
        if self.remaining:
            return False
        self.state = "chunk_end"
        return True

    def _chunk_end(self, now: float) -> bool:
        if len(self.buffer) < 2:
            return False
        self.buffer, self.state = self.buffer[2:], "chunk_size"
        return True

    def _trailer(self, now: float) -> bool:
        end = self.buffer.find(b"\r\n")
        if end < 0:
            return False
        line, self.buffer = self.buffer[:end], self.buffer[end + 2:]
        if not line:
            self.state, self.response.is_complete = "done", True
        return True

    def _length(self, now: float) -> bool:
        take = self.buffer[:self.remaining]
        self._append(now, take)
        self.buffer = self.buffer[len(take):]
        self.remaining -= len(take)
        self.response.is_complete = self.remaining == 0
        return False

    def _until_close(self, now: float) -> bool:
        self._append(now, self.buffer)
        self.buffer = b""
        return False

    def _done(self, now: float) -> bool:
        return False

    def _append(self, now: float, data: bytes) -> None:
        segments = self.response.segments
        if segments and segments[-1][0] == now:  # several chunks in one read
            segments[-1] = (now, segments[-1][1] + data)
        elif data:
            segments.append((now, data))


class Connection(asyncio.Protocol):
    """One keep-alive connection; serves one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future | None = None
        self.is_closed = False
        self.num_requests = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.parser is None:
            self._fail(HttpError("data arrived with no request outstanding"))
            return
        try:
            self.parser.feed(data, now)
        except HttpError as exc:
            self._fail(exc)
            return
        if self.parser.response.is_complete:
            self._finish()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        if self.parser is None or self.waiter is None or self.waiter.done():
            return
        try:
            self.parser.feed_eof(time.perf_counter())
        except HttpError as error:
            self._fail(error if exc is None else HttpError(f"{error}: {exc}"))
            return
        self._finish()

    def send(self, request: bytes) -> asyncio.Future:
        """Write a request; the future resolves to its complete Response."""
        assert self.transport is not None and self.waiter is None
        self.parser = ResponseParser()
        self.waiter = asyncio.get_running_loop().create_future()
        self.num_requests += 1
        self.transport.write(request)
        return self.waiter

    def is_reusable(self) -> bool:
        return not self.is_closed and self.waiter is None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _finish(self) -> None:
        response = self.parser.response
        waiter, self.waiter, self.parser = self.waiter, None, None
        if not response.is_keep_alive:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter, self.parser = self.waiter, None, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class ConnectionPool:
    """Keep-alive connections to one origin, opened on demand, with no upper limit."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self.host = parsed.hostname or "127.0.0.1"
        self.is_tls = parsed.scheme == "https"
        self.port = parsed.port or (443 if self.is_tls else 80)
        self.host_header = parsed.netloc
        self.idle: list[Connection] = []
        self.ssl_context = ssl.create_default_context() if self.is_tls else None

    def request_bytes(self, path: str, body: bytes) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    async def acquire(self) -> Connection:
        while self.idle:
            connection = self.idle.pop()
            if connection.is_reusable():
                return connection
        loop = asyncio.get_running_loop()
        server_hostname = self.host if self.is_tls else None
        try:
            _, connection = await loop.create_connection(
                Connection, self.host, self.port, ssl=self.ssl_context,
                server_hostname=server_hostname,
            )
        except OSError as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return connection

    def release(self, connection: Connection) -> None:
        if connection.is_reusable():
            self.idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()
