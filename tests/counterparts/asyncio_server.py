#!/usr/bin/python3
"""An OpenAI-style model server on asyncio streams with its own HTTP/1.1 parser.

It models what real model servers do that a proxy in front of them must cope
with: binding only once the weights are loaded (or answering 503 while they
load), closing idle keep-alive connections after a few seconds, accepting new
connections slowly, and resetting or dropping connections.  See README.md.

Prints `LISTENING <port>` on stdout once it accepts connections.
"""
import argparse
import asyncio
import http
import math
import os
import signal
import socket
import struct
import sys
import time
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_payloads as mp  # noqa: E402

MAX_LINE = 8190
MAX_HEADERS = 100
MAX_BODY = 16 * 1024 * 1024
HEADER_TIMEOUT = 30.0


class BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class Request:
    def __init__(self, method, target, version, headers):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers  # list of (lower-case name, value)
        parts = urlsplit(target)
        self.path = parts.path
        self.query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.body = b""

    def header(self, name):
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def header_all(self, name):
        return [v for k, v in self.headers if k == name]

    def connection_tokens(self):
        toks = set()
        for v in self.header_all("connection"):
            toks.update(t.strip().lower() for t in v.split(","))
        return toks

    def wants_keep_alive(self):
        toks = self.connection_tokens()
        if self.version == "HTTP/1.0":
            return "keep-alive" in toks
        return "close" not in toks


async def read_line(reader):
    try:
        line = await reader.readline()
    except ValueError:  # longer than the stream limit
        raise BadRequest(431, "header line too long")
    if len(line) > MAX_LINE:
        raise BadRequest(431, "header line too long")
    return line


async def read_head(reader, first_line):
    """Parses the request line and headers; the first line was read by the caller."""
    line = first_line.rstrip(b"\r\n")
    try:
        method, target, version = line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise BadRequest(400, "malformed request line")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505, "unsupported HTTP version")
    if not method.isalpha() or not target.startswith("/"):
        raise BadRequest(400, "malformed request line")
    headers = []
    while True:
        raw = await read_line(reader)
        if not raw:
            raise BadRequest(400, "connection closed inside the headers")
        raw = raw.rstrip(b"\r\n")
        if not raw:
            break
        if len(headers) >= MAX_HEADERS:
            raise BadRequest(431, "too many headers")
        name, sep, value = raw.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise BadRequest(400, "malformed header line")
        try:
            headers.append((name.decode("ascii").lower(), value.strip().decode("latin-1")))
        except UnicodeDecodeError:
            raise BadRequest(400, "malformed header name")
    return Request(method, target, version, headers)


async def read_chunked(reader):
    body = bytearray()
    while True:
        size_line = (await read_line(reader)).rstrip(b"\r\n")
        size_txt = size_line.split(b";", 1)[0].strip()
        try:
            if not size_txt or any(c not in b"0123456789abcdefABCDEF" for c in size_txt):
                raise ValueError
            size = int(size_txt, 16)
        except ValueError:
            raise BadRequest(400, "invalid chunk size")
        if size == 0:
            while (await read_line(reader)).rstrip(b"\r\n"):
                pass  # trailers are ignored
            return bytes(body)
        if len(body) + size > MAX_BODY:
            raise BadRequest(413, "request body too large")
        try:
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise BadRequest(400, "chunk not followed by CRLF")
        except asyncio.IncompleteReadError:
            raise BadRequest(400, "connection closed inside the body")


async def read_body(reader, writer, req):
    te = req.header_all("transfer-encoding")
    cl = req.header_all("content-length")
    if te and cl:
        raise BadRequest(400, "both Transfer-Encoding and Content-Length")
    if (req.header("expect") or "").lower() == "100-continue" and (te or cl):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if te:
        codings = [c.strip().lower() for v in te for c in v.split(",")]
        if codings[-1] != "chunked" or codings.count("chunked") != 1:
            raise BadRequest(501, "unsupported transfer coding")
        return await read_chunked(reader)
    if cl:
        if len(set(cl)) != 1 or not cl[0].isdigit():
            raise BadRequest(400, "invalid Content-Length")
        length = int(cl[0])
        if length > MAX_BODY:
            raise BadRequest(413, "request body too large")
        try:
            return await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            raise BadRequest(400, "connection closed inside the body")
    return b""


