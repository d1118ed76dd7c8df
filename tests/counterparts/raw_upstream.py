#!/usr/bin/python3
"""A scriptable raw-socket HTTP/1.1 upstream for fault tests.

Use it as a library:

    with RawUpstream(idle_close_ms=200, idle_close_mode="rst") as up:
        ... talk to 127.0.0.1:up.port ...
        assert up.resets == 1

or as a script (`raw_upstream.py --port 0 ...`, prints `LISTENING <port>`;
GET /__stats answers its counters as JSON).

Paths (the query string may override the defaults given to the constructor):
  /stream?n=&delay_ms=      SSE over chunked encoding: n events then `data: [DONE]`
  /reset                    RST after reading the request, before any response byte
  /reset-mid                headers (Content-Length: 1000) and 100 body bytes, then RST
  /bad-chunk                `Transfer-Encoding: chunked` with an invalid chunk-size line,
                            all in the first segment sent
  /upgrade                  an unsolicited `101 Switching Protocols`
  /trickle?bytes=&interval_ms=   the body one byte per interval
  /close-before-response    FIN without any response byte
  /slow?ms=                 200 after a delay
  /no-content-with-body?later_ms=   a 204 declaring Content-Length: 2, the 2 bytes sent later
  /status?code=             that status with a JSON error body
  /ok and any other path    200 JSON echoing method, path and body length
"""
import argparse
import json
import signal
import socket
import struct
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

MAX_HEAD = 65536
MAX_BODY = 16 * 1024 * 1024
POLL = 0.05


class ClientGone(Exception):
    """The peer closed or reset the connection, or the server is stopping."""


class BadRequest(Exception):
    pass


class Request:
    def __init__(self, method, target, version, headers, body=b""):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers  # dict: lower-case name -> last value
        parts = urlsplit(target)
        self.path = parts.path
        self.query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.body = body

    def wants_keep_alive(self):
        toks = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in toks
        return "close" not in toks


