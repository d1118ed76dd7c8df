"""End-to-end: per-node GPU placement in the Kubernetes backend, against the
API simulator, whose scheduler fits pods per node as kube-scheduler does
(resources, cordons, taints, selectors)."""

import threading

import pytest

from conftest import wait_for
from test_kubernetes import (  # noqa: F401  (pki and cluster are fixtures)
    cluster, complete, deployment, kmodel, pki, start_thaw, urllib_status)

FAST = {"autoscaler": {"tick_ms": 200}, "warm_pool": {"budget_slices": 8}}


def pods_of(sim, name):
    _, pods = sim.call("GET", "/api/v1/namespaces/models/pods")
    return [p for p in pods["items"]
            if p["metadata"]["labels"].get("app") == name
            and "deletionTimestamp" not in p["metadata"]]


def node_of(sim, name):
    ps = pods_of(sim, name)
    return ps[0]["spec"].get("nodeName") if ps else None


def replicas(sim, name):
    return sim.call("GET", f"/apis/apps/v1/namespaces/models/deployments/{name}")[1][
        "spec"]["replicas"]


def status_node(t, name):
    return next(n for n in t.status()["kubernetes"]["nodes"] if n["name"] == name)


def test_two_slice_replica_evicts_a_warm_replica_to_fit_on_one_node(cluster, thaw_factory,
                                                                     tmp_path):
    """Two nodes of 3 slices, each with a warm idle 2-slice batch replica: 2
    slices are free in all but no node has 2. A critical 2-slice model wakes:
    thaw must evict one warm replica so the new pod fits on that node, not
    count the two free slices as room (the pod would stay Pending)."""
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 3},
                         {"name": "gpu-b", "gpus": 1, "replicas": 3}], load_ms=100)
    idle = {"thaw.dev/priority": "batch", "thaw.dev/idle-timeout": "1s"}
    for name, node in (("warm-a", "gpu-a"), ("warm-b", "gpu-b")):
        sim.create_deployment(deployment(name, replicas=1, gpus=2, annotations=idle))
        wait_for(lambda name=name, node=node: node_of(sim, name) == node, timeout=20,
                 what=f"{name} on {node}")
    sim.create_deployment(deployment("big", gpus=2, annotations={"thaw.dev/priority": "critical"},
                        load_ms=100))
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    for name in ("warm-a", "warm-b"):
        wait_for(lambda name=name: kmodel(t, name)["pool"]["warm"], timeout=20,
                 what=f"{name} kept warm")
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", complete(t, host="big.models",
                                                                       timeout=40)))
    th.start()
    th.join(45)
    assert "r" in out and out["r"].status == 200
    # Exactly one warm replica went, and big runs where it was.
    gone = [n for n in ("warm-a", "warm-b") if replicas(sim, n) == 0]
    assert len(gone) == 1, gone
    kept = "warm-b" if gone == ["warm-a"] else "warm-a"
    assert replicas(sim, kept) == 1
    assert node_of(sim, "big") == {"warm-a": "gpu-a", "warm-b": "gpu-b"}[gone[0]]
    for name in ("gpu-a", "gpu-b"):
        n = status_node(t, name)
        assert n["allocatable"] == {"nvidia.com/gpu": 3}
        assert n["used"] == {"nvidia.com/gpu": 2}
        assert t.metric("thaw_node_used", node=name, resource="nvidia.com/gpu") == 2
    on_node = status_node(t, node_of(sim, "big"))["replicas"]
    assert [(r["model"], r["requests"]) for r in on_node] == [("big", {"nvidia.com/gpu": 2})]
    evicted = kmodel(t, gone[0])["pool"]
    assert evicted["last_decision"] == "evict"
    assert "for big" in evicted["reason"] and "on node gpu-" in evicted["reason"]
    big = kmodel(t, "big")
    assert {n["name"]: n["fit"] for n in big["placement"]["nodes"]} == {
        "gpu-a": "resources", "gpu-b": "resources"}  # both nodes now hold 2 of 3
    assert big["placement"]["requests"] == {"nvidia.com/gpu": 2}