def reason(status):
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Status"


def reset_connection(writer):
    """Closes with RST: SO_LINGER on with a zero timeout, then close."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class ModelServer:
    def __init__(self, args):
        self.args = args
        self.port = 0
        self.served_by = ""
        self.load_deadline = time.monotonic() + args.load_seconds
        self.requests = 0
        self.connections = 0
        self.inflight = 0
        self.max_inflight = 0
        self.by_path = {}
        self.acceptor = asyncio.Lock()
        self.writers = set()
        # Sleep mode (vLLM's --enable-sleep-mode): asleep or waking, the
        # generation routes answer 503.
        self.sleeping = False
        self.sleeps = 0
        self.wakes = 0

    def loaded(self):
        return time.monotonic() >= self.load_deadline

    # --- responses -------------------------------------------------------

    def head(self, status, headers, close):
        lines = [f"HTTP/1.1 {status} {reason(status)}",
                 f"x-served-by: {self.served_by}"]
        lines += [f"{k}: {v}" for k, v in headers]
        lines.append("connection: close" if close else "connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(self, writer, req, status, body, close=False, headers=(),
                   content_type="application/json"):
        hdrs = [("content-type", content_type), ("content-length", str(len(body)))]
        hdrs += list(headers)
        writer.write(self.head(status, hdrs, close))
        if req is None or req.method != "HEAD":
            writer.write(body)
        await writer.drain()

    async def send_error(self, writer, req, status, message, err_type, close=False, headers=()):
        await self.send(writer, req, status, mp.error_body(message, err_type, status),
                        close=close, headers=headers)

    async def send_stream(self, writer, req, kind, n, close):
        """SSE with chunked transfer encoding; an HTTP/1.0 client gets close-delimited."""
        chunked = req.version == "HTTP/1.1"
        close = close or not chunked
        hdrs = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        if chunked:
            hdrs.append(("transfer-encoding", "chunked"))
        writer.write(self.head(200, hdrs, close))
        await writer.drain()
        delay = self.args.token_delay_ms / 1000.0
        for frame in mp.stream_events(kind, self.args.model, n):
            if delay and frame != b"data: [DONE]\n\n":
                await asyncio.sleep(delay)
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame) if chunked else frame)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return close

    # --- routing ---------------------------------------------------------

    async def handle(self, writer, req, close):
        """Answers one request; returns True when the connection must close."""
        path = req.path
        if path.startswith("/fault/"):
            return await self.handle_fault(writer, req, close)
        if not self.loaded():
            retry = max(1, math.ceil(self.load_deadline - time.monotonic()))
            await self.send_error(writer, req, 503, "model is loading", "unavailable",
                                  close, headers=[("retry-after", str(retry))])
            return close
        limit = self.args.max_concurrency
        if limit and self.inflight > limit:
            await self.send_error(writer, req, 429, "too many requests in flight",
                                  "overloaded", close)
            return close
        if self.sleeping and path in ("/v1/chat/completions", "/v1/completions",
                                      "/v1/embeddings"):
            await self.send_error(writer, req, 503, "the model is sleeping", "unavailable", close)
            return close
        routes = {
            "/health": ("GET", self.route_health),
            "/v1/models": ("GET", self.route_models),
            "/v1/chat/completions": ("POST", self.route_chat),
            "/v1/completions": ("POST", self.route_completions),
            "/v1/embeddings": ("POST", self.route_embeddings),
        }
        if self.args.enable_sleep_mode:
            routes["/sleep"] = ("POST", self.route_sleep)
            routes["/wake_up"] = ("POST", self.route_wake_up)
            routes["/is_sleeping"] = ("GET", self.route_is_sleeping)
        if path not in routes:
            await self.send_error(writer, req, 404, f"no route for {path}", "not_found", close)
            return close
        method, fn = routes[path]
        if req.method != method and not (method == "GET" and req.method == "HEAD"):
            await self.send_error(writer, req, 405, "method not allowed", "invalid_request_error",
                                  close, headers=[("allow", method)])
            return close
        return await fn(writer, req, close)

    async def route_health(self, writer, req, close):
        await self.send(writer, req, 200, mp.dumps({"status": "ok"}), close)
        return close

    async def route_models(self, writer, req, close):
        await self.send(writer, req, 200, mp.models_list(self.args.model), close)
        return close

    # --- sleep mode, as vLLM serves it: POST /sleep?level=1|2 and POST
    # /wake_up answer 200 with an empty body once done; GET /is_sleeping.

    async def route_sleep(self, writer, req, close):
        level = req.query.get("level", "1")
        if level not in ("1", "2"):
            await self.send_error(writer, req, 400, "level must be 1 or 2",
                                  "invalid_request_error", close)
            return close
        if self.args.fail_sleep:
            await self.send_error(writer, req, 500, "sleep failed", "internal_error", close)
            return close
        if not self.sleeping:
            await asyncio.sleep(self.args.sleep_seconds)
            self.sleeping = True
            self.sleeps += 1
        await self.send(writer, req, 200, b"", close)
        return close

    async def route_wake_up(self, writer, req, close):
        if self.args.fail_wake:
            await self.send_error(writer, req, 500, "wake_up failed", "internal_error", close)
            return close
        if self.sleeping:
            await asyncio.sleep(self.args.wake_seconds)
            self.sleeping = False
            self.wakes += 1
        await self.send(writer, req, 200, b"", close)
        return close

    async def route_is_sleeping(self, writer, req, close):
        await self.send(writer, req, 200, mp.dumps({"is_sleeping": self.sleeping}), close)
        return close

    async def parse_body(self, writer, req, close):
        obj, err = mp.parse_request(req.body)
        if err:
            await self.send_error(writer, req, 400, err, "invalid_request_error", close)
            return None
        if self.args.strict_model and obj.get("model") != self.args.model:
            await self.send_error(writer, req, 404, f"the model `{obj.get('model')}` does not exist",
                                  "not_found", close)
            return None
        return obj

    async def generate(self, writer, req, close, kind):
        obj = await self.parse_body(writer, req, close)
        if obj is None:
            return close
        n = mp.token_count(obj, self.args.tokens)
        if obj.get("stream") is True:
            return await self.send_stream(writer, req, kind, n, close)
        if self.args.token_delay_ms:
            await asyncio.sleep(n * self.args.token_delay_ms / 1000.0)
        await self.send(writer, req, 200, mp.completion(kind, self.args.model, n, self.served_by),
                        close)
        return close

    async def route_chat(self, writer, req, close):
        return await self.generate(writer, req, close, "chat")

    async def route_completions(self, writer, req, close):
        return await self.generate(writer, req, close, "text")

    async def route_embeddings(self, writer, req, close):
        obj = await self.parse_body(writer, req, close)
        if obj is None:
            return close
        body, err = mp.embeddings(self.args.model, obj)
        if err:
            await self.send_error(writer, req, 400, err, "invalid_request_error", close)
        else:
            await self.send(writer, req, 200, body, close)
        return close

    async def handle_fault(self, writer, req, close):
        path = req.path
        if path == "/fault/reset":
            reset_connection(writer)
            return True
        if path == "/fault/close":
            writer.close()
            return True
        if path == "/fault/hang":
            await asyncio.sleep(3600)
            return True
        if path == "/fault/slow-headers":
            ms = int(req.query.get("ms", "500"))
            writer.write(f"HTTP/1.1 200 {reason(200)}\r\n".encode())
            await writer.drain()
            await asyncio.sleep(ms / 1000.0)
            body = mp.dumps({"status": "ok"})
            writer.write(f"x-served-by: {self.served_by}\r\ncontent-type: application/json\r\n"
                         f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
            await writer.drain()
            return True
        if path == "/fault/reset-mid":
            events = int(req.query.get("events", "2"))
            writer.write(self.head(200, [("content-type", "text/event-stream"),
                                         ("transfer-encoding", "chunked")], False))
            for frame in list(mp.stream_events("chat", self.args.model, events + 5))[:events]:
                writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
            await asyncio.sleep(0.05)
            reset_connection(writer)
            return True
        if path == "/fault/status":
            code = int(req.query.get("code", "500"))
            await self.send_error(writer, req, code, f"injected status {code}", "injected", close)
            return close
        await self.send_error(writer, req, 404, f"no fault {path}", "not_found", close)
        return close

    # --- connections -----------------------------------------------------

    async def serve_connection(self, reader, writer):
        self.connections += 1
        self.writers.add(writer)
        try:
            if self.args.accept_delay_ms:
                # One connection at a time, like a single slow accept loop.
                async with self.acceptor:
                    await asyncio.sleep(self.args.accept_delay_ms / 1000.0)
            await self.request_loop(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self.writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def request_loop(self, reader, writer):
        first = True
        while True:
            if first:
                line = await read_line(reader)
            else:
                # Like uvicorn: the keep-alive timer runs from the end of a response.
                try:
                    line = await asyncio.wait_for(read_line(reader), self.args.idle_timeout)
                except asyncio.TimeoutError:
                    return
            first = False
            if not line:
                return
            if line in (b"\r\n", b"\n"):
                first = True  # a stray CRLF between requests is allowed
                continue
            try:
                req = await asyncio.wait_for(read_head(reader, line), HEADER_TIMEOUT)
                req.body = await read_body(reader, writer, req)
            except BadRequest as e:
                await self.send_error(writer, None, e.status, e.message, "invalid_request_error",
                                      close=True)
                return
            except asyncio.TimeoutError:
                return
            if req.path != "/stats":
                self.requests += 1
                self.by_path[req.path] = self.by_path.get(req.path, 0) + 1
            close = not req.wants_keep_alive()
            if req.path == "/stats":
                await self.send(writer, req, 200, self.stats_body(), close)
            else:
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
                try:
                    close = await self.handle(writer, req, close)
                finally:
                    self.inflight -= 1
            if close:
                return

    def stats_body(self):
        return mp.dumps({"requests": self.requests, "connections": self.connections,
                         "max_inflight": self.max_inflight, "inflight": self.inflight,
                         "by_path": self.by_path, "loaded": self.loaded(),
                         "sleeping": self.sleeping, "sleeps": self.sleeps, "wakes": self.wakes,
                         "pid": os.getpid(), "port": self.port})


async def main_async(args):
    srv = ModelServer(args)
    if args.loading_mode == "bind-late" and args.load_seconds > 0:
        await asyncio.sleep(args.load_seconds)
    server = await asyncio.start_server(srv.serve_connection, "127.0.0.1", args.port,
                                        limit=MAX_LINE + 2, backlog=args.backlog)
    srv.port = server.sockets[0].getsockname()[1]
    srv.served_by = f"{os.getpid()}:{srv.port}"
    print(f"LISTENING {srv.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    for w in list(srv.writers):
        w.transport.abort()
    await server.wait_closed()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="counterpart-model")
    p.add_argument("--load-seconds", type=float, default=0.0)
    p.add_argument("--loading-mode", choices=["bind-late", "503"], default="bind-late")
    p.add_argument("--idle-timeout", type=float, default=5.0)
    p.add_argument("--max-concurrency", type=int, default=0,
                   help="answer 429 when more requests than this are in flight (0: no limit)")
    p.add_argument("--accept-delay-ms", type=float, default=0.0)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--strict-model", action="store_true",
                   help="answer 404 when the request's model is not --model")
    p.add_argument("--backlog", type=int, default=128)
    p.add_argument("--enable-sleep-mode", action="store_true",
                   help="serve POST /sleep, POST /wake_up and GET /is_sleeping as vLLM does")
    p.add_argument("--sleep-seconds", type=float, default=0.01)
    p.add_argument("--wake-seconds", type=float, default=0.05)
    p.add_argument("--fail-sleep", action="store_true", help="answer /sleep with 500")
    p.add_argument("--fail-wake", action="store_true", help="answer /wake_up with 500")
    return p.parse_args(argv)


def main():
    asyncio.run(main_async(parse_args()))


if __name__ == "__main__":
    main()
