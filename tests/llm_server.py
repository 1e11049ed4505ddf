"""A scripted OpenAI-compatible chat-completions server for tests, on 127.0.0.1.

It answers `POST /v1/chat/completions` from a script: a list of steps consumed in order, one
per request. A step is a dict:

    {"reply": "text"}                     one choice (or a list of texts: one choice each)
    {"status": 429, "headers": {...}}     an error status with an OpenAI-style error body
    {"delay": 2.0, ...}                   sleep before answering (client timeouts)
    {"raw": "not json"}                   a 200 with a body that is not a completion
    {"usage": {"prompt_tokens": 10, "completion_tokens": 5}}   override the token counts
    {"finish_reason": "length"}           a truncated reply

or a callable `step(request_json) -> dict` that decides from the request. Every request is
kept (body and headers) in `requests`. When the script runs out, the server answers 500 with
"script exhausted", so that a test that asks more than it scripted fails loudly.

Use it as a context manager: `with ScriptedServer(steps) as srv: srv.base_url`.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Step = dict[str, Any] | Callable[[dict], dict]


def tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: one token per four characters."""
    return max(1, len(text) // 4)


class ScriptedServer:
    def __init__(self, steps: list[Step] | None = None):
        self.steps: list[Step] = list(steps or [])
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                try:
                    req = json.loads(body)
                except ValueError:
                    req = {"_unparsed": body.decode(errors="replace")}
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "json": req})
                    step = server.steps.pop(0) if server.steps else None
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                if step is None:
                    return self._send(500, {"error": {"message": "script exhausted", "type": "server_error"}})
                if callable(step):
                    step = step(req)
                if step.get("delay"):
                    time.sleep(step["delay"])
                if "raw" in step:
                    return self._send(step.get("status", 200), step["raw"], step.get("headers"))
                status = step.get("status", 200)
                if status != 200:
                    err = {"error": {"message": step.get("message", f"scripted {status}"),
                                     "type": "rate_limit_error" if status == 429 else "server_error",
                                     "code": None, "param": None}}
                    return self._send(status, err, step.get("headers"))
                self._send(200, completion(req, step))

            def _send(self, status: int, payload: Any, headers: dict | None = None):
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, str(v))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def add(self, *steps: Step) -> None:
        with self.lock:
            self.steps.extend(steps)

    def chat_requests(self) -> list[dict]:
        return [r for r in self.requests if r["path"].rstrip("/") == "/v1/chat/completions"]

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(req: dict, step: dict) -> dict:
    replies = step.get("reply", "")
    replies = replies if isinstance(replies, list) else [replies]
    prompt = sum(tokens(m.get("content") or "") for m in req.get("messages", []))
    usage = step.get("usage") or {"prompt_tokens": prompt,
                                  "completion_tokens": sum(tokens(r) for r in replies)}
    usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
    return {
        "id": f"chatcmpl-{int(time.time() * 1e6)}", "object": "chat.completion",
        "created": int(time.time()), "model": req.get("model", "scripted"),
        "choices": [{"index": i, "message": {"role": "assistant", "content": r},
                     "finish_reason": step.get("finish_reason", "stop"), "logprobs": None}
                    for i, r in enumerate(replies)],
        "usage": None if step.get("no_usage") else usage,
    }


def serve_forever(steps_file: str) -> None:  # pragma: no cover - a manual aid
    """`python -m tests.llm_server steps.json`: serve a JSON list of steps and print the URL."""
    with open(steps_file) as f:
        steps = json.load(f)
    with ScriptedServer(steps) as srv:
        print(srv.base_url, flush=True)
        srv.thread.join()


if __name__ == "__main__":  # pragma: no cover
    import sys
    serve_forever(sys.argv[1])
