"""End-to-end: sleep mode in a cluster (thaw.dev/sleep-mode), through the pod's IP.

An idle pod of a sleep-mode model is sent POST /sleep and leaves routing; the
Deployment keeps its count and the pod keeps running. A request wakes it with
POST /wake_up (a wake, not a cold start). A pod that fails to wake is deleted,
its ReplicaSet starts a new one and the held request is served by that.
"""

import json
import signal
import threading
import time
import urllib.request

import pytest

from conftest import Busy, wait_for
from test_ha import fleet, hand_lease  # noqa: F401  (fleet: a fixture)
from test_kubernetes import (SLOW, cluster, complete, deployment, kmodel, pki,  # noqa: F401
                             start_thaw, urllib_status)


def sleepy_llama(cluster, thaw_factory, tmp_path, fault=None, load_ms=1200, extra=None):
    sim = cluster()
    d = deployment("llama", replicas=0, load_ms=load_ms,
                   annotations={"thaw.dev/sleep-mode": "true",
                                "thaw.dev/idle-before-sleep": "400ms",
                                "thaw.dev/sleep-timeout": "5s"})
    if fault:
        d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/sleep-fault"] = fault
    sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path, extra=extra)
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


@pytest.mark.timer_heavy
def test_a_wake_waits_until_the_pod_put_to_sleep_for_it_is_asleep(cluster, thaw_factory,
                                                                    tmp_path):
    """As above, but b takes 1.5 s to answer its /sleep: a's /wake_up goes out
    only once b is asleep and its memory free (before, both were awake on
    the 24 GiB GPU meanwhile: 28 GiB)."""
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 4,
                          "labels": {"nvidia.com/gpu.memory": "24576"}}])
    for name, sleep_ms in (("a", "10"), ("b", "1500")):
        d = deployment(name, load_ms=1200, annotations={
            "thaw.dev/sleep-mode": "true", "thaw.dev/idle-before-sleep": "1h",
            "thaw.dev/gpu-memory": "14Gi"})
        d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/sleep-ms"] = sleep_ms
        sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    assert complete(t, host="a.models").status == 200
    assert complete(t, host="b.models").status == 200
    wait_for(lambda: kmodel(t, "a")["state"] == "sleeping", timeout=5, what="a asleep")
    t0 = time.monotonic()
    r = complete(t, host="a.models")
    assert r.status == 200, r.body
    assert kmodel(t, "b")["state"] == "sleeping"  # asleep before a woke, not falling asleep
    assert time.monotonic() - t0 >= 1.4
    assert kmodel(t, "a")["sleep"]["wakes"] == 1


def one_gpu_node(cluster):
    return cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 4,
                           "labels": {"nvidia.com/gpu.memory": "24576"}}])


def memory_model(name, tier=None, sleep=False, token_ms="5", replicas=0,
                 idle_before_sleep="500ms"):
    anns = {"thaw.dev/gpu-memory": "14Gi"}
    if sleep:
        anns.update({"thaw.dev/sleep-mode": "true",
                     "thaw.dev/idle-before-sleep": idle_before_sleep})
    if tier:
        anns["thaw.dev/priority"] = tier
    # a load that spans the activator's half-second tick, as a model's does
    d = deployment(name, replicas=replicas, load_ms=1200, annotations=anns)
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = token_ms
    return d


def used_while(t, busy):
    """The GPU memory the node's awake pods hold, sampled while busy() is true."""
    seen = []
    while busy():
        node = next(n for n in t.status()["kubernetes"]["nodes"] if n["name"] == "gpu-a")
        seen.append(node["gpu_memory"]["used_bytes"])
        time.sleep(0.05)
    return seen