def test_cordoned_and_tainted_nodes_in_status(cluster, thaw_factory, tmp_path):
    """A cordoned node and a node with a taint the model does not tolerate are
    not places for its replicas: /status says so per node, and a model that
    tolerates the taint may go there."""
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 2},
                         {"name": "gpu-b", "gpus": 1, "replicas": 2},
                         {"name": "gpu-c", "gpus": 1, "replicas": 2,
                          "product": "NVIDIA-H100-80GB-HBM3"}])
    sim.call("PATCH", "/api/v1/nodes/gpu-a", {"spec": {"unschedulable": True}},
             ctype="application/merge-patch+json")
    sim.call("PATCH", "/api/v1/nodes/gpu-b", {"spec": {"taints": [
        {"key": "dedicated", "value": "training", "effect": "NoSchedule"}]}},
        ctype="application/merge-patch+json")
    sim.create_deployment(deployment("llama"))
    tolerant = deployment("tolerant")
    spec = tolerant["spec"]["template"]["spec"]
    spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "nvidia.com/gpu.product", "operator": "NotIn",
            "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}}
    sim.create_deployment(tolerant)
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    wait_for(lambda: status_node(t, "gpu-b")["taints"], what="the taint seen")
    a, b = status_node(t, "gpu-a"), status_node(t, "gpu-b")
    assert a["cordoned"] and not b["cordoned"]
    assert b["taints"] == [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]
    assert t.metric("thaw_node_cordoned", node="gpu-a") == 1
    fits = {n["name"]: n["fit"] for n in kmodel(t, "llama")["placement"]["nodes"]}
    assert fits == {"gpu-a": "cordoned", "gpu-b": "taint", "gpu-c": "fits"}
    fits = {n["name"]: n["fit"] for n in kmodel(t, "tolerant")["placement"]["nodes"]}
    assert fits == {"gpu-a": "cordoned", "gpu-b": "fits", "gpu-c": "affinity"}


def test_scale_up_is_denied_when_only_cordoned_or_tainted_nodes_have_room(cluster, thaw_factory,
                                                                          tmp_path):
    """The model's one replica fills gpu-a; gpu-b (cordoned) and gpu-c (a
    taint it does not tolerate) are empty. Demand for more replicas must be
    denied, not admitted against the slices of nodes it may not use."""
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 1},
                         {"name": "gpu-b", "gpus": 1, "replicas": 2},
                         {"name": "gpu-c", "gpus": 1, "replicas": 2}], load_ms=100)
    d = deployment("llama", replicas=1, annotations={
        "thaw.dev/target": "1", "thaw.dev/max-concurrency": "1", "thaw.dev/max-scale": "4"},
        load_ms=100)
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "400"
    # gpu-b cordoned and gpu-c tainted first: the scheduler then has only gpu-a.
    sim.call("PATCH", "/api/v1/nodes/gpu-b", {"spec": {"unschedulable": True}},
             ctype="application/merge-patch+json")
    sim.call("PATCH", "/api/v1/nodes/gpu-c", {"spec": {"taints": [
        {"key": "dedicated", "value": "training", "effect": "NoExecute"}]}},
        ctype="application/merge-patch+json")
    sim.create_deployment(d)
    wait_for(lambda: node_of(sim, "llama") == "gpu-a", timeout=20, what="llama on gpu-a")
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    wait_for(lambda: kmodel(t)["state"] == "ready", timeout=20, what="llama ready")
    res = []
    ths = [threading.Thread(target=lambda: res.append(complete(t, timeout=60)))
           for _ in range(3)]
    for th in ths:
        th.start()
    wait_for(lambda: kmodel(t)["autoscaler"]["desired"] >= 2, timeout=20, what="more wanted")
    wait_for(lambda: kmodel(t)["pool"].get("last_decision") == "deny", timeout=10,
             what="denied")
    assert "no node it may use has room" in kmodel(t)["pool"]["reason"]
    for th in ths:
        th.join(60)
    assert [r.status for r in res] == [200] * 3
    assert [n for name, n in sim.state()["scale_log"] if name == "llama"] == []
    assert replicas(sim, "llama") == 1


def with_resource(d, resource, n=1):
    """d's pod template asks for n of resource (and no plain nvidia.com/gpu)."""
    c = d["spec"]["template"]["spec"]["containers"][0]
    c["resources"] = {"requests": {resource: str(n)}, "limits": {resource: str(n)}}
    return d


