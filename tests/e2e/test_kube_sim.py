"""The Kubernetes API simulator itself, against real clients (kubectl, the
Python client): its controllers, scheduler and kubelet behave as the
Kubernetes documentation says the real ones do. No thaw here."""

import json
import os
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import wait_for
from test_kubernetes import KUBECTL, cluster, pki  # noqa: F401  (fixtures)

NS = "models"


def kubectl(sim, tmp_path, *args, timeout=30):
    if not os.path.exists(KUBECTL):
        pytest.skip("kubectl not installed (scripts/setup.sh installs it)")
    kc = str(tmp_path / "kc")
    if not os.path.exists(kc):
        sim.kubeconfig(kc)
    return subprocess.run([KUBECTL, "--kubeconfig", kc, *args], capture_output=True, text=True,
                          timeout=timeout)


def kjson(sim, tmp_path, *args):
    r = kubectl(sim, tmp_path, *args, "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def web(name="web", replicas=1, gpus=0, labels=None, annotations=None, probe=None, **spec):
    """A Deployment written as the Kubernetes documentation writes one."""
    labels = labels or {"app": name}
    ctr = {"name": "server", "image": "vllm/vllm-openai:v0.6.0",
           "ports": [{"name": "http", "containerPort": 8000}],
           "readinessProbe": probe or {"httpGet": {"path": "/health", "port": "http"},
                                       "periodSeconds": 1}}
    if gpus:
        ctr["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    body = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": {"thaw.dev/model": "true"}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                     "template": {"metadata": {"labels": dict(labels),
                                               "annotations": {"sim.thaw.dev/load-ms": "100",
                                                               **(annotations or {})}},
                                  "spec": {"containers": [ctr]}}}}
    body["spec"].update(spec)
    return body


def create(sim, body):
    code, out = sim.call("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", body)
    assert code == 201, out
    return out


def pods(sim, **selectors):
    q = "&".join(f"{k}={v}" for k, v in selectors.items())
    return sim.call("GET", f"/api/v1/namespaces/{NS}/pods?{q}")[1]["items"]


def ready(p):
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in p["status"].get("conditions", []))


def rs_view(sim):
    return {r["name"]: r for r in sim.state()["replicasets"]}


