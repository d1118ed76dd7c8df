#!/usr/bin/python3
"""Minimal OpenAI-style model server on asyncio streams (Python 3.11 stdlib only).

Mimics how Python model servers (vLLM / FastAPI on uvicorn) behave while
loading and serving, for benchmarking how quickly a proxy in front of it
notices readiness and releases held requests.

Loading modes:
  bind-late  the listening socket is created only after --load-ms elapsed;
             until then connections are refused.
  503        bound at once; every request answers 503 + Retry-After: 1 with a
             JSON error until --load-ms elapsed.

--ready-file PATH: when the server first answers GET /health with 200, the
CLOCK_MONOTONIC time (ns, decimal) taken just before the response bytes are
written is stored atomically in PATH (tmp file + rename), once.

Prints "LISTENING <port>" (flushed) once connections are accepted.
"""

import argparse
import asyncio
import email.utils
import json
import os
import signal
import sys
import time

HEAD_LIMIT = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
SERVER_NAME = b"asyncio-model"

REASONS = {
    100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found",
    405: "Method Not Allowed", 411: "Length Required",
    413: "Payload Too Large", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented",
    503: "Service Unavailable",
}

LOADING_BODY = json.dumps(
    {"error": {"message": "Loading model", "type": "unavailable", "code": 503}}
).encode()
HEALTH_BODY = b'{"status":"ok"}'


class BadRequest(Exception):
    def __init__(self, status=400, message="Bad Request"):
        super().__init__(message)
        self.status = status
        self.message = message


_date_cache = [0, b""]


def http_date():
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = email.utils.formatdate(now, usegmt=True).encode()
    return _date_cache[1]


def error_body(message, etype, code):
    return json.dumps({"error": {"message": message, "type": etype, "code": code}}).encode()