THREE_KINDS = [
    {"name": "ts", "gpus": 1, "replicas": 4,
     "labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing"}},
    {"name": "mig", "gpus": 1, "replicas": 1, "product": "NVIDIA-A100-SXM4-40GB",
     "allocatable": {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 2},
     "labels": {"nvidia.com/mig.strategy": "mixed"}},
    {"name": "mps", "gpus": 1, "replicas": 1,
     "allocatable": {"nvidia.com/gpu": 0, "nvidia.com/gpu.shared": 4},
     "labels": {"nvidia.com/gpu.sharing-strategy": "mps"}},
]


def test_each_kind_of_shared_gpu_gets_the_models_that_ask_for_it(cluster, thaw_factory,
                                                                 tmp_path):
    """Three nodes, three ways of sharing a GPU: time-sliced (nvidia.com/gpu x4),
    MIG in the mixed strategy (nvidia.com/mig-1g.10gb x2), MPS renamed
    (nvidia.com/gpu.shared x4). Each model wakes on the node whose kind it asks
    for, and thaw sees exactly that node as the one that fits."""
    sim = cluster(nodes=THREE_KINDS, load_ms=100)
    for name, res in (("sliced", "nvidia.com/gpu"), ("migged", "nvidia.com/mig-1g.10gb"),
                      ("shared", "nvidia.com/gpu.shared")):
        sim.create_deployment(with_resource(deployment(name, load_ms=100), res))
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    for name, node in (("sliced", "ts"), ("migged", "mig"), ("shared", "mps")):
        fits = {n["name"]: n["fit"] for n in kmodel(t, name)["placement"]["nodes"]}
        assert [n for n, f in fits.items() if f == "fits"] == [node], (name, fits)
        assert complete(t, host=f"{name}.models", timeout=40).status == 200
        assert node_of(sim, name) == node
    assert status_node(t, "mig")["used"] == {"nvidia.com/mig-1g.10gb": 1}
    assert status_node(t, "mps")["used"] == {"nvidia.com/gpu.shared": 1}


def test_a_mig_model_evicts_a_mig_replica_not_a_time_sliced_one(cluster, thaw_factory,
                                                                 tmp_path):
    """Both MIG instances are held by warm idle batch replicas, and a warm
    time-sliced batch replica idles too. A critical model needing a MIG
    instance wakes: the eviction frees a MIG instance on the MIG node, and the
    time-sliced replica (whose release would free nothing it can use) stays."""
    sim = cluster(nodes=THREE_KINDS, load_ms=100)
    idle = {"thaw.dev/priority": "batch", "thaw.dev/idle-timeout": "1s"}
    for name, res in (("mig-a", "nvidia.com/mig-1g.10gb"), ("mig-b", "nvidia.com/mig-1g.10gb"),
                      ("ts-a", "nvidia.com/gpu")):
        sim.create_deployment(with_resource(deployment(name, replicas=1, annotations=idle), res))
    sim.create_deployment(with_resource(deployment(
        "urgent", annotations={"thaw.dev/priority": "critical"}, load_ms=100),
        "nvidia.com/mig-1g.10gb"))
    for name, node in (("mig-a", "mig"), ("mig-b", "mig"), ("ts-a", "ts")):
        wait_for(lambda name=name, node=node: node_of(sim, name) == node, timeout=20,
                 what=f"{name} on {node}")
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    for name in ("mig-a", "mig-b", "ts-a"):
        wait_for(lambda name=name: kmodel(t, name)["pool"]["warm"], timeout=20,
                 what=f"{name} kept warm")
    r = complete(t, host="urgent.models", timeout=40)
    assert r.status == 200
    assert node_of(sim, "urgent") == "mig"
    gone = [n for n in ("mig-a", "mig-b") if replicas(sim, n) == 0]
    assert len(gone) == 1, gone
    assert replicas(sim, "ts-a") == 1
    assert kmodel(t, gone[0])["pool"]["last_decision"] == "evict"


