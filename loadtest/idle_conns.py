#!/usr/bin/python3
"""Memory per idle keep-alive client connection.

Opens N connections to thaw, sends one request on each and reads the reply
(so each is a used keep-alive connection, as a client pool leaves them),
then reads thaw's RSS. Reports (RSS after - RSS before) / N. Also held
requests: with the model's only slot taken, N requests wait in the queue,
and the RSS they add per request is reported (bodies are tiny).

Environment: SMOKE=1 for N=1000 (CI), else N (default 10000), THAW_BIN.
Figures only; never fails on them.
"""

import json
import os
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from upstream import Upstream  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import rss_kib  # noqa: E402

THAW_BIN = os.environ.get("THAW_BIN", os.path.join(ROOT, "build", "thaw"))
SMOKE = os.environ.get("SMOKE") == "1"
N = int(os.environ.get("N", "1000" if SMOKE else "10000"))


def start_thaw(d, models):
    cfg = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "log": {"level": "warn"},
           "limits": {"max_connections": N + 100, "max_queue_per_model": N + 100,
                      "max_queue_total": N + 100},
           "models": models}
    return common.start_thaw(THAW_BIN, d, cfg)


def queued(admin):
    import urllib.request
    with urllib.request.urlopen(f"http://{admin}/status", timeout=10) as r:
        return json.load(r)["queued"]


def open_all(port, n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        socks.append(s)
    return socks


def send_all(socks, req):
    for s in socks:
        s.setblocking(True)
        s.sendall(req)
        s.setblocking(False)


def read_replies(socks, timeout=120):
    """Reads until every socket has a complete small response."""
    sel = selectors.DefaultSelector()
    pending = {}
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
        pending[s] = b""
    done = 0
    deadline = time.monotonic() + timeout
    while done < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(1):
            s = key.fileobj
            data = s.recv(65536)
            pending[s] += data
            buf = pending[s]
            if b"\r\n\r\n" in buf:
                head, body = buf.split(b"\r\n\r\n", 1)
                cl = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
                if cl and len(body) >= cl[0]:
                    sel.unregister(s)
                    done += 1
    sel.close()
    return done


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n = min(N, hard - 200)
    d = tempfile.mkdtemp(prefix="thaw-mem-")
    up = Upstream().start()
    thaw = None
    socks = []
    try:
        models = [{"name": "m", "endpoints": [up.address], "max_concurrency": 1}]
        thaw, port, admin = start_thaw(d, models)
        time.sleep(0.2)
        base = rss_kib(thaw.pid)
        socks = open_all(port, n)
        got = 0
        # In batches, as clients would: 10,000 requests held at once would
        # leave freed (but still resident) heap behind and skew the figure.
        for i in range(0, n, 100):
            send_all(socks[i:i + 100], b"GET /echo HTTP/1.1\r\nHost: m\r\n\r\n")
            got += read_replies(socks[i:i + 100])
        time.sleep(0.5)
        after = rss_kib(thaw.pid)
        per_conn = (after - base) * 1024 / n
        print(f"idle keep-alive connections: {n} open ({got} answered), thaw RSS "
              f"{base} KiB -> {after} KiB: {per_conn:.0f} bytes per connection "
              f"(target <= 2048)")
        for s in socks:
            s.close()
        socks = []

        # Held requests, on a fresh process so freed memory is not reused:
        # the only slot is busy, so N requests wait queued.
        thaw.terminate()
        thaw.wait(30)
        thaw, port, admin = start_thaw(d, models)
        holder = socket.create_connection(("127.0.0.1", port))
        holder.sendall(b"GET /sleep?ms=600000 HTTP/1.1\r\nHost: m\r\n\r\n")
        time.sleep(0.3)
        socks = open_all(port, n)
        time.sleep(0.3)
        base = rss_kib(thaw.pid)
        send_all(socks, b"GET /echo HTTP/1.1\r\nHost: m\r\n\r\n")
        deadline = time.monotonic() + 60
        while queued(admin) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        held = queued(admin)
        after = rss_kib(thaw.pid)
        per_req = (after - base) * 1024 / n
        print(f"held requests: {held} queued, thaw RSS {base} KiB -> {after} KiB: "
              f"{per_req:.0f} bytes per held request beyond its connection (target <= 4096)")
        holder.close()
        print("MEM_JSON " + json.dumps({"connections": n, "bytes_per_idle_conn": round(per_conn),
                                        "bytes_per_held_request": round(per_req)}))
    finally:
        for s in socks:
            s.close()
        if thaw:
            thaw.terminate()
            try:
                thaw.wait(30)
            except subprocess.TimeoutExpired:
                thaw.kill()
        up.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
