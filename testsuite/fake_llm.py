"""A scripted OpenAI-compatible HTTP server on the loopback interface, for the LLM tests.

`FakeLLMServer(script)` serves `POST /v1/chat/completions` by popping the next `Reply` of its script
(a completion, an HTTP error, a garbage or empty body, a stream cut short, a delay past the client's
timeout) and `GET /v1/models`. It records every request (body and headers) for the tests to inspect.
It binds only 127.0.0.1, and it is bounded: it stops by itself after `lifetime_s` seconds, and when
the script runs out it answers 500 "script exhausted" so a test that asks too often fails visibly.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Reply:
    """One scripted answer. `kind`: chat | status | garbage | empty | stream | truncated-stream."""

    kind: str = "chat"
    content: str = ""
    finish_reason: str = "stop"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    usage: tuple[int, int] | None = (100, 50)


def chat(content: str, **kw: Any) -> Reply:
    return Reply("chat", content, **kw)


def python_block(code: str, prose: str = "Here is the candidate.") -> str:
    return f"{prose}\n\n```python\n{code.strip()}\n```\n"


class FakeLLMServer:
    def __init__(self, script: list[Reply], *, model: str = "fake-model", lifetime_s: float = 60.0) -> None:
        self.script = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": server.model, "object": "model",
                                                                 "created": 0, "owned_by": "kstrata-tests"}]})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = None
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    reply = server.script.pop(0) if server.script else None
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                self._counted = True
                try:
                    self._reply(reply, body)
                finally:
                    self._leave()

            def _leave(self) -> None:
                # A request stops counting as in flight before its answer is sent: once the client has the
                # answer it may send its next request, which must not find this one still counted.
                if getattr(self, "_counted", False):
                    self._counted = False
                    with server._lock:
                        server.in_flight -= 1

            def _reply(self, reply: Reply | None, body: Any) -> None:
                if reply is None:
                    self._json(500, {"error": {"message": "script exhausted"}})
                    return
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self._leave()
                try:
                    self._answer(reply, body or {})
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _answer(self, reply: Reply, body: dict[str, Any]) -> None:
                if reply.kind == "status":
                    self._json(reply.status, {"error": {"message": reply.content or f"scripted {reply.status}",
                                                        "type": "scripted"}}, reply.headers)
                elif reply.kind in ("garbage", "empty"):
                    data = b"" if reply.kind == "empty" else (reply.content or "<html>upstream proxy error").encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                elif reply.kind in ("stream", "truncated-stream"):
                    self._stream(reply, reply.kind == "truncated-stream")
                elif body.get("stream"):  # a plain completion, asked for as a stream
                    self._stream(reply, False)
                else:
                    usage = None if reply.usage is None else {"prompt_tokens": reply.usage[0],
                                                              "completion_tokens": reply.usage[1],
                                                              "total_tokens": sum(reply.usage)}
                    self._json(200, {"id": "cmpl-1", "object": "chat.completion", "created": int(time.time()),
                                     "model": body.get("model", server.model),
                                     "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                                                  "message": {"role": "assistant", "content": reply.content}}],
                                     "usage": usage})

            def _stream(self, reply: Reply, cut: bool) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()

                def send(obj: Any) -> None:
                    data = f"data: {json.dumps(obj) if not isinstance(obj, str) else obj}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                text = reply.content
                pieces = [text[i:i + 40] for i in range(0, len(text), 40)]
                if cut:
                    pieces = pieces[: max(1, len(pieces) // 2)]
                for p in pieces:
                    send({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": server.model,
                          "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]})
                if cut:  # the connection drops: no finish reason, no [DONE], no terminating chunk
                    self.close_connection = True
                    return
                send({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": server.model,
                      "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
                if reply.usage:
                    send({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": server.model,
                          "choices": [], "usage": {"prompt_tokens": reply.usage[0],
                                                   "completion_tokens": reply.usage[1],
                                                   "total_tokens": sum(reply.usage)}})
                send("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

        self._httpd = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True
        self._stopped = False

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/v1"

    def start(self) -> FakeLLMServer:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._timer.cancel()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def wait_requests(self, n: int, timeout_s: float = 10.0) -> int:
        """How many requests arrived, once `n` have or `timeout_s` passed: a client that gave up on a slow
        answer (a timeout) has sent its request before the server's thread may have read it."""
        import time

        deadline = time.monotonic() + timeout_s
        while len(self.requests) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(self.requests)

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
