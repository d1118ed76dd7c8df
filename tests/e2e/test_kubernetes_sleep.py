"""End-to-end: sleep mode in a cluster (thaw.dev/sleep-mode), through the pod's IP.

An idle pod of a sleep-mode model is sent POST /sleep and leaves routing; the
Deployment keeps its count and the pod keeps running. A request wakes it with
POST /wake_up (a wake, not a cold start). A pod that fails to wake is deleted,
its ReplicaSet starts a new one and the held request is served by that.
"""

import json
import time
import urllib.request

from conftest import wait_for
from test_kubernetes import (SLOW, cluster, complete, deployment, kmodel, pki,  # noqa: F401
                             start_thaw, urllib_status)


def sleepy_llama(cluster, thaw_factory, tmp_path, fault=None, load_ms=1200):
    sim = cluster()
    d = deployment("llama", replicas=0, load_ms=load_ms,
                   annotations={"thaw.dev/sleep-mode": "true",
                                "thaw.dev/idle-before-sleep": "400ms",
                                "thaw.dev/sleep-timeout": "5s"})
    if fault:
        d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/sleep-fault"] = fault
    sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    assert complete(t).status == 200  # a cold start
    return sim, t


def pod_get(ip, path):
    with urllib.request.urlopen(f"http://{ip}:8000{path}", timeout=5) as r:
        return json.load(r)


def replicas(sim):
    code, d = sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")
    return d["spec"]["replicas"]


def test_idle_pod_sleeps_and_a_request_wakes_it(cluster, thaw_factory, tmp_path):
    sim, t = sleepy_llama(cluster, thaw_factory, tmp_path)
    wait_for(lambda: kmodel(t)["state"] == "sleeping", timeout=5, what="asleep")
    st = kmodel(t)
    pod = next(p for p in st["pods"] if not p["terminating"])
    assert pod["sleep"] == "sleeping" and not pod["ready"]
    assert pod_get(pod["ip"], "/is_sleeping") == {"is_sleeping": True}
    assert replicas(sim) == 1  # the pod stays: the Deployment is not scaled
    cold = t.metric("thaw_cold_start_seconds_count", model="llama", namespace="models")
    t0 = time.monotonic()
    r = complete(t)
    took = time.monotonic() - t0
    assert r.status == 200, r.body
    assert took < 1.0 * SLOW, f"a wake took {took:.2f}s"
    st = kmodel(t)
    assert st["state"] == "ready" and st["sleep"]["wakes"] == 1
    assert [p["name"] for p in st["pods"] if p["ready"]] == [pod["name"]]
    assert t.metric("thaw_sleep_events_total", model="llama", namespace="models",
                    event="wake") == 1
    assert t.metric("thaw_wake_from_sleep_seconds_count", model="llama", namespace="models") == 1
    assert t.metric("thaw_cold_start_seconds_count", model="llama", namespace="models") == cold


def test_pod_that_fails_to_wake_is_replaced_by_a_cold_start(cluster, thaw_factory, tmp_path):
    sim, t = sleepy_llama(cluster, thaw_factory, tmp_path, fault="fail-wake", load_ms=300)
    wait_for(lambda: kmodel(t)["state"] == "sleeping", timeout=5, what="asleep")
    old = next(p["name"] for p in kmodel(t)["pods"])
    r = complete(t)
    assert r.status == 200, r.body  # held through the failure, served by the new pod
    st = kmodel(t)
    assert [p["name"] for p in st["pods"] if p["ready"]] != [old]
    assert t.metric("thaw_sleep_events_total", model="llama", namespace="models",
                    event="wake_failed") == 1
    wait_for(lambda: all(p["name"] != old or p["terminating"] for p in kmodel(t)["pods"]),
             timeout=5, what="the pod that did not wake deleted")


def test_gpu_memory_needed_on_a_node_puts_an_idle_pod_to_sleep(cluster, thaw_factory, tmp_path):
    """One GPU of 24 GiB shared by time-slicing; two models of 14 GiB each. The
    scheduler counts slices, not memory, so both land there: the idle one is put
    to sleep for the other's start, and for its own wake the other sleeps."""
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 4,
                          "labels": {"nvidia.com/gpu.memory": "24576"}}])
    for name in ("a", "b"):
        sim.create_deployment(deployment(name, load_ms=1200, annotations={
            "thaw.dev/sleep-mode": "true", "thaw.dev/idle-before-sleep": "1h",
            "thaw.dev/gpu-memory": "14Gi"}))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")

    def node():
        return next(n for n in t.status()["kubernetes"]["nodes"] if n["name"] == "gpu-a")
    assert node()["gpu_memory"]["total_bytes"] == 24 << 30
    assert complete(t, host="a.models").status == 200
    assert node()["gpu_memory"]["used_bytes"] == 14 << 30
    assert complete(t, host="b.models").status == 200
    assert kmodel(t, "a")["state"] == "sleeping"
    assert node()["gpu_memory"]["used_bytes"] == 14 << 30
    t0 = time.monotonic()
    r = complete(t, host="a.models")
    assert r.status == 200, r.body
    assert time.monotonic() - t0 < 3 * SLOW
    assert kmodel(t, "b")["state"] == "sleeping" and kmodel(t, "a")["state"] == "ready"
    assert node()["gpu_memory"]["used_bytes"] == 14 << 30
    assert kmodel(t, "a")["sleep"]["wakes"] == 1
    assert t.metric("thaw_cold_start_seconds_count", model="a", namespace="models") == 1