@pytest.mark.timer_heavy
@pytest.mark.parametrize("b_sleeps", [False, True], ids=["b-plain", "b-sleep-mode"])
def test_a_busy_sleep_mode_pod_keeps_its_gpu_memory(cluster, thaw_factory, tmp_path, b_sleeps):
    """One GPU of 24 GiB. a (sleep mode, 14 GiB) serves a 3 s request when b
    (14 GiB) is asked for: a cannot be put to sleep under its request, so b
    waits for the memory until a is idle and asleep (before, b's pod started
    at once: 28 GiB awake on the 24 GiB GPU)."""
    sim = one_gpu_node(cluster)
    sim.create_deployment(memory_model("a", sleep=True, token_ms="750"))  # 4 tokens: 3 s
    sim.create_deployment(memory_model("b", sleep=b_sleeps))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    assert complete(t, host="a.models", body={"model": "x", "prompt": "hi",
                                              "max_tokens": 1}).status == 200
    out = {}
    long_a = threading.Thread(target=lambda: out.__setitem__("a", complete(t, host="a.models")))
    later_b = threading.Thread(target=lambda: out.__setitem__("b", complete(t, host="b.models")))
    long_a.start()
    time.sleep(0.5)
    later_b.start()
    seen = used_while(t, long_a.is_alive)
    later_b.join(30)
    assert out["a"].status == 200 and out["b"].status == 200, (out["a"].body, out["b"].body)
    assert max(seen) <= 24 << 30, f"{max(seen) >> 30} GiB awake on the 24 GiB GPU"
    # b started once a was idle, and a was put to sleep for it
    assert kmodel(t, "a")["state"] == "sleeping" and kmodel(t, "b")["state"] == "ready"
    assert t.metric("thaw_cold_start_seconds_count", model="b", namespace="models") == 1