GiB = 1 << 30
# Memory-bound time-sliced nodes, as GPU feature discovery labels them:
# "full" one 80 GiB GPU in 4 replicas, "pair" two 40 GiB GPUs in 2 each.
MEMORY_NODES = [
    {"name": "full", "gpus": 1, "replicas": 4,
     "labels": {"nvidia.com/gpu.memory": "81920",
                "nvidia.com/gpu.sharing-strategy": "time-slicing"}},
    {"name": "pair", "gpus": 2, "replicas": 2, "product": "NVIDIA-L40S",
     "labels": {"nvidia.com/gpu.memory": "40960",
                "nvidia.com/gpu.sharing-strategy": "time-slicing"}},
]


def with_memory(d, memory, node=None):
    """d declares its replica's GPU memory (on the pod template, as Knative
    users write annotations) and, given a node, may run only there."""
    d["spec"]["template"]["metadata"]["annotations"]["thaw.dev/gpu-memory"] = memory
    if node:
        d["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return d


def test_memory_bound_gpu_refuses_a_third_model(cluster, thaw_factory, tmp_path):
    """Two 30 GiB replicas share the 80 GiB GPU of "full" with slices to
    spare. A third 30 GiB model that may only go there is denied (its
    Deployment stays at zero, its request is held until its queue timeout);
    one that may go anywhere is admitted and lands on "pair" (one 40 GiB
    GPU takes it); a 50 GiB one fits no single GPU and is denied."""
    sim = cluster(nodes=MEMORY_NODES, load_ms=100)
    keep = {"thaw.dev/min-scale": "1"}
    for name in ("a", "b"):
        sim.create_deployment(with_memory(deployment(name, replicas=1, annotations=keep),
                                          "30Gi", "full"))
        wait_for(lambda name=name: node_of(sim, name) == "full", timeout=20,
                 what=f"{name} on full")
    short = {"thaw.dev/queue-timeout": "2s"}
    # A startup timeout shorter than its queue timeout: a request waiting for
    # GPU memory is no failed start; it ends at its queue timeout.
    sim.create_deployment(with_memory(deployment("pinned", annotations={
        "thaw.dev/queue-timeout": "3s", "thaw.dev/startup-timeout": "1s"}), "30Gi", "full"))
    sim.create_deployment(with_memory(deployment("free", load_ms=100), "30720Mi"))
    sim.create_deployment(with_memory(deployment("huge", annotations=short), "50Gi"))
    sim.create_deployment(with_memory(deployment("typo"), "30 GB"))
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    wait_for(lambda: status_node(t, "full")["gpu_memory"]["used_bytes"] == 60 * GiB,
             what="a and b seen on full")
    fits = {n["name"]: n["fit"] for n in kmodel(t, "pinned")["placement"]["nodes"]}
    assert fits == {"full": "gpu_memory", "pair": "node_selector"}
    held = [None, None]
    ths = [threading.Thread(target=lambda i=i, h=h: held.__setitem__(
        i, complete(t, host=f"{h}.models", timeout=20))) for i, h in enumerate(("pinned", "huge"))]
    for th in ths:
        th.start()
    for name in ("pinned", "huge"):
        wait_for(lambda name=name: kmodel(t, name)["pool"].get("last_decision") == "deny",
                 timeout=10, what=f"{name} denied")
        assert "no node it may use has room" in kmodel(t, name)["pool"]["reason"]
        assert kmodel(t, name)["state"] == "waiting_for_capacity"  # held, not "scaled_to_zero"
    assert complete(t, host="free.models", timeout=40).status == 200
    assert node_of(sim, "free") == "pair"
    for th in ths:
        th.join(20)
    assert all(r is not None and r.status in (503, 504) for r in held), held
    assert held[0].status == 504 and held[0].json()["error"]["code"] == "queue_timeout", \
        held[0].body
    assert replicas(sim, "pinned") == 0 and replicas(sim, "huge") == 0
    assert [n for n, _ in sim.state()["scale_log"] if n in ("pinned", "huge")] == []
    assert kmodel(t, "pinned")["gpu_memory_bytes"] == 30 * GiB
    typo = kmodel(t, "typo")
    assert typo["gpu_memory_bytes"] == 0
    assert 'thaw.dev/gpu-memory: "30 GB" is not a quantity of bytes' in typo["annotation_errors"]
    full = status_node(t, "full")
    assert full["sharing_strategy"] == "time-slicing"
    assert full["gpu_memory"] == {"source": "label", "gpus": 1, "per_gpu_bytes": 80 * GiB,
                                  "total_bytes": 80 * GiB, "used_bytes": 60 * GiB,
                                  "replicas": 2, "packs": True}
    gpu = full["resources"]["nvidia.com/gpu"]
    assert (gpu["capacity"], gpu["used"]) == (4, 2)
    assert sorted(h["model"] for h in gpu["holders"]) == ["a", "b"]
    assert {r["gpu_memory_bytes"] for r in full["replicas"]} == {30 * GiB}
    pair = status_node(t, "pair")["gpu_memory"]
    assert (pair["gpus"], pair["per_gpu_bytes"], pair["used_bytes"]) == (2, 40 * GiB, 30 * GiB)
    assert t.metric("thaw_node_gpu_memory_bytes", node="pair") == 80 * GiB
    assert t.metric("thaw_node_gpu_memory_used_bytes", node="full") == 60 * GiB


def test_memory_eviction_makes_room_for_a_critical_model(cluster, thaw_factory, tmp_path):
    """Two warm idle batch replicas of 30 GiB hold the 80 GiB GPU (the node has
    no memory label: kubernetes.gpu_memory_bytes says it); slices are free,
    memory is not. A critical 30 GiB model wakes: one warm replica is
    evicted (its release makes the newcomer fit) and the newcomer is served
    there; the other stays."""
    sim = cluster(nodes=[{"name": "full", "gpus": 1, "replicas": 4}], load_ms=100)
    idle = {"thaw.dev/priority": "batch", "thaw.dev/idle-timeout": "1s"}
    for name in ("warm-a", "warm-b"):
        sim.create_deployment(with_memory(deployment(name, replicas=1, annotations=idle),
                                          "30Gi"))
    sim.create_deployment(with_memory(deployment(
        "urgent", annotations={"thaw.dev/priority": "critical"}, load_ms=100), "30Gi"))
    for name in ("warm-a", "warm-b"):
        wait_for(lambda name=name: node_of(sim, name) == "full", timeout=20,
                 what=f"{name} on full")
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST, gpu_memory_bytes=80 * GiB)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    assert status_node(t, "full")["gpu_memory"]["source"] == "config"
    for name in ("warm-a", "warm-b"):
        wait_for(lambda name=name: kmodel(t, name)["pool"]["warm"], timeout=20,
                 what=f"{name} kept warm")
    assert complete(t, host="urgent.models", timeout=40).status == 200
    assert node_of(sim, "urgent") == "full"
    gone = [n for n in ("warm-a", "warm-b") if replicas(sim, n) == 0]
    assert len(gone) == 1, gone
    evicted = kmodel(t, gone[0])["pool"]
    assert evicted["last_decision"] == "evict" and "for urgent" in evicted["reason"]
    wait_for(lambda: status_node(t, "full")["gpu_memory"]["used_bytes"] == 60 * GiB,
             what="the evicted pod gone")


