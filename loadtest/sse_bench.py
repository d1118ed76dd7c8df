#!/usr/bin/python3
"""SSE streaming: the proxy's CPU per token event, thaw beside nginx and HAProxy.

One upstream (thaw-sse-upstream, C, epoll) streams chunked Server-Sent Events,
each carrying its send time; thaw-sse-client (C, epoll) opens the streams
and measures every event's delivery delay. The client goes through thaw, nginx
(1 worker, proxy_buffering off, HTTP/1.1 and keep-alive to the upstream),
HAProxy (1 thread, option http-no-delay, http-reuse always) or straight to the
upstream ("direct"), in an order that rotates each round. Scenarios:

  a  1,000 streams x 50 events/s           (many streams)
  b  5,000 streams x 10 events/s           (more streams, same total rate)
  c  1 stream, as fast as possible         (bulk)
  d  short requests: GET /small, 50 keep-alive connections back to back

Per proxy: CPU-us per event (utime+stime of the proxy's processes, workers
included, from /proc/PID/stat, over the run, divided by the events the client
received: a count of work done, so it holds on a busy machine), the peak RSS
(sampled every 100 ms, workers included; the first round's, scenarios in the
order above, so b and later carry what b grew), the delivery delay p50/p99 and what
the proxy adds to it against direct in the same round; for d: CPU-us per
request and req/s. Medians over rounds; thaw's ratios against nginx and
HAProxy. The last line is `SSE_JSON {...}`.

Environment: SMOKE=1 (CI: 1 round, small sizes, a few seconds), ROUNDS (3),
DURATION (s of streaming per scenario, 10), TOTAL_RATE (events/s offered over
all streams of a and b, 50000), A_STREAMS (1000), B_STREAMS (5000), THAW_BIN,
UPSTREAM_BIN, CLIENT_BIN, SCENARIOS (those to run, e.g. "a,d"; all by default),
THAW_BASELINE_BIN (another thaw build, run as "thaw-base" in the same rotation:
a before/after comparison under the same conditions), FLOOR_BIN (the bare relay
thaw-relay-floor; when built, its epoll and io_uring modes run in the rotation as
"floor-ep" and "floor-ur": the least CPU any proxy can spend per event here),
FLOOR_COALESCE (e.g. "100,300": the epoll relay once more per value, as "floor-c100"
..., sleeping that many microseconds after each loop turn that had work, so that
a turn carries several events: what batching by waiting saves),
TARGETS (those to measure besides thaw and direct, e.g. "haproxy,floor-ep"). Compare "ev/s" with the offered rate: a machine
that cannot keep up batches events, which lowers everyone's CPU per event.
Figures only: it never fails on time.
"""

import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from bench_proxy import free_port, start, wait_port  # noqa: E402

ROOT = os.path.dirname(HERE)
BUILD = os.path.join(ROOT, "build")
THAW_BIN = os.environ.get("THAW_BIN", os.path.join(BUILD, "thaw"))
UPSTREAM_BIN = os.environ.get("UPSTREAM_BIN", os.path.join(BUILD, "thaw-sse-upstream"))
CLIENT_BIN = os.environ.get("CLIENT_BIN", os.path.join(BUILD, "thaw-sse-client"))
SMOKE = os.environ.get("SMOKE") == "1"
ROUNDS = int(os.environ.get("ROUNDS", "1" if SMOKE else "3"))
DURATION = float(os.environ.get("DURATION", "1" if SMOKE else "10"))
# offered events/s over all streams of scenarios a and b (SMOKE: a tenth)
TOTAL_RATE = float(os.environ.get("TOTAL_RATE", "50000"))
A_STREAMS = int(os.environ.get("A_STREAMS", "1000"))
B_STREAMS = int(os.environ.get("B_STREAMS", "5000"))
HOST = "bench"
PROXIES = ("thaw", "nginx", "haproxy")
CLK_TCK = common.CLK_TCK
BASELINE_BIN = os.environ.get("THAW_BASELINE_BIN")
FLOOR_BIN = os.environ.get("FLOOR_BIN", os.path.join(BUILD, "thaw-relay-floor"))
FLOORS = (("floor-ep", "epoll", {}), ("floor-ur", "uring", {}),
          *((f"floor-c{us}", "epoll", {"FLOOR_COALESCE_US": us})
            for us in os.environ.get("FLOOR_COALESCE", "").split(",") if us))