def pod_scheduled(p):
    return next((c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"),
                None)


# --- Deployments and ReplicaSets ------------------------------------------------------

def test_kubectl_shows_replicasets_owning_pods(cluster, tmp_path):
    sim = cluster(kubelet_ms=None)
    d = create(sim, web(replicas=2))
    wait_for(lambda: len([p for p in pods(sim) if ready(p)]) == 2, timeout=20,
             what="two pods ready")
    rss = kjson(sim, tmp_path, "get", "rs")["items"]
    assert len(rss) == 1
    rs = rss[0]
    h = rs["metadata"]["labels"]["pod-template-hash"]
    assert rs["metadata"]["name"] == f"web-{h}"
    assert rs["metadata"]["ownerReferences"] == [{
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
        "uid": d["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", "pod-template-hash": h}
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert rs["status"]["readyReplicas"] == 2
    ps = kjson(sim, tmp_path, "get", "pods", "-l", "app=web")["items"]
    assert len(ps) == 2
    for p in ps:
        assert p["metadata"]["name"].startswith(f"web-{h}-")
        assert len(p["metadata"]["name"]) == len(f"web-{h}-") + 5
        assert p["metadata"]["labels"] == {"app": "web", "pod-template-hash": h}
        ref = p["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "ReplicaSet", rs["metadata"]["name"], rs["metadata"]["uid"], True)
    r = kubectl(sim, tmp_path, "get", "rs", "-l", f"pod-template-hash={h}",
                "-o", "jsonpath={.items[*].metadata.name}")
    assert r.stdout == rs["metadata"]["name"]
    # What each controller did, as Events.
    evs = {(e["involvedObject"]["kind"], e["reason"], e["source"]["component"]): e
           for e in kjson(sim, tmp_path, "get", "events")["items"]}
    assert evs[("Deployment", "ScalingReplicaSet", "deployment-controller")]["message"] == \
        f"Scaled up replica set {rs['metadata']['name']} to 2 from 0"
    assert ("ReplicaSet", "SuccessfulCreate", "replicaset-controller") in evs
    assert ("Pod", "Scheduled", "default-scheduler") in evs
    assert ("Pod", "Started", "kubelet") in evs
    # kubectl describe reads the namespace, the ReplicaSets and the Events.
    r = kubectl(sim, tmp_path, "describe", "deployment", "web")
    assert r.returncode == 0, r.stderr
    assert f"NewReplicaSet:   {rs['metadata']['name']} (2/2 replicas created)" in r.stdout
    assert "ScalingReplicaSet" in r.stdout
    # A deleted pod turns terminating and the ReplicaSet replaces it.
    gone = ps[0]["metadata"]["name"]
    r = kubectl(sim, tmp_path, "delete", "pod", gone, "--wait=false")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: len([p for p in pods(sim) if ready(p) and
                          p["metadata"]["name"] != gone]) == 2, timeout=20, what="replaced")
    wait_for(lambda: gone not in [p["metadata"]["name"] for p in pods(sim)], timeout=20,
             what="the deleted pod gone")
    # Deleting the Deployment takes its ReplicaSets and pods with it.
    assert kubectl(sim, tmp_path, "delete", "deployment", "web").returncode == 0
    wait_for(lambda: not pods(sim) and not sim.state()["replicasets"], timeout=20,
             what="garbage collected")


def test_rollout_status_follows_a_rolling_update(cluster, tmp_path):
    sim = cluster(kubelet_ms=None, nodes=[{"name": "n1", "gpus": 0}])
    create(sim, web(replicas=4))
    r = kubectl(sim, tmp_path, "rollout", "status", "deployment/web", "--timeout=60s",
                timeout=70)
    assert r.returncode == 0 and "successfully rolled out" in r.stdout, r.stdout + r.stderr
    first = list(rs_view(sim))
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            st = sim.state()
            live = [p for p in st["pods"] if not p["terminating"]]
            samples.append(({r["name"]: r["replicas"] for r in st["replicasets"]}, len(live),
                            sum(1 for p in live if p["ready"])))
            time.sleep(0.05)
    th = threading.Thread(target=sample)
    th.start()
    # A template change (a strategic merge patch of the containers list).
    r = kubectl(sim, tmp_path, "set", "env", "deployment/web", "MODE=fast")
    assert r.returncode == 0, r.stderr
    r = kubectl(sim, tmp_path, "rollout", "status", "deployment/web", "--timeout=60s",
                timeout=70)
    stop.set()
    th.join()
    assert r.returncode == 0 and "successfully rolled out" in r.stdout, r.stdout + r.stderr
    assert "Waiting for deployment" in r.stdout  # it did wait for the rollout
    final = rs_view(sim)
    new = next(n for n in final if n not in first)
    assert final[first[0]]["replicas"] == 0 and final[new]["replicas"] == 4
    assert final[new]["revision"] == 2
    # Mid-way both ReplicaSets had pods; never more than replicas + maxSurge
    # (25% of 4 = 1) pods, never fewer than replicas - maxUnavailable (1) ready.
    assert any(s[0].get(first[0], 0) > 0 and s[0].get(new, 0) > 0 for s in samples)
    assert max(s[1] for s in samples) <= 5
    assert min(s[2] for s in samples) >= 3
    d = kjson(sim, tmp_path, "get", "deployment", "web")
    ctr = d["spec"]["template"]["spec"]["containers"][0]
    assert ctr["env"] == [{"name": "MODE", "value": "fast"}]
    assert ctr["image"] == "vllm/vllm-openai:v0.6.0" and ctr["readinessProbe"]  # merged
    assert d["metadata"]["generation"] == 2 and d["status"]["observedGeneration"] == 2
    assert d["status"]["updatedReplicas"] == 4 and d["status"]["availableReplicas"] == 4
    conds = {c["type"]: c for c in d["status"]["conditions"]}
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"
    assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"


def test_recreate_strategy_stops_old_pods_before_new_ones(cluster, tmp_path):
    sim = cluster(kubelet_ms=None, nodes=[{"name": "n1", "gpus": 0}])
    create(sim, web(replicas=2, strategy={"type": "Recreate"}))
    wait_for(lambda: len([p for p in pods(sim) if ready(p)]) == 2, timeout=20, what="ready")
    old_hash = pods(sim)[0]["metadata"]["labels"]["pod-template-hash"]
    mixed = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in pods(sim)}
            mixed.append(len(hashes) > 1)
            time.sleep(0.03)
    th = threading.Thread(target=sample)
    th.start()
    r = kubectl(sim, tmp_path, "rollout", "restart", "deployment/web")
    assert r.returncode == 0, r.stderr
    r = kubectl(sim, tmp_path, "rollout", "status", "deployment/web", "--timeout=60s",
                timeout=70)
    stop.set()
    th.join()
    assert r.returncode == 0 and "successfully rolled out" in r.stdout, r.stdout + r.stderr
    now = pods(sim)
    assert len(now) == 2 and all(p["metadata"]["labels"]["pod-template-hash"] != old_hash
                                 for p in now)
    assert not any(mixed)  # old and new pods never ran together


def test_scale_by_patch_and_subresource_and_selector_expressions(cluster, tmp_path):
    from kubernetes import client, config
    sim = cluster(kubelet_ms=None, nodes=[{"name": "n1", "gpus": 0}])
    config.load_kube_config(sim.kubeconfig(str(tmp_path / "kc-py")))
    apps = client.AppsV1Api()
    body = web("expr", replicas=0, labels={"app": "expr", "tier": "gpu"})
    body["spec"]["selector"] = {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["expr", "other"]},
        {"key": "tier", "operator": "Exists"}]}
    apps.create_namespaced_deployment(NS, body)
    sc = apps.read_namespaced_deployment_scale("expr", NS)
    assert sc.status.selector == "app in (expr,other),tier"
    apps.patch_namespaced_deployment_scale("expr", NS, {"spec": {"replicas": 1}})
    wait_for(lambda: len(pods(sim)) == 1, timeout=10, what="scaled by /scale")
    for ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        want = 3 if "strategic" in ctype else 2
        code, d = sim.call("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/expr",
                           {"spec": {"replicas": want}}, ctype=ctype)
        assert code == 200 and d["spec"]["replicas"] == want
        wait_for(lambda: len([p for p in pods(sim) if not p["metadata"].get(
            "deletionTimestamp")]) == want, timeout=10, what=f"scaled by {ctype}")
    d = apps.read_namespaced_deployment("expr", NS)
    assert d.metadata.generation == 4  # one per spec change
    wait_for(lambda: apps.read_namespaced_deployment("expr", NS).status.ready_replicas == 3,
             timeout=20, what="three ready")
    # A selector that does not match the template is refused, as by the real server.
    bad = web("bad")
    bad["spec"]["selector"] = {"matchLabels": {"app": "nope"}}
    code, st = sim.call("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", bad)
    assert code == 422 and st["reason"] == "Invalid"
    assert "`selector` does not match template `labels`" in st["message"]


