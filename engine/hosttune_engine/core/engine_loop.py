"""Runs an Engine on its own thread; other threads reach it only through messages.

An HTTP server puts `EngineRequest` / `AbortRequest` in with `submit` and gets
every `TokenOutput` through the `on_output` callback (called on the engine
thread: hand it to an event loop with `loop.call_soon_threadsafe`). An exception
out of a step ends the thread; `on_fatal` hears of it, so a server can exit.
`when_idle` runs a function on the engine thread once no request is in the engine
(a server measures its step costs that way after warmup).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable

from hosttune_engine.core.engine import Engine
from hosttune_engine.core.messages import AbortRequest, EngineRequest, EngineStats, TokenOutput
from hosttune_engine.errors import RequestError


class EngineLoop:
    def __init__(self, engine: Engine, on_output: Callable[[TokenOutput], None],
                 on_error: Callable[[str, Exception], None] | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None):
        self.engine = engine
        self.on_output = on_output
        self.on_error = on_error or (lambda request_id, error: None)
        self.on_fatal = on_fatal
        self._inbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._waiting_call: _IdleCall | None = None  # taken from the inbox, run once the engine is idle
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stats = engine.stats()

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def submit(self, message: EngineRequest | AbortRequest) -> None:
        """Thread-safe: queue a request or an abort for the engine thread."""
        self._inbox.put(message)

    def when_idle(self, fn: Callable[[], object]) -> Future:
        """Thread-safe: run fn() on the engine thread as soon as no request is in the engine (before the
        messages queued after this call); the future gets its result or its exception."""
        future: Future = Future()
        self._inbox.put(_IdleCall(fn, future))
        return future

    def stats(self) -> EngineStats:
        """The counters as of the end of the last step (safe from any thread)."""
        return self._stats

    def stop(self, timeout: float | None = None) -> None:
        """End the thread, then the engine's other tensor-parallel ranks (if the thread ended: a step still
        running would share the ranks' message channel; the ranks end with this process then)."""
        self._stop.set()
        self._inbox.put(None)  # wake the thread if it is idle
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.engine.shutdown()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # the engine is broken: whoever drives it must know
            self.engine.check_ranks()  # a dead tensor-parallel rank ends the process here, with its reason
            if self.on_fatal is None:
                raise
            self.on_fatal(e)

    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = not self.engine.has_unfinished_requests()
            if idle and self._waiting_call is not None:
                call, self._waiting_call = self._waiting_call, None
                call.run(then=self._refresh_stats)  # what the call did counts at once, not after the next step
            if self._waiting_call is None:  # the messages after a waiting call wait for it
                self._drain(block=idle)
            for output in self.engine.step():
                self.on_output(output)
            self._refresh_stats()

    def _refresh_stats(self) -> None:
        self._stats = self.engine.stats()

    def _drain(self, block: bool) -> None:
        """Handle the queued messages, up to a call that waits for the engine to be idle."""
        try:
            message = self._inbox.get(block=block)
            while True:
                if isinstance(message, _IdleCall):
                    self._waiting_call = message
                    return
                if message is not None:
                    self._handle(message)
                message = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _handle(self, message: EngineRequest | AbortRequest) -> None:
        try:
            self.engine.handle(message)
        except RequestError as e:
            self.on_error(message.request_id, e)


class _IdleCall:
    def __init__(self, fn: Callable[[], object], future: Future):
        self.fn, self.future = fn, future

    def run(self, then: Callable[[], None]) -> None:
        """fn(), then `then()`, then the future resolved (so its waiter sees what `then` did)."""
        try:
            result = self.fn()
            then()
            self.future.set_result(result)
        except Exception as e:  # the caller decides: a failed measurement need not end the engine thread
            self.future.set_exception(e)
