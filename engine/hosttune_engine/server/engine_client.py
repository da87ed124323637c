"""The event loop's side of the engine loop: submit requests, route their outputs, abort them.

The HTTP layer reaches the engine only through this client and the message
dataclasses (`EngineRequest`, `AbortRequest`, `TokenOutput`). The engine thread
hands outputs over in batches: one event-loop wakeup per step, not per token.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Callable

from hosttune_engine.core.messages import AbortRequest, EngineRequest, EngineStats, TokenOutput


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an error; no request can be served any more."""


@dataclass(frozen=True)
class RequestFailed:
    """Sent to a request's queue instead of outputs when the engine refused it or died."""

    request_id: str
    error: Exception


class EngineClient:
    """Owns the engine thread; must be built inside the running event loop."""

    def __init__(self, engine, on_fatal: Callable[[BaseException], None] | None = None):
        from hosttune_engine.core.engine_loop import EngineLoop  # loads torch

        self._aio = asyncio.get_running_loop()
        self._routes: dict[str, asyncio.Queue] = {}
        self._pending: collections.deque = collections.deque()
        self._wakeup_scheduled = False
        self._on_fatal = on_fatal or (lambda error: None)
        self.error: BaseException | None = None
        self._loop = EngineLoop(engine, self._on_output, self._on_error, self._on_thread_fatal)

    def start(self) -> "EngineClient":
        self._loop.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._loop.stop(timeout)

    def stats(self) -> EngineStats:
        return self._loop.stats()

    def when_idle(self, fn) -> asyncio.Future:
        """fn() run on the engine thread once no request is in the engine; await its result."""
        return asyncio.wrap_future(self._loop.when_idle(fn), loop=self._aio)

    @property
    def num_routed(self) -> int:
        """Requests whose final output has not arrived yet (aborted ones until the engine confirms)."""
        return len(self._routes)

    def submit(self, request: EngineRequest, queue: asyncio.Queue) -> None:
        """Queue `request`; its `TokenOutput`s (or one `RequestFailed`) will arrive in `queue`."""
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped: {self.error!r}")
        self._routes[request.request_id] = queue
        self._loop.submit(request)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks; its final output (finish_reason 'abort') still arrives."""
        if request_id in self._routes and self.error is None:
            self._loop.submit(AbortRequest(request_id))

    # -- on the engine thread -----------------------------------------------------------
    def _on_output(self, item: TokenOutput | RequestFailed) -> None:
        self._pending.append(item)
        if not self._wakeup_scheduled:
            self._wakeup_scheduled = True
            try:
                self._aio.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the event loop is closed: the server is gone
                pass

    def _on_error(self, request_id: str, error: Exception) -> None:
        self._on_output(RequestFailed(request_id, error))

    def _on_thread_fatal(self, error: BaseException) -> None:
        try:
            self._aio.call_soon_threadsafe(self._die, error)
        except RuntimeError:
            pass

    # -- on the event loop ----------------------------------------------------------------
    def _deliver(self) -> None:
        self._wakeup_scheduled = False  # before draining: a later append schedules a new wakeup
        while self._pending:
            item = self._pending.popleft()
            queue = self._routes.get(item.request_id)
            if queue is None:
                continue
            if isinstance(item, RequestFailed) or item.finished:
                del self._routes[item.request_id]
            queue.put_nowait(item)

    def _die(self, error: BaseException) -> None:
        self.error = error
        dead = EngineDeadError(f"the engine stopped: {error!r}")
        for request_id, queue in self._routes.items():
            queue.put_nowait(RequestFailed(request_id, dead))
        self._routes.clear()
        self._on_fatal(error)
