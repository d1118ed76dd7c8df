"""End-to-end: the Kubernetes backend against the API simulator (TLS, token),
and real Kubernetes clients (kubectl, the Python client) against the simulator."""

import datetime
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

import httpc
from conftest import ROOT, Thaw, wait_for

SIM = os.path.join(ROOT, "tests", "sim", "kube_sim.py")
MODEL_SIM = os.environ.get("THAW_SIM_BIN", os.path.join(ROOT, "build", "thaw-model-sim"))
KUBECTL = os.environ.get("KUBECTL") or os.path.join(ROOT, ".tools", "bin", "kubectl")
if not os.path.exists(KUBECTL):
    KUBECTL = shutil.which("kubectl") or KUBECTL
SLOW = 3 if os.environ.get("THAW_SANITIZED") else 1


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{ca}.key",
                "-out", f"{d}/{ca}.crt", "-days", "2", "-subj", f"/CN={ca}")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/srv.key", "-out",
            f"{d}/srv.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                               "extendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", f"{d}/srv.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
            "-CAcreateserial", "-out", f"{d}/srv.crt", "-days", "2", "-extfile", f"{d}/ext.cnf")
    return d


SUBNET_LOCKS = os.path.join(tempfile.gettempdir(), "thaw-test-pod-subnets")


def claim_pod_subnet():
    """A block of pod IPs (127.N.x.y) no other simulator on this machine
    uses now: simulators of tests running in parallel would otherwise hand
    out the same pod IPs, and one test's activator would reach another
    test's model server. The claim is a lock on a file, held until the
    returned descriptor is closed (or the process ends)."""
    os.makedirs(SUBNET_LOCKS, exist_ok=True)
    first = os.getpid() % 250
    for k in range(250):
        n = 2 + (first + k) % 250
        fd = os.open(os.path.join(SUBNET_LOCKS, str(n)), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return n, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError("every pod subnet is taken")


class KubeSim:
    def __init__(self, pki, workdir, nodes=None, kubelet_ms=1000, load_ms=500, token="t0k3n",
                 state=None):
        self.pki, self.dir, self.token = pki, workdir, token
        self.port_file = os.path.join(workdir, f"sim-port-{time.monotonic_ns()}")
        args = [sys.executable if sys.executable.startswith("/usr/bin/") else "/usr/bin/python3",
                SIM, "--port", "0", "--port-file", self.port_file, "--cert", f"{pki}/srv.crt",
                "--key", f"{pki}/srv.key", "--token", token, "--model-sim", MODEL_SIM,
                "--load-ms", str(load_ms), "--bookmark-s", "1"]
        if kubelet_ms is not None:  # None: each probe's own periodSeconds (10 s by default)
            args += ["--kubelet-period-ms", str(kubelet_ms)]
        if nodes:
            args += ["--nodes", json.dumps(nodes)]
        if state:
            args += ["--state", state]
        # Its own block of pod IPs, kept across restarts (pods are adopted).
        self.subnet, self.subnet_lock = claim_pod_subnet()
        args += ["--pod-subnet", str(self.subnet)]
        self.args = args
        self.start()

    def start(self, port=None):
        args = list(self.args)
        if port:
            args[args.index("--port") + 1] = str(port)
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.log = open(os.path.join(self.dir, "kube-sim.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.exists(self.port_file), what="kube-sim port")
        self.port = int(open(self.port_file).read())
        self.url = f"https://127.0.0.1:{self.port}"

    def stop(self, restart=False):
        """restart: SIGTERM, pods keep running (with --state); else SIGINT."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if restart else signal.SIGINT)
            self.proc.wait(20)
        self.log.close()
        if not restart and self.subnet_lock is not None:
            os.close(self.subnet_lock)  # its pods are gone: the block is free
            self.subnet_lock = None

    def call(self, method, path, body=None, ctype="application/json", token=None):
        ctx = ssl.create_default_context(cafile=f"{self.pki}/ca.crt")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.token}", "Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def update(self, path, change):
        """GET, change, PUT: retried on 409 Conflict as kubectl and client-go's
        RetryOnConflict do, since thaw writes the same objects (scale,
        annotations) and a PUT of a stale resourceVersion is refused."""
        for _ in range(20):
            _, obj = self.call("GET", path)
            change(obj)
            code, out = self.call("PUT", path, obj)
            if code != 409:
                assert code == 200, (code, out)
                return out
        raise AssertionError(f"PUT {path}: conflict after 20 tries")

    def create_deployment(self, body, token=None):
        """Creates a Deployment and, as a cluster's manifests would, the Service
        in front of it: named by thaw.dev/service (default the Deployment's
        name), selecting the Deployment's pods, on its container port."""
        md = body["metadata"]
        ns = md.get("namespace", "models")
        code, made = self.call("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body,
                               token=token)
        svc = (md.get("annotations") or {}).get("thaw.dev/service", md["name"])
        ports = [{"name": "http", "port": p["containerPort"], "targetPort": p["containerPort"]}
                 for c in body["spec"]["template"]["spec"]["containers"][:1]
                 for p in c.get("ports", [])[:1]]
        self.call("POST", f"/api/v1/namespaces/{ns}/services", {
            "metadata": {"name": svc, "namespace": ns},
            "spec": {"selector": body["spec"]["selector"]["matchLabels"], "ports": ports}},
            token=token)
        return code, made

    def faults(self, **kw):
        return self.call("POST", "/_sim/faults", kw)

    def state(self):
        return self.call("GET", "/_sim/state")[1]

    def kubeconfig(self, path, ca="ca", token=None, token_file=None, namespace="models",
                   exec_=None):
        user = ({"exec": exec_} if exec_ else {"tokenFile": token_file} if token_file
                else {"token": token or self.token})
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "sim",
               "clusters": [{"name": "sim", "cluster": {
                   "server": self.url, "certificate-authority": f"{self.pki}/{ca}.crt"}}],
               "users": [{"name": "thaw", "user": user}],
               "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "thaw",
                                                        "namespace": namespace}}]}
        import yaml
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        return path


