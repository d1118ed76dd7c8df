#!/usr/bin/python3
"""The Kubernetes backend under load, through the API simulator.

1. Cold start: N concurrent clients (100 and 1,000; 20 with SMOKE=1) hit a model
   Deployment at zero replicas, written as the Kubernetes docs write one
   (selector app: llama, no thaw label on the pod template), the kubelet
   probing every 10 s (its default). thaw scales it; the pod's model server
   records (CLOCK_MONOTONIC) when its health check first answered; each
   client records its first byte on the same clock. Reported: thaw's added
   delay from pod health to each first byte (first/p50/p99/max), lost
   requests, and the scale PATCHes sent (must be 1). Servers: the C
   simulator, and loadtest/asyncio_model.py (independently written, Python
   asyncio) binding late and answering 503 while loading.
2. Scale: D model Deployments (2,000; 200 with SMOKE=1) in the simulator.
   Reported: thaw's time from start to /readyz (informers synced), its RSS
   once synced, and its CPU time over 10 s idle afterwards.

Figures only; never fails on time.
"""

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import rss_kib, wait_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
THAW_BIN = os.environ.get("THAW_BIN", os.path.join(BUILD, "thaw"))
SIM_BIN = os.path.join(BUILD, "thaw-model-sim")
CLIENT_BIN = os.path.join(BUILD, "thaw-coldstart-client")
KUBE_SIM = os.path.join(ROOT, "tests", "sim", "kube_sim.py")
SMOKE = os.environ.get("SMOKE") == "1"
TOKEN = "bench-token"


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def make_pki(d):
    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/ca.key",
       "-out", f"{d}/ca.crt", "-days", "1", "-subj", "/CN=bench-ca")
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/srv.key", "-out",
       f"{d}/srv.csr", "-subj", "/CN=127.0.0.1")
    with open(f"{d}/ext.cnf", "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    sh("openssl", "x509", "-req", "-in", f"{d}/srv.csr", "-CA", f"{d}/ca.crt", "-CAkey",
       f"{d}/ca.key", "-CAcreateserial", "-out", f"{d}/srv.crt", "-days", "1", "-extfile",
       f"{d}/ext.cnf")


