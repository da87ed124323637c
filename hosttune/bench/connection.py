"""HTTP/1.1 connections that timestamp response bytes the moment they arrive.

A general-purpose client (aiohttp, httpx) hands each piece of a streamed body to a
coroutine, which runs one loop iteration later, after every other ready socket has been
served: with 512 streams that each get a token in the same decode step, the last
stream's timestamp would be late by the time it takes to wake 511 coroutines. Here the
asyncio protocol callback itself stamps the bytes with `time.perf_counter()` and feeds
them to the stream's event parser; the waiting coroutine wakes once, when the response
is complete. Reads go into one preallocated buffer per connection (a BufferedProtocol),
so no read allocates more than the bytes it got.

Only what a load tester needs: POST with a JSON body, HTTP/1.1 keep-alive, chunked,
Content-Length or close-delimited bodies, http and https.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from urllib.parse import urlparse

from hosttune.bench.sse import EventStream
from hosttune.errors import BenchError

MAX_HEAD = 64 * 1024
READ_SIZE = 64 * 1024
HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, TRAILER, LENGTH, UNTIL_CLOSE, DONE = range(8)


def tls_context(cacert: str | None = None, is_insecure: bool = False) -> ssl.SSLContext:
    """How https endpoints are trusted: the system's CAs, the CA in `cacert` instead, or (insecure)
    nothing checked at all."""
    if cacert and is_insecure:
        raise BenchError("--cacert names a CA to check the server against; --insecure checks nothing: give one")
    if is_insecure:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=cacert) if cacert else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise BenchError(f"--cacert {cacert}: not a readable PEM file of CA certificates ({exc})") from None


class HttpError(Exception):
    """The connection failed or the response could not be parsed."""


class Response:
    """A response as it arrives. A 200 body goes to an `EventStream`; others are kept."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.events: EventStream | None = None
        self.body = bytearray()
        self.last_at = 0.0  # arrival time of the last body bytes
        self.is_complete = False
        self.is_keep_alive = True

    def take(self, data: bytes, now: float) -> None:
        self.last_at = now
        if self.events is not None:
            self.events.feed(data, now)
        elif len(self.body) < MAX_HEAD:
            self.body += data


class ResponseParser:
    """Incremental HTTP/1.1 response parser (head, then chunked/length/close body)."""

    def __init__(self, is_keep_text: bool = False) -> None:
        self.response = Response()
        self.is_keep_text = is_keep_text
        self.buffer = b""
        self.state = HEAD
        self.remaining = 0  # bytes left in the current chunk or body

    def feed(self, data: bytes, now: float) -> None:
        """Consume `data`. One loop with local state: this runs for every chunk read."""
        buf = self.buffer + data if self.buffer else data
        pos, end, state, remaining = 0, len(buf), self.state, self.remaining
        response = self.response
        while pos < end and state != DONE:
            if state == CHUNK_SIZE:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    break
                remaining = _chunk_size(buf[pos:line_end])
                pos = line_end + 2
                state = CHUNK_DATA if remaining else TRAILER
            elif state == CHUNK_DATA or state == LENGTH:
                take = min(remaining, end - pos)
                response.take(buf[pos:pos + take], now)
                pos += take
                remaining -= take
                if not remaining:
                    state = CHUNK_END if state == CHUNK_DATA else DONE
            elif state == CHUNK_END:
                if end - pos < 2:
                    break
                pos, state = pos + 2, CHUNK_SIZE
            elif state == HEAD:
                head_end = buf.find(b"\r\n\r\n", pos)
                if head_end < 0:
                    if end - pos > MAX_HEAD:
                        raise HttpError("response head too large")
                    break
                state, remaining = self._head(buf[pos:head_end].decode("latin-1"))
                pos = head_end + 4
            elif state == TRAILER:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    break
                state = DONE if line_end == pos else TRAILER
                pos = line_end + 2
            else:  # UNTIL_CLOSE
                response.take(buf[pos:], now)
                pos = end
        self.buffer = buf[pos:] if pos < end else b""
        self.state, self.remaining = state, remaining
        response.is_complete = state == DONE

    def feed_eof(self) -> None:
        if self.state == UNTIL_CLOSE:
            self.state, self.response.is_complete = DONE, True
        elif self.state != DONE:
            raise HttpError("connection closed before the response was complete")

    def _head(self, head: str) -> tuple[int, int]:
        """Parse status line and headers; return the body state and its byte count."""
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP/1.x response: {status_line[:80]!r}")
        response = self.response
        response.status = int(parts[1])
        for line in lines:
            name, _, value = line.partition(":")
            response.headers[name.strip().lower()] = value.strip()
        if response.status == 200:
            response.events = EventStream(self.is_keep_text)
        connection = response.headers.get("connection", "").lower()
        response.is_keep_alive = parts[0] == "HTTP/1.1" and connection != "close"
        if response.status in (204, 304) or 100 <= response.status < 200:
            return DONE, 0
        if "chunked" in response.headers.get("transfer-encoding", "").lower():
            return CHUNK_SIZE, 0
        if "content-length" in response.headers:
            length = int(response.headers["content-length"])
            return (LENGTH if length else DONE), length
        response.is_keep_alive = False
        return UNTIL_CLOSE, 0


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise HttpError(f"bad chunk size {line[:20]!r}") from None


class Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; serves one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future | None = None
        self.read_buffer = bytearray(READ_SIZE)
        self.is_closed = False
        self.num_requests = 0
        self.is_answered = False  # bytes of the current request's response arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        now = time.perf_counter()
        self.is_answered = True
        if self.parser is None:
            self._fail(HttpError("data arrived with no request outstanding"))
            return
        try:
            self.parser.feed(bytes(self.read_buffer[:nbytes]), now)
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
            self.parser.feed_eof()
        except HttpError as error:
            self._fail(error if exc is None else HttpError(f"{error}: {exc}"))
            return
        self._finish()

    def send(self, request: bytes, is_keep_text: bool = False) -> asyncio.Future:
        """Write a request; the future resolves to its complete Response (with the
        stream's text when `is_keep_text`)."""
        assert self.transport is not None and self.waiter is None
        self.parser = ResponseParser(is_keep_text)
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        self.num_requests += 1
        self.is_answered = False
        try:  # closed under us since the pool handed it out: asyncio would drop the bytes, uvloop raises
            if self.transport.is_closing():
                raise RuntimeError("the transport is closing")
            self.transport.write(request)
        except RuntimeError as exc:
            self._fail(HttpError(f"connection closed before the request was sent ({exc})"))
        return waiter

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

    def __init__(self, url: str, headers: tuple[tuple[str, str], ...] = (),
                 ssl_context: ssl.SSLContext | None = None) -> None:
        parsed = urlparse(url)
        self.extra_head = "".join(f"{name}: {value}\r\n" for name, value in headers)
        self.host = parsed.hostname or "127.0.0.1"
        self.is_tls = parsed.scheme == "https"
        self.port = parsed.port or (443 if self.is_tls else 80)
        self.host_header = parsed.netloc
        self.idle: list[Connection] = []
        self.ssl_context = (ssl_context or tls_context()) if self.is_tls else None

    def request_bytes(self, path: str, body: bytes) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{self.extra_head}"
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