def deployment(name, replicas=0, gpus=1, annotations=None, load_ms=None, port=8000,
               priority_class=None, model_label=None):
    anns = dict(annotations or {})
    tpl_anns = {}
    if load_ms is not None:
        tpl_anns["sim.thaw.dev/load-ms"] = str(load_ms)
    spec = {"containers": [{"name": "server", "image": "vllm/vllm-openai:latest",
                            "ports": [{"containerPort": port}],
                            "readinessProbe": {"httpGet": {"path": "/health", "port": port}},
                            "resources": {"requests": {"nvidia.com/gpu": str(gpus)},
                                          "limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    label = model_label or name
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "models", "labels": {"thaw.dev/model": label},
                         "annotations": anns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, "thaw.dev/model": label},
                                               "annotations": tpl_anns},
                                  "spec": spec}}}


@pytest.fixture
def cluster(pki, tmp_path):
    sims = []

    def make(**kw):
        s = KubeSim(pki, str(tmp_path), **kw)
        sims.append(s)
        return s
    yield make
    for s in sims:
        s.stop()


def start_thaw(thaw_factory, sim, tmp_path, extra=None, **kube):
    kc = sim.kubeconfig(str(tmp_path / "kubeconfig"), **kube.pop("kc", {}))
    cfg = {"kubernetes": {"namespaces": ["models"], **kube}}
    cfg.update(extra or {})
    return thaw_factory(cfg, ["--kubeconfig", kc])


def synced_llama(cluster, thaw_factory, tmp_path, annotations=None, sim_kw=None, deploy_kw=None,
                 **thaw_kw):
    """A simulated cluster with the one model Deployment "llama", and thaw synced to it."""
    sim = cluster(**(sim_kw or {}))
    sim.create_deployment(deployment("llama", annotations=annotations, **(deploy_kw or {})))
    t = start_thaw(thaw_factory, sim, tmp_path, **thaw_kw)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    return sim, t


def spec_replicas_of(sim, name="llama"):
    return sim.call("GET", f"/apis/apps/v1/namespaces/models/deployments/{name}")[1]["spec"].get(
        "replicas", 0)


def kmodel(t, name="llama"):
    return next(m for m in t.status()["models"] if m["name"] == name)


def complete(t, host="llama.models", body=None, timeout=60):
    return httpc.request(t.host, t.port, "POST", "/v1/completions", {"Host": host},
                         json.dumps(body or {"model": "x", "prompt": "hi"}).encode(),
                         timeout=timeout)


def parallel(n, fn):
    out = [None] * n
    ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn())) for i in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(120)
    return out


# --- real clients against the simulator ---------------------------------------

