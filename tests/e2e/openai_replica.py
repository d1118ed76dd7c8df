#!/usr/bin/python3
"""A small OpenAI-style model server for the front-door tests: the endpoints
the openai client's calls reach, answered from the request (the model named,
what was uploaded), standard library only.

  GET  /health, /v1/models
  POST /v1/chat/completions (stream or not), /v1/completions, /v1/responses,
       /v1/embeddings (float or base64), /v1/audio/transcriptions and
       /v1/audio/translations (multipart: model and file), anything else
       under /v1/ or the extension paths: {"path", "model"}

As a process (a process-backend command): --port P [--load-ms MS] binds only
after MS (a model loading), [--error-status N] answers every POST with N and
an OpenAI error body (with --vllm-error, vLLM's: "object": "error" and the status as
"code"), [--delay-ms MS] answers POSTs after MS, [--gzip] gzips a chat stream for a client
that accepts gzip (as compression middleware does), [--no-stream] answers a chat request
with JSON whatever its "stream". In a test: Replica().start() serves on a thread.
"""

import argparse
import base64
import gzip
import json
import re
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def multipart_fields(body, content_type):
    """{name: bytes} of a multipart/form-data body."""
    m = re.search(r'boundary="?([^";]+)"?', content_type or "")
    if not m:
        return {}
    out = {}
    for part in body.split(b"--" + m.group(1).encode())[1:]:
        if part.startswith(b"--"):
            break
        head, _, data = part.partition(b"\r\n\r\n")
        name = re.search(rb'name="([^"]*)"', head)
        if name:
            out[name.group(1).decode()] = data[:-2] if data.endswith(b"\r\n") else data
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    error_status = 0
    delay_ms = 0
    counts = None

    def log_message(self, *args):
        pass

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.counts["GET " + self.path] = self.counts.get("GET " + self.path, 0) + 1
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        else:
            self.send_json(200, {"object": "list", "data": [
                {"id": "replica-own-id", "object": "model", "created": 0, "owned_by": "x"}]})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        path = self.path.split("?")[0]
        self.counts["POST " + path] = self.counts.get("POST " + path, 0) + 1
        time.sleep(self.delay_ms / 1000)
        if self.error_status and getattr(self, "vllm_error", False):
            self.send_json(self.error_status, {
                "object": "error", "message": "the replica cannot serve this now",
                "type": "ServiceUnavailableError", "param": None, "code": self.error_status})
            return
        if self.error_status:
            self.send_json(self.error_status, {"error": {
                "message": "the replica cannot serve this now", "type": "replica_error",
                "param": None, "code": "replica_busy"}})
            return
        ctype = self.headers.get("Content-Type", "")
        if ctype.startswith("multipart/form-data"):
            fields = multipart_fields(body, ctype)
            model = fields.get("model", b"").decode()
            self.send_json(200, {"text": f"{len(fields.get('file', b''))} bytes for {model}",
                                 "path": path, "model": model})
            return
        req = json.loads(body or b"{}")
        model = req.get("model", "")
        now = int(time.time())
        if path == "/v1/chat/completions" and req.get("stream") and not getattr(
                self, "no_stream", False):
            self.stream_chat(model, now)
        elif path == "/v1/chat/completions":
            self.send_json(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": now,
                                 "model": model, "choices": [{
                                     "index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "hello"}}]})
        elif path == "/v1/responses":
            self.send_json(200, {
                "id": "resp_1", "object": "response", "created_at": now, "status": "completed",
                "model": model, "output": [{
                    "type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer from {model}",
                                 "annotations": []}]}],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": []})
        elif path == "/v1/embeddings":
            vec = [0.5, 0.25, 0.125]
            emb = (base64.b64encode(struct.pack("<3f", *vec)).decode()
                   if req.get("encoding_format") == "base64" else vec)
            self.send_json(200, {"object": "list", "model": model, "data": [
                {"object": "embedding", "index": 0, "embedding": emb}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1}})
        else:
            self.send_json(200, {"path": path, "model": model})

    def stream_chat(self, model, now):
        coded = getattr(self, "gzip", False) and "gzip" in self.headers.get("Accept-Encoding", "")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        if coded:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        events = []
        for i, word in enumerate(["one ", "two ", "three"]):
            chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": now,
                     "model": model, "choices": [{"index": 0, "delta": {"content": word},
                                                  "finish_reason": "stop" if i == 2 else None}]}
            events.append(f"data: {json.dumps(chunk)}\n\n".encode())
        events.append(b"data: [DONE]\n\n")
        if coded:
            events = [gzip.compress(b"".join(events))]
        for e in events:
            self.write_chunk(e)
        self.wfile.write(b"0\r\n\r\n")

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class Replica:
    """The server on a thread, on an ephemeral loopback port."""

    def __init__(self, error_status=0):
        self.counts = {}
        handler = type("H", (Handler,), {"error_status": error_status, "counts": self.counts})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--load-ms", type=int, default=0)
    ap.add_argument("--error-status", type=int, default=0)
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--vllm-error", action="store_true")
    ap.add_argument("--gzip", action="store_true")
    ap.add_argument("--no-stream", action="store_true")
    a = ap.parse_args()
    time.sleep(a.load_ms / 1000)
    handler = type("H", (Handler,), {"error_status": a.error_status, "delay_ms": a.delay_ms,
                                     "vllm_error": a.vllm_error, "gzip": a.gzip,
                                     "no_stream": a.no_stream, "counts": {}})
    server = ThreadingHTTPServer(("127.0.0.1", a.port), handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
