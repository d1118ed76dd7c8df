#!/usr/bin/python3
"""An OpenAI-style ASGI app served by a real uvicorn (Debian's python3-uvicorn).

uvicorn's own HTTP handling is the point: it closes idle keep-alive
connections after timeout_keep_alive (5 s by default), sends chunked streams,
and answers with its own headers (server, date).  See README.md.

Prints `LISTENING <port>` on stdout once uvicorn accepts connections.
"""
import argparse
import asyncio
import math
import os
import sys
import time

import uvicorn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_payloads as mp  # noqa: E402


class ModelApp:
    def __init__(self, args):
        self.args = args
        self.port = 0
        self.served_by = ""
        self.load_deadline = time.monotonic() + (
            args.load_seconds if args.loading_mode == "503" else 0.0)
        self.requests = 0
        self.clients = set()  # (host, port) of each connection seen
        self.inflight = 0
        self.max_inflight = 0
        self.by_path = {}

    def set_port(self, port):
        self.port = port
        self.served_by = f"{os.getpid()}:{port}"

    def loaded(self):
        return time.monotonic() >= self.load_deadline

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        client = scope.get("client")
        if client:
            self.clients.add(tuple(client))
        path = scope["path"]
        if path == "/stats":
            await self.send_json(send, 200, self.stats_body())
            return
        self.requests += 1
        self.by_path[path] = self.by_path.get(path, 0) + 1
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            body = await read_body(receive)
            await self.route(scope, body, send)
        finally:
            self.inflight -= 1

    async def lifespan(self, receive, send):
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def send_json(self, send, status, body, headers=()):
        hdrs = [(b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-served-by", self.served_by.encode())]
        hdrs += [(k.encode(), v.encode()) for k, v in headers]
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    async def send_error(self, send, status, message, err_type, headers=()):
        await self.send_json(send, status, mp.error_body(message, err_type, status), headers)

    async def route(self, scope, body, send):
        path, method = scope["path"], scope["method"]
        if not self.loaded():
            retry = max(1, math.ceil(self.load_deadline - time.monotonic()))
            await self.send_error(send, 503, "model is loading", "unavailable",
                                  [("retry-after", str(retry))])
            return
        limit = self.args.max_concurrency
        if limit and self.inflight > limit:
            await self.send_error(send, 429, "too many requests in flight", "overloaded")
            return
        routes = {
            "/health": "GET", "/v1/models": "GET", "/v1/chat/completions": "POST",
            "/v1/completions": "POST", "/v1/embeddings": "POST", "/fault/status": "GET",
            "/fault/hang": "GET",
        }
        if path not in routes:
            await self.send_error(send, 404, f"no route for {path}", "not_found")
            return
        if method != routes[path]:
            await self.send_error(send, 405, "method not allowed", "invalid_request_error",
                                  [("allow", routes[path])])
            return
        if path == "/health":
            await self.send_json(send, 200, mp.dumps({"status": "ok"}))
        elif path == "/v1/models":
            await self.send_json(send, 200, mp.models_list(self.args.model))
        elif path == "/fault/status":
            code = int(query_value(scope, "code", "500"))
            await self.send_error(send, code, f"injected status {code}", "injected")
        elif path == "/fault/hang":
            await asyncio.sleep(3600)
        else:
            await self.generate(path, body, send)

    async def generate(self, path, body, send):
        obj, err = mp.parse_request(body)
        if err:
            await self.send_error(send, 400, err, "invalid_request_error")
            return
        if self.args.strict_model and obj.get("model") != self.args.model:
            await self.send_error(send, 404, f"the model `{obj.get('model')}` does not exist",
                                  "not_found")
            return
        if path == "/v1/embeddings":
            out, err = mp.embeddings(self.args.model, obj)
            if err:
                await self.send_error(send, 400, err, "invalid_request_error")
            else:
                await self.send_json(send, 200, out)
            return
        kind = "chat" if path == "/v1/chat/completions" else "text"
        n = mp.token_count(obj, self.args.tokens)
        delay = self.args.token_delay_ms / 1000.0
        if obj.get("stream") is not True:
            if delay:
                await asyncio.sleep(n * delay)
            await self.send_json(send, 200, mp.completion(kind, self.args.model, n,
                                                          self.served_by))
            return
        # No content-length: uvicorn sends the stream with chunked encoding.
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache"),
                                (b"x-served-by", self.served_by.encode())]})
        for frame in mp.stream_events(kind, self.args.model, n):
            if delay and frame != b"data: [DONE]\n\n":
                await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    def stats_body(self):
        return mp.dumps({"requests": self.requests, "connections": len(self.clients),
                         "max_inflight": self.max_inflight, "inflight": self.inflight,
                         "by_path": self.by_path, "loaded": self.loaded(),
                         "pid": os.getpid(), "port": self.port})


def query_value(scope, key, default):
    from urllib.parse import parse_qs
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(key)
    return values[-1] if values else default


async def read_body(receive):
    body = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    return bytes(body)


async def main_async(args):
    if args.loading_mode == "bind-late" and args.load_seconds > 0:
        await asyncio.sleep(args.load_seconds)
    app = ModelApp(args)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port,
                            timeout_keep_alive=args.idle_timeout, log_level="warning",
                            lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving
            sys.exit("uvicorn did not start")
        await asyncio.sleep(0.01)
    app.set_port(server.servers[0].sockets[0].getsockname()[1])
    print(f"LISTENING {app.port}", flush=True)
    await serving


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="counterpart-model")
    p.add_argument("--load-seconds", type=float, default=0.0)
    p.add_argument("--loading-mode", choices=["bind-late", "503"], default="bind-late")
    p.add_argument("--idle-timeout", type=float, default=5,
                   help="uvicorn's timeout_keep_alive (default 5, uvicorn's own default)")
    p.add_argument("--max-concurrency", type=int, default=0)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--strict-model", action="store_true")
    return p.parse_args(argv)


def main():
    asyncio.run(main_async(parse_args()))


if __name__ == "__main__":
    main()