def test_documented_deployment_is_selected_by_its_selector_only(cluster, tmp_path):
    sim = cluster(kubelet_ms=None, nodes=[{"name": "n1", "gpus": 0}])
    create(sim, web("x", replicas=2))
    # A pod of someone else's that carries the Deployment's model label is
    # not its pod; the Deployment's pods carry only its template's labels.
    code, _ = sim.call("POST", f"/api/v1/namespaces/{NS}/pods", {
        "metadata": {"name": "stray", "labels": {"thaw.dev/model": "true", "app": "y"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert code == 201
    wait_for(lambda: len([p for p in pods(sim, labelSelector="app=x") if ready(p)]) == 2,
             timeout=20, what="selected pods ready")
    ps = pods(sim, labelSelector="app=x")
    assert {tuple(sorted(p["metadata"]["labels"])) for p in ps} == {("app", "pod-template-hash")}
    d = wait_for(lambda: (lambda d: d if d["status"].get("readyReplicas") == 2 else None)(
        sim.call("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/x")[1]), what="status")
    assert d["status"]["replicas"] == 2  # the stray pod is not counted
    stray = pods(sim, fieldSelector="metadata.name=stray")[0]
    assert "ownerReferences" not in stray["metadata"]


# --- the scheduler ------------------------------------------------------------------

def test_pod_needing_two_gpus_stays_pending_with_the_real_message(cluster, tmp_path):
    sim = cluster(nodes=[{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1}])
    create(sim, web("big", replicas=1, gpus=2))
    wait_for(lambda: pods(sim) and pod_scheduled(pods(sim)[0]), what="scheduling tried")
    p = pods(sim)[0]
    cond = pod_scheduled(p)
    assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"] == ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. "
                               "preemption: 0/2 nodes are available: 2 No preemption victims "
                               "found for incoming pod.")
    # Capacity arrives: a node with two GPUs joins, and the pod goes there.
    code, _ = sim.call("POST", "/api/v1/nodes", {
        "metadata": {"name": "c", "labels": {"kubernetes.io/hostname": "c"}},
        "status": {"allocatable": {"nvidia.com/gpu": "2", "pods": "110", "cpu": "8"}}})
    assert code == 201
    wait_for(lambda: pods(sim)[0]["spec"].get("nodeName") == "c", timeout=10,
             what="scheduled on the new node")
    assert sim.state()["nodes"]["c"]["requested"] == {"nvidia.com/gpu": "2"}


def test_scheduling_delay_and_image_pull_with_the_kubelets_events(cluster, tmp_path):
    sim = cluster()
    create(sim, web("slow", annotations={"sim.thaw.dev/schedule-delay-ms": "300",
                                         "sim.thaw.dev/pull-ms": "400"}))
    wait_for(lambda: pods(sim), what="pod created")
    start = time.monotonic()
    p = pods(sim)[0]
    assert not p["spec"].get("nodeName") and pod_scheduled(p) is None  # not reached yet
    wait_for(lambda: pods(sim)[0]["spec"].get("nodeName"), what="scheduled")
    bound = time.monotonic()
    assert bound - start >= 0.2
    # Pulling: Pending, the container waiting in ContainerCreating, no container started.
    wait_for(lambda: pods(sim)[0]["status"].get("containerStatuses"), what="pull started")
    p = pods(sim)[0]
    cs = p["status"]["containerStatuses"][0]
    assert p["status"]["phase"] == "Pending"
    assert cs["state"] == {"waiting": {"reason": "ContainerCreating"}} and not cs["started"]
    wait_for(lambda: "running" in pods(sim)[0]["status"]["containerStatuses"][0]["state"],
             what="container started")
    assert time.monotonic() - bound >= 0.35
    running = pods(sim)[0]["status"]["containerStatuses"][0]["state"]["running"]
    assert running["startedAt"].endswith("Z")
    # The kubelet's Events, as it words them, selectable by reason.
    q = "fieldSelector=involvedObject.kind%3DPod%2Creason%3DPulled"
    evs = sim.call("GET", f"/api/v1/namespaces/{NS}/events?{q}")[1]["items"]
    assert len(evs) == 1 and evs[0]["source"]["component"] == "kubelet"
    assert re.fullmatch(r'Successfully pulled image "vllm/vllm-openai:v0\.6\.0" in '
                        r'(\d+\.\d{3})s \(\1s including waiting\)\. Image size: \d+ bytes\.',
                        evs[0]["message"]), evs[0]["message"]
    assert 0.35 <= float(re.search(r"in ([\d.]+)s", evs[0]["message"]).group(1)) < 1.5
    evs = sim.call("GET", f"/api/v1/namespaces/{NS}/events")[1]["items"]
    order = [e["reason"] for e in sorted(evs, key=lambda e: int(e["metadata"]["resourceVersion"]))
             if e["involvedObject"]["kind"] == "Pod"]
    # (then Unhealthy, perhaps: the readiness probe while the model loads)
    assert order[:4] == ["Scheduled", "Pulling", "Pulled", "Started"], order
    pulling = next(e for e in evs if e["reason"] == "Pulling")
    assert pulling["message"] == 'Pulling image "vllm/vllm-openai:v0.6.0"'


def test_cordon_and_uncordon_change_scheduling(cluster, tmp_path):
    sim = cluster(nodes=[{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1}])
    r = kubectl(sim, tmp_path, "cordon", "a")
    assert r.returncode == 0 and "cordoned" in r.stdout, r.stderr
    node = kjson(sim, tmp_path, "get", "node", "a")
    assert node["spec"]["unschedulable"] is True
    wait_for(lambda: any(t["key"] == "node.kubernetes.io/unschedulable" for t in sim.call(
        "GET", "/api/v1/nodes/a")[1]["spec"].get("taints", [])), what="cordon taint")
    create(sim, web("w", replicas=2, gpus=1))
    wait_for(lambda: len(pods(sim)) == 2 and all(pod_scheduled(p) for p in pods(sim)),
             what="both tried")
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods(sim)}
    assert sorted(placed.values(), key=str) == [None, "b"]
    pending = next(p for p in pods(sim) if not p["spec"].get("nodeName"))
    assert pod_scheduled(pending)["message"] == (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were "
        "unschedulable. preemption: 0/2 nodes are available: 1 No preemption victims found "
        "for incoming pod, 1 Preemption is not helpful for scheduling.")
    r = kubectl(sim, tmp_path, "uncordon", "a")
    assert r.returncode == 0 and "uncordoned" in r.stdout, r.stderr
    wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(sim)), timeout=10,
             what="scheduled after uncordon")
    assert sorted(p["spec"]["nodeName"] for p in pods(sim)) == ["a", "b"]
    assert "unschedulable" not in sim.call("GET", "/api/v1/nodes/a")[1]["spec"]
    assert sim.state()["nodes"]["a"]["pods"]


