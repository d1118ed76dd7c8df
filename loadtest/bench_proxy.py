#!/usr/bin/python3
"""Throughput and latency: the same upstream behind thaw, nginx and haproxy.

One nginx worker serves a small JSON response as the upstream. In front of
it, in turn: thaw, nginx (1 worker, upstream keep-alive) and haproxy
(1 thread, http-reuse always). wrk loads each for the same time with the
same connections; rounds alternate so drift hits all three alike. Prints
req/s, p50 and p99 per proxy (best round by req/s) and thaw's ratios.

Also CPU per request: the utime+stime the proxy's processes (workers
included) spent during the round, divided by the requests served; it holds
on a busy machine, where req/s does not.

Environment: SMOKE=1 for a 2-second single round (CI), DURATION (s),
CONNECTIONS, ROUNDS, THAW_BIN; THAW_BASELINE_BIN adds a second thaw
("thaw-base", e.g. an older build) to the same alternating rounds. Figures
only: it never fails on time.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THAW_BIN = os.environ.get("THAW_BIN", os.path.join(ROOT, "build", "thaw"))
SMOKE = os.environ.get("SMOKE") == "1"
DURATION = int(os.environ.get("DURATION", "2" if SMOKE else "10"))
CONNECTIONS = int(os.environ.get("CONNECTIONS", "10" if SMOKE else "50"))
ROUNDS = int(os.environ.get("ROUNDS", "1" if SMOKE else "3"))
BODY = '{"id":"cmpl-1","object":"text_completion","choices":[{"text":"ok"}]}'


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listening on {port}")


def start(cmd, **kw):
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def parse_wrk(out):
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def lat(pct):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        v, unit = float(m.group(1)), m.group(2)
        return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sockerr = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "p50_ms": lat(50), "p99_ms": lat(99),
            "non2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": sockerr.group(1) if sockerr else ""}


def wrk(port, host, pid):
    cmd = ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{DURATION}s", "--latency",
           "-H", f"Host: {host}", f"http://127.0.0.1:{port}/health"]
    cpu0 = common.cpu_seconds(pid)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=DURATION + 60).stdout
    cpu = common.cpu_seconds(pid) - cpu0
    r = parse_wrk(out)
    requests = re.search(r"(\d+) requests in", out)
    n = int(requests.group(1)) if requests else 0
    r["cpu_us_per_req"] = cpu * 1e6 / n if n else float("nan")
    return r


def main():
    for tool in ("wrk", "nginx", "haproxy"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            print(f"bench_proxy: {tool} not installed; skipping")
            return 0
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    d = tempfile.mkdtemp(prefix="thaw-bench-")
    procs = []
    try:
        up = free_port()
        with open(f"{d}/upstream.conf", "w") as f:
            f.write(common.nginx_conf(d, f"""server {{ listen 127.0.0.1:{up} backlog=4096;
                default_type application/json;
                location / {{ return 200 '{BODY}'; }} }}"""))
        procs.append(start([nginx, "-c", f"{d}/upstream.conf", "-p", d]))

        thaw_port, thaw_admin = free_port(), free_port()
        with open(f"{d}/thaw.json", "w") as f:
            json.dump({"listen": f"127.0.0.1:{thaw_port}", "admin_listen": f"127.0.0.1:{thaw_admin}",
                       "log": {"level": "warn"},
                       "models": [{"name": "bench", "endpoints": [f"127.0.0.1:{up}"],
                                   "max_concurrency": 4096}]}, f)
        thaw_proc = start([THAW_BIN, "--config", f"{d}/thaw.json"])
        procs.append(thaw_proc)
        base_bin = os.environ.get("THAW_BASELINE_BIN")
        base_port = base_proc = None
        if base_bin:
            base_port, base_admin = free_port(), free_port()
            with open(f"{d}/thaw-base.json", "w") as f:
                json.dump({"listen": f"127.0.0.1:{base_port}",
                           "admin_listen": f"127.0.0.1:{base_admin}", "log": {"level": "warn"},
                           "models": [{"name": "bench", "endpoints": [f"127.0.0.1:{up}"],
                                       "max_concurrency": 4096}]}, f)
            base_proc = start([base_bin, "--config", f"{d}/thaw-base.json"])
            procs.append(base_proc)

        ngx_port = free_port()
        with open(f"{d}/proxy.conf", "w") as f:
            f.write(common.nginx_conf(d, common.nginx_proxy(ngx_port, up)))
        ngx_proc = start([nginx, "-c", f"{d}/proxy.conf", "-p", d])
        procs.append(ngx_proc)

        hap_port = free_port()
        with open(f"{d}/haproxy.cfg", "w") as f:
            f.write(f"""global
    nbthread 1
    maxconn 4000
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always
frontend fe
    bind 127.0.0.1:{hap_port}
    default_backend be
backend be
    server up 127.0.0.1:{up}
""")
        hap_proc = start([haproxy, "-f", f"{d}/haproxy.cfg"])
        procs.append(hap_proc)
        for p in (up, thaw_port, ngx_port, hap_port) + ((base_port,) if base_port else ()):
            wait_port(p)

        targets = [("thaw", thaw_port, "bench", thaw_proc.pid),
                   ("nginx", ngx_port, "bench", ngx_proc.pid),
                   ("haproxy", hap_port, "bench", hap_proc.pid)]
        if base_proc:
            targets.insert(1, ("thaw-base", base_port, "bench", base_proc.pid))
        best = {}
        for rnd in range(ROUNDS):
            for name, port, host, pid in targets:
                r = wrk(port, host, pid)
                if name not in best or r["rps"] > best[name]["rps"]:
                    best[name] = r
        mode = "smoke" if SMOKE else "full"
        print(f"proxy benchmark ({mode}: wrk -t1 -c{CONNECTIONS} -d{DURATION}s, "
              f"{ROUNDS} round(s), best round shown; upstream: nginx, 1 worker)")
        print(f"{'proxy':<10} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11} "
              f"{'non-2xx':>8}")
        for name, *_ in targets:
            r = best[name]
            print(f"{name:<10} {r['rps']:>10.0f} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} "
                  f"{r['cpu_us_per_req']:>11.2f} {r['non2xx']:>8}")
        t = best["thaw"]
        for peer in ("thaw-base", "nginx", "haproxy"):
            if peer not in best:
                continue
            p = best[peer]
            print(f"thaw/{peer}: req/s {t['rps'] / p['rps']:.2f}x, "
                  f"p99 {t['p99_ms'] / p['p99_ms']:.2f}x, "
                  f"CPU per request {t['cpu_us_per_req'] / p['cpu_us_per_req']:.2f}x "
                  "(lower is better)")
        print("BENCH_JSON " + json.dumps(best))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
