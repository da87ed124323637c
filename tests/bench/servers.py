"""Real-time priority for timing tests, and a loopback HTTP server that answers as a test says."""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

# One timed body at a time on the machine, whichever pytest worker runs it.
LOCK = Path(tempfile.gettempdir()) / "hosttune-tests-realtime.lock"


@contextmanager
def realtime():
    """Run the body at real-time priority when permitted (root on Linux), then restore.

    For timing-accuracy tests on a machine whose cores other processes share: the
    test measures bench's accuracy, not how long the scheduler makes it wait. Real-time
    tasks of one priority do not share a core by turns (SCHED_FIFO runs each until it
    blocks), so two timed bodies at once, one per pytest worker, would delay each other
    by whole milliseconds: a lock file makes them take turns."""
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _fifo() as permitted:
            yield permitted


@contextmanager
def _fifo():
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, PermissionError, OSError):
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, policy, param)


Answer = Callable[[str, str, bytes], "tuple[int, bytes] | tuple[int, bytes, dict[str, str]]"]


@contextmanager
def loopback_http(answer: Answer):
    """A loopback HTTP server whose every GET and POST `answer(method, path, body)` answers with (status, body) or
    (status, body, headers); yields its base URL and shuts it down after the block."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self._reply(answer("GET", self.path, b""))

        def do_POST(self):
            self._reply(answer("POST", self.path, self.rfile.read(int(self.headers.get("Content-Length") or 0))))

        def _reply(self, reply):
            status, body, headers = reply if len(reply) == 3 else (*reply, {})
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
