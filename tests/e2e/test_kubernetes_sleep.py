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
from test_ha import fleet  # noqa: F401  (a fixture)
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


def sleep_status(t):
    """The activator's view of each pod of llama: name -> sleep state."""
    return {p["name"]: p.get("sleep", "awake") for p in kmodel(t)["pods"]
            if not p["terminating"]}


def test_two_activators_share_sleep_mode(fleet):
    """The chart runs two activators. Sleep mode with both: a pod sleeps only
    once the model is idle at both (a request in flight at the follower keeps
    it awake: the leader would otherwise put it to sleep under it), both keep
    it out of routing while asleep, and a request at either activator wakes
    it (the follower asks the leader, which sends /wake_up): no cold start,
    nothing answered "the model is sleeping". The pod runs the independent
    asyncio counterpart with vLLM's sleep mode."""
    f = fleet(2)
    leader = f.one_leader()
    follower = next(t for t in f.thaws if t is not leader)
    d = deployment("llama", replicas=0, load_ms=300,
                   annotations={"thaw.dev/sleep-mode": "true",
                                "thaw.dev/idle-before-sleep": "500ms",
                                "thaw.dev/sleep-timeout": "5s"})
    d["spec"]["template"]["metadata"]["annotations"].update(
        {"sim.thaw.dev/server": "asyncio", "sim.thaw.dev/sleep-mode": "true",
         "sim.thaw.dev/token-ms": "500"})
    f.sim.create_deployment(d)
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")
    # A cold start through the follower, then a request there that takes 2 s
    # (4 tokens of 500 ms): the leader sees nothing of it but the follower's
    # /demand, and must not put the pod to sleep meanwhile.
    assert complete(follower).status == 200
    t0 = time.monotonic()
    r = complete(follower)
    assert r.status == 200, r.body
    assert time.monotonic() - t0 >= 1.9
    assert leader.metric("thaw_sleep_events_total", model="llama", namespace="models",
                         event="sleep") == 0
    # Idle at both: asleep, out of both activators' routing, still counted.
    wait_for(lambda: set(sleep_status(leader).values()) == {"sleeping"} and
             set(sleep_status(follower).values()) == {"sleeping"}, timeout=10 * SLOW,
             what="asleep at both activators")
    pod = next(p for p in kmodel(leader)["pods"] if not p["terminating"])
    assert pod_get(pod["ip"], "/is_sleeping") == {"is_sleeping": True}
    assert replicas(f.sim) == 1
    assert kmodel(follower)["state"] == "sleeping"
    # The follower tells the leader it let go of the pod.
    assert json.loads(follower.admin("/demand")[1])["unrouted"] == [f"models/{pod['name']}"]
    # Woken by a request at the follower, then at the leader.
    for n, t in enumerate((follower, leader), start=1):
        t0 = time.monotonic()
        r = complete(t)
        assert r.status == 200, r.body
        assert time.monotonic() - t0 < 5 * SLOW
        assert [p["name"] for p in kmodel(t)["pods"] if p["ready"]] == [pod["name"]]
        assert leader.metric("thaw_sleep_events_total", model="llama", namespace="models",
                             event="wake") == n
        wait_for(lambda: set(sleep_status(leader).values()) == {"sleeping"} and
                 set(sleep_status(follower).values()) == {"sleeping"}, timeout=10 * SLOW,
                 what="asleep again")
    assert follower.metric("thaw_sleep_events_total", model="llama", namespace="models",
                           event="wake") == 0
    assert replicas(f.sim) == 1
    for t in f.thaws:
        assert t.metric("thaw_cold_start_seconds_count", model="llama", namespace="models") <= 1