def test_taints_tolerations_selectors_and_extended_resources(cluster, tmp_path):
    sim = cluster(nodes=[
        {"name": "tainted", "gpus": 4, "taints": ["dedicated=gpu:NoSchedule"]},
        {"name": "plain", "gpus": 1, "labels": {"pool": "small"}},
        {"name": "mig", "gpus": 0, "allocatable": {"nvidia.com/mig-1g.10gb": "7"},
         "labels": {"pool": "mig"}}])
    create(sim, web("plain", replicas=2, gpus=1))
    wait_for(lambda: len(pods(sim)) == 2 and all(pod_scheduled(p) for p in pods(sim)),
             what="both tried")
    assert sorted(str(p["spec"].get("nodeName")) for p in pods(sim)) == ["None", "plain"]
    pending = next(p for p in pods(sim) if not p["spec"].get("nodeName"))
    assert pod_scheduled(pending)["message"].startswith(
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, "
        "2 Insufficient nvidia.com/gpu.")
    # Tolerating the taint (Equal), the pending one is still kept off by its
    # own template; a Deployment that tolerates it lands there.
    body = web("tol", replicas=2, gpus=1, labels={"app": "tol"})
    body["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    body["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]}]}}}
    create(sim, body)
    wait_for(lambda: len([p for p in pods(sim, labelSelector="app=tol")
                          if p["spec"].get("nodeName")]) == 2, timeout=10, what="tolerated")
    assert {p["spec"]["nodeName"] for p in pods(sim, labelSelector="app=tol")} == {"tainted"}
    # A MIG slice asked for by limits only, with a nodeSelector.
    mig = web("mig", replicas=1, labels={"app": "mig"})
    mig["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/mig-1g.10gb": "2"}}
    mig["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "mig"}
    create(sim, mig)
    wait_for(lambda: pods(sim, labelSelector="app=mig") and
             pods(sim, labelSelector="app=mig")[0]["spec"].get("nodeName") == "mig",
             timeout=10, what="on the MIG node")
    assert sim.state()["nodes"]["mig"]["requested"] == {"nvidia.com/mig-1g.10gb": "2"}


# --- the kubelet ------------------------------------------------------------------

def listening(ip, port):
    try:
        socket.create_connection((ip, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def watch_start(sim, label, port=8000, timeout=20):
    """Polls a pod: when it ran, when its server listened, when it was Ready."""
    t = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "ready" not in t:
        ps = pods(sim, labelSelector=label)
        now = time.monotonic()
        if ps and ps[0]["status"].get("podIP") and ps[0]["status"]["phase"] == "Running":
            ip = ps[0]["status"]["podIP"]
            if "running" not in t:
                t["running"], t["ip"] = now, ip
                t["listening_when_running"] = listening(ip, port)
            if "listen" not in t and listening(ip, port):
                t["listen"] = time.monotonic()
            if ready(ps[0]):
                t["ready"] = now
        time.sleep(0.02)
    return t


@pytest.mark.parametrize("server", ["c", "asyncio"])
def test_running_before_listening_ready_at_the_next_probe(cluster, tmp_path, server):
    sim = cluster(kubelet_ms=None)  # the probes' own periodSeconds
    body = web("slow", gpus=1, annotations={"sim.thaw.dev/load-ms": "700",
                                             "sim.thaw.dev/server": server},
               probe={"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 3})
    create(sim, body)
    t = watch_start(sim, "app=slow")
    assert "ready" in t, t
    assert not t["listening_when_running"]  # Running with an IP while still loading
    assert t["running"] < t["listen"] <= t["ready"]
    # Ready at the first probe after the server listens: the probes run when
    # the container starts and every 3 s after (so ~2 s after listening here).
    lag = t["ready"] - t["listen"]
    assert 0.3 < lag <= 3.3, t
    since_start = t["ready"] - t["running"]
    assert abs(since_start - 3 * round(since_start / 3)) < 0.4, t  # on the probe ticker
    c = sim.call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=app=slow")[1]["items"][0]
    unhealthy = [e for e in sim.call("GET", f"/api/v1/namespaces/{NS}/events")[1]["items"]
                 if e["reason"] == "Unhealthy" and e["involvedObject"]["uid"] ==
                 c["metadata"]["uid"]]
    ip = c["status"]["podIP"]
    assert [e["message"] for e in unhealthy] == [
        f'Readiness probe failed: Get "http://{ip}:8000/health": dial tcp {ip}:8000: '
        "connect: connection refused"]
    cs = c["status"]["containerStatuses"][0]
    assert cs["ready"] and cs["started"] and "running" in cs["state"]
    assert c["status"]["podIP"].startswith("127.")


def test_asyncio_server_answering_503_while_loading(cluster, tmp_path):
    sim = cluster(kubelet_ms=300)  # --kubelet-period-ms overrides periodSeconds
    create(sim, web("five", annotations={"sim.thaw.dev/load-ms": "1500",
                                          "sim.thaw.dev/server": "asyncio",
                                          "sim.thaw.dev/loading": "503"},
                    probe={"httpGet": {"path": "/health", "port": "http"},
                           "periodSeconds": 30}))
    t = watch_start(sim, "app=five")
    assert "ready" in t, t
    assert t["listening_when_running"] is False or t["listen"] - t["running"] < 1.0
    # Listening early, answering 503: Ready only once loaded (1.5 s).
    assert t["ready"] - t["listen"] > 0.8
    assert any(e["reason"] == "Unhealthy" and e["message"] ==
               "Readiness probe failed: HTTP probe failed with statuscode: 503"
               for e in sim.call("GET", f"/api/v1/namespaces/{NS}/events")[1]["items"])
    import urllib.request
    with urllib.request.urlopen(f"http://{t['ip']}:8000/v1/models", timeout=5) as r:
        assert r.headers["x-served-by"]
        assert json.loads(r.read())["data"][0]["id"] == "sim"  # no thaw.dev/model pod label


def test_probe_thresholds_initial_delay_and_startup_probe(cluster, tmp_path):
    sim = cluster(kubelet_ms=None, nodes=[{"name": "n1", "gpus": 0}])
    body = web("st", annotations={"sim.thaw.dev/load-ms": "0"},
               probe={"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1,
                      "initialDelaySeconds": 2, "successThreshold": 2})
    body["spec"]["template"]["spec"]["containers"][0]["startupProbe"] = {
        "tcpSocket": {"port": 8000}, "periodSeconds": 1}
    create(sim, body)
    t = watch_start(sim, "app=st")
    assert "ready" in t, t
    # Not before initialDelaySeconds, then two successes a period apart.
    assert t["ready"] - t["running"] >= 2.5, t
    # A server that exits is restarted by the kubelet (back-off 10 s first).
    p = pods(sim, labelSelector="app=st")[0]
    pid = next(x["pid"] for x in sim.state()["pods"] if x["name"] == p["metadata"]["name"])
    os.kill(pid, 9)
    wait_for(lambda: not ready(pods(sim, labelSelector="app=st")[0]), timeout=5,
             what="not ready after the crash")
    cs = pods(sim, labelSelector="app=st")[0]["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert pods(sim, labelSelector="app=st")[0]["status"]["phase"] == "Running"
    wait_for(lambda: ready(pods(sim, labelSelector="app=st")[0]), timeout=40,
             what="ready again after the restart")
    cs = pods(sim, labelSelector="app=st")[0]["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 1 and cs["lastState"]["terminated"]["exitCode"] != 0


# --- Services and EndpointSlices ----------------------------------------------------

def test_endpointslices_follow_a_created_service(cluster, tmp_path):
    from kubernetes import client, config
    sim = cluster(kubelet_ms=300, nodes=[{"name": "n1", "gpus": 0,
                                          "labels": {"topology.kubernetes.io/zone": "z1"}}])
    config.load_kube_config(sim.kubeconfig(str(tmp_path / "kc-py")))
    core, disc = client.CoreV1Api(), client.DiscoveryV1Api()
    create(sim, web("x", replicas=2))
    wait_for(lambda: len([p for p in pods(sim) if ready(p)]) == 2, timeout=20, what="ready")
    assert disc.list_namespaced_endpoint_slice(NS).items == []  # no Service, no slices
    svc = core.create_namespaced_service(NS, {
        "metadata": {"name": "x-svc", "labels": {"team": "ml"}},
        "spec": {"selector": {"app": "x"}, "ports": [{"name": "web", "port": 80,
                                                      "targetPort": "http"}]}})
    assert svc.spec.cluster_ip and svc.spec.ports[0].protocol == "TCP"

    def slices():
        return disc.list_namespaced_endpoint_slice(
            NS, label_selector="kubernetes.io/service-name=x-svc").items
    wait_for(lambda: slices() and len(slices()[0].endpoints or []) == 2, timeout=10,
             what="slice with two endpoints")
    s = slices()[0]
    assert s.metadata.labels["endpointslice.kubernetes.io/managed-by"] == \
        "endpointslice-controller.k8s.io"
    assert s.metadata.labels["team"] == "ml"
    assert s.metadata.owner_references[0].uid == svc.metadata.uid
    assert [(p.name, p.port, p.protocol) for p in s.ports] == [("web", 8000, "TCP")]
    ips = {p["status"]["podIP"]: p for p in pods(sim)}
    for ep in s.endpoints:
        p = ips[ep.addresses[0]]
        assert ep.target_ref.name == p["metadata"]["name"] and ep.target_ref.kind == "Pod"
        assert ep.node_name == "n1" and ep.zone == "z1"
        assert (ep.conditions.ready, ep.conditions.serving, ep.conditions.terminating) == (
            True, True, False)
    # Scale down: the endpoint turns terminating, then goes.
    seen_terminating = []
    sim.call("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/x/scale",
             {"spec": {"replicas": 1}}, ctype="application/merge-patch+json")

    def one_left():
        eps = slices()[0].endpoints or []
        seen_terminating.extend(e for e in eps if e.conditions.terminating)
        return len(eps) == 1
    wait_for(one_left, timeout=20, interval=0.01, what="one endpoint left")
    for e in seen_terminating:
        assert e.conditions.ready is False
    # A selector that matches nothing empties it; deleting the Service removes it.
    core.patch_namespaced_service("x-svc", NS, {"spec": {"selector": {"app": "nothing"}}})
    wait_for(lambda: not (slices()[0].endpoints or []), timeout=10, what="emptied")
    core.delete_namespaced_service("x-svc", NS)
    wait_for(lambda: not slices(), timeout=10, what="slices garbage collected")


def test_restart_with_state_adopts_running_pods(cluster, tmp_path):
    state = str(tmp_path / "state.json")
    sim = cluster(state=state, nodes=[{"name": "n1", "gpus": 0}])
    create(sim, web("keep", replicas=2))
    wait_for(lambda: len([p for p in pods(sim) if ready(p)]) == 2, timeout=20, what="ready")
    before = {p["name"]: p["pid"] for p in sim.state()["pods"]}
    rss = rs_view(sim)
    port = sim.port
    sim.stop(restart=True)
    sim.start(port=port)
    after = {p["name"]: p["pid"] for p in sim.state()["pods"]}
    assert after == before and all(before.values())  # the same processes, adopted
    assert set(rs_view(sim)) == set(rss)
    time.sleep(1.5)
    assert len([p for p in pods(sim) if ready(p)]) == 2  # still ready, nothing recreated
    sim.call("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/keep/scale",
             {"spec": {"replicas": 0}}, ctype="application/merge-patch+json")
    wait_for(lambda: not pods(sim), timeout=20, what="adopted pods terminated")
    for pid in before.values():
        wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or
                 open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z",
                 timeout=10, what="process gone")


def test_watch_with_a_selector_sees_objects_leave_and_join(cluster, tmp_path):
    from kubernetes import client, config, watch
    sim = cluster(nodes=[{"name": "n1", "gpus": 0}])
    config.load_kube_config(sim.kubeconfig(str(tmp_path / "kc-py")))
    apps = client.AppsV1Api()
    create(sim, web("w", replicas=0))
    seen = []

    def relabel():
        time.sleep(0.5)
        apps.patch_namespaced_deployment("w", NS, {"metadata": {"labels": {"thaw.dev/model":
                                                                               None}}})
        time.sleep(0.3)
        apps.patch_namespaced_deployment("w", NS, {"metadata": {"labels": {"thaw.dev/model":
                                                                               "true"}}})
    threading.Thread(target=relabel).start()
    w = watch.Watch()
    for ev in w.stream(apps.list_namespaced_deployment, NS, label_selector="thaw.dev/model",
                       timeout_seconds=5):
        if ev["type"] != "MODIFIED":  # (status writes of the controller come as MODIFIED)
            seen.append(ev["type"])
        if len(seen) == 3:
            w.stop()
    assert seen == ["ADDED", "DELETED", "ADDED"]


def test_secrets_and_configmaps_as_the_api_serves_them(cluster, tmp_path):
    """The official client: stringData lands base64 in data, data that is not
    base64 is a 422, a fieldSelector on metadata.name picks one object."""
    import base64
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException
    sim = cluster(nodes=[{"name": "n1", "gpus": 0}])
    config.load_kube_config(sim.kubeconfig(str(tmp_path / "kc-py")))
    core = client.CoreV1Api()
    core.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name="a"), string_data={"k": "v1"}))
    core.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name="b"), data={"k": base64.b64encode(b"v2").decode()}))
    got = core.read_namespaced_secret("a", NS)
    assert got.data == {"k": base64.b64encode(b"v1").decode()} and got.type == "Opaque"
    with pytest.raises(ApiException) as e:
        core.create_namespaced_secret(NS, client.V1Secret(
            metadata=client.V1ObjectMeta(name="c"), data={"k": "not base64!"}))
    assert e.value.status == 422
    only_b = core.list_namespaced_secret(NS, field_selector="metadata.name=b")
    assert [s.metadata.name for s in only_b.items] == ["b"]
    core.create_namespaced_config_map(NS, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="m"), data={"doc.json": "{}"}))
    assert core.read_namespaced_config_map("m", NS).data == {"doc.json": "{}"}