@pytest.mark.timer_heavy
def test_an_idle_critical_sleep_mode_pod_is_not_slept_for_a_standard_one(cluster, thaw_factory,
                                                                          tmp_path):
    """An idle critical pod is not put to sleep for a standard model's memory
    (the tier rule): the standard model waits until the critical one sleeps
    on its own, instead of starting beside it on the full GPU."""
    sim = one_gpu_node(cluster)
    sim.create_deployment(memory_model("a", tier="critical", sleep=True,
                                       idle_before_sleep="2s"))
    sim.create_deployment(memory_model("b", tier="standard"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    assert complete(t, host="a.models").status == 200
    out = {}
    b = threading.Thread(target=lambda: out.__setitem__("b", complete(t, host="b.models")))
    b.start()
    seen = used_while(t, lambda: b.is_alive() and kmodel(t, "a")["state"] != "sleeping")
    b.join(30)
    assert out["b"].status == 200, out["b"].body
    assert max(seen) <= 24 << 30, f"{max(seen) >> 30} GiB awake on the 24 GiB GPU"


def test_pods_awake_together_over_the_gpu_memory_are_put_to_sleep(cluster, thaw_factory,
                                                                  tmp_path):
    """Two sleep-mode Deployments installed with a replica each on one 24 GiB
    GPU (28 GiB awake), idle, idle-before-sleep an hour: one is put to sleep
    at once, the lower tier's, though no pod asks for memory (before, both
    stayed awake over the GPU's memory for the hour)."""
    sim = one_gpu_node(cluster)
    for name, tier in (("a", "standard"), ("b", "critical")):
        sim.create_deployment(memory_model(name, tier=tier, sleep=True, replicas=1,
                                           idle_before_sleep="1h"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    wait_for(lambda: kmodel(t, "a")["state"] == "sleeping", timeout=10 * SLOW,
             what="the standard pod asleep")
    assert kmodel(t, "b")["state"] == "ready"
    node = next(n for n in t.status()["kubernetes"]["nodes"] if n["name"] == "gpu-a")
    assert node["gpu_memory"]["used_bytes"] == 14 << 30


def test_a_pod_is_put_to_sleep_when_the_gpus_do_not_pack_though_the_sum_fits(cluster,
                                                                              thaw_factory,
                                                                              tmp_path):
    """Two GPUs of 40 GiB, an idle sleep-mode pod of 30 GiB on each, and a
    20 GiB model wakes: 80 GiB in all fits the node's 80, but no GPU has 20
    left. One pod is put to sleep for it, as the plan that admitted it
    counted on (before, only the node's sum was checked: nothing slept)."""
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 2, "replicas": 4,
                          "labels": {"nvidia.com/gpu.memory": "40960"}}])
    for name in ("a", "b"):
        d = memory_model(name, sleep=True, idle_before_sleep="1h")
        d["metadata"]["annotations"]["thaw.dev/gpu-memory"] = "30Gi"
        sim.create_deployment(d)
    c = memory_model("c")
    c["metadata"]["annotations"]["thaw.dev/gpu-memory"] = "20Gi"
    sim.create_deployment(c)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    for name in ("a", "b", "c"):
        assert complete(t, host=f"{name}.models").status == 200
    assert sorted(kmodel(t, n)["state"] for n in ("a", "b")) == ["ready", "sleeping"]
    node = next(n for n in t.status()["kubernetes"]["nodes"] if n["name"] == "gpu-a")
    assert node["gpu_memory"]["packs"] and node["gpu_memory"]["used_bytes"] == 50 << 30


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
    f = sleepy_fleet(fleet, 2, token_ms=500)
    leader = f.one_leader()
    follower = next(t for t in f.thaws if t is not leader)
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
    assert replicas(f.sim) == 1
    for t in f.thaws:
        assert t.metric("thaw_cold_start_seconds_count", model="llama", namespace="models") <= 1


def sleepy_fleet(fleet, n, token_ms, idle_before_sleep="500ms", **fleet_kw):
    """n activators and a sleep-mode model on the asyncio counterpart."""
    f = fleet(n, **fleet_kw)
    d = deployment("llama", replicas=0, load_ms=300,
                   annotations={"thaw.dev/sleep-mode": "true",
                                "thaw.dev/idle-before-sleep": idle_before_sleep,
                                "thaw.dev/sleep-timeout": "5s"})
    d["spec"]["template"]["metadata"]["annotations"].update(
        {"sim.thaw.dev/server": "asyncio", "sim.thaw.dev/sleep-mode": "true",
         "sim.thaw.dev/token-ms": str(token_ms)})
    f.sim.create_deployment(d)
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")
    return f


@pytest.mark.timer_heavy
def test_a_new_leader_does_not_put_to_sleep_a_pod_a_follower_is_using(fleet):
    """The leader dies while a follower has a long request on the model's only
    pod, and another activator takes the lease: it has heard nothing from the
    others yet, and must not take the model for idle (a /sleep would land
    under the follower's request). The pod sleeps once the request is over."""
    # The leader polls the others once a second (the default); the follower
    # with the request is slow to take the lease, so the idle one takes it.
    f = sleepy_fleet(fleet, 3, token_ms=2000, idle_before_sleep="300ms",
                     kube={"peers_poll_ms": 1000, "peers_timeout_ms": 5000},
                     per={2: {"renew_interval_ms": 1900, "renew_deadline_ms": 2500}})
    follower = f.thaws[2]
    if f.one_leader() is follower:
        hand_lease(f, f.thaws[0])
    leader = f.one_leader()
    one_token = {"model": "x", "prompt": "hi", "max_tokens": 1}
    assert complete(follower, body=one_token).status == 200  # a cold start, then 2 s
    pod = next(p for p in kmodel(follower)["pods"] if not p["terminating"])
    out = {}

    def long_request():
        out["r"] = complete(follower)  # 4 tokens of 2 s, on the pod all along
    th = threading.Thread(target=long_request)
    th.start()
    time.sleep(1.0)
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(10)
    asleep_under_it = []
    while th.is_alive():
        if pod_get(pod["ip"], "/is_sleeping")["is_sleeping"]:
            asleep_under_it.append(time.monotonic())
        time.sleep(0.1)
    assert out["r"].status == 200, out["r"].body
    assert not asleep_under_it, "the pod slept under the follower's request"
    new = f.one_leader(timeout=15)
    # Not heard from, the dead activator holds sleep off until it leaves
    # thaw's Service (its pod deleted).
    assert set(sleep_status(new).values()) == {"awake"}
    path = "/apis/discovery.k8s.io/v1/namespaces/models/endpointslices/thaw-abc"
    _, sl = f.sim.call("GET", path)
    sl["endpoints"] = [e for e in sl["endpoints"] if e["addresses"][0] != leader.host]
    f.sim.call("PUT", path, sl)
    wait_for(lambda: set(sleep_status(new).values()) == {"sleeping"}, timeout=10 * SLOW,
             what="asleep once idle")


def test_a_sleep_called_off_after_the_leader_stalled_wakes_the_pod_first(fleet):
    """The leader sends POST /sleep (the server takes 3 s to fall asleep) and
    stalls before it can mark the pod asleep, then dies: the mark stays
    falling-asleep. The activator that takes the lease cannot know whether
    the /sleep was sent; calling the sleep off (for a request, or for the
    silent activator) it wakes the pod (POST /wake_up, harmless had it been
    awake) before anything is routed to it (before, it routed the request to
    the sleeping server, which answered "the model is sleeping")."""
    f = fleet(2, kube={"lease_duration_ms": 5000})
    d = deployment("llama", gpus=0, load_ms=300,
                   annotations={"thaw.dev/sleep-mode": "true",
                                "thaw.dev/idle-before-sleep": "300ms",
                                "thaw.dev/sleep-timeout": "10s"})
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/sleep-ms"] = "3000"
    f.sim.create_deployment(d)
    leader = f.one_leader()
    other = next(t for t in f.thaws if t is not leader)
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")
    assert complete(other).status == 200  # a cold start
    pod = next(p for p in kmodel(other)["pods"] if not p["terminating"])
    # Once the other lets go of the pod, the leader sends /sleep at its next
    # poll and tick (well within 2 s); 2 s later it cannot have its answer.
    wait_for(lambda: json.loads(other.admin("/demand")[1])["unrouted"], timeout=10 * SLOW,
             interval=0.02, what="the other activator letting go of the pod")
    time.sleep(2)
    leader.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: pod_get(pod["ip"], "/is_sleeping")["is_sleeping"], timeout=5,
                 what="the pod asleep: the leader sent /sleep before it stalled")
        # The lease (5 s) outlasts the /sleep.
        wait_for(lambda: other.metric("thaw_leader") == 1, timeout=10,
                 what="the other activator leading")
        r = complete(other, timeout=20)
    finally:
        leader.proc.kill()
        leader.proc.wait(10)
    assert r.status == 200, r.body
    stats = pod_get(pod["ip"], "/stats")
    assert (stats["sleeps"], stats["wakes"], stats["completions"]) == (1, 1, 2), stats