def test_kubectl_describe_shows_thaws_events(cluster, thaw_factory, tmp_path):
    """`kubectl describe deployment` lists the Events of the Deployment it
    describes by its uid (involvedObject.uid): thaw's carry it, so a wake and a
    bad annotation show there, not only in `kubectl get events`."""
    if not os.path.exists(KUBECTL):
        pytest.skip("kubectl not installed (scripts/setup.sh installs it)")
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/queue-timeout": "soon"})
    assert complete(t).status == 200
    wait_for(lambda: "ColdStartCompleted" in events_by_reason(sim), what="events")
    kc = sim.kubeconfig(str(tmp_path / "kc"))
    r = subprocess.run([KUBECTL, "--kubeconfig", kc, "-n", "models", "describe", "deployment",
                        "llama"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    events = r.stdout[r.stdout.index("Events:"):]
    for reason in ("ScaledFromZero", "ColdStartCompleted", "InvalidAnnotations"):
        assert reason in events, r.stdout


def test_kubectl_get_scale_and_watch(cluster, tmp_path):
    if not os.path.exists(KUBECTL):
        pytest.skip("kubectl not installed (scripts/setup.sh installs it)")
    sim = cluster()
    kc = sim.kubeconfig(str(tmp_path / "kc"))
    sim.create_deployment(deployment("llama"))

    def kubectl(*args, **kw):
        return subprocess.run([KUBECTL, "--kubeconfig", kc, *args], capture_output=True,
                              text=True, timeout=30, **kw)
    r = kubectl("get", "deployments")
    assert r.returncode == 0 and "llama" in r.stdout, r.stderr
    r = kubectl("get", "deployment", "llama", "-o", "jsonpath={.metadata.labels}")
    assert "thaw.dev/model" in r.stdout
    watch = subprocess.Popen([KUBECTL, "--kubeconfig", kc, "get", "deployments", "-w",
                              "-o", "jsonpath={.spec.replicas}{\"\\n\"}"],
                             stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    r = kubectl("scale", "deployment", "llama", "--replicas=2")
    assert r.returncode == 0 and "scaled" in r.stdout, r.stderr
    got = []

    def read():
        for line in watch.stdout:
            got.append(line.strip())
            if "2" in got:
                return
    th = threading.Thread(target=read)
    th.start()
    th.join(10)
    watch.kill()
    assert "2" in got  # the watch saw the scale
    wait_for(lambda: kubectl("get", "pods", "-o", "jsonpath={.items[*].status.phase}")
             .stdout.count("Running") == 2, timeout=20,
             what="two pods running")
    r = kubectl("get", "nodes", "-o", "jsonpath={.items[0].status.allocatable}")
    assert "nvidia.com/gpu" in r.stdout


def test_python_client_lists_and_watches(cluster, tmp_path):
    from kubernetes import client, config, watch
    sim = cluster()
    config.load_kube_config(sim.kubeconfig(str(tmp_path / "kc")))
    apps = client.AppsV1Api()
    body = deployment("mistral")
    apps.create_namespaced_deployment("models", body)
    names = [d.metadata.name for d in apps.list_namespaced_deployment(
        "models", label_selector="thaw.dev/model").items]
    assert names == ["mistral"]
    seen = []
    w = watch.Watch()

    def scale():
        time.sleep(0.5)
        apps.patch_namespaced_deployment_scale("mistral", "models", {"spec": {"replicas": 1}})
    threading.Thread(target=scale).start()
    for ev in w.stream(apps.list_namespaced_deployment, "models", timeout_seconds=5):
        seen.append((ev["type"], ev["object"].spec.replicas))
        if ev["type"] == "MODIFIED" and ev["object"].spec.replicas == 1:
            w.stop()
    assert ("ADDED", 0) in seen and ("MODIFIED", 1) in seen
    with pytest.raises(client.exceptions.ApiException) as e:
        apps.read_namespaced_deployment("nope", "models")
    assert e.value.status == 404
    # 401 without the token, 409 on a stale resourceVersion.
    assert sim.call("GET", "/api/v1/nodes", token="wrong")[0] == 401
    _, d = sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/mistral")
    stale = dict(d)
    stale["metadata"] = dict(d["metadata"], resourceVersion="1")
    code, st = sim.call("PUT", "/apis/apps/v1/namespaces/models/deployments/mistral", stale)
    assert code == 409 and st["kind"] == "Status" and st["reason"] == "Conflict"


def test_lists_come_in_pages_to_kubectl_the_python_client_and_thaw(cluster, thaw_factory,
                                                                    tmp_path):
    """520 model Deployments: the simulator pages lists as the API server
    does (limit, continue; an expired token is 410), kubectl and the Python
    client follow the pages, and thaw reads them in pages of 500 and knows
    every model."""
    from kubernetes import client, config
    sim = cluster()
    n = 520
    for i in range(n):
        sim.create_deployment(deployment(f"m{i:03d}"))
    config.load_kube_config(sim.kubeconfig(str(tmp_path / "kc")))
    apps = client.AppsV1Api()
    first = apps.list_namespaced_deployment("models", limit=200)
    assert len(first.items) == 200 and first.metadata._continue
    second = apps.list_namespaced_deployment("models", limit=200,
                                             _continue=first.metadata._continue)
    assert second.items[0].metadata.name == "m200" and second.metadata._continue
    assert second.metadata.resource_version == first.metadata.resource_version
    sim.faults(compact=True)
    with pytest.raises(client.exceptions.ApiException) as e:
        apps.list_namespaced_deployment("models", limit=200, _continue=second.metadata._continue)
    assert e.value.status == 410
    if os.path.exists(KUBECTL):
        r = subprocess.run([KUBECTL, "--kubeconfig", str(tmp_path / "kc"), "get", "deployments",
                            "-n", "models", "--chunk-size=128", "-o", "name"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.split()) == n
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, timeout=30, what="informers synced")
    st = t.status()
    assert len(st["models"]) == n
    deps = [i for i in st["kubernetes"]["informers"] if i["resource"] == "deployments"]
    assert deps and deps[0]["list_pages"] == 2 and deps[0]["lists"] == 1, deps
    # Every continue token expired (a busy etcd compacting): thaw lists
    # again whole, as client-go's pager falls back, and knows every model.
    sim.faults(expire_pages=True)
    t2 = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t2, "/readyz") == 200, timeout=30, what="synced unpaged")
    st = t2.status()
    assert len(st["models"]) == n
    deps = [i for i in st["kubernetes"]["informers"] if i["resource"] == "deployments"]
    assert deps[0]["list_pages"] == 2 and deps[0]["lists"] == 1, deps


# --- thaw's Kubernetes backend -------------------------------------------------

def test_scale_from_zero_with_100_held_requests(cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          sim_kw=dict(load_ms=800),
                          annotations={"thaw.dev/max-concurrency": "128", "thaw.dev/target": "128"})
    assert kmodel(t)["state"] == "scaled_to_zero"
    res = parallel(100, lambda: complete(t))
    assert [r.status for r in res] == [200] * 100
    assert sim.state()["counters"]["scale_writes"] == 1  # one scale-up for all of them
    t.assert_reconciled()
    m = kmodel(t)
    assert m["replicas_desired"] == 1 and m["scale_ups"] == 1
    # An Event on the Deployment says so.
    _, evs = sim.call("GET", "/api/v1/namespaces/models/events")
    assert any(e["reason"] == "ScaledFromZero" and e["involvedObject"]["name"] == "llama"
               for e in evs["items"])


def test_direct_probe_beats_the_endpointslice(cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          sim_kw=dict(load_ms=200, kubelet_ms=4000))
    start = time.monotonic()
    assert complete(t).status == 200
    assert time.monotonic() - start < 3.5  # the kubelet would first probe at 4 s
    pod = kmodel(t)["pods"][0]
    assert pod["probe_ok"] and not pod["endpoint_ready"]


def test_pods_found_by_the_deployments_selector_are_probed_directly(cluster, thaw_factory,
                                                                   tmp_path):
    """A Deployment written as the Kubernetes docs write it: selector app=x,
    template labels app=x only, thaw.dev/model on the Deployment alone. Its
    pods are the ones its selector selects, so thaw probes them itself: the
    first held request reaches the pod as its server first answers /health,
    not when the kubelet (every 10 s here) marks it ready."""
    sim = cluster(load_ms=300, kubelet_ms=10000)
    ready_file = str(tmp_path / "health-answered")
    d = deployment("llama")
    labels = d["spec"]["template"]["metadata"]["labels"]
    labels.pop("thaw.dev/model")
    assert labels == {"app": "llama"} and d["spec"]["selector"] == {"matchLabels": labels}
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/ready-file"] = ready_file
    sim.create_deployment(d)
    # Unrelated pods in the namespace (not selected) stay out of the model.
    other = deployment("other", replicas=1, gpus=0)
    other["metadata"]["labels"] = {}
    sim.create_deployment(other)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    start = time.monotonic()
    r = complete(t, timeout=30)
    done_ns = time.monotonic_ns()
    assert r.status == 200
    assert time.monotonic() - start < 5  # the kubelet would first probe at 10 s
    answered_ns = int(open(ready_file).read())
    # From the server's first 200 on /health to the reply (4 tokens x 5 ms).
    assert (done_ns - answered_ns) / 1e6 < 300 * SLOW, (done_ns - answered_ns) / 1e6
    pods = kmodel(t)["pods"]
    assert len(pods) == 1 and pods[0]["name"].startswith("llama-")
    assert pods[0]["probe_ok"] and not pods[0]["endpoint_ready"]


def test_api_faults_during_a_cold_start_lose_nothing(cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          sim_kw=dict(load_ms=1500),
                          annotations={"thaw.dev/target": "100"})
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", parallel(20, lambda: complete(t))))
    th.start()
    wait_for(lambda: t.status()["queued"] == 20, what="held")
    lists = t.metric("thaw_kubernetes_lists_total")
    sim.faults(drop_watches=True)
    sim.faults(fail_next=3)
    sim.faults(compact=True)
    th.join(60)
    assert [r.status for r in out["r"]] == [200] * 20
    assert sim.state()["counters"]["scale_writes"] == 1
    wait_for(lambda: t.metric("thaw_kubernetes_lists_total") >= lists + 4, timeout=30,
             what="every informer relisted after 410")
    t.assert_reconciled()
    # /metrics counts every informer /status lists (the Pulling and Pulled
    # Event informers too).
    infs = t.status()["kubernetes"]["informers"]
    assert {i["resource"] for i in infs} >= {"deployments", "pods", "nodes"}
    assert t.metric("thaw_kubernetes_lists_total") == sum(i["lists"] for i in infs)
    assert t.metric("thaw_kubernetes_watch_restarts_total") == sum(
        i["watch_restarts"] for i in infs)


def test_api_server_restart_keeps_warm_models_serving(cluster, thaw_factory, tmp_path):
    state = str(tmp_path / "sim-state.json")
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=100, state=state))
    assert complete(t).status == 200
    port = sim.port
    sim.stop(restart=True)  # the API is gone: a warm model keeps flowing
    for _ in range(5):
        assert complete(t).status == 200
    sim.start(port=port)
    wait_for(lambda: t.metric("thaw_kubernetes_watch_restarts_total") >= 1, timeout=40,
             what="watches resumed")
    assert complete(t).status == 200
    sim.stop()


