#!/usr/bin/python3
"""Cold start under load: thaw's own added delay when a model wakes up.

For N concurrent clients (1, 100, 1000) hitting a cold process-backed model
whose server loads in a known time: every client's request is held while
the model loads; the server records (CLOCK_MONOTONIC) the moment its health
check first answered 200; each client records its first response byte on
the same clock. Reported: that difference per client (thaw's added delay:
noticing readiness, then releasing every held request), first/p50/p99/max,
and requests lost (not answered 200: must be 0).

Servers: the project's C simulator (thaw-model-sim), and loadtest/asyncio_model.py,
an independently written Python asyncio server (accepts at Python speed, a
100-connection backlog as asyncio's default) in both of its loading modes:
bind-late (the port opens when loaded) and 503 (health answers 503 while
loading). For the asyncio server the same N requests are also sent straight
to it once loaded, all at once on fresh connections; and its best rate, on 64
warm keep-alive connections (wrk), with its CPU per request: straight to it,
and through thaw-relay-floor (a relay that parses nothing). N requests take
at least N / that rate of the server's own time; through the relay, the floor
for any proxy's p99 at N on this machine.

Then requests slow to answer: 256 held (100 with SMOKE=1) on the asyncio server
answering each 2 s (0.5 s) after it arrives, as a non-streaming completion does:
when the last is answered, against 2 s if all reach the server at once.

Then memory: N held requests (10,000; 1,000 with SMOKE=1) on a cold model,
thaw's RSS per held request, connection included.

Environment: SMOKE=1 (CI: 1 and 100 clients, 1,000 held), THAW_BIN, SIM_BIN,
CLIENT_BIN, FLOOR_BIN. Figures only; never fails on time.
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import rss_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
THAW_BIN = os.environ.get("THAW_BIN", os.path.join(BUILD, "thaw"))
SIM_BIN = os.environ.get("SIM_BIN", os.path.join(BUILD, "thaw-model-sim"))
CLIENT_BIN = os.environ.get("CLIENT_BIN", os.path.join(BUILD, "thaw-coldstart-client"))
FLOOR_BIN = os.environ.get("FLOOR_BIN", os.path.join(BUILD, "thaw-relay-floor"))
SMOKE = os.environ.get("SMOKE") == "1"


ASYNCIO_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "asyncio_model.py")
SERVERS = ("c", "asyncio-bind-late", "asyncio-503")


def server_command(server, port, load_ms, ready_file, answer_ms=0):
    if server == "c":
        return [SIM_BIN, "--port", port, "--load-ms", str(load_ms), "--token-ms", "0",
                "--tokens", "1", "--ready-file", ready_file]
    mode = server.split("-", 1)[1]
    return ["/usr/bin/python3", ASYNCIO_SERVER, "--port", port, "--load-ms", str(load_ms),
            "--loading-mode", mode, "--tokens", "1", "--token-ms", str(answer_ms),
            "--ready-file", ready_file]


def start_thaw(d, load_ms, n, ready_file, server="c", answer_ms=0):
    cfg = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "log": {"level": "warn"},
           "limits": {"max_connections": n + 100, "max_queue_per_model": n + 100,
                      "max_queue_total": n + 100},
           "models": [{"name": "llama", "max_concurrency": max(n, 1),
                       "command": server_command(server, "{port}", load_ms, ready_file,
                                                 answer_ms),
                       "queue_timeout_ms": 120000}]}
    return common.start_thaw(THAW_BIN, d, cfg)


def status(admin):
    with urllib.request.urlopen(f"http://{admin}/status", timeout=10) as r:
        return json.load(r)


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, int(round(p / 100 * (len(sorted_vals) - 1))))
    return sorted_vals[k]


def delays_ms(out, ready_ns):
    rows = [tuple(int(x) for x in line.split()) for line in out.splitlines()]
    ok = [r for r in rows if r[1] == 200]
    return rows, ok, sorted((r[0] - ready_ns) / 1e6 for r in ok)


def run_direct(n, d):
    """The asyncio server alone: loaded, then n requests at once on fresh
    connections; each client's first byte after the moment they were sent."""
    port = "0"
    ready_file = f"{d}/ready-direct-{n}"
    srv = subprocess.Popen(server_command("asyncio-bind-late", port, 0, ready_file),
                           stdout=subprocess.PIPE, text=True)
    try:
        line = srv.stdout.readline().split()
        port = line[1]
        start_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        client = subprocess.Popen([CLIENT_BIN, "127.0.0.1", port, str(n), "/v1/completions",
                                   '{"model":"llama","prompt":"hi"}', "60000"],
                                  stdout=subprocess.PIPE, text=True)
        out, _ = client.communicate(timeout=120)
        _, ok, delays = delays_ms(out, start_ns)
        return {"clients": n, "server": "asyncio direct", "answered_200": len(ok),
                "lost": n - len(ok), "first_ms": delays[0] if delays else float("nan"),
                "p50_ms": pct(delays, 50), "p99_ms": pct(delays, 99),
                "max_ms": delays[-1] if delays else float("nan")}
    finally:
        srv.terminate()
        srv.wait(10)