class Conn:
    """One accepted connection: buffered reads that notice stop(), and the ways to end it."""

    def __init__(self, server, sock):
        self.server = server
        self.sock = sock
        self.buf = bytearray()
        self.closed = False
        sock.settimeout(POLL)

    # --- reading ---------------------------------------------------------

    def recv_more(self, deadline=None):
        """Appends what arrives to buf; False on timeout (deadline passed)."""
        while True:
            if self.server.stopping.is_set():
                raise ClientGone()
            if deadline is not None and time.monotonic() >= deadline:
                return False
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                raise ClientGone()
            if not data:
                raise ClientGone()
            self.buf += data
            return True

    def read_until(self, marker, limit):
        while True:
            i = self.buf.find(marker)
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[:i + len(marker)]
                return out
            if len(self.buf) > limit:
                raise BadRequest("line or head too long")
            self.recv_more()

    def read_exact(self, n):
        while len(self.buf) < n:
            self.recv_more()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def wait_for_request(self, idle_s):
        """True when request bytes are buffered; False when idle for idle_s."""
        deadline = time.monotonic() + idle_s if idle_s else None
        while not self.buf:
            if not self.recv_more(deadline):
                return False
        return True

    def read_request(self):
        while self.buf.startswith(b"\r\n"):
            del self.buf[:2]
        head = self.read_until(b"\r\n\r\n", MAX_HEAD)
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            raise BadRequest("malformed request line")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest("malformed header line")
            headers[name.strip().lower()] = value.strip()
        req = Request(method, target, version, headers)
        has_body = "transfer-encoding" in headers or headers.get("content-length", "0") != "0"
        if headers.get("expect", "").lower() == "100-continue" and has_body:
            self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            req.body = self.read_chunked()
        elif "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                raise BadRequest("invalid Content-Length")
            if n < 0 or n > MAX_BODY:
                raise BadRequest("invalid Content-Length")
            req.body = self.read_exact(n)
        return req

    def read_chunked(self):
        body = bytearray()
        while True:
            line = self.read_until(b"\r\n", 4096).split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                raise BadRequest("invalid chunk size")
            if size == 0:
                while self.read_until(b"\r\n", 8192):
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY:
                raise BadRequest("body too large")
            body += self.read_exact(size)
            if self.read_exact(2) != b"\r\n":
                raise BadRequest("chunk not followed by CRLF")

    # --- writing and ending ----------------------------------------------

    def pause(self, seconds):
        """Sleeps, but ends the connection's work at once when the server stops."""
        if self.server.stopping.wait(seconds):
            raise ClientGone()

    def send(self, data):
        if self.server.stopping.is_set():
            raise ClientGone()
        try:
            self.sock.sendall(data)
        except OSError:
            raise ClientGone()

    def respond(self, status, body, headers=(), close=False, reason="Status"):
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if self.server.keepalive_header is not None and not close:
            lines.append(f"Keep-Alive: timeout={self.server.keepalive_header}")
        lines.append("Connection: close" if close else "Connection: keep-alive")
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def respond_json(self, status, obj, close=False, reason="OK"):
        self.respond(status, json.dumps(obj).encode(), [("Content-Type", "application/json")],
                     close, reason)

    def reset(self):
        """Closes with RST (SO_LINGER on, zero timeout)."""
        if self.closed:
            return
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.server._count("resets")  # before the RST, so a peer that sees it sees the count
        self.closed = True
        self.sock.close()

    def close(self):
        """Closes with FIN."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def hold_until_peer_closes(self, seconds):
        """Keeps the connection open until the peer closes it or seconds pass."""
        deadline = time.monotonic() + seconds
        try:
            while self.recv_more(deadline):
                self.buf.clear()
        except ClientGone:
            pass


class RawUpstream:
    """A threaded raw-socket upstream on 127.0.0.1; see the module docstring for its paths.

    idle_close_ms: close a connection that has had no request bytes for this long
        (counted from accept or from the end of the last response); None: never.
    idle_close_mode: "fin" or "rst" for that close.
    keepalive_header: when set, responses carry `Keep-Alive: timeout=<value>`.
    close_after_n_requests: close (FIN) each connection after its N-th response;
        with announce_close the N-th response carries `Connection: close`.
    routes: {path: fn(conn, request, close) -> bool keep_alive}, added to or overriding the
        built-ins; `close` is True when the response must end the connection, and fn may
        use conn.respond/respond_json/send/reset/close.
    """

    def __init__(self, port=0, *, idle_close_ms=None, idle_close_mode="fin",
                 keepalive_header=None, close_after_n_requests=None, announce_close=False,
                 stream_events=5, stream_delay_ms=10, trickle_bytes=20, trickle_interval_ms=50,
                 routes=None):
        if idle_close_mode not in ("fin", "rst"):
            raise ValueError("idle_close_mode must be 'fin' or 'rst'")
        self.idle_close_ms = idle_close_ms
        self.idle_close_mode = idle_close_mode
        self.keepalive_header = keepalive_header
        self.close_after_n_requests = close_after_n_requests
        self.announce_close = announce_close
        self.stream_events = stream_events
        self.stream_delay_ms = stream_delay_ms
        self.trickle_bytes = trickle_bytes
        self.trickle_interval_ms = trickle_interval_ms
        self.routes = dict(routes or {})
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.counters = {"connections": 0, "requests": 0, "resets": 0, "idle_closes": 0,
                         "open": 0}
        self.paths = []  # path of each request seen, in order
        self.conns = set()
        self.threads = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(128)
        self.listener.settimeout(POLL)
        self.port = self.listener.getsockname()[1]
        self.accept_thread = None

    # --- counters --------------------------------------------------------

    def _count(self, name, delta=1):
        with self.lock:
            self.counters[name] += delta

    @property
    def connections(self):
        """Connections accepted so far."""
        return self.counters["connections"]

    @property
    def requests(self):
        """Requests read so far (whole head and body), all paths except /__stats."""
        return self.counters["requests"]

    @property
    def resets(self):
        """RSTs sent: /reset, /reset-mid, idle closes in "rst" mode, conn.reset() in routes."""
        return self.counters["resets"]

    @property
    def idle_closes(self):
        return self.counters["idle_closes"]

    @property
    def open_connections(self):
        return self.counters["open"]

    def stats(self):
        with self.lock:
            return dict(self.counters, paths=list(self.paths))

    def wait_until(self, predicate, timeout=5.0):
        """Polls predicate(self) until true; returns its last value."""
        deadline = time.monotonic() + timeout
        while not predicate(self) and time.monotonic() < deadline:
            time.sleep(0.01)
        return predicate(self)

    # --- life cycle ------------------------------------------------------

    def start(self):
        self.accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                              name=f"raw-upstream-{self.port}")
        self.accept_thread.start()
        return self

    def stop(self):
        self.stopping.set()
        if self.accept_thread:
            self.accept_thread.join(5)
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _accept_loop(self):
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self.stopping.is_set():
                    return
                time.sleep(POLL)
                continue
            self._count("connections")
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            with self.lock:
                self.threads = [x for x in self.threads if x.is_alive()]
                self.threads.append(t)
            t.start()

    # --- one connection --------------------------------------------------

    def _serve(self, sock):
        conn = Conn(self, sock)
        self._count("open")
        try:
            self._request_loop(conn)
        except ClientGone:
            pass
        except BadRequest as e:
            try:
                conn.respond_json(400, {"error": {"message": str(e), "type": "bad_request"}},
                                  close=True, reason="Bad Request")
            except ClientGone:
                pass
        except Exception as e:  # a fault server must never take the test down
            print(f"raw_upstream: connection handler failed: {e!r}", file=sys.stderr, flush=True)
        finally:
            conn.close()
            self._count("open", -1)

    def _request_loop(self, conn):
        served = 0
        while True:
            idle = self.idle_close_ms / 1000.0 if self.idle_close_ms else None
            if not conn.wait_for_request(idle):
                self._count("idle_closes")
                if self.idle_close_mode == "rst":
                    conn.reset()
                else:
                    conn.close()
                return
            req = conn.read_request()
            if req.path == "/__stats":
                conn.respond_json(200, self.stats())
                continue
            with self.lock:
                self.counters["requests"] += 1
                self.paths.append(req.path)
            served += 1
            last = self.close_after_n_requests is not None and served >= self.close_after_n_requests
            close = not req.wants_keep_alive() or (last and self.announce_close)
            handler = self.routes.get(req.path) or BUILTIN.get(req.path, route_ok)
            keep = handler(conn, req, close)
            if conn.closed or not keep or close or last:
                return


# --- built-in behaviours: fn(conn, req, close) -> keep_alive ------------------

def route_ok(conn, req, close):
    conn.respond_json(200, {"ok": True, "method": req.method, "path": req.path,
                            "body_bytes": len(req.body)}, close)
    return not close


def route_stream(conn, req, close):
    up = conn.server
    n = int(req.query.get("n", up.stream_events))
    delay = float(req.query.get("delay_ms", up.stream_delay_ms)) / 1000.0
    head = ["HTTP/1.1 200 OK", "Content-Type: text/event-stream", "Cache-Control: no-cache",
            "Transfer-Encoding: chunked", "Connection: close" if close else "Connection: keep-alive"]
    conn.send(("\r\n".join(head) + "\r\n\r\n").encode())
    for i in range(n):
        if delay:
            conn.pause(delay)
        frame = f"data: {json.dumps({'i': i})}\n\n".encode()
        conn.send(b"%x\r\n%s\r\n" % (len(frame), frame))
    done = b"data: [DONE]\n\n"
    conn.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    return not close


def route_reset(conn, req, close):
    conn.reset()
    return False


def route_reset_mid(conn, req, close):
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
              b"Content-Length: 1000\r\n\r\n" + b"x" * 100)
    conn.pause(0.05)
    conn.reset()
    return False


def route_reset_at_once(conn, req, close):
    # The head, part of the body and the RST back to back: a proxy may learn of
    # all three in one readiness report.
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
              b"Content-Length: 100\r\n\r\nabc")
    conn.reset()
    return False


def route_bad_chunk(conn, req, close):
    # Head and the invalid size line in one segment, so a proxy meets both in its first read.
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"zz-not-hex\r\nhello\r\n")
    conn.hold_until_peer_closes(2.0)
    return False


def route_upgrade(conn, req, close):
    conn.send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\n\r\n\x81\x05hello")
    conn.hold_until_peer_closes(2.0)
    return False


def route_trickle(conn, req, close):
    up = conn.server
    n = int(req.query.get("bytes", up.trickle_bytes))
    interval = float(req.query.get("interval_ms", up.trickle_interval_ms)) / 1000.0
    conn.send(("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
               f"Content-Length: {n}\r\n" +
               ("Connection: close\r\n" if close else "") + "\r\n").encode())
    for i in range(n):
        conn.pause(interval)
        conn.send(bytes([ord("a") + i % 26]))
    return not close


def route_close_before_response(conn, req, close):
    conn.close()
    return False


def route_no_content_with_body(conn, req, close):
    # A 204 that declares a body (which HTTP says it cannot have), the body sent later.
    conn.send(b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n")
    conn.pause(float(req.query.get("later_ms", "50")) / 1000.0)
    conn.send(b"ok")
    return not close


def route_slow(conn, req, close):
    conn.pause(float(req.query.get("ms", "1000")) / 1000.0)
    return route_ok(conn, req, close)


def route_status(conn, req, close):
    code = int(req.query.get("code", "500"))
    conn.respond_json(code, {"error": {"message": f"injected status {code}", "type": "injected",
                                       "code": code}}, close, reason="Injected")
    return not close


BUILTIN = {
    "/ok": route_ok,
    "/stream": route_stream,
    "/reset": route_reset,
    "/reset-mid": route_reset_mid,
    "/reset-at-once": route_reset_at_once,
    "/bad-chunk": route_bad_chunk,
    "/upgrade": route_upgrade,
    "/trickle": route_trickle,
    "/close-before-response": route_close_before_response,
    "/slow": route_slow,
    "/no-content-with-body": route_no_content_with_body,
    "/status": route_status,
}


def main():
    p = argparse.ArgumentParser(description="A scriptable raw-socket HTTP upstream.")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--idle-close-ms", type=float, default=None)
    p.add_argument("--idle-close-mode", choices=["fin", "rst"], default="fin")
    p.add_argument("--keepalive-header", type=int, default=None)
    p.add_argument("--close-after-n-requests", type=int, default=None)
    p.add_argument("--announce-close", action="store_true")
    p.add_argument("--stream-events", type=int, default=5)
    p.add_argument("--stream-delay-ms", type=float, default=10)
    a = p.parse_args()
    up = RawUpstream(a.port, idle_close_ms=a.idle_close_ms, idle_close_mode=a.idle_close_mode,
                     keepalive_header=a.keepalive_header,
                     close_after_n_requests=a.close_after_n_requests,
                     announce_close=a.announce_close, stream_events=a.stream_events,
                     stream_delay_ms=a.stream_delay_ms).start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"LISTENING {up.port}", flush=True)
    done.wait()
    up.stop()


if __name__ == "__main__":
    main()
