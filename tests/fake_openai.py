"""A small OpenAI-compatible server on 127.0.0.1 for tests: scripted replies, errors, slowness, bad JSON.

`script` is a list of steps consumed one per request; when it runs out, `default` answers. A step is
("text", str) | ("status", int) | ("slow", (seconds, text)) | ("raw", bytes) | ("calls", [(name, arguments
text), ...]) for a tool-calling reply | ("reject", message) for a 400 with that message | a callable
taking the request JSON and returning a reply text.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = tuple[str, Any] | Callable[[dict[str, Any]], str]


class FakeOpenAI:
    def __init__(self, default: Step = ("text", "ok")) -> None:
        self.script: list[Step] = []
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def next_step(self) -> Step:
        with self._lock:
            return self.script.pop(0) if self.script else self.default

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with fake._lock:
                    fake.requests.append(body)
                    fake.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    self._send(404, b'{"error": "not found"}')
                    return
                step = fake.next_step()
                if isinstance(step, tuple) and step[0] == "slow":
                    time.sleep(step[1][0])
                    step = ("text", step[1][1])
                if callable(step):
                    self._send(200, _completion(step(body)))
                elif step[0] == "text":
                    self._send(200, _completion(step[1]))
                elif step[0] == "calls":
                    self._send(200, _completion("", step[1]))
                elif step[0] == "reject":
                    self._send(400, json.dumps({"error": {"message": step[1]}}).encode())
                elif step[0] == "status":
                    self._send(step[1], json.dumps({"error": {"message": f"scripted {step[1]}"}}).encode())
                else:
                    self._send(200, step[1])

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError):  # the client timed out and left
                    self.wfile.write(payload)

        return Handler


def _completion(text: str, calls: list[tuple[str, str]] | None = None) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}}
                                 for n, (name, args) in enumerate(calls)]
    return json.dumps({"id": "fake", "object": "chat.completion",
                       "choices": [{"index": 0, "message": message,
                                    "finish_reason": "tool_calls" if calls else "stop"}],
                       "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}).encode()


@contextmanager
def serve(fake: FakeOpenAI) -> Iterator[str]:
    """Runs the fake on a free port; yields its base URL (…/v1)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
