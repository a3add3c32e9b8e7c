"""Real HTTP servers on loopback that play scripted replies and record what they were sent.

The model SDKs speak through their own HTTP stacks (httpx2), which transport mocks do not see; a real server on
127.0.0.1 tests the whole path: headers, JSON bodies, status codes, retries and client timeouts.

    with ScriptedServer([Reply(429, {...}), Reply(200, body)]) as server:
        client = SDK(base_url=server.url, max_retries=1)
        ...
        server.requests[0]["body"]
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    body: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0          # sleep before answering (to run past a client timeout)
    # Server-sent events (name, data) sent instead of the body when the request asks for "stream": true.
    events: list[tuple[str, dict]] | None = None


class ScriptedServer:
    """Answers each POST with the next scripted Reply; when the script runs out it answers 500 with no retry."""

    def __init__(self, script: list[Reply]):
        self.script = list(script)
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # A short poll keeps shutdown (which waits for the next poll) from costing each test half a second.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def bodies(self) -> list[dict]:
        return [request["body"] for request in self.requests]

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, request: dict) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self.script:
                return self.script.pop(0)
        return Reply(500, {"error": {"type": "script_exhausted", "message": "the fake server's script ran out"}},
                     {"x-should-retry": "false"})

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                reply = server._next({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                      "body": json.loads(raw or b"{}")})
                time.sleep(reply.delay_s)
                if reply.events is not None and json.loads(raw or b"{}").get("stream"):
                    content_type = "text/event-stream"
                    payload = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n"
                                      for name, data in reply.events).encode()
                else:
                    content_type, payload = "application/json", json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", content_type)
                    self.send_header("content-length", str(len(payload)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and hung up, as the test meant it to

            def log_message(self, *args):
                pass  # keep test output clean

        return Handler


def retryable(status: int, body: dict) -> Reply:
    """An error reply that asks for a 1 ms wait, so the SDK's retry backoff costs no real time in tests."""
    return Reply(status, body, {"retry-after-ms": "1"})