def start_sim(d, extra=()):
    pf = f"{d}/sim-port"
    if os.path.exists(pf):
        os.unlink(pf)
    p = subprocess.Popen(["/usr/bin/python3", KUBE_SIM, "--port", "0", "--port-file", pf,
                          "--cert", f"{d}/srv.crt", "--key", f"{d}/srv.key", "--token", TOKEN,
                          "--model-sim", SIM_BIN, *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_file(pf)
    port = int(open(pf).read())
    with open(f"{d}/kubeconfig", "w") as f:
        f.write(f"""apiVersion: v1
kind: Config
current-context: sim
clusters: [{{name: sim, cluster: {{server: "https://127.0.0.1:{port}",
  certificate-authority: "{d}/ca.crt"}}}}]
users: [{{name: u, user: {{token: {TOKEN}}}}}]
contexts: [{{name: sim, context: {{cluster: sim, user: u}}}}]
""")
    return p, port


def api(d, port, method, path, body=None):
    ctx = ssl.create_default_context(cafile=f"{d}/ca.crt")
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {TOKEN}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
        return json.loads(r.read() or b"null")


def deployment(name, ns="models", annotations=None, tpl_annotations=None):
    return {"metadata": {"name": name, "namespace": ns, "labels": {"thaw.dev/model": "true"},
                         "annotations": annotations or {}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name},
                                               "annotations": tpl_annotations or {}},
                                  "spec": {"containers": [{
                                      "name": "server", "image": "vllm/vllm-openai",
                                      "ports": [{"containerPort": 8000}],
                                      "readinessProbe": {"httpGet": {"path": "/health",
                                                                     "port": 8000}},
                                      "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}}}


def start_thaw(d, n_conn):
    cfg = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "log": {"level": "warn"},
           "limits": {"max_connections": n_conn + 100},
           "kubernetes": {"namespaces": ["models"]}}
    return common.start_thaw(THAW_BIN, d, cfg, ["--kubeconfig", f"{d}/kubeconfig"])


def ready(admin):
    try:
        with urllib.request.urlopen(f"http://{admin}/readyz", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def has_model(admin, name):
    try:
        with urllib.request.urlopen(f"http://{admin}/status", timeout=5) as r:
            return any(m["name"] == name for m in json.load(r)["models"])
    except OSError:
        return False


def stop(p, sig=signal.SIGTERM):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def pct(v, p):
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")


def cold_start(d, n, server="c", loading="bind-late"):
    sim, port = start_sim(d)
    thaw = None
    try:
        ready_file = f"{d}/pod-ready-{server}-{loading}"
        api(d, port, "POST", "/apis/apps/v1/namespaces/models/deployments",
            deployment("llama", annotations={"thaw.dev/max-concurrency": str(n),
                                             "thaw.dev/target": str(n)},
                       # long enough for every client to be held first
                       tpl_annotations={"sim.thaw.dev/load-ms": "1500" if n <= 100 else "3000",
                                        "sim.thaw.dev/token-ms": "0",
                                        "sim.thaw.dev/server": server,
                                        "sim.thaw.dev/loading": loading,
                                        "sim.thaw.dev/ready-file": ready_file}))
        # The Service whose EndpointSlices list the model's pods.
        api(d, port, "POST", "/api/v1/namespaces/models/services",
            {"metadata": {"name": "llama"},
             "spec": {"selector": {"app": "llama"},
                      "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}})
        thaw, tport, admin = start_thaw(d, n)
        deadline = time.monotonic() + 30
        while not (ready(admin) and has_model(admin, "llama")) and time.monotonic() < deadline:
            time.sleep(0.05)
        out = subprocess.run([CLIENT_BIN, "127.0.0.1", str(tport), str(n), "/v1/completions",
                              '{"model":"llama","prompt":"hi"}', "60000"],
                             capture_output=True, text=True, timeout=120).stdout
        rows = [tuple(int(x) for x in line.split()) for line in out.splitlines()]
        if not os.path.exists(ready_file):
            codes = sorted({r[1] for r in rows})
            raise RuntimeError(f"the model never became ready (client statuses {codes})")
        ready_ns = int(open(ready_file).read())
        ok = [r for r in rows if r[1] == 200]
        delays = sorted((r[0] - ready_ns) / 1e6 for r in ok)
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/_sim/state",
                                    context=ssl.create_default_context(
                                        cafile=f"{d}/ca.crt")) as r:
            scale_writes = json.load(r)["counters"].get("scale_writes", 0)
        return {"clients": n, "server": f"{server} {loading}", "lost": n - len(ok),
                "scale_patches": scale_writes,
                "first_ms": delays[0] if delays else float("nan"),
                "p50_ms": pct(delays, 50), "p99_ms": pct(delays, 99),
                "max_ms": delays[-1] if delays else float("nan")}
    finally:
        if thaw:
            stop(thaw)
        stop(sim, signal.SIGINT)


def scale(d, n):
    sim, port = start_sim(d, ["--bookmark-s", "60"])
    thaw = None
    try:
        for i in range(n):
            api(d, port, "POST", "/apis/apps/v1/namespaces/models/deployments",
                deployment(f"model-{i:05d}", annotations={"thaw.dev/priority": "batch"}))
        start = time.monotonic()
        thaw, _, admin = start_thaw(d, 10)
        deadline = start + 120
        while not ready(admin) and time.monotonic() < deadline:
            time.sleep(0.02)
        sync_s = time.monotonic() - start
        with urllib.request.urlopen(f"http://{admin}/status", timeout=30) as r:
            models = len(json.load(r)["models"])
        rss = rss_kib(thaw.pid)
        hz = os.sysconf("SC_CLK_TCK")
        c0 = common.cpu_ticks(thaw.pid)
        idle_s = 10
        time.sleep(idle_s)
        cpu_ms = (common.cpu_ticks(thaw.pid) - c0) * 1000 / hz
        return {"deployments": n, "models_seen": models, "sync_s": round(sync_s, 2),
                "rss_mib": round(rss / 1024, 1), "idle_cpu_ms_per_s": round(cpu_ms / idle_s, 2)}
    finally:
        if thaw:
            stop(thaw)
        stop(sim, signal.SIGINT)


def main():
    for b in (THAW_BIN, SIM_BIN, CLIENT_BIN):
        if not os.path.exists(b):
            print(f"k8s_bench: {b} not built; skipping")
            return 0
    if not shutil.which("openssl"):
        print("k8s_bench: openssl missing; skipping")
        return 0
    d = tempfile.mkdtemp(prefix="thaw-k8s-bench-")
    try:
        make_pki(d)
        kinds = [("c", "bind-late"), ("asyncio-model", "bind-late"), ("asyncio-model", "503")]
        sizes = (20,) if SMOKE else (100, 1000)
        cold = [cold_start(d, n, *k) for n in sizes for k in (kinds[1:2] if SMOKE else kinds)]
        print("kubernetes cold start (through the API simulator, kubelet probing every 10 s): "
              "pod health OK -> first byte")
        for c in cold:
            print(f"  {c['server']:>24}, {c['clients']} clients: first {c['first_ms']:.2f} ms, "
                  f"p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms, max {c['max_ms']:.2f} ms, "
                  f"lost {c['lost']}, scale PATCHes {c['scale_patches']}")
        s = scale(d, 200 if SMOKE else 2000)
        print(f"kubernetes scale: {s['deployments']} model Deployments: synced in {s['sync_s']} s, "
              f"RSS {s['rss_mib']} MiB, idle CPU {s['idle_cpu_ms_per_s']} ms/s "
              f"({s['models_seen']} models in /status)")
        print("K8S_JSON " + json.dumps({"cold": cold, "scale": s}))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