def test_an_activator_that_lost_the_lease_follows_the_leaders_marks(fleet):
    """The leader put the pod to sleep, then lost the lease while running on:
    a request there asks the new leader for a wake and is served (before, the
    pod stayed asleep in the old leader's own state and its requests timed
    out), and the new leader can put the pod to sleep again."""
    f = sleepy_fleet(fleet, 2, token_ms=50)
    a = f.one_leader()
    b = next(t for t in f.thaws if t is not a)
    assert complete(a).status == 200
    wait_for(lambda: set(sleep_status(a).values()) == {"sleeping"} and
             set(sleep_status(b).values()) == {"sleeping"}, timeout=10 * SLOW, what="asleep")
    hand_lease(f, b)
    r = complete(a, timeout=20)
    assert r.status == 200, r.body
    assert b.metric("thaw_sleep_events_total", model="llama", namespace="models",
                    event="wake") == 1
    wait_for(lambda: set(sleep_status(a).values()) == {"sleeping"} and
             set(sleep_status(b).values()) == {"sleeping"}, timeout=10 * SLOW,
             what="asleep again, by the new leader")
    assert b.metric("thaw_sleep_events_total", model="llama", namespace="models",
                    event="sleep") == 1


def test_a_mark_the_api_refuses_holds_no_request(fleet):
    """Writing the falling-asleep mark fails (no `patch` on pods in the
    activator's Role, say): a request that comes meanwhile is served at once,
    not held until its queue timeout, and the pod is not asked to sleep again
    when idle after a few failures."""
    f = sleepy_fleet(fleet, 2, token_ms=50)
    a = f.one_leader()
    b = next(t for t in f.thaws if t is not a)
    assert complete(a).status == 200
    f.sim.call("POST", "/_sim/faults", {"fail_next": 100000, "fail_matching": "falling-asleep"})
    wait_for(lambda: set(sleep_status(a).values()) == {"falling_asleep"}, timeout=10 * SLOW,
             what="falling asleep")
    t0 = time.monotonic()
    assert complete(a, timeout=20).status == 200
    assert time.monotonic() - t0 < 2 * SLOW
    # After a few refused marks the pod stays awake and serving.
    awake_since = [None]

    def awake_for_3s():
        if set(sleep_status(a).values()) != {"awake"}:
            awake_since[0] = None
            return False
        awake_since[0] = awake_since[0] or time.monotonic()
        return time.monotonic() - awake_since[0] >= 3
    wait_for(awake_for_3s, timeout=20 * SLOW, interval=0.1, what="given up")
    assert complete(b, timeout=20).status == 200


