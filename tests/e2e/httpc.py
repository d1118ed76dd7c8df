"""A small raw HTTP/1.1 client over sockets, so tests control every byte."""

import json
import socket
import time


class Response:
    def __init__(self, status, reason, headers, body, chunks=None):
        self.status = status
        self.reason = reason
        self.headers = headers  # list of (name, value)
        self.body = body
        self.chunks = chunks or []  # (arrival time, bytes) for chunked bodies

    def header(self, name, default=None):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return default

    def header_all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def json(self):
        return json.loads(self.body)


class Reader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def readline(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self, n):
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_to_eof(self):
        while True:
            try:
                self._fill()
            except EOFError:
                data, self.buf = self.buf, b""
                return data

    def response(self, method="GET"):
        """Reads one response; skips 1xx interim responses unless asked."""
        while True:
            status_line = self.readline().decode("latin1")
            version, status, *reason = status_line.split(" ", 2)
            status = int(status)
            headers = []
            while True:
                line = self.readline()
                if not line:
                    break
                k, v = line.decode("latin1").split(":", 1)
                headers.append((k.strip(), v.strip()))
            r = Response(status, reason[0] if reason else "", headers, b"")
            if 100 <= status < 200:
                return r
            break
        if method == "HEAD" or status in (204, 304):
            return r
        te = r.header("transfer-encoding")
        cl = r.header("content-length")
        if te and "chunked" in te.lower():
            body = b""
            while True:
                size = int(self.readline().split(b";")[0], 16)
                if size == 0:
                    while self.readline():
                        pass
                    break
                data = self.read(size)
                self.read(2)
                r.chunks.append((time.monotonic(), data))
                body += data
            r.body = body
        elif cl is not None:
            r.body = self.read(int(cl))
        else:
            r.body = self.read_to_eof()
        return r


def request(host, port, method="GET", path="/", headers=None, body=b"", timeout=30):
    """One request on a fresh connection; returns the Response."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        send(s, method, path, headers, body)
        return Reader(s).response(method)
    finally:
        s.close()


def send(sock, method="GET", path="/", headers=None, body=b"", host="thaw.test"):
    hdrs = {"Host": host}
    if body:
        hdrs["Content-Length"] = str(len(body))
    hdrs.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in hdrs.items() if v is not None) + "\r\n"
    if isinstance(body, str):
        body = body.encode()
    sock.sendall(head.encode() + body)


def closed_by_peer(sock, timeout=5):
    """True when the peer closes (EOF or reset) within timeout."""
    sock.settimeout(timeout)
    try:
        while True:
            d = sock.recv(65536)
            if not d:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