def build_response(status, body, keep_alive, ctype=b"application/json", extra=()):
    parts = [
        b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, "Unknown").encode()),
        b"date: " + http_date() + b"\r\n",
        b"server: " + SERVER_NAME + b"\r\n",
        b"content-type: " + ctype + b"\r\n",
        b"content-length: %d\r\n" % len(body),
    ]
    for name, value in extra:
        parts.append(name + b": " + value + b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    parts.append(body)
    return b"".join(parts)


class Request:
    __slots__ = ("method", "target", "path", "version", "headers", "body", "keep_alive")


class ModelServer:
    def __init__(self, args):
        self.args = args
        self.loaded = False
        self.ready_written = False
        self.requests = 0
        self.connections = 0
        self.inflight = 0
        self.max_inflight = 0
        self.writers = set()
        self.server = None
        self.seq = 0

    # ------------------------------------------------------------------ parsing
    async def read_request(self, reader, writer, timeout):
        """Returns a Request, or None on clean EOF / idle timeout."""
        try:
            if timeout is not None:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            else:
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.TimeoutError:
            return None
        except asyncio.IncompleteReadError as e:
            if e.partial.strip():
                raise BadRequest(400, "Incomplete request head")
            return None
        except asyncio.LimitOverrunError:
            raise BadRequest(400, "Request head exceeds 64 KiB")

        lines = head[:-4].split(b"\r\n")
        # Tolerate (ignore) leading empty lines before the request line (RFC 9112 2.2).
        while lines and lines[0] == b"":
            lines.pop(0)
        if not lines:
            raise BadRequest(400, "Empty request")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise BadRequest(400, "Malformed request line")
        method, target, version = parts
        if not method.isalpha() or not method.isupper():
            raise BadRequest(400, "Malformed method")
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise BadRequest(400, "Unsupported HTTP version")
        headers = {}
        for line in lines[1:]:
            if not line or line[:1] in (b" ", b"\t"):
                raise BadRequest(400, "Malformed header line")
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip() or b" " in name:
                raise BadRequest(400, "Malformed header line")
            name = name.lower().decode("latin-1")
            value = value.strip().decode("latin-1")
            if name in headers:
                if name == "content-length" and headers[name] != value:
                    raise BadRequest(400, "Conflicting Content-Length")
                headers[name] = headers[name] + ", " + value
            else:
                headers[name] = value

        req = Request()
        req.method = method.decode()
        req.target = target.decode("latin-1")
        if req.target.startswith(("http://", "https://")):
            rest = req.target.split("://", 1)[1]
            slash = rest.find("/")
            req.target = rest[slash:] if slash >= 0 else "/"
        req.path = req.target.split("?", 1)[0]
        req.version = version
        req.headers = headers
        conn_tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if version == b"HTTP/1.0":
            req.keep_alive = False  # HTTP/1.0 closes after the response
        else:
            req.keep_alive = "close" not in conn_tokens

        # ---- body
        te = headers.get("transfer-encoding")
        cl = headers.get("content-length")
        if te is not None:
            codings = [c.strip().lower() for c in te.split(",") if c.strip()]
            if codings != ["chunked"]:
                raise BadRequest(501, "Unsupported Transfer-Encoding")
            if headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            req.body = await self.read_chunked(reader)
        elif cl is not None:
            cl = cl.split(",")[0].strip()
            if not cl.isdigit():
                raise BadRequest(400, "Invalid Content-Length")
            n = int(cl)
            if n > MAX_BODY:
                raise BadRequest(413, "Request body too large")
            if n and headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                req.body = await reader.readexactly(n) if n else b""
            except asyncio.IncompleteReadError:
                raise BadRequest(400, "Incomplete body")
        else:
            req.body = b""
        return req

    async def read_chunked(self, reader):
        chunks = []
        total = 0
        try:
            while True:
                line = await reader.readuntil(b"\r\n")
                size_s = line[:-2].split(b";", 1)[0].strip()
                try:
                    size = int(size_s, 16)
                except ValueError:
                    raise BadRequest(400, "Malformed chunk size")
                if size < 0:
                    raise BadRequest(400, "Malformed chunk size")
                if size == 0:
                    # trailers until an empty line
                    while True:
                        t = await reader.readuntil(b"\r\n")
                        if t == b"\r\n":
                            return b"".join(chunks)
                total += size
                if total > MAX_BODY:
                    raise BadRequest(413, "Request body too large")
                data = await reader.readexactly(size + 2)
                if data[-2:] != b"\r\n":
                    raise BadRequest(400, "Malformed chunk")
                chunks.append(data[:-2])
        except asyncio.IncompleteReadError:
            raise BadRequest(400, "Incomplete chunked body")
        except asyncio.LimitOverrunError:
            raise BadRequest(400, "Chunk line too long")

    # ------------------------------------------------------------------ serving
    async def handle_conn(self, reader, writer):
        self.connections += 1
        self.writers.add(writer)
        idle = self.args.idle_timeout
        first = True
        try:
            while True:
                # Like uvicorn: the keep-alive timer runs after a response.
                try:
                    req = await self.read_request(reader, writer, None if first else idle)
                except BadRequest as e:
                    writer.write(build_response(
                        e.status, error_body(e.message, "invalid_request_error", e.status),
                        False))
                    await writer.drain()
                    break
                if req is None:
                    break
                first = False
                self.requests += 1
                self.inflight += 1
                if self.inflight > self.max_inflight:
                    self.max_inflight = self.inflight
                try:
                    keep = await self.dispatch(req, writer)
                finally:
                    self.inflight -= 1
                await writer.drain()
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self.writers.discard(writer)
            try:
                writer.close()
            except Exception:
                pass

    async def dispatch(self, req, writer):
        """Handle one request; returns whether to keep the connection open."""
        ka = req.keep_alive
        if not self.loaded:
            writer.write(build_response(503, LOADING_BODY, ka, extra=((b"retry-after", b"1"),)))
            return ka
        path, method = req.path, req.method
        if path == "/health":
            if method not in ("GET", "HEAD"):
                return self.not_allowed(writer, ka, b"GET")
            resp = build_response(200, HEALTH_BODY, ka)
            if method == "HEAD":
                resp = resp[: -len(HEALTH_BODY)]
            if self.args.ready_file and not self.ready_written:
                self.ready_written = True
                ts = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                writer.write(resp)
                self.write_ready_file(ts)
            else:
                writer.write(resp)
            return ka
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                return self.not_allowed(writer, ka, b"POST")
            return await self.completion(req, writer, chat=(path == "/v1/chat/completions"))
        if path == "/stats":
            if method != "GET":
                return self.not_allowed(writer, ka, b"GET")
            body = json.dumps({
                "requests": self.requests,
                "connections": self.connections,
                "max_inflight": self.max_inflight,
                "inflight": self.inflight,
            }).encode()
            writer.write(build_response(200, body, ka))
            return ka
        writer.write(build_response(404, error_body("Not Found", "not_found", 404), ka))
        return ka

    def not_allowed(self, writer, ka, allow):
        writer.write(build_response(
            405, error_body("Method Not Allowed", "invalid_request_error", 405), ka,
            extra=((b"allow", allow),)))
        return ka

    def write_ready_file(self, ts):
        path = self.args.ready_file
        tmp = "%s.tmp.%d" % (path, os.getpid())
        try:
            with open(tmp, "w") as f:
                f.write("%d\n" % ts)
            os.replace(tmp, path)
        except OSError as e:
            print("ready-file write failed: %s" % e, file=sys.stderr, flush=True)

    async def completion(self, req, writer, chat):
        ka = req.keep_alive
        try:
            payload = json.loads(req.body) if req.body.strip() else {}
            if not isinstance(payload, dict):
                raise ValueError("body must be a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            writer.write(build_response(
                400, error_body("Invalid JSON body: %s" % e, "invalid_request_error", 400), ka))
            return ka
        ntok = max(0, self.args.tokens)
        delay = self.args.token_ms / 1000.0
        model = str(payload.get("model") or "asyncio-model")
        self.seq += 1
        rid = ("chatcmpl-%d-%d" if chat else "cmpl-%d-%d") % (os.getpid(), self.seq)
        created = int(time.time())
        prompt = payload.get("messages") if chat else payload.get("prompt")
        prompt_tokens = max(1, len(json.dumps(prompt).split())) if prompt else 0
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": ntok,
                 "total_tokens": prompt_tokens + ntok}

        if payload.get("stream"):
            return await self.stream(writer, req, chat, ntok, delay, model, rid, created)

        if delay > 0 and ntok:
            await asyncio.sleep(delay * ntok)
        text = "".join(" tok%d" % i for i in range(ntok))
        if chat:
            obj = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                   "choices": [{"index": 0,
                                "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": "length"}],
                   "usage": usage}
        else:
            obj = {"id": rid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": None,
                                "finish_reason": "length"}],
                   "usage": usage}
        writer.write(build_response(200, json.dumps(obj).encode(), ka))
        return ka

    async def stream(self, writer, req, chat, ntok, delay, model, rid, created):
        chunked = req.version == b"HTTP/1.1"
        ka = req.keep_alive and chunked
        head = [
            b"HTTP/1.1 200 OK\r\n",
            b"date: " + http_date() + b"\r\n",
            b"server: " + SERVER_NAME + b"\r\n",
            b"content-type: text/event-stream; charset=utf-8\r\n",
            b"cache-control: no-cache\r\n",
        ]
        if chunked:
            head.append(b"transfer-encoding: chunked\r\n")
        if not ka:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        writer.write(b"".join(head))
        await writer.drain()

        def send(data):
            if chunked:
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                writer.write(data)

        obj_name = "chat.completion.chunk" if chat else "text_completion"
        for i in range(ntok):
            if delay > 0:
                await asyncio.sleep(delay)
            last = i == ntok - 1
            if chat:
                delta = {"content": " tok%d" % i}
                if i == 0:
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": "length" if last else None}
            else:
                choice = {"index": 0, "text": " tok%d" % i, "logprobs": None,
                          "finish_reason": "length" if last else None}
            ev = {"id": rid, "object": obj_name, "created": created, "model": model,
                  "choices": [choice]}
            send(b"data: " + json.dumps(ev).encode() + b"\n\n")
            await writer.drain()
        send(b"data: [DONE]\n\n")
        if chunked:
            writer.write(b"0\r\n\r\n")
        return ka

    # ------------------------------------------------------------------ lifecycle
    async def start_server(self):
        a = self.args
        self.server = await asyncio.start_server(
            self.handle_conn, host=a.host, port=a.port, backlog=a.backlog,
            limit=HEAD_LIMIT)
        port = self.server.sockets[0].getsockname()[1]
        sys.stdout.write("LISTENING %d\n" % port)
        sys.stdout.flush()

    async def main(self):
        a = self.args
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        stop_task = asyncio.ensure_future(stop.wait())

        load_s = max(0.0, a.load_ms / 1000.0)
        if a.loading_mode == "bind-late":
            if load_s > 0:
                done, _ = await asyncio.wait(
                    {stop_task, asyncio.ensure_future(asyncio.sleep(load_s))},
                    return_when=asyncio.FIRST_COMPLETED)
                if stop_task in done:
                    return 0
            self.loaded = True
            await self.start_server()
        else:
            await self.start_server()
            if load_s > 0:
                loop.call_later(load_s, self.set_loaded)
            else:
                self.loaded = True

        await stop_task
        self.server.close()
        for w in list(self.writers):
            try:
                w.transport.abort()
            except Exception:
                pass
        return 0

    def set_loaded(self):
        self.loaded = True


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0, help="0 = ephemeral")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--load-ms", type=float, default=0.0)
    p.add_argument("--loading-mode", choices=("bind-late", "503"), default="bind-late")
    p.add_argument("--ready-file", default=None)
    p.add_argument("--idle-timeout", type=float, default=5.0)
    p.add_argument("--backlog", type=int, default=100)
    p.add_argument("--token-ms", type=float, default=0.0)
    p.add_argument("--tokens", type=int, default=1)
    return p.parse_args(argv)


def main():
    args = parse_args()
    srv = ModelServer(args)
    rc = asyncio.run(srv.main())
    sys.stdout.flush()
    sys.exit(rc)


if __name__ == "__main__":
    main()