@pytest.mark.timer_heavy
def test_the_slice_cap_holds_a_wake_from_zero(cluster, thaw_factory, tmp_path):
    """warm_pool.capacity_slices 1 on a node of 4 slices: with "a" holding the
    one slice, a request for "b" does not scale it from zero (the cap holds
    wakes as it holds scale-ups); it waits and ends at its queue timeout,
    and the decision names the cap."""
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 4}], load_ms=100)
    sim.create_deployment(deployment("a", replicas=1, annotations={"thaw.dev/min-scale": "1"}))
    sim.create_deployment(deployment("b", annotations={"thaw.dev/queue-timeout": "3s"}))
    wait_for(lambda: node_of(sim, "a") == "gpu-a", timeout=20, what="a running")
    t = start_thaw(thaw_factory, sim, tmp_path,
                   extra={"autoscaler": {"tick_ms": 200}, "warm_pool": {"capacity_slices": 1}})
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    wait_for(lambda: kmodel(t, "a")["state"] == "ready", timeout=20, what="a ready")
    r = complete(t, host="b.models", timeout=20)
    assert r.status == 504 and r.json()["error"]["code"] == "queue_timeout", r.body
    assert replicas(sim, "b") == 0
    assert "warm_pool.capacity_slices reached" in kmodel(t, "b")["pool"]["reason"]
    t.assert_reconciled()