@pytest.mark.timer_heavy
def test_a_request_that_wakes_the_pod_is_not_slept_under(fleet):
    """A request at the follower wakes the pod and runs 12 s; the leader polls
    every 3 s, so its view of the follower is that old. It must not put the
    pod to sleep under the request, whatever it saw last: the follower counts
    the request wherever it runs and lets go of the pod only once it ends."""
    f = sleepy_fleet(fleet, 2, token_ms=3000, idle_before_sleep="300ms",
                     kube={"peers_poll_ms": 3000, "peers_timeout_ms": 10000})
    leader = f.one_leader()
    follower = next(t for t in f.thaws if t is not leader)
    assert complete(follower, body={"model": "x", "prompt": "hi", "max_tokens": 1}).status == 200
    wait_for(lambda: set(sleep_status(leader).values()) == {"sleeping"} and
             set(sleep_status(follower).values()) == {"sleeping"}, timeout=20 * SLOW,
             what="asleep")
    pod = next(p for p in kmodel(leader)["pods"] if not p["terminating"])
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", complete(follower)))
    th.start()
    woken, asleep_under_it = False, []
    while th.is_alive():
        sleeping = pod_get(pod["ip"], "/is_sleeping")["is_sleeping"]
        woken = woken or not sleeping
        if woken and sleeping and th.is_alive():
            asleep_under_it.append(time.monotonic())
        time.sleep(0.1)
    assert out["r"].status == 200, out["r"].body
    assert woken and not asleep_under_it


def test_an_asleep_pod_is_kept_until_the_idle_timeout(cluster, thaw_factory, tmp_path):
    """The autoscaler counts an asleep pod as a replica it keeps: the model is
    scaled to zero at its idle timeout, not one stable window after its pod
    fell asleep (which turned the next request's wake into a cold start)."""
    sim, t = sleepy_llama(cluster, thaw_factory, tmp_path, load_ms=300,
                          extra={"autoscaler": {"tick_ms": 300, "stable_window_ms": 6000}})
    wait_for(lambda: kmodel(t)["state"] == "sleeping", timeout=5, what="asleep")
    time.sleep(8)
    assert replicas(sim) == 1
    assert kmodel(t)["state"] == "sleeping"


def test_a_pod_asleep_when_thaw_restarts_is_woken_not_routed(cluster, thaw_factory, tmp_path):
    """thaw restarts (a rollout) while its model's pod is asleep: the pod is
    Ready (vLLM answers /health while asleep) and listed ready in its
    EndpointSlice, but thaw asks its server (GET /is_sleeping) before routing
    it, and requests wake it. Before, it was routed as awake and requests got
    the sleeping server's 503 until idle-before-sleep passed. (Here the pod
    fell asleep before the kubelet's first readiness probe: not Ready, yet
    asleep.)"""
    sim, t = sleepy_llama(cluster, thaw_factory, tmp_path, load_ms=300)
    wait_for(lambda: kmodel(t)["state"] == "sleeping", timeout=5 * SLOW, what="asleep")
    pod = next(p for p in kmodel(t)["pods"] if not p["terminating"])
    t.stop()
    t2 = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t2, "/readyz") == 200, what="informers synced")
    assert pod_get(pod["ip"], "/is_sleeping") == {"is_sleeping": True}
    answers = [complete(t2) for _ in range(3)]
    assert [r.status for r in answers] == [200, 200, 200], answers[0].body
    assert t2.metric("thaw_sleep_events_total", model="llama", namespace="models",
                     event="wake") == 1
    assert t2.metric("thaw_cold_start_seconds_count", model="llama", namespace="models") == 0
    assert replicas(sim) == 1