WRK_POST = """wrk.method = "POST"
wrk.body = '{"model":"llama","prompt":"hi"}'
wrk.headers["Content-Type"] = "application/json"
"""


def cpu_ms(pid):
    """A process's time on a CPU so far (ns precision, /proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e6


def run_rate(d, relay=False, seconds=2):
    """The loaded asyncio server's requests per second on 64 warm keep-alive
    connections, and its CPU per request: how fast it can answer at best.
    With relay, through thaw-relay-floor (a relay that parses nothing, the
    least any proxy adds): on two shared cores the proxy's work competes with
    the server's, so this is the best any proxy can get from it here.
    None when wrk (or the relay) is missing."""
    if not shutil.which("wrk") or (relay and not os.path.exists(FLOOR_BIN)):
        return None
    script = f"{d}/post.lua"
    with open(script, "w") as f:
        f.write(WRK_POST)
    srv = subprocess.Popen(server_command("asyncio-bind-late", "0", 0, f"{d}/ready-rate"),
                           stdout=subprocess.PIPE, text=True)
    procs = [srv]
    try:
        port = srv.stdout.readline().split()[1]
        if relay:
            floor = subprocess.Popen([FLOOR_BIN, "epoll", "0", port], stdout=subprocess.PIPE,
                                     text=True)
            procs.append(floor)
            port = floor.stdout.readline().split()[1]
        before = cpu_ms(srv.pid)
        out = subprocess.run(["wrk", "-t1", "-c64", f"-d{seconds}s", "-s", script,
                              f"http://127.0.0.1:{port}/v1/completions"],
                             capture_output=True, text=True, timeout=seconds + 30).stdout
        used = cpu_ms(srv.pid) - before
        rate = requests = None
        for line in out.splitlines():
            if line.startswith("Requests/sec:"):
                rate = float(line.split()[1])
            elif "requests in" in line:
                requests = int(line.split()[0])
        if not rate or not requests:
            return None
        return {"rps": rate, "server_cpu_us_per_request": used * 1000 / requests}
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def held_burst(port, n, ready_file):
    """n clients at once on thaw's port, each on its own connection; then the
    server's ready time (from ready_file) and each answer's delay after it."""
    client = subprocess.Popen([CLIENT_BIN, "127.0.0.1", str(port), str(n), "/v1/completions",
                               '{"model":"llama","prompt":"hi"}', "60000"],
                              stdout=subprocess.PIPE, text=True)
    out, _ = client.communicate(timeout=120)
    with open(ready_file) as f:
        ready_ns = int(f.read())
    return (ready_ns, *delays_ms(out, ready_ns))


class CpuFromReady(threading.Thread):
    """CPU time of thaw and of its model server from the server's first
    healthy answer (its ready file written) on: where the time after it goes."""

    def __init__(self, thaw_pid, ready_file):
        super().__init__(daemon=True)
        self.thaw_pid, self.ready_file, self.start_ms = thaw_pid, ready_file, None
        self.pids = ()

    def run(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_file) and os.path.getsize(self.ready_file):
                with open(f"/proc/{self.thaw_pid}/task/{self.thaw_pid}/children") as f:
                    self.pids = (self.thaw_pid, *(int(p) for p in f.read().split()[:1]))
                self.start_ms = [cpu_ms(p) for p in self.pids]
                return
            time.sleep(0.0002)

    def used_ms(self):
        """(thaw, server) ms since ready; None when not seen."""
        self.join(5)
        if not self.start_ms or len(self.pids) < 2:
            return None
        return tuple(cpu_ms(p) - t for p, t in zip(self.pids, self.start_ms))


def run_cold(n, d, server="c"):
    load_ms = 1000 if n <= 100 else 2500
    ready_file = f"{d}/ready-{server}-{n}"
    thaw, port, admin = start_thaw(d, load_ms, n, ready_file, server)
    try:
        cpu = CpuFromReady(thaw.pid, ready_file)
        cpu.start()
        ready_ns, rows, ok, delays = held_burst(port, n, ready_file)
        used = cpu.used_ms()
        early = [r for r in ok if r[0] < ready_ns]
        st = status(admin)["models"][0]
        return {"clients": n, "server": server, "load_ms": load_ms, "answered_200": len(ok),
                "lost": n - len(ok), "before_ready": len(early), "starts": st["starts"],
                "first_ms": delays[0] if delays else float("nan"),
                "p50_ms": pct(delays, 50), "p99_ms": pct(delays, 99),
                "max_ms": delays[-1] if delays else float("nan"),
                "thaw_cpu_us_per_request": used and used[0] * 1000 / n,
                "server_cpu_us_per_request": used and used[1] * 1000 / n}
    finally:
        thaw.terminate()
        thaw.wait(30)


def run_slow(n, answer_ms, d):
    """n requests held on a cold asyncio server that answers each answer_ms
    after it arrives (a non-streaming completion): the last answer's delay
    after the server's first healthy answer. answer_ms when all n reach the
    server at once (max_concurrency is n)."""
    ready_file = f"{d}/ready-slow-{n}"
    thaw, port, admin = start_thaw(d, 500, n, ready_file, "asyncio-bind-late", answer_ms)
    try:
        _, _, ok, delays = held_burst(port, n, ready_file)
        checks = common.metric(admin, "thaw_upstream_accept_checks_total")
        return {"clients": n, "answer_ms": answer_ms, "lost": n - len(ok),
                "last_ms": delays[-1] if delays else float("nan"), "accept_checks": checks}
    finally:
        thaw.terminate()
        thaw.wait(30)


def run_memory(n, d):
    ready_file = f"{d}/ready-mem"
    thaw, port, admin = start_thaw(d, 30000, n, ready_file)
    client = None
    try:
        time.sleep(0.3)
        base = rss_kib(thaw.pid)
        client = subprocess.Popen([CLIENT_BIN, "127.0.0.1", str(port), str(n), "/v1/completions",
                                   '{"model":"llama","prompt":"hi"}', "20000"],
                                  stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        held = 0
        while time.monotonic() < deadline:
            held = status(admin)["queued"]
            if held >= n:
                break
            time.sleep(0.1)
        after = rss_kib(thaw.pid)
        return {"held": held, "rss_before_kib": base, "rss_after_kib": after,
                "bytes_per_held_request": round((after - base) * 1024 / max(held, 1))}
    finally:
        if client:
            client.kill()
            client.wait()
        thaw.terminate()
        thaw.wait(30)


def main():
    for b in (THAW_BIN, SIM_BIN, CLIENT_BIN, ASYNCIO_SERVER):
        if not os.path.exists(b):
            print(f"coldstart: {b} not built; skipping")
            return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    d = tempfile.mkdtemp(prefix="thaw-cold-")
    try:
        sizes = (1, 100) if SMOKE else (1, 100, 1000)
        servers = ("c", "asyncio-bind-late") if SMOKE else SERVERS
        results = [run_cold(n, d, server) for server in servers for n in sizes]
        direct = [run_direct(n, d) for n in sizes if n > 1]
        print("cold start: thaw's added delay, model health OK -> client's first byte")
        print("(CPU: us per request from the server's first healthy answer on, thaw's and "
              "the server's)")
        print(f"{'server':>18} {'clients':>8} {'first ms':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'max ms':>8} {'lost':>5} {'starts':>6} {'CPU thaw':>9} {'CPU server':>10}")
        for r in results + direct:
            cpus = [r.get(k) for k in ("thaw_cpu_us_per_request", "server_cpu_us_per_request")]
            cpus = [f"{c:.0f}" if c is not None else "-" for c in cpus]
            print(f"{r['server']:>18} {r['clients']:>8} {r['first_ms']:>9.2f} {r['p50_ms']:>8.2f} "
                  f"{r['p99_ms']:>8.2f} {r['max_ms']:>8.2f} {r['lost']:>5} "
                  f"{r.get('starts', '-'):>6} {cpus[0]:>9} {cpus[1]:>10}")
            if r.get("before_ready"):
                print(f"  note: {r['before_ready']} answered before the health check: "
                      "they were not held")
        slow = run_slow(100 if SMOKE else 256, 500 if SMOKE else 2000, d)
        print(f"{slow['clients']} held requests answered {slow['answer_ms']} ms after they arrive "
              f"(asyncio, binds late): last answer {slow['last_ms']:.0f} ms after the server's "
              f"first healthy answer (all at once: {slow['answer_ms']} ms), lost {slow['lost']}, "
              f"accept checks {slow['accept_checks']:.0f}")
        rates = {} if SMOKE else {"direct": run_rate(d), "relay": run_rate(d, relay=True)}
        for how, rate in rates.items():
            if rate:
                label = "direct" if how == "direct" else "through a bare relay"
                print(f"asyncio server's best rate, 64 warm connections, {label}: "
                      f"{rate['rps']:.0f} requests/s, its CPU {rate['server_cpu_us_per_request']:.0f}"
                      " us per request; " + ", ".join(
                          f"{n} requests need >= {n / rate['rps'] * 1000:.0f} ms of it"
                          for n in sizes if n > 1))
        mem = run_memory(1000 if SMOKE else 10000, d)
        print(f"held requests on a cold model: {mem['held']}, RSS {mem['rss_before_kib']} KiB -> "
              f"{mem['rss_after_kib']} KiB: {mem['bytes_per_held_request']} bytes each, "
              "connection included (target <= 4096)")
        print("COLDSTART_JSON " + json.dumps({"cold": results, "direct": direct, "slow": slow,
                                              "asyncio_rate": rates, "memory": mem}))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