def test_an_api_server_restarted_empty_is_listed_again(cluster, thaw_factory, tmp_path):
    """An API server restored from an older etcd, or restarted empty, is behind the
    resourceVersion thaw watches from: it answers 504 ResourceVersionTooLarge, and
    thaw must list again (as client-go does) rather than watch from there forever,
    blind to everything the new server holds."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50))
    for i in range(150):  # the old server's resourceVersion, well ahead of a new one's
        sim.call("PATCH", "/apis/apps/v1/namespaces/models/deployments/llama",
                 {"metadata": {"annotations": {"example.com/n": str(i)}}},
                 ctype="application/merge-patch+json")
    time.sleep(1)  # thaw's watches are at the old server's latest version
    port = sim.port
    sim.stop()
    sim.start(port=port)  # empty: no state kept
    sim.create_deployment(deployment("mistral"))
    wait_for(lambda: "mistral" in [m["name"] for m in t.status()["models"]], timeout=30,
             what="the new server's Deployment listed")
    wait_for(lambda: "llama" not in [m["name"] for m in t.status()["models"]], timeout=10,
             what="the Deployment the new server does not have removed")
    sim.stop()


@pytest.mark.timer_heavy
def test_watches_refused_back_off_instead_of_listing_in_a_loop(cluster, thaw_factory,
                                                              tmp_path):
    """A server that lists but refuses every watch (a Role without `watch`, a
    gateway that drops watch=true): each refusal lists again, after a back-off
    that doubles. The back-off was reset by each successful list, so every
    informer listed about three times a second for as long as it lasted."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50))
    informers = len(t.status()["kubernetes"]["informers"])
    sim.call("POST", "/_sim/faults", {"refuse_watches": True})
    sim.call("POST", "/_sim/faults", {"drop_watches": True})
    before = t.metric("thaw_kubernetes_lists_total")
    time.sleep(4)
    lists = t.metric("thaw_kubernetes_lists_total") - before
    sim.call("POST", "/_sim/faults", {"refuse_watches": False})
    # 250 ms doubling (jittered ±50%): at most about 5 lists each in 4 s; a
    # back-off reset by each list makes about 12.
    assert lists <= 6 * informers, (lists, informers)
    assert complete(t).status == 200  # served all along


@pytest.mark.timer_heavy
def test_a_wake_while_the_api_server_is_down_backs_off_and_serves_when_it_is_back(
        cluster, thaw_factory, tmp_path):
    state = str(tmp_path / "sim-state.json")
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=100, state=state))
    port = sim.port
    sim.stop(restart=True)
    out = {}
    held = threading.Thread(target=lambda: out.update(r=complete(t, timeout=60)))
    held.start()
    time.sleep(5)
    # The wake is retried with backoff (250 ms doubling, at most 4 s apart,
    # jittered), not every tick and request: about 5 tries in 5 s, not 10.
    tries = t.logs().count("scale from zero failed")
    assert 2 <= tries <= 7, tries
    # The wake is on its way as far as thaw can tell (documented so).
    assert kmodel(t)["state"] == "scaling_up"
    sim.start(port=port)
    held.join(60)
    assert out["r"].status == 200
    sim.stop()


EXEC_PLUGIN = """#!/bin/sh
# An exec credential plugin: the token from a file, valid for $VALID_S seconds.
echo run >> "$RUNS"
[ "$(cat "$FAIL" 2>/dev/null)" = yes ] && { echo "no credentials" >&2; exit 1; }
case "$KUBERNETES_EXEC_INFO" in *'"kind":"ExecCredential"'*) ;; *) exit 3 ;; esac
exp=$(date -u -d "+$VALID_S seconds" +%Y-%m-%dT%H:%M:%SZ)
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
printf '"status":{"token":"%s","expirationTimestamp":"%s"}}' "$(cat "$TOKEN")" "$exp"
"""


def exec_plugin(tmp_path, token, valid_s):
    plugin = tmp_path / "get-token"
    plugin.write_text(EXEC_PLUGIN)
    plugin.chmod(0o755)
    (tmp_path / "token").write_text(token)
    env = {"RUNS": tmp_path / "runs", "TOKEN": tmp_path / "token", "FAIL": tmp_path / "fail",
           "VALID_S": valid_s}
    return {"apiVersion": "client.authentication.k8s.io/v1", "command": "./get-token",
            "env": [{"name": k, "value": str(v)} for k, v in env.items()]}


def plugin_runs(tmp_path):
    p = tmp_path / "runs"
    return len(p.read_text().splitlines()) if p.exists() else 0


