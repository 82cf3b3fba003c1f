"""A scripted HTTP server standing in for kube-apiserver, so the real kubernetes
client is exercised (requests, status codes, watch streams) without a cluster."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    content_type: str | None


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out (as tests of timeouts make it) closed the
        # connection before the delayed answer: expected, not worth a traceback.
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class StubAPI:
    """Answers each request with the next scripted response for its method and path
    (a regex), or ``200 {}``; records every request."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._script: list[tuple[str, re.Pattern[str], deque[tuple[Any, ...]]]] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                stub.requests.append(Recorded(self.command, self.path, body, self.headers.get("Content-Type")))
                code, payload, delay = stub._next(self.command, self.path)
                if delay:
                    time.sleep(delay)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def respond(self, method: str, path: str, *responses: tuple[Any, ...]) -> None:
        """Queue responses ``(code, payload[, delay_s])`` for requests matching ``method``
        and the ``path`` regex; a bytes payload is sent as it is."""
        with self._lock:
            self._script.append((method, re.compile(path), deque(responses)))

    def _next(self, method: str, path: str) -> tuple[int, Any, float]:
        with self._lock:
            for m, pattern, queue in self._script:
                if m == method and pattern.search(path) and queue:
                    code, payload, *delay = queue.popleft()
                    return code, payload, (delay[0] if delay else 0.0)
        return 200, {}, 0.0

    def api_client(self) -> client.ApiClient:
        config = client.Configuration(host=self.url)
        config.retries = 0
        return client.ApiClient(config)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def status_body(code: int, reason: str) -> dict[str, Any]:
    """A metav1.Status error body."""
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
