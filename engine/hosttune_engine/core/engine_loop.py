"""Runs an Engine on its own thread; other threads reach it only through messages.

An HTTP server puts `EngineRequest` / `AbortRequest` in with `submit` and gets
every `TokenOutput` through the `on_output` callback (called on the engine
thread: hand it to an event loop with `loop.call_soon_threadsafe`). An exception
out of a step ends the thread; `on_fatal` hears of it, so a server can exit.
"""

from __future__ import annotations

import queue
import threading
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
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stats = engine.stats()

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def submit(self, message: EngineRequest | AbortRequest) -> None:
        """Thread-safe: queue a request or an abort for the engine thread."""
        self._inbox.put(message)

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
            self._drain(block=not self.engine.has_unfinished_requests())
            for output in self.engine.step():
                self.on_output(output)
            self._stats = self.engine.stats()

    def _drain(self, block: bool) -> None:
        try:
            message = self._inbox.get(block=block)
            while True:
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