def synced_with_plugin(cluster, thaw_factory, tmp_path, valid_s):
    """thaw synced to a cluster that only takes the exec plugin's token."""
    sim = cluster(load_ms=50)
    sim.faults(tokens=["plugin-t0k3n"])
    sim.create_deployment(deployment("llama"),
             token="plugin-t0k3n")
    t = start_thaw(thaw_factory, sim, tmp_path,
                   kc={"exec_": exec_plugin(tmp_path, "plugin-t0k3n", valid_s)})
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced with the plugin's token")
    return sim, t


def test_exec_credential_plugin(cluster, thaw_factory, tmp_path):
    # Valid for 3,600 s: no run is due before the API server refuses the token.
    sim, t = synced_with_plugin(cluster, thaw_factory, tmp_path, 3600)
    assert plugin_runs(tmp_path) == 1
    assert complete(t).status == 200
    # The credential rotates: the API server's 401 makes thaw run the plugin again.
    (tmp_path / "token").write_text("n3w-plugin-t0k3n")
    sim.faults(tokens=["n3w-plugin-t0k3n"], drop_watches=True)
    sim.create_deployment(deployment("qwen"),
             token="n3w-plugin-t0k3n")
    wait_for(lambda: any(m["name"] == "qwen" for m in t.status()["models"]), timeout=30,
             what="new model seen with the plugin's new token")
    assert plugin_runs(tmp_path) >= 2
    assert "t0k3n" not in t.logs()


def test_exec_credential_plugin_refreshes_before_expiry(cluster, thaw_factory, tmp_path):
    # 61 s left: within a minute of expiry once a second has passed.
    sim, t = synced_with_plugin(cluster, thaw_factory, tmp_path, 61)
    # Due a minute before expiry, with no request to prompt it.
    wait_for(lambda: plugin_runs(tmp_path) >= 2, what="plugin run before expiry")
    assert complete(t).status == 200
    # A failing run keeps the token that still works, and says so.
    (tmp_path / "fail").write_text("yes")
    wait_for(lambda: "exec credential plugin failed" in t.logs(), what="failure logged")
    n = plugin_runs(tmp_path)
    time.sleep(3)
    assert plugin_runs(tmp_path) == n  # retried every 10 s, not in a loop
    assert complete(t).status == 200
    sim.create_deployment(deployment("qwen"),
             token="plugin-t0k3n")
    wait_for(lambda: any(m["name"] == "qwen" for m in t.status()["models"]), timeout=10,
             what="the API still reachable with the token kept")
    assert "plugin-t0k3n" not in t.logs()


def test_exec_credential_plugin_failing_at_start_is_a_clear_error(tmp_path):
    sim_kc = exec_plugin(tmp_path, "x", 60)
    (tmp_path / "fail").write_text("yes")
    kc = tmp_path / "kubeconfig"
    import yaml
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"exec": sim_kc}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    cfg = tmp_path / "thaw.json"
    cfg.write_text(json.dumps({"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                               "kubernetes": {"namespaces": ["models"]}}))
    from conftest import THAW_BIN
    r = subprocess.run([THAW_BIN, "--config", str(cfg), "--kubeconfig", str(kc)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "get-token exited with status 1" in r.stderr + r.stdout, r.stderr


def test_token_rotation(cluster, thaw_factory, tmp_path):
    sim = cluster(load_ms=100)
    tok = tmp_path / "token"
    tok.write_text("t0k3n\n")
    sim.create_deployment(deployment("llama"))
    t = start_thaw(thaw_factory, sim, tmp_path, kc={"token_file": str(tok)})
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    before = sim.state()["counters"].get("unauthorized", 0)
    tok.write_text("n3w-t0k3n\n")
    sim.faults(tokens=["n3w-t0k3n"], drop_watches=True)
    # A new model appears only if thaw talks to the API with the new token.
    sim.create_deployment(deployment("qwen"),
             token="n3w-t0k3n")
    wait_for(lambda: any(m["name"] == "qwen" for m in t.status()["models"]), timeout=30,
             what="new model seen with the rotated token")
    assert "n3w-t0k3n" not in t.logs() and "t0k3n" not in t.logs()
    assert sim.state()["counters"].get("unauthorized", 0) > before  # old token refused


def test_wrong_ca_is_a_clear_error(cluster, thaw_factory, tmp_path):
    sim = cluster()
    t = start_thaw(thaw_factory, sim, tmp_path, kc={"ca": "other-ca"})
    wait_for(lambda: "SSL" in t.logs() or "certificate" in t.logs(), timeout=15,
             what="a TLS error in the log")
    assert urllib_status(t, "/readyz") == 503
    st = t.status()["kubernetes"]
    assert not st["synced"]
    assert any("certificate" in (i.get("last_error") or "").lower() for i in st["informers"])


def test_not_ready_until_synced(cluster, thaw_factory, tmp_path):
    sim = cluster()
    sim.faults(delay_ms=1500)
    t = start_thaw(thaw_factory, sim, tmp_path)
    code = urllib_status(t, "/readyz")
    assert code == 503
    wait_for(lambda: urllib_status(t, "/readyz") == 200, timeout=30, what="ready after sync")
    sim.faults(delay_ms=0)


def urllib_status(t, path):
    try:
        return t.admin(path)[0]
    except urllib.error.HTTPError as e:
        return e.code


def test_pending_for_gpu_capacity_then_scheduled(cluster, thaw_factory, tmp_path):
    sim = cluster(nodes=[{"name": "gpu-a", "gpus": 1, "replicas": 1}], load_ms=100)
    other = deployment("training-job", replicas=1)  # not a model: it just holds the GPU
    del other["metadata"]["labels"]["thaw.dev/model"]
    del other["spec"]["template"]["metadata"]["labels"]["thaw.dev/model"]
    sim.create_deployment(other)
    sim.create_deployment(deployment("llama"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    wait_for(lambda: sim.call("GET", "/api/v1/namespaces/models/pods")[1]["items"] and all(
        p["status"]["phase"] == "Running"
        for p in sim.call("GET", "/api/v1/namespaces/models/pods")[1]["items"]),
        timeout=20, what="the other workload running")
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", complete(t)))
    th.start()
    wait_for(lambda: kmodel(t)["state"] == "waiting_for_capacity", timeout=20,
             what="llama waiting for a GPU")
    assert t.status()["queued"] == 1  # held, not failed
    sim.call("PATCH", "/apis/apps/v1/namespaces/models/deployments/training-job/scale",
             {"spec": {"replicas": 0}}, ctype="application/merge-patch+json")
    th.join(60)
    assert out["r"].status == 200


def test_a_model_installed_with_a_replica_loads_and_waits_its_idle_timeout(
        cluster, thaw_factory, tmp_path):
    # The install deploy.md describes: the Deployment comes with one replica
    # (Kubernetes' default) whose server takes a while to load. thaw must not
    # take it to zero before it ever served: idle-timeout counts from when
    # thaw first saw it, whether or not the pod is ready yet.
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=4000),
                          annotations={"thaw.dev/idle-timeout": "60s"},
                          deploy_kw=dict(replicas=1))
    time.sleep(2.5)  # many planning steps while the server loads
    assert spec_replicas_of(sim) == 1, t.logs()
    assert complete(t).status == 200  # the loaded replica serves, no cold start
    assert sim.state()["counters"].get("scale_writes", 0) == 0


def test_deleted_deployment_answers_held_requests(cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=60000))
    res = {}
    ths = [threading.Thread(target=lambda i=i: res.__setitem__(i, complete(t))) for i in range(3)]
    for th in ths:
        th.start()
    wait_for(lambda: t.status()["queued"] == 3, what="held")
    sim.call("DELETE", "/apis/apps/v1/namespaces/models/deployments/llama")
    for th in ths:
        th.join(30)
    for r in res.values():
        assert r.status == 503
        assert r.json()["error"]["code"] == "model_removed"
        assert "models/llama was deleted" in r.json()["error"]["message"]
    t.assert_reconciled()
    assert complete(t).status == 404  # gone from routing too


def test_a_deployment_that_loses_its_label_answers_held_requests_saying_so(
        cluster, thaw_factory, tmp_path):
    # The watch by label reports it as deleted too: the message must not
    # say the Deployment was deleted when it is still there.
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=60000))
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", complete(t)))
    th.start()
    wait_for(lambda: t.status()["queued"] == 1, what="held")
    sim.call("PATCH", "/apis/apps/v1/namespaces/models/deployments/llama",
             {"metadata": {"labels": {"thaw.dev/model": None}}},
             ctype="application/merge-patch+json")
    th.join(30)
    r = out["r"]
    assert r.status == 503 and r.json()["error"]["code"] == "model_removed"
    msg = r.json()["error"]["message"]
    assert "models/llama no longer carries the thaw.dev/model label" in msg, msg
    assert sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")[0] == 200
    t.assert_reconciled()


def test_deleted_deployment_answers_requests_still_sending_their_body(cluster, thaw_factory,
                                                                      tmp_path):
    # Routed by its body's "model" before the body is complete: the request
    # holds the model while the rest arrives, and must be answered (not left
    # pointing at a freed model) when the Deployment goes.
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=60000))
    s = t.connect(timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: thaw.test\r\n"
              b"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
              b'{"model":"llama","prompt":"' + b"x" * 1000)
    wait_for(lambda: t.metric("thaw_buffered_body_bytes") == 1048576, what="body reserved")
    sim.call("DELETE", "/apis/apps/v1/namespaces/models/deployments/llama")
    r = httpc.Reader(s).response()
    s.close()
    assert r.status == 503
    assert "models/llama was deleted" in r.json()["error"]["message"]
    wait_for(lambda: t.metric("thaw_buffered_body_bytes") == 0, what="budget released")
    t.assert_reconciled()


