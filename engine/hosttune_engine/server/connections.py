"""Open connections, bounded: a header timeout and a cap on how many may be open at once.

aiohttp closes a connection that stays idle past its keepalive timeout (our idle timeout),
but a client that trickles a request's headers a byte at a time is not idle to it, and
nothing bounds the number of connections but the file-descriptor limit. So the listening
socket hands each connection to a thin protocol in front of aiohttp's own handler:

- it closes a connection whose request headers are not complete `header_timeout_s` after
  its first byte (or after the connection opened, if it sends nothing);
- past `max_connections` open ones, a new connection gets a 503 and is closed at once.

The guard reads two fields of aiohttp's request handler (`_request_count`, the requests
whose headers were parsed, and `_request_in_progress`); the server tests hold 1,000
slow-header connections against it, so an aiohttp that renamed them fails there.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.responses import dumps, error_body

log = logging.getLogger("hosttune_engine.server")

LISTEN_BACKLOG = 2048  # a burst of new connections (a load balancer's pool filling) waits in the kernel


def _busy_response(retry_after_s: int) -> bytes:
    body = dumps(error_body(ApiError(503, "The server has too many open connections; retry shortly",
                                     "ServiceUnavailableError")))
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: {retry_after_s}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class ConnectionGuard:
    """A protocol factory for loop.create_server, wrapping aiohttp's (`runner.server`)."""

    def __init__(self, handler_factory, max_connections: int, header_timeout_s: float, retry_after_s: int = 1):
        self.handler_factory = handler_factory
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.busy_response = _busy_response(retry_after_s)
        self.num_open = 0
        self.num_refused = 0
        self.num_timed_out = 0

    def __call__(self) -> asyncio.Protocol:
        if self.num_open >= self.max_connections:
            self.num_refused += 1
            return _Refuse(self.busy_response)
        return _Guarded(self, self.handler_factory())


class _Refuse(asyncio.Protocol):
    def __init__(self, response: bytes):
        self.response = response

    def connection_made(self, transport) -> None:
        transport.write(self.response)
        transport.close()


class _Guarded(asyncio.Protocol):
    """Forwards everything to aiohttp's handler; closes the connection when its headers are late."""

    def __init__(self, guard: ConnectionGuard, inner):
        self.guard, self.inner = guard, inner
        self.transport = None
        self._timer: asyncio.TimerHandle | None = None
        self._num_parsed = 0

    def connection_made(self, transport) -> None:
        self.guard.num_open += 1
        self.transport = transport
        self.inner.connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        self.guard.num_open -= 1
        self._disarm()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)
        parsed = self.inner._request_count
        if parsed != self._num_parsed:  # a request's headers are complete
            self._num_parsed = parsed
            self._disarm()
        elif self._timer is None and not self.inner._request_in_progress:
            self._arm()  # the first bytes of the next request

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.guard.header_timeout_s, self._late, self._num_parsed)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self, num_parsed: int) -> None:
        self._timer = None
        if self.inner._request_count != num_parsed or self.inner._request_in_progress:
            return  # the headers came (a request is being read or answered)
        self.guard.num_timed_out += 1
        if self.transport is not None:
            self.transport.abort()


class GuardedSite(web.TCPSite):
    """aiohttp's TCPSite, listening through a ConnectionGuard."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard_args: dict):
        super().__init__(runner, host, port, backlog=LISTEN_BACKLOG)
        self._guard_args = guard_args
        self.guard: ConnectionGuard | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)
        self.guard = ConnectionGuard(self._runner.server, **self._guard_args)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.guard, self._host, self._port, reuse_address=True,
                                                backlog=self._backlog)
