"""A scriptable HTTP/1.1 upstream for the end-to-end tests.

Runs in a background thread on 127.0.0.1 (port 0) with keep-alive, and picks
its behaviour from the request path:

  /echo                 JSON with method, path, headers and body
  /chunked?n=N&ms=M     N chunks, M ms apart
  /sse?n=N&ms=M         text/event-stream, OpenAI-style chunks, then [DONE]
  /close-delimited      no Content-Length, body ends when the socket closes
  /status/CODE          empty response with that status (204, 304, ...)
  /big?bytes=N          N bytes of body
  /sleep?ms=M           answer after M ms
  /slow-head?ms=M       same as sleep (named for first-byte timeouts)
  /hang                 never answer
  /cut                  head and half a body, then close
  /garbage              not HTTP at all

Counters (requests, connections, peak concurrency) are kept for the tests.
"""

import asyncio
import json
import threading
import urllib.parse


class Upstream:
    def __init__(self):
        self.requests = 0
        self.connections = 0
        self.active = 0
        self.peak = 0
        self.paths = []
        self._loop = None
        self._server = None
        self.port = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("upstream did not start")
        return self

    def stop(self):
        if self._loop:
            async def shutdown():
                self._server.close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._loop.stop()
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
            self._thread.join(5)

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def _run(self):
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, limit=1 << 20))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, version = line.decode("latin1").rstrip("\r\n").split(" ", 2)
                headers = []
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, v = h.decode("latin1").rstrip("\r\n").split(":", 1)
                    headers.append((k.strip(), v.strip()))
                hmap = {k.lower(): v for k, v in headers}
                body = b""
                if "content-length" in hmap:
                    body = await reader.readexactly(int(hmap["content-length"]))
                self.requests += 1
                self.paths.append(target)
                self.active += 1
                self.peak = max(self.peak, self.active)
                try:
                    keep = await self._respond(writer, method, target, headers, body)
                finally:
                    self.active -= 1
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def _respond(self, w, method, target, headers, body):
        url = urllib.parse.urlsplit(target)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        path = url.path

        def head(status, hdrs, reason="OK"):
            lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in hdrs]
            w.write(("\r\n".join(lines) + "\r\n\r\n").encode())

        if path == "/echo" or path.startswith("/v1/") or path == "/":
            payload = json.dumps({"method": method, "path": target, "headers": headers,
                                  "body": body.decode("utf-8", "replace")}).encode()
            head(200, [("Content-Type", "application/json"), ("Content-Length", len(payload)),
                       ("X-Upstream", "yes"), ("Keep-Alive", "timeout=5")])
            if method != "HEAD":
                w.write(payload)
        elif path == "/chunked" or path == "/sse":
            n, ms = int(q.get("n", 3)), int(q.get("ms", 0))
            ctype = "text/event-stream" if path == "/sse" else "text/plain"
            head(200, [("Content-Type", ctype), ("Transfer-Encoding", "chunked")])
            await w.drain()
            for i in range(n):
                if path == "/sse":
                    data = json.dumps({"object": "chat.completion.chunk",
                                       "choices": [{"index": 0, "delta": {"content": f"tok{i} "}}]})
                    piece = f"data: {data}\n\n".encode()
                else:
                    piece = f"chunk{i}\n".encode()
                w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await w.drain()
                if ms:
                    await asyncio.sleep(ms / 1000)
            if path == "/sse":
                piece = b"data: [DONE]\n\n"
                w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            w.write(b"0\r\n\r\n")
        elif path == "/close-delimited":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
            w.write(b"all of this until close\n" * 10)
            await w.drain()
            return False
        elif path.startswith("/status/"):
            code = int(path.rsplit("/", 1)[1])
            extra = [("ETag", '"x"')] if code == 304 else []
            head(code, extra, reason="Whatever")
        elif path == "/big":
            n = int(q.get("bytes", 1 << 20))
            head(200, [("Content-Type", "application/octet-stream"), ("Content-Length", n)])
            block = b"x" * 65536
            left = n
            while left > 0:
                w.write(block[:min(left, len(block))])
                left -= min(left, len(block))
                await w.drain()
        elif path in ("/sleep", "/slow-head"):
            await asyncio.sleep(int(q.get("ms", 100)) / 1000)
            payload = json.dumps({"slept_ms": int(q.get("ms", 100)), "path": target}).encode()
            head(200, [("Content-Type", "application/json"), ("Content-Length", len(payload))])
            w.write(payload)
        elif path == "/hang":
            await asyncio.sleep(3600)
        elif path == "/cut":
            head(200, [("Content-Type", "text/plain"), ("Content-Length", 1000)])
            w.write(b"y" * 500)
            await w.drain()
            return False
        elif path == "/garbage":
            w.write(b"this is not http\r\n\r\n")
            await w.drain()
            return False
        else:
            payload = b'{"error":"no such path"}'
            head(404, [("Content-Type", "application/json"), ("Content-Length", len(payload))],
                 reason="Not Found")
            w.write(payload)
        await w.drain()
        return True