def test_annotations_and_bad_values(cluster, thaw_factory, tmp_path):
    sim = cluster(load_ms=50)
    sim.create_deployment(deployment(
        "llama", annotations={"thaw.dev/max-concurrency": "lots", "thaw.dev/priority": "critical",
                              "thaw.dev/aliases": "meta-llama/Llama-3.1-8B, llama3",
                              "thaw.dev/hosts": "llm.example.com",
                              "autoscaling.knative.dev/max-scale": "3",
                              "autoscaling.knative.dev/scale-to-zero-pod-retention-period": "1m30s",
                              "thaw.dev/startup-timeout": "soon"}))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    m = kmodel(t)
    assert m["priority"] == "critical" and m["max_concurrency"] == 8  # default kept
    assert "thaw.dev/max-concurrency" in m["annotation_errors"]
    assert "thaw.dev/startup-timeout" in m["annotation_errors"]
    assert m["max_scale"] == 3
    assert m["idle_timeout_ms"] == 90000  # from the Knative alias
    r = httpc.request(t.host, t.port, "POST", "/v1/chat/completions", {"Host": "thaw"},
                      b'{"model":"llama3","messages":[]}')
    assert r.status == 200
    assert complete(t, host="llm.example.com").status == 200
    assert "bad annotations" in t.logs()