@pytest.mark.timer_heavy
@pytest.mark.parametrize("held_at", ["follower", "leader"])
def test_a_request_at_the_second_activator_wakes_the_pod_dealt_to_it(fleet, held_at):
    """Two activators, a limit of 1 a pod, so each holds one of the two pods;
    both pods asleep, the autoscaler wanting one (a long stable window, short
    requests). A request at the second activator wakes the pod dealt to it:
    as a follower it asks the leader for that pod, as the leader it picks it.
    Before, the first asleep pod in no particular order was woken; when that
    was the first activator's, the request waited beside it, as nothing asked
    again while a pod was ready."""
    f = fleet(2, autoscaler={"tick_ms": 300, "stable_window_ms": 60000})
    first, second = f.thaws
    if (f.one_leader() is second) != (held_at == "leader"):
        hand_lease(f, second if held_at == "leader" else first)
    d = deployment("llama", replicas=0, load_ms=300,
                   annotations={"thaw.dev/sleep-mode": "true",
                                "thaw.dev/idle-before-sleep": "500ms",
                                "thaw.dev/sleep-timeout": "5s",
                                "thaw.dev/max-concurrency": "1"})
    d["spec"]["template"]["metadata"]["annotations"].update(
        {"sim.thaw.dev/server": "asyncio", "sim.thaw.dev/sleep-mode": "true",
         "sim.thaw.dev/token-ms": "500"})
    f.sim.create_deployment(d)
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")
    assert kmodel(second)["slots"]["rank"] == 1
    short = {"model": "x", "prompt": "hi", "max_tokens": 1}
    for t in (first, second):  # a pod for each (the second's by the share floor)
        r = complete(t, body=short, timeout=60)
        assert r.status == 200, r.body
    assert replicas(f.sim) == 2
    wait_for(lambda: list(sleep_status(first).values()) == ["sleeping", "sleeping"] and
             list(sleep_status(second).values()) == ["sleeping", "sleeping"],
             timeout=20 * SLOW, what="both pods asleep at both activators")
    # The deal's order: oldest first, then by name; the second pod is the second's.
    pods = f.sim.call("GET", "/api/v1/namespaces/models/pods")[1]["items"]
    mine = sorted((p["metadata"]["creationTimestamp"], p["metadata"]["name"])
                  for p in pods if p["metadata"]["name"].startswith("llama-"))[1][1]
    t0 = time.monotonic()
    r = complete(second, body=short, timeout=20)
    assert r.status == 200, r.body
    assert time.monotonic() - t0 < 8 * SLOW
    assert sleep_status(second)[mine] == "awake"