ONLY = [x for x in os.environ.get("TARGETS", "").replace(" ", "").split(",") if x]
WANTED = [x for x in os.environ.get("SCENARIOS", "").replace(" ", "").split(",") if x]
OFFERED = {}  # scenario -> events/s offered over all its streams


def scenarios():
    """name -> (description, client arguments after HOST PORT HOSTHDR)."""
    a_streams, b_streams = (100, 500) if SMOKE else (A_STREAMS, B_STREAMS)
    total = TOTAL_RATE / 10 if SMOKE else TOTAL_RATE
    a_rate, b_rate = max(1, round(total / a_streams)), max(1, round(total / b_streams))
    bulk_events = 100000 if SMOKE else 2000000
    short_conns, short_s = (10, 1) if SMOKE else (50, 5)
    timeout = int(DURATION) + 120
    OFFERED["a"], OFFERED["b"] = a_streams * a_rate, b_streams * b_rate
    every = {
        "a": (f"{a_streams} streams x {a_rate} ev/s",
              ["stream", a_streams, int(a_rate * DURATION), a_rate, 1, timeout]),
        "b": (f"{b_streams} streams x {b_rate} ev/s",
              ["stream", b_streams, int(b_rate * DURATION), b_rate, 1, timeout]),
        "c": (f"1 stream, {bulk_events} events as fast as possible",
              ["stream", 1, bulk_events, 0, 1, timeout]),
        "d": (f"short requests, {short_conns} connections x {short_s} s",
              ["short", short_conns, short_s]),
    }
    return {k: v for k, v in every.items() if not WANTED or k in WANTED}


def raise_nofile():
    """Soft limit up to the hard one (inherited by everything started here);
    5,000 streams take 10,000 descriptors in a proxy, HAProxy's maxconn 9000
    asks for about 18,000."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < 19000:
        print(f"sse_bench: RLIMIT_NOFILE hard limit {hard} is low for 5,000 streams")


def tree_rss_kib(pid):
    total = 0
    for p in common.process_tree(pid):
        try:
            total += common.rss_kib(p)
        except OSError:
            pass
    return total


class RssSampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, tree_rss_kib(self.pid))
            self.stop.wait(0.1)


def haproxy_conf(port, up):
    return f"""global
    nbthread 1
    maxconn 9000
defaults
    mode http
    maxconn 9000
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-no-delay
    http-reuse always
frontend fe
    bind 127.0.0.1:{port}
    default_backend be
backend be
    server up 127.0.0.1:{up}
"""


def start_targets(d, up, procs):
    """Starts the three proxies; returns name -> (port, pid to measure)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    cfg = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "log": {"level": "warn"},
           "limits": {"max_connections": 12000, "max_queue_per_model": 10000,
                      "max_queue_total": 10000},
           "models": [{"name": HOST, "endpoints": [f"127.0.0.1:{up}"],
                       "max_concurrency": 10000}]}
    thaw, thaw_port, _ = common.start_thaw(THAW_BIN, d, cfg)
    procs.append(thaw)
    extra = {}
    if BASELINE_BIN:
        os.makedirs(f"{d}/base", exist_ok=True)
        base, base_port, _ = common.start_thaw(BASELINE_BIN, f"{d}/base", cfg)
        procs.append(base)
        extra["thaw-base"] = (base_port, base.pid)
    if os.path.exists(FLOOR_BIN):
        for name, mode, env in FLOORS:
            floor = subprocess.Popen([FLOOR_BIN, mode, "0", str(up)], stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, **env})
            procs.append(floor)
            line = floor.stdout.readline().split()
            if len(line) == 2 and line[0] == "port":
                extra[name] = (int(line[1]), floor.pid)
            else:  # e.g. io_uring disabled on this kernel: said on stderr
                print(f"sse_bench: {name} did not start; left out")
    ngx_port = free_port()
    with open(f"{d}/proxy.conf", "w") as f:
        f.write(common.nginx_conf(d, common.nginx_proxy(ngx_port, up), connections=20000))
    ngx = start([nginx, "-c", f"{d}/proxy.conf", "-p", d])
    procs.append(ngx)
    hap_port = free_port()
    with open(f"{d}/haproxy.cfg", "w") as f:
        f.write(haproxy_conf(hap_port, up))
    hap = start([haproxy, "-f", f"{d}/haproxy.cfg"])
    procs.append(hap)
    for p in (thaw_port, ngx_port, hap_port):
        wait_port(p)
    return {"thaw": (thaw_port, thaw.pid), "nginx": (ngx_port, ngx.pid),
            "haproxy": (hap_port, hap.pid), "direct": (up, None), **extra}