@pytest.mark.timer_heavy
def test_scaled_back_up_before_the_pod_went_it_is_used_again(cluster, thaw_factory, tmp_path):
    """1 -> 0 -> 1 faster than the cluster removes the pod: the pod stays (as a
    ReplicaSet may keep it) and thaw must route to it again, not wait forever."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/idle-timeout": "1s"})
    for _ in range(3):
        assert complete(t).status == 200
        wait_for(lambda: kmodel(t)["replicas_desired"] == 0, timeout=20, what="to zero")
        assert complete(t, timeout=30).status == 200


def test_idle_model_scales_to_zero(cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/idle-timeout": "1s"})
    assert complete(t).status == 200
    wait_for(lambda: sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")[1]
             ["spec"]["replicas"] == 0, timeout=20, what="scaled to zero")
    # (the Event is posted after the scale is written: it may come a moment later)
    wait_for(lambda: "ScaledToZero" in events_by_reason(sim), timeout=5, what="the Event")
    assert complete(t, timeout=30).status == 200  # and back


def events_by_reason(sim):
    _, evs = sim.call("GET", "/api/v1/namespaces/models/events")
    out = {}
    for e in evs["items"]:
        out.setdefault(e["reason"], []).append(e)
    return out


@pytest.mark.timer_heavy
def test_repeated_events_aggregate_into_one_with_a_count(cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/idle-timeout": "1s"})

    def wake_and_sleep(times_before):
        assert complete(t, timeout=30).status == 200
        wait_for(lambda: kmodel(t)["scale_downs"] == times_before + 1, timeout=20,
                 what="scaled to zero")
        # The Event write follows the scale write.
        wait_for(lambda: sum(e["count"] for e in events_by_reason(sim).get("ScaledToZero", []))
                 == times_before + 1, what="event written")

    for i in range(3):
        wake_and_sleep(i)
    evs = events_by_reason(sim)
    # Three wakes and three sleeps: one Event each, counted, not three.
    assert [e["count"] for e in evs["ScaledFromZero"]] == [3]
    assert [e["count"] for e in evs["ScaledToZero"]] == [3]
    e = evs["ScaledFromZero"][0]
    uid = sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")[1]["metadata"]["uid"]
    assert e["involvedObject"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                   "name": "llama", "namespace": "models", "uid": uid}
    assert e["source"]["component"] == "thaw" and e["type"] == "Normal"
    assert e["firstTimestamp"] <= e["lastTimestamp"]
    # A completed cold start is told too (aggregated when its times match an
    # earlier one's to the tenth of a second); not a wake that found its pod
    # still there (scaled up again before the cluster took it away).
    done = evs["ColdStartCompleted"]
    told = sum(e["count"] for e in done)
    assert 1 <= told <= 3
    st = t.status()["kubernetes"]["events"]
    assert st["created"] == 2 + len(done) and st["aggregated"] == 4 + told - len(done)
    assert st["errors"] == 0
    # An Event the API server has dropped (expired) is created again, not lost.
    sim.call("DELETE", "/api/v1/namespaces/models/events/" + e["metadata"]["name"])
    wake_and_sleep(3)
    evs = events_by_reason(sim)
    assert [e["count"] for e in evs["ScaledFromZero"]] == [1]
    assert [e["count"] for e in evs["ScaledToZero"]] == [4]
    assert t.status()["kubernetes"]["events"]["errors"] == 0


def test_api_server_restart_during_a_cold_start(cluster, thaw_factory, tmp_path):
    state = str(tmp_path / "sim-state.json")
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          sim_kw=dict(load_ms=300, state=state),
                          annotations={"thaw.dev/target": "100"})
    port = sim.port
    sim.stop(restart=True)  # the API is down when the first request arrives
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", parallel(10, lambda: complete(t))))
    th.start()
    wait_for(lambda: t.status()["queued"] == 10, what="held while the API is down")
    time.sleep(0.5)  # scale attempts fail meanwhile and back off
    sim.start(port=port)
    th.join(60)
    assert [r.status for r in out["r"]] == [200] * 10
    assert sim.state()["counters"]["scale_writes"] == 1  # no duplicate scale-up
    t.assert_reconciled()
    sim.stop()


def test_config_models_and_cluster_models_together(cluster, thaw_factory, tmp_path, upstream):
    sim = cluster(load_ms=50)
    sim.create_deployment(deployment("llama"))
    t = start_thaw(thaw_factory, sim, tmp_path, extra={
        "models": [{"name": "static-one", "endpoints": [upstream.address]}]})
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    assert httpc.request(t.host, t.port, path="/echo", headers={"Host": "static-one"}).status == 200
    assert complete(t).status == 200
    backends = {m["name"]: m["backend"] for m in t.status()["models"]}
    assert backends == {"static-one": "static", "llama": "kubernetes"}


def test_reload_keeps_cluster_models_and_applies_file_settings(cluster, thaw_factory, tmp_path,
                                                              upstream, upstream2):
    sim = cluster(load_ms=50)
    sim.create_deployment(deployment("llama"))
    t = start_thaw(thaw_factory, sim, tmp_path, extra={
        "models": [{"name": "static-one", "endpoints": [upstream.address]}]})
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    assert complete(t).status == 200
    with open(t.config_path) as f:
        cfg = json.load(f)
    cfg["models"] = [{"name": "static-two", "endpoints": [upstream2.address]}]
    cfg["kubernetes"]["namespaces"] = ["models", "other"]  # needs a restart
    cfg["limits"] = {"max_body_bytes": 100}
    with open(t.config_path, "w") as f:
        json.dump(cfg, f)
    t.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: t.metric("thaw_config_reloads_total", result="success") == 1, what="reload")
    assert "key=kubernetes" in t.logs()
    assert {m["name"] for m in t.status()["models"]} == {"llama", "static-two"}
    assert complete(t).status == 200  # the discovered model is untouched
    assert complete(t, body={"model": "x", "prompt": "y" * 200}).status == 413
    get = lambda host: httpc.request(t.host, t.port, path="/echo", headers={"Host": host}).status
    assert get("static-two") == 200 and get("static-one") == 404


def test_pods_that_never_get_ready_fail_held_requests_after_startup_timeout(
        cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          annotations={"thaw.dev/startup-timeout": "1s"},
                          deploy_kw=dict(load_ms=600000))
    start = time.monotonic()
    r = complete(t)
    assert r.status == 503 and r.json()["error"]["code"] == "start_failed"
    assert "startup-timeout" in r.json()["error"]["message"]
    assert 0.9 < time.monotonic() - start < 5
    t.assert_reconciled()


# --- the idle clock across restarts --------------------------------------------

LAST_REQUEST = "thaw.dev/last-request-at"


def get_llama(sim):
    return sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")[1]


def stays_up(sim, until, step=0.2):
    """spec.replicas stays above zero until time.monotonic() reaches until."""
    while time.monotonic() < until:
        assert get_llama(sim)["spec"]["replicas"] >= 1, "scaled to zero too early"
        time.sleep(step)


FAST_PLANS = {"autoscaler": {"tick_ms": 300}}


@pytest.mark.timer_heavy
def test_restart_keeps_a_warm_model_until_its_idle_timeout(cluster, thaw_factory, tmp_path):
    """A warm model, idle-timeout 12 s, thaw restarted 5 s after its last request: it stays
    up (it used to go to zero 0.4 s after the new thaw synced) and goes to zero 12 s after
    that request, as recorded on the Deployment, not 12 s after the restart."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/idle-timeout": "12s"}, extra=FAST_PLANS)
    assert complete(t).status == 200
    last = time.monotonic()
    time.sleep(5)
    t.stop()
    t2 = start_thaw(thaw_factory, sim, tmp_path, extra=FAST_PLANS)
    wait_for(lambda: urllib_status(t2, "/readyz") == 200, what="informers synced")
    stays_up(sim, last + 10)
    recorded = get_llama(sim)["metadata"]["annotations"].get(LAST_REQUEST)
    assert recorded, "the last request is recorded on the Deployment"
    wait_for(lambda: get_llama(sim)["spec"]["replicas"] == 0, timeout=last + 15.5 - time.monotonic(),
             what="to zero 12 s after the last request (not 12 s after the restart)")
    ic = kmodel(t2)["idle_clock"]
    assert ic["last_request_at"] == recorded and ic["idle_ms"] >= 12000