@pytest.mark.timer_heavy
def test_a_preempted_pod_keeps_its_gpu_memory_until_it_is_gone(cluster, thaw_factory, tmp_path):
    """One GPU of 24 GiB. Batch b (14 GiB) serves a 3 s request when critical
    c (14 GiB) is asked for: b is preempted (scaled down), and its pod,
    terminating, finishes the request first. c's pod is created only once
    b's is gone: the scheduler counts the terminating pod's GPU slice but
    not its memory, so before, c's pod started beside it at once (28 GiB on
    the 24 GiB GPU for the drain, up to the pod's grace period)."""
    sim = one_gpu_node(cluster)
    sim.create_deployment(memory_model("b", tier="batch", token_ms="750"))  # 4 tokens: 3 s
    sim.create_deployment(memory_model("c", tier="critical"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    assert complete(t, host="b.models", body={"model": "x", "prompt": "hi",
                                              "max_tokens": 1}).status == 200
    out = {}
    long_b = threading.Thread(target=lambda: out.__setitem__("b", complete(t, host="b.models")))
    long_b.start()
    time.sleep(0.5)
    c = threading.Thread(target=lambda: out.__setitem__("c", complete(t, host="c.models")))
    c.start()
    together = []
    while c.is_alive():
        pods = sim.call("GET", "/api/v1/namespaces/models/pods")[1]["items"]
        running = {p["metadata"]["name"].split("-")[0] for p in pods
                   if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"}
        if {"b", "c"} <= running:
            together.append(time.monotonic())
        time.sleep(0.05)
    long_b.join(30)
    assert out["b"].status == 200 and out["c"].status == 200, (out["b"].body, out["c"].body)
    assert t.metric("thaw_pool_decisions_total", model="b", namespace="models",
                    action="preempt") >= 1
    assert not together, f"b's and c's pods ran together for {len(together)} samples"


@pytest.mark.timer_heavy
def test_a_busy_batch_sleep_mode_pod_is_preempted_for_critical_memory(cluster, thaw_factory,
                                                                      tmp_path):
    """One GPU of 24 GiB. Batch b (sleep mode, 14 GiB) is kept busy by two
    streams of 1 s requests; critical c (14 GiB) is asked for. b's pod is
    preempted (scaled down: its requests in flight finish, then it stops) and
    c is served in seconds; b's later requests wait and are served once c has
    gone idle. Before, only an idle sleep-mode pod gave up its memory (put to
    sleep): c waited as long as the batch stream lasted, as the process
    backend no longer lets it."""
    sim = one_gpu_node(cluster)
    sim.create_deployment(memory_model("b", tier="batch", sleep=True, token_ms="250"))
    c = memory_model("c", tier="critical")
    c["metadata"]["annotations"]["thaw.dev/idle-timeout"] = "1s"
    sim.create_deployment(c)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    with Busy(lambda: complete(t, host="b.models")) as batch:
        wait_for(lambda: len(batch.statuses) >= 2, timeout=20 * SLOW, what="b serving")
        t0 = time.monotonic()
        r = complete(t, host="c.models", timeout=20)
        took = time.monotonic() - t0
    assert r.status == 200, r.body
    assert took < 10, took
    assert t.metric("thaw_pool_decisions_total", model="b", namespace="models",
                    action="preempt") >= 1
    assert batch.statuses and set(batch.statuses) == {200}  # drained or waited, none lost


@pytest.mark.timer_heavy
def test_a_rollout_of_one_memory_model_holds_no_other_back(cluster, thaw_factory, tmp_path):
    """Two GPU nodes of 24 GiB. x (14 GiB) runs a pod on one, then rolls out a
    new template whose pod takes minutes to load (a surge: two pods, one
    replica, for as long as it lasts). y (14 GiB) at zero is asked for: it
    starts at once on the other node. A scale-up waits only for pods thaw
    itself scaled away a moment ago, not for a rollout's extra pod (taken
    for one on its way out, it held y back as long as the rollout lasted)."""
    sim = cluster(nodes=[{"name": f"gpu-{n}", "gpus": 1, "replicas": 4,
                          "labels": {"nvidia.com/gpu.memory": "24576"}} for n in "ab"])
    sim.create_deployment(memory_model("x", replicas=1))
    sim.create_deployment(memory_model("y"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    wait_for(lambda: kmodel(t, "x")["state"] == "ready", timeout=10 * SLOW, what="x ready")

    def slow_template(d):
        d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/load-ms"] = "600000"
    sim.update("/apis/apps/v1/namespaces/models/deployments/x", slow_template)
    wait_for(lambda: len([p for p in kmodel(t, "x")["pods"] if not p["terminating"]]) == 2,
             timeout=10 * SLOW, what="the rollout's second pod")
    t0 = time.monotonic()
    r = complete(t, host="y.models", timeout=30)
    assert r.status == 200, r.body
    assert time.monotonic() - t0 < 8 * SLOW
    assert "waits for GPU memory" not in t.logs()