def run_client(port, args):
    cmd = [CLIENT_BIN, args[0], "127.0.0.1", str(port), HOST, *(str(a) for a in args[1:])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(port, pid, up_pid, args):
    """One client run against one target: the client's figures plus the
    proxy's (and the upstream's) CPU and the proxy's peak RSS."""
    sampler = RssSampler(pid) if pid else None
    if sampler:
        sampler.start()
    before = common.cpu_ticks(pid) if pid else 0
    up_before = common.cpu_ticks(up_pid)
    r = run_client(port, args)
    time.sleep(0.2)  # the proxy finishes closing what the client closed
    after = common.cpu_ticks(pid) if pid else 0
    up_after = common.cpu_ticks(up_pid)
    if sampler:
        sampler.stop.set()
        sampler.join()
    work = r["events"] if args[0] == "stream" else r["responses"]
    r["work"] = work
    r["proxy_cpu_s"] = (after - before) / CLK_TCK if pid else None
    r["proxy_cpu_us_per_unit"] = ((after - before) / CLK_TCK * 1e6 / work
                                  if pid and work else None)
    r["upstream_cpu_us_per_unit"] = ((up_after - up_before) / CLK_TCK * 1e6 / work
                                     if work else None)
    r["peak_rss_kib"] = sampler.peak if sampler else None
    r["rps"] = r["responses"] / r["elapsed_s"] if r["elapsed_s"] else 0
    r["events_per_s"] = r["events"] / r["elapsed_s"] if r["elapsed_s"] else 0
    return r


def median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def summarise(runs, names):
    """runs[scenario][round][target] -> per scenario and target: medians over rounds."""
    out = {}
    for sc, rounds in runs.items():
        out[sc] = {}
        for name in names:
            rs = [rnd[name] for rnd in rounds]
            s = {
                "cpu_us_per_unit": median([r["proxy_cpu_us_per_unit"] for r in rs]),
                "upstream_cpu_us_per_unit": median([r["upstream_cpu_us_per_unit"] for r in rs]),
                # the first round's: later rounds start with the heap an earlier
                # scenario grew (allocators keep freed memory)
                "peak_rss_kib": rs[0]["peak_rss_kib"],
                "p50_us": median([r["p50_us"] for r in rs]),
                "p99_us": median([r["p99_us"] for r in rs]),
                "work": median([r["work"] for r in rs]),
                "rps": median([r["rps"] for r in rs]),
                "events_per_s": median([r["events_per_s"] for r in rs]),
                "errors": sum(r["errors"] for r in rs),
            }
            # added delay: against direct in the same round, then the median
            s["added_p50_us"] = median([rnd[name]["p50_us"] - rnd["direct"]["p50_us"]
                                        for rnd in rounds])
            s["added_p99_us"] = median([rnd[name]["p99_us"] - rnd["direct"]["p99_us"]
                                        for rnd in rounds])
            out[sc][name] = s
    return out


def fmt(v, spec):
    """v formatted by spec; None as a dash of the same width."""
    if v is None:
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width) if width else 1)
    return format(v, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


def print_report(summary, descs, names):
    mode = "smoke" if SMOKE else "full"
    print(f"SSE streaming benchmark ({mode}: {ROUNDS} round(s), medians over rounds; "
          f"upstream: thaw-sse-upstream; load average {os.getloadavg()[0]:.2f})")
    for sc, desc in descs.items():
        unit = "req" if sc == "d" else "event"
        print(f"\n({sc}) {desc}")
        print(f"{'target':<8} {'CPU us/' + unit:>13} {'RSS MiB, r1':>13} "
              f"{'p50 us':>9} {'p99 us':>9} {'+p50 us':>9} {'+p99 us':>9} "
              f"{'req/s' if sc == 'd' else 'ev/s':>10} {'errors':>7}")
        for name in names:
            s = summary[sc][name]
            rss = s["peak_rss_kib"] / 1024 if s["peak_rss_kib"] else None
            rate = s["rps"] if sc == "d" else s["events_per_s"]
            added50 = None if name == "direct" else s["added_p50_us"]
            added99 = None if name == "direct" else s["added_p99_us"]
            print(f"{name:<8} {fmt(s['cpu_us_per_unit'], '13.2f')} {fmt(rss, '13.1f')} "
                  f"{fmt(s['p50_us'], '9.0f')} {fmt(s['p99_us'], '9.0f')} "
                  f"{fmt(added50, '9.0f')} {fmt(added99, '9.0f')} "
                  f"{fmt(rate, '10.0f')} {s['errors']:>7}")
    for sc in [x for x in ("a", "b") if x in descs]:
        offered = OFFERED[sc]
        slow = [n for n in names if summary[sc][n]["events_per_s"] < 0.9 * offered]
        if slow:
            print(f"note: in ({sc}) {', '.join(slow)} delivered under 90% of the {offered:.0f} "
                  "ev/s offered: the machine did not keep up, events were batched and CPU per "
                  "event is lower than at this rate on a machine that does (try TOTAL_RATE)")
    print()
    pairs = [("thaw", n) for n in ("nginx", "haproxy", "thaw-base", "floor-ep", "floor-ur")
             if n in names]
    # the bare relays against the peers: how far below them any proxy can go here
    pairs += [(f, n) for f, _, _ in FLOORS if f in names for n in ("nginx", "haproxy")
              if n in names]
    pairs += [(f, "floor-ep") for f, _, _ in FLOORS if f in names and f != "floor-ep"
              and "floor-ep" in names]
    for ours, peer in pairs:
        parts = []
        for sc in descs:
            t, p = summary[sc][ours], summary[sc][peer]
            parts.append(f"{sc}: CPU {fmt(ratio(t['cpu_us_per_unit'], p['cpu_us_per_unit']), '.2f')}x"
                         f" RSS {fmt(ratio(t['peak_rss_kib'], p['peak_rss_kib']), '.2f')}x")
        print(f"{ours}/{peer} (lower is better): " + "; ".join(parts))


def main():
    for tool in ("nginx", "haproxy"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            print(f"sse_bench: {tool} not installed; skipping")
            return 0
    for b in (THAW_BIN, UPSTREAM_BIN, CLIENT_BIN):
        if not os.path.exists(b):
            print(f"sse_bench: {b} not built; skipping")
            return 0
    raise_nofile()
    load_start = os.getloadavg()
    started = time.monotonic()
    d = tempfile.mkdtemp(prefix="thaw-sse-bench-")
    procs = []
    try:
        upstream = subprocess.Popen([UPSTREAM_BIN, "0"], stdout=subprocess.PIPE, text=True)
        procs.append(upstream)
        up = int(upstream.stdout.readline().split()[1])
        targets = start_targets(d, up, procs)
        names = ["thaw", "nginx", "haproxy", "direct"] + [n for n in targets if n not in
                                                          ("thaw", "nginx", "haproxy", "direct")]
        if ONLY:  # thaw and direct always: the ratios and the added delay need them
            names = [n for n in names if n in ONLY or n in ("thaw", "direct")]
        descs = {sc: desc for sc, (desc, _) in scenarios().items()}
        runs = {sc: [] for sc in descs}
        for rnd in range(ROUNDS):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for sc, (_, args) in scenarios().items():
                results = {}
                for name in order:
                    port, pid = targets[name]
                    results[name] = measure(port, pid, upstream.pid, args)
                    time.sleep(0.3)
                runs[sc].append(results)
        summary = summarise(runs, names)
        print_report(summary, descs, names)
        elapsed = time.monotonic() - started
        print(f"load average at start {load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f}; "
              f"took {elapsed:.0f} s")
        print("SSE_JSON " + json.dumps({"mode": "smoke" if SMOKE else "full", "rounds": ROUNDS,
                                        "duration_s": DURATION, "scenarios": descs,
                                        "load_start": load_start[0],
                                        "load_end": os.getloadavg()[0],
                                        "summary": summary, "runs": runs}))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