@pytest.mark.timer_heavy
def test_restart_without_a_recorded_request_starts_the_clock_at_sync(cluster, thaw_factory,
                                                                     tmp_path):
    """A model already warm (say a Deployment installed with one replica) that thaw has
    never recorded a request for: its idle clock starts when thaw syncs, not at "never"."""
    sim = cluster(load_ms=50)
    sim.create_deployment(deployment("llama", replicas=1, annotations={"thaw.dev/idle-timeout": "5s"}))
    wait_for(lambda: get_llama(sim).get("status", {}).get("readyReplicas") == 1,
             what="pod ready")
    t = start_thaw(thaw_factory, sim, tmp_path, extra=FAST_PLANS)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    synced = time.monotonic()
    stays_up(sim, synced + 3.5)
    wait_for(lambda: get_llama(sim)["spec"]["replicas"] == 0, timeout=10, what="to zero")
    assert time.monotonic() - synced >= 4.5
    assert LAST_REQUEST not in get_llama(sim)["metadata"].get("annotations", {})


@pytest.mark.timer_heavy
def test_a_busy_model_writes_its_last_request_at_most_once_per_interval(cluster, thaw_factory,
                                                                         tmp_path):
    """Requests every 0.2 s for 13 s, idle-timeout 20 s: writes are at most one per
    max(20 s / 4, 10 s) = 10 s, the last one trailing, and the last written time is the
    last request's."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/idle-timeout": "20s"}, extra=FAST_PLANS)
    seen = []

    def watch_annotation(stop):
        while not stop.is_set():
            v = get_llama(sim)["metadata"].get("annotations", {}).get(LAST_REQUEST)
            if v and (not seen or seen[-1] != v):
                seen.append(v)
            time.sleep(0.1)
    stop = threading.Event()
    watcher = threading.Thread(target=watch_annotation, args=(stop,))
    watcher.start()
    try:
        end = time.monotonic() + 13
        while time.monotonic() < end:
            assert complete(t).status == 200
            time.sleep(0.2)
        last_wall = time.time()
        wait_for(lambda: t.metric("thaw_kubernetes_last_request_writes_total") == 3, timeout=12,
                 what="the trailing write")
        time.sleep(1)
    finally:
        stop.set()
        watcher.join()
    assert len(seen) == 3, seen
    assert t.metric("thaw_kubernetes_last_request_write_errors_total") == 0
    written = datetime.datetime.fromisoformat(seen[-1].replace("Z", "+00:00")).timestamp()
    assert abs(written - last_wall) < 1.5, (seen[-1], last_wall)


def test_a_rollout_during_a_cold_start_serves_from_the_new_pods(cluster, thaw_factory, tmp_path):
    """A request wakes the model; while its pod still loads, the Deployment's
    template changes (a new image, say). The Deployment controller starts a
    new ReplicaSet beside the old one: both are the model's pods (its
    selector selects them), the held request goes to the first that answers,
    the new pod here (it loads faster), and once the rollout is done only new
    pods are left. One scale PATCH, nothing lost."""
    sim = cluster(kubelet_ms=1000)
    d = deployment("llama", gpus=0)
    tpl = d["spec"]["template"]["metadata"]
    tpl["labels"]["thaw.dev/model"] = "old"  # the name the pod's server answers with
    tpl["annotations"].update({"sim.thaw.dev/server": "asyncio", "sim.thaw.dev/load-ms": "4000"})
    sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", complete(t, timeout=60)))
    th.start()

    def pods():
        _, ps = sim.call("GET", "/api/v1/namespaces/models/pods?labelSelector=app%3Dllama")
        return [p for p in ps["items"] if "deletionTimestamp" not in p["metadata"]]
    wait_for(lambda: any(p["status"].get("phase") == "Running" for p in pods()), timeout=20,
             what="the old pod loading")

    def relabel(d):
        tpl = d["spec"]["template"]["metadata"]
        tpl["labels"]["thaw.dev/model"] = "new"
        tpl["annotations"]["sim.thaw.dev/load-ms"] = "300"
    sim.update("/apis/apps/v1/namespaces/models/deployments/llama", relabel)
    changed = time.monotonic()
    th.join(60)
    r = out["r"]
    assert r.status == 200, r.body
    assert json.loads(r.body)["model"] == "new"
    assert time.monotonic() - changed < 5 * SLOW
    # The rollout finishes: only the new ReplicaSet's pod is left, and it serves.
    wait_for(lambda: [p["metadata"]["labels"]["thaw.dev/model"] for p in pods()] == ["new"],
             timeout=40, what="the old pod gone")
    r = complete(t)
    assert r.status == 200 and json.loads(r.body)["model"] == "new"
    assert len([n for name, n in sim.state()["scale_log"] if name == "llama"]) == 1
    t.assert_reconciled()


def test_a_pod_without_a_readiness_probe_is_routed_once_it_listens(cluster, thaw_factory,
                                                                 tmp_path):
    """A Deployment with no readinessProbe (as many examples write one): the
    kubelet takes the started container for Ready and its EndpointSlice says
    ready while the server still loads, not yet listening. thaw routes the
    pod once its own probe finds the port open, not on the slice's word
    (before, the held request went to a refusing port: a failed connect, an
    ejection, and a wait for the next try)."""
    sim = cluster()
    d = deployment("llama", load_ms=1500)
    del d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    r = complete(t)
    assert r.status == 200, r.body
    assert "connect failed" not in t.logs(), t.logs()
    assert t.metric("thaw_upstream_connect_failures_total") in (0, None)
