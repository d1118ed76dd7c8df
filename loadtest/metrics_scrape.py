#!/usr/bin/python3
"""Proxied request latency while /metrics is scraped, with many models.

Starts thaw with N static models (default 400), all on one small upstream
(thaw-model-sim, in its own process), then times proxied GET /health
requests, one at a time on a keep-alive connection: first with no scrape,
then while another process scrapes /metrics back to back. Prints p50, p99
and max of both, the scrapes done and the size of one exposition.

Usage: loadtest/metrics_scrape.py [THAW_BIN ...]   (several binaries: one
line each, e.g. the current build and one of an older commit)
Environment: MODELS (400), SECONDS per phase (5), THAW_SIM_BIN.
Figures only; never fails on them.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SIM = os.environ.get("THAW_SIM_BIN", os.path.join(ROOT, "build", "thaw-model-sim"))
MODELS = int(os.environ.get("MODELS", "400"))
SECONDS = float(os.environ.get("SECONDS", "5"))

SCRAPER = """
import sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    with urllib.request.urlopen(url, timeout=60) as r:
        r.read()
    n += 1
print(n)
"""


def start_sim(d):
    pf = os.path.join(d, "sim-port")
    p = subprocess.Popen([SIM, "--port", "0", "--port-file", pf, "--model", "sim",
                          "--load-ms", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    common.wait_file(pf)
    time.sleep(0.05)
    with open(pf) as f:
        return p, f"127.0.0.1:{int(f.read().strip())}"


class Client:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.req = b"GET /health HTTP/1.1\r\nHost: model-0001\r\n\r\n"

    def one(self):
        self.s.sendall(self.req)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.s.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += self.s.recv(65536)

    def timed(self, seconds):
        out = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            self.one()
            out.append(time.perf_counter() - t0)
        return sorted(out)


def pct(v, q):
    return v[min(len(v) - 1, int(len(v) * q))] * 1000


def run(thaw_bin):
    d = tempfile.mkdtemp(prefix="thaw-metrics-")
    sim, addr = start_sim(d)
    cfg = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "log": {"level": "warn"},
           "models": [{"name": f"model-{i:04d}", "endpoints": [addr], "max_concurrency": 64}
                      for i in range(MODELS)]}
    thaw, port, admin = common.start_thaw(thaw_bin, d, cfg)
    try:
        url = f"http://{admin}/metrics"
        t0 = time.perf_counter()
        with urllib.request.urlopen(url) as r:
            size = len(r.read())
        one_scrape = time.perf_counter() - t0
        c = Client(port)
        c.timed(0.5)  # warm up
        quiet = c.timed(SECONDS)
        scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, url, str(SECONDS + 1)],
                                   stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        busy = c.timed(SECONDS)
        scrapes = scraper.communicate(timeout=120)[0].strip()
        print(f"{thaw_bin}: {MODELS} models, /metrics {size} bytes ({one_scrape * 1000:.0f} ms "
              f"to fetch)\n  without scrapes: p50 {pct(quiet, .5):.2f} ms  p99 "
              f"{pct(quiet, .99):.2f} ms  max {quiet[-1] * 1000:.2f} ms  ({len(quiet)} requests)"
              f"\n  during scrapes:  p50 {pct(busy, .5):.2f} ms  p99 {pct(busy, .99):.2f} ms  "
              f"max {busy[-1] * 1000:.2f} ms  ({len(busy)} requests, {scrapes} scrapes in "
              f"{SECONDS + 1:.0f} s)")
    finally:
        thaw.terminate()
        thaw.wait(30)
        sim.terminate()
        sim.wait(10)


if __name__ == "__main__":
    for b in sys.argv[1:] or [os.environ.get("THAW_BIN", os.path.join(ROOT, "build", "thaw"))]:
        run(b)
