"""Helpers the load tests share: start thaw on a config, read its ports,
read a process's RSS and CPU time (with its descendants), wait for a file,
and the nginx configuration the proxy benchmarks compare thaw with."""

import json
import os
import subprocess
import time
import urllib.request


def wait_file(path, timeout=20):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        time.sleep(0.01)


def metric(admin, name):
    """A counter or gauge without labels from thaw's /metrics at admin
    ("host:port"); NaN when absent."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return float("nan")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_tree(pid):
    """pid and its descendants (nginx's master and worker)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def cpu_ticks(pid):
    """utime+stime (and reaped children's) of pid and its live descendants,
    in clock ticks (CLK_TCK a second)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is field 3 (state); utime..cstime are fields 14..17
        total += sum(int(x) for x in fields[11:15])
    return total


def cpu_seconds(pid):
    return cpu_ticks(pid) / CLK_TCK


def start_thaw(thaw_bin, workdir, cfg, extra_args=()):
    """Starts thaw on cfg (listen addresses on port 0); returns (process,
    proxy port, admin address) once it wrote its port file."""
    with open(f"{workdir}/thaw.json", "w") as f:
        json.dump(cfg, f)
    pf = f"{workdir}/thaw-ports.json"
    if os.path.exists(pf):
        os.unlink(pf)
    p = subprocess.Popen([thaw_bin, "--config", f"{workdir}/thaw.json", "--port-file", pf,
                          *extra_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_file(pf)
    with open(pf) as f:
        ports = json.load(f)
    return p, int(ports["listen"].rsplit(":", 1)[1]), ports["admin_listen"]


def nginx_conf(d, body, connections=4096):
    """A one-worker nginx (no daemon, no logs, temp files under d) serving
    the http-level `body`; `connections` is its worker_connections and
    descriptor limit."""
    return f"""
worker_processes 1;
worker_rlimit_nofile {connections};
daemon off;
pid {d}/nginx.pid;
error_log /dev/null crit;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    {body}
}}
"""


def nginx_proxy(port, up):
    """The http-level body of nginx as the proxy under comparison: HTTP/1.1
    and 64 keep-alive connections to the upstream, no buffering (each piece
    passed on as it comes, as a token stream needs)."""
    return f"""
    upstream model {{ server 127.0.0.1:{up}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://model;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}"""
