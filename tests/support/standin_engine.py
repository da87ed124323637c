"""A stand-in for a deployed engine (standard library only, so it runs on a bare test host): /health,
/v1/models and /v1/completions of one token, as the OpenAI-compatible engines answer them.

    python3 standin_engine.py PORT [HEALTH_STATUS]
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def handler(health_status: int):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(health_status, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(200, {"choices": [{"index": 0, "text": "!"}], "usage": {"completion_tokens": 1}})

        def log_message(self, *args):
            pass

    return Handler


def serve(port: int, health_status: int = 200) -> ThreadingHTTPServer:
    """Started on a thread (tests on this machine); port 0 picks a free one."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(health_status))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler(int(sys.argv[2]) if len(sys.argv) > 2 else 200)).serve_forever()
