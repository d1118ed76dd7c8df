"""Cold starts split into phases: through the Kubernetes simulator a pod goes
through a scheduling delay, a wait for capacity (Unschedulable until a node
with room joins), an image pull with the kubelet's Pulling/Pulled Events and
a model load; the phase histogram, /status during the cold start, the SSE
heartbeat and the Event on the Deployment show each phase. The process
backend splits spawn -> listening -> healthy, and a model's history gives
the expected remaining time (heartbeat, Retry-After)."""

import json
import re
import socket
import threading
import time

from conftest import wait_for
from test_kubernetes import (  # noqa: F401  (pki and cluster are fixtures)
    cluster, deployment, pki, start_thaw, urllib_status)
from test_process import SIM, sim_model

TOL = 0.45  # s: watch latency, the simulator's 50 ms tick, thaw's probe pacing


def phase_sums(t, model):
    """{phase: (count, sum)} from thaw_cold_start_phase_seconds."""
    _, text = t.admin("/metrics")
    out = {}
    for line in text.splitlines():
        m = re.match(r'thaw_cold_start_phase_seconds_(sum|count)\{(.*)\} (\S+)', line)
        if m and f'model="{model}"' in m.group(2):
            phase = re.search(r'phase="(\w+)"', m.group(2)).group(1)
            c, s = out.get(phase, (0, 0.0))
            out[phase] = (float(m.group(3)), s) if m.group(1) == "count" else (c, float(m.group(3)))
    return out


def stream_request(host, port, hostname, model):
    s = socket.create_connection((host, port), timeout=30)
    body = json.dumps({"model": model, "prompt": "hi", "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (hostname.encode(), len(body), body))
    return s


def read_until(s, marker, timeout=20):
    s.settimeout(timeout)
    data = b""
    while marker not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_kubernetes_cold_start_phases(cluster, thaw_factory, tmp_path):
    sim = cluster(kubelet_ms=100)
    d = deployment("llama", gpus=0, load_ms=700,
                   annotations={"thaw.dev/loading-heartbeat": "200ms"})
    d["spec"]["template"]["metadata"]["annotations"].update(
        {"sim.thaw.dev/schedule-delay-ms": "400", "sim.thaw.dev/pull-ms": "800"})
    # More CPU than the one node has: Unschedulable until a bigger node joins.
    d["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "64"}}
    sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")

    s = stream_request(t.host, t.port, "llama.models", "x")
    seen = {}  # phase -> first seen in /status
    pod_seen = {}  # phase -> the pod's cold_start when first seen there

    def watch_status():
        end = time.monotonic() + 20
        while time.monotonic() < end:
            m = next(x for x in t.status()["models"] if x["name"] == "llama")
            cs = m.get("cold_start")
            for p in m.get("pods", []):
                if p.get("cold_start"):
                    pod_seen.setdefault(p["cold_start"]["phase"], p["cold_start"])
            if cs:
                seen.setdefault(cs["phase"], cs)
            elif seen:
                return
            time.sleep(0.05)
    th = threading.Thread(target=watch_status)
    th.start()
    wait_for(lambda: "capacity" in seen, timeout=10, what="waiting for capacity in /status")
    time.sleep(0.6)
    node = {"metadata": {"name": "big-node", "labels": {"kubernetes.io/hostname": "big-node"}},
            "status": {"allocatable": {"cpu": "128", "memory": "512Gi", "pods": "110"},
                       "capacity": {"cpu": "128", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    code, _ = sim.call("POST", "/api/v1/nodes", node)
    assert code == 201
    data = read_until(s, b"data: ")
    s.close()
    th.join(30)
    # The heartbeat named the phases as they went by.
    beats = re.findall(rb": loading phase=(\w+) elapsed=(\d+)s expected_remaining=(\w+)", data)
    assert beats, data[:400]
    assert {b[0] for b in beats} >= {b"capacity", b"image_pull", b"load"}, beats
    assert beats[0][2] == b"unknown"  # no history yet
    # /status showed each phase while it lasted, with its elapsed time.
    for ph in ("capacity", "image_pull", "load"):
        assert ph in seen, seen
    assert seen["load"]["elapsed_ms"] > seen["image_pull"]["elapsed_ms"]
    # Per pod: the time so far in each phase it went through.
    assert set(pod_seen["load"]["phases_ms"]) >= {"scale", "schedule", "capacity", "image_pull",
                                                  "container_start", "load"}, pod_seen
    assert abs(pod_seen["load"]["phases_ms"]["image_pull"] - 800) < TOL * 1000, pod_seen
    # The histogram: each phase once, close to what the cluster did.
    sums = phase_sums(t, "llama")
    for ph in ("scale", "schedule", "capacity", "image_pull", "container_start", "load", "health"):
        assert sums.get(ph, (0,))[0] == 1, (ph, sums)
    assert abs(sums["schedule"][1] - 0.4) < TOL, sums
    assert sums["capacity"][1] > 0.4, sums
    assert abs(sums["image_pull"][1] - 0.8) < TOL, sums
    assert abs(sums["load"][1] - 0.7) < TOL, sums
    # An Event on the Deployment names the slowest phase.
    _, evs = sim.call("GET", "/api/v1/namespaces/models/events")
    done = [e for e in evs["items"] if e["reason"] == "ColdStartCompleted"]
    assert len(done) == 1 and done[0]["involvedObject"]["kind"] == "Deployment"
    slowest = max(("capacity", "image_pull", "load", "schedule"), key=lambda p: sums[p][1])
    assert f"slowest phase: {slowest}" in done[0]["message"], done[0]["message"]
    m = next(x for x in t.status()["models"] if x["name"] == "llama")
    assert "cold_start" not in m and m["cold_start_expected_ms"] > 2000


def test_process_phases_and_expected_remaining(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=800, idle_timeout_ms=300, max_queue=1,
                                           loading_heartbeat_ms=200)]})
    for round_ in range(2):
        s = stream_request(t.host, t.port, "thaw.test", "llama")
        time.sleep(0.3)
        if round_ == 1:
            # The queue is full: 503 with Retry-After from the model's history
            # (about 0.8 s expected, 0.3 s gone).
            r = socket.create_connection((t.host, t.port), timeout=10)
            body = b'{"model": "llama", "prompt": "hi"}'
            r.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: thaw.test\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            head = read_until(r, b"\r\n\r\n", 10)
            r.close()
            assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1\r\n" in head, head
        data = read_until(s, b"data: ")
        s.close()
        beats = re.findall(rb": loading phase=(\w+) elapsed=(\d+)s expected_remaining=(\w+)", data)
        assert beats and beats[0][0] == b"load", data[:300]
        if round_ == 0:
            assert beats[0][2] == b"unknown"
        else:
            assert beats[0][2] == b"1s", beats  # ~0.8 s expected, rounded up
        if round_ == 0:
            wait_for(lambda: next(x for x in t.status()["models"])["replicas"] == [],
                     timeout=10, what="idle stop")
    sums = phase_sums(t, "llama")
    assert sums["load"][0] == 2 and sums["health"][0] == 2, sums
    # (thaw's log has each replica's load and health times, should these fail)
    assert abs(sums["load"][1] / 2 - 0.8) < TOL, (sums, t.logs()[-3000:])
    assert sums["health"][1] / 2 < 0.2, (sums, t.logs()[-3000:])
    assert "scale" not in sums  # no scheduling on a single host
