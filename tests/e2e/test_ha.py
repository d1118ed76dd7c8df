"""End-to-end: several activators against the API simulator: one leader via a
Lease, one scale-up when several poke at zero, failover, shared demand,
stale peers dropped."""

import datetime
import json
import os
import signal
import threading
import time

import pytest

import httpc
from conftest import Thaw, free_port, wait_for
from test_kubernetes import SLOW, KubeSim, deployment, pki  # noqa: F401  (pki is a fixture)

LEASE = {"lease_duration_ms": 3000, "renew_interval_ms": 300, "renew_deadline_ms": 2000}


def fleet_ips(n):
    """Loopback addresses of its own for each test worker: two workers' fleets
    on the same addresses could take each other's ports (a proxy port picked
    by the kernel on one is the admin port the other checked free)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    w = int(worker[2:]) if worker[2:].isdigit() else 0
    return [f"127.0.{1 + w}.{11 + i}" for i in range(n)]


def port_free_on(ips):
    """A port nothing listens on at any of ips."""
    import socket
    for _ in range(50):
        port = free_port()
        try:
            for ip in ips:
                s = socket.socket()
                try:
                    s.bind((ip, port))
                finally:
                    s.close()
            return port
        except OSError:
            continue
    raise AssertionError(f"no port free on all of {ips}")


class Fleet:
    """N activators on 127.0.W.11.. (W: the test worker), one admin port,
    listed in thaw's own Service."""

    def __init__(self, sim, tmp_path, n, autoscaler=None, kube=None, per=None):
        """kube: more kubernetes settings for all; per: {index: settings} for one."""
        self.sim = sim
        self.ips = fleet_ips(n)
        self.admin_port = port_free_on(self.ips)
        sim.call("POST", "/apis/discovery.k8s.io/v1/namespaces/models/endpointslices", {
            "metadata": {"name": "thaw-abc", "namespace": "models",
                         "labels": {"kubernetes.io/service-name": "thaw"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": f"thaw-{i}"}}
                          for i, ip in enumerate(self.ips)],
            "ports": [{"name": "admin", "port": self.admin_port}]})
        kc = sim.kubeconfig(str(tmp_path / "kubeconfig"))
        self.thaws = []
        for i, ip in enumerate(self.ips):
            cfg = {"listen": f"{ip}:0", "admin_listen": f"{ip}:{self.admin_port}",
                   "autoscaler": autoscaler or {"tick_ms": 300, "stable_window_ms": 6000},
                   "kubernetes": {"namespaces": ["models"], "leader_election": True,
                                  "identity": f"thaw-{i}", "lease_namespace": "models",
                                  "peers_service": "thaw", "peers_port": self.admin_port,
                                  "peers_poll_ms": 200, "peers_timeout_ms": 1200, **LEASE,
                                  **(kube or {}), **((per or {}).get(i, {}))}}
            os.environ["POD_IP"] = ip
            try:
                self.thaws.append(Thaw(cfg, ["--kubeconfig", kc]))
            finally:
                del os.environ["POD_IP"]

    def leaders(self):
        out = []
        for t in self.thaws:
            if t.proc.poll() is not None:
                continue
            le = t.status()["kubernetes"]["leader_election"]
            if le["leading"]:
                out.append(t)
        return out

    def one_leader(self, timeout=15):
        return wait_for(lambda: (lambda ls: ls[0] if len(ls) == 1 else None)(self.leaders()),
                        timeout=timeout, what="exactly one leader")

    def stop(self):
        for t in self.thaws:
            if t.proc.poll() is None:
                t.stop()


@pytest.fixture
def fleet(pki, tmp_path):
    made = []

    def make(n, kube=None, per=None, autoscaler=None, **sim_kw):
        sim = KubeSim(pki, str(tmp_path), **sim_kw)
        f = Fleet(sim, tmp_path, n, autoscaler=autoscaler, kube=kube, per=per)
        made.append(f)
        return f
    yield make
    for f in made:
        f.stop()
        f.sim.stop()


def complete(t, body=None, timeout=60):
    return httpc.request(t.host, t.port, "POST", "/v1/completions", {"Host": "llama.models"},
                         json.dumps(body or {"model": "x", "prompt": "hi"}).encode(),
                         timeout=timeout)


def spec_replicas(sim, name="llama"):
    return sim.call("GET", f"/apis/apps/v1/namespaces/models/deployments/{name}")[1]["spec"][
        "replicas"]


def lease_transitions(f):
    _, lease = f.sim.call("GET", "/apis/coordination.k8s.io/v1/namespaces/models/leases/"
                                 "thaw-leader")
    return lease["spec"].get("leaseTransitions", 0)


def hand_lease(f, to):
    """Moves the leader Lease to activator `to` (as if the leader had missed
    its renewals and `to` had taken it), the old leader still running."""
    path = "/apis/coordination.k8s.io/v1/namespaces/models/leases/thaw-leader"
    identity = to.status()["kubernetes"]["leader_election"]["identity"]

    def put():
        _, lease = f.sim.call("GET", path)
        lease["spec"]["holderIdentity"] = identity
        lease["spec"]["renewTime"] = datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ")
        return f.sim.call("PUT", path, lease)[0] == 200  # 409: a renewal came between
    wait_for(put, timeout=10, what="the Lease written")
    wait_for(lambda: f.leaders() == [to], timeout=10, what="the lease moved")


def test_exactly_one_leader(fleet):
    f = fleet(3)
    leader = f.one_leader()
    _, lease = f.sim.call("GET", "/apis/coordination.k8s.io/v1/namespaces/models/leases/"
                                 "thaw-leader")
    me = leader.status()["kubernetes"]["leader_election"]["identity"]
    assert lease["spec"]["holderIdentity"] == me
    assert lease["spec"]["leaseDurationSeconds"] == 3
    assert lease["spec"]["acquireTime"] and lease["spec"]["renewTime"]
    time.sleep(1.5)  # renewals keep it, nobody else takes it
    assert f.leaders() == [leader]
    _, again = f.sim.call("GET", "/apis/coordination.k8s.io/v1/namespaces/models/leases/"
                                 "thaw-leader")
    assert again["spec"]["renewTime"] != lease["spec"]["renewTime"]
    assert again["spec"]["leaseTransitions"] == lease["spec"]["leaseTransitions"]
    assert leader.metric("thaw_leader") == 1
    assert leader.metric("thaw_peers", state="fresh") == 2
    # Followers poll no one: none of their peers is stale (an alert on the
    # sum of stale peers must stay quiet in a healthy fleet).
    assert sum(t.metric("thaw_peers", state="stale") for t in f.thaws) == 0


def test_two_activators_poking_at_zero_scale_up_once(fleet):
    f = fleet(2, load_ms=800)
    f.one_leader()
    transitions = lease_transitions(f)
    f.sim.create_deployment(deployment("llama", annotations={"thaw.dev/target": "100"}))
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")
    res = []
    ths = [threading.Thread(target=lambda t=t: res.append(complete(t)))
           for t in f.thaws for _ in range(5)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    assert [r.status for r in res] == [200] * 10
    # One replica, never two (each activator scaling up) and never back to zero.
    # The same count written again happens only with a new leader (after a
    # late renewal on a loaded machine).
    log = [n for name, n in f.sim.state()["scale_log"] if name == "llama"]
    assert log and set(log) == {1}, log
    if lease_transitions(f) == transitions:
        assert len(log) == 1, log
    for t in f.thaws:
        t.assert_reconciled()


def test_a_wake_that_lost_the_race_is_not_written_again(fleet):
    # Each activator holds more requests than the model takes at once, so
    # each keeps trying to wake it. The one whose conditional PATCH got 409
    # saw the winner's write arrive while its PATCH was out: it must not try
    # again at that resourceVersion as if the Deployment were still at zero
    # (that wrote the scale twice and posted a second, false ScaledFromZero).
    f = fleet(2, load_ms=300)
    f.one_leader()
    transitions = lease_transitions(f)
    names = [f"m{i}" for i in range(4)]
    for name in names:
        d = deployment(name, annotations={"thaw.dev/max-concurrency": "2",
                                          "thaw.dev/max-scale": "1",
                                          "thaw.dev/idle-timeout": "10m"})
        d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "100"
        f.sim.create_deployment(d)
    for t in f.thaws:
        wait_for(lambda t=t: {m["name"] for m in t.status()["models"]} >= set(names),
                 what="models seen")
    for name in names:
        res = []

        def one(t, name=name):
            res.append(httpc.request(t.host, t.port, "POST", "/v1/completions",
                                     {"Host": f"{name}.models"},
                                     json.dumps({"model": name, "prompt": "hi"}).encode(),
                                     timeout=60))
        ths = [threading.Thread(target=one, args=(t,)) for t in f.thaws for _ in range(8)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(60)
        assert [r.status for r in res] == [200] * 16, [r.body for r in res if r.status != 200]
    time.sleep(0.5)
    if lease_transitions(f) != transitions:
        pytest.skip("the lease changed hands: a new leader may write a scale again")
    log = f.sim.state()["scale_log"]
    _, evs = f.sim.call("GET", "/api/v1/namespaces/models/events")
    for name in names:
        assert [n for m, n in log if m == name] == [1], (name, log)
        woke = [(e["message"], e.get("count", 1)) for e in evs["items"]
                if e["reason"] == "ScaledFromZero" and e["involvedObject"]["name"] == name]
        assert len(woke) == 1 and woke[0][1] == 1, (name, woke)


def test_leader_killed_during_a_cold_start(fleet):
    f = fleet(3, load_ms=2500)
    leader = f.one_leader()
    f.sim.create_deployment(deployment("llama", annotations={"thaw.dev/target": "100"}))
    survivors = [t for t in f.thaws if t is not leader]
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")
    res = []
    ths = [threading.Thread(target=lambda t=t: res.append(complete(t)))
           for t in survivors for _ in range(4)]
    for th in ths:
        th.start()
    wait_for(lambda: sum(t.status()["queued"] for t in survivors) == 8, what="held")
    killed = time.monotonic()
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(10)
    new = wait_for(lambda: (lambda ls: ls[0] if len(ls) == 1 else None)(f.leaders()),
                   timeout=10, what="a new leader")
    assert time.monotonic() - killed < 3.0 + 2.0  # within the lease duration (plus a renew)
    assert new is not leader
    for th in ths:
        th.join(60)
    assert [r.status for r in res] == [200] * 8
    # No flapping: replicas went 0 -> 1 and were never taken back down.
    time.sleep(1.5)
    log = [n for name, n in f.sim.state()["scale_log"] if name == "llama"]
    assert log and log[0] >= 1 and 0 not in log, log
    _, lease = f.sim.call("GET", "/apis/coordination.k8s.io/v1/namespaces/models/leases/"
                                 "thaw-leader")
    assert lease["spec"]["leaseTransitions"] >= 1


@pytest.mark.timer_heavy
def test_demand_split_across_activators_scales_like_one(fleet):
    f = fleet(2, load_ms=300)
    f.one_leader()
    f.sim.create_deployment(deployment(
        "llama", gpus=0, annotations={"thaw.dev/target": "1", "thaw.dev/max-concurrency": "1",
                                      "thaw.dev/max-scale": "8"},
        load_ms=300))
    # Each request holds its replica's only slot for ~4 s.
    f.sim.update("/apis/apps/v1/namespaces/models/deployments/llama",
                 lambda d: d["spec"]["template"]["metadata"]["annotations"].update(
                     {"sim.thaw.dev/token-ms": "1000"}))
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")
    res = []
    ths = [threading.Thread(target=lambda t=t: res.append(complete(t, timeout=90)))
           for t in f.thaws for _ in range(3)]
    for th in ths:
        th.start()
    # 3 + 3 requests: the leader sums them and asks for 6 replicas.
    wait_for(lambda: spec_replicas(f.sim) >= 6, timeout=30, what="six replicas")
    leader = f.leaders()[0]
    m = next(x for x in leader.status()["models"] if x["name"] == "llama")
    assert m["demand"]["peers"] >= 1
    for th in ths:
        th.join(90)
    assert all(r.status == 200 for r in res)


def test_a_partitioned_peer_is_dropped(fleet):
    f = fleet(2)
    leader = f.one_leader()
    follower = next(t for t in f.thaws if t is not leader)
    wait_for(lambda: leader.metric("thaw_peers", state="fresh") == 1, what="peer fresh")
    follower.proc.send_signal(signal.SIGSTOP)  # alive, but answers nothing
    try:
        wait_for(lambda: leader.metric("thaw_peers", state="stale") == 1, timeout=10,
                 what="peer stale")
        peers = leader.status()["kubernetes"]["peers"]
        assert [p["fresh"] for p in peers if not p["self"]] == [False]
    finally:
        follower.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: leader.metric("thaw_peers", state="fresh") == 1, timeout=10,
             what="peer back")


LAST_REQUEST = "thaw.dev/last-request-at"


def warm_llama(f, idle_timeout):
    f.sim.create_deployment(deployment(
        "llama", annotations={"thaw.dev/target": "100", "thaw.dev/idle-timeout": idle_timeout}))
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")


def stays_up(sim, until, step=0.2):
    while time.monotonic() < until:
        assert spec_replicas(sim) >= 1, "scaled to zero too early"
        time.sleep(step)


@pytest.mark.timer_heavy
def test_leader_change_keeps_a_warm_model_until_its_idle_timeout(fleet):
    """The leader served the model's last request and is killed: the new leader, which
    never saw that traffic, keeps the model until idle-timeout after it (it used to scale
    it to zero one stable window after taking the lease), then scales it to zero."""
    f = fleet(2, load_ms=50)
    leader = f.one_leader()
    warm_llama(f, "16s")
    assert complete(leader).status == 200
    last = time.monotonic()
    time.sleep(1.5)
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(10)
    new = f.one_leader(timeout=10)
    assert new is not leader
    stays_up(f.sim, last + 14)
    # 16 s after the request as recorded by the old leader (from the lease it would be ~20 s).
    wait_for(lambda: spec_replicas(f.sim) == 0, timeout=last + 19 - time.monotonic(),
             what="to zero 16 s after the last request")
    _, d = f.sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")
    assert d["metadata"]["annotations"].get(LAST_REQUEST)


@pytest.mark.timer_heavy
def test_a_new_leader_holds_scale_downs_for_the_models_own_window(fleet):
    """A leader holds scale-downs for one stable window after taking the lease: the
    model's (thaw.dev/window: 6s), not the global one (60 s here)."""
    f = fleet(1, load_ms=50, autoscaler={"tick_ms": 300})
    leader = f.one_leader()
    f.sim.create_deployment(deployment(
        "llama", annotations={"thaw.dev/idle-timeout": "2s", "thaw.dev/window": "6s"}))
    wait_for(lambda: any(m["name"] == "llama" for m in leader.status()["models"]),
             what="model seen")
    assert complete(leader).status == 200
    wait_for(lambda: spec_replicas(f.sim) == 0, timeout=25, what="to zero")


@pytest.mark.timer_heavy
def test_requests_only_at_a_follower_keep_the_model_warm(fleet):
    """Short requests (done between two polls of /demand) reach only a follower: the
    leader's idle clock still counts them, through the follower's /demand, and records
    the last one on the Deployment."""
    f = fleet(2, load_ms=50)
    leader = f.one_leader()
    follower = next(t for t in f.thaws if t is not leader)
    warm_llama(f, "4s")
    end = time.monotonic() + 12
    while time.monotonic() < end:
        assert complete(follower).status == 200
        time.sleep(1)
    log = [n for name, n in f.sim.state()["scale_log"] if name == "llama"]
    assert log and 0 not in log, log
    _, d = f.sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")
    assert d["metadata"]["annotations"].get(LAST_REQUEST)
    assert leader.metric("thaw_kubernetes_last_request_writes_total") >= 1
    assert follower.metric("thaw_kubernetes_last_request_writes_total") == 0
    wait_for(lambda: spec_replicas(f.sim) == 0, timeout=15, what="to zero once they stop")


def pod_stats(sim, name="llama"):
    """Each ready pod's GET /stats (thaw-model-sim): peak in-flight, completions."""
    # The Deployment's pods: the ones its selector selects.
    _, pods = sim.call("GET", f"/api/v1/namespaces/models/pods?labelSelector=app%3D{name}")
    out = {}
    for p in pods["items"]:
        st = httpc.request(p["status"]["podIP"], 8000, "GET", "/stats", {}, b"", timeout=5)
        out[p["metadata"]["name"]] = json.loads(st.body)
    return out


@pytest.mark.parametrize("activators,concurrency,pods", [(2, 1, 3), (3, 2, 4), (3, 1, 4)])
def test_a_pods_concurrency_holds_across_activators(fleet, activators, concurrency, pods):
    """thaw.dev/max-concurrency is the pod's limit, not each activator's: the
    pods' slots are split across the activators (3 activators, 4 pods x 2:
    3 + 3 + 2; with a limit of 1, each activator holds whole pods), and a burst
    on every activator never puts more than the limit on any pod, while every
    request is served."""
    f = fleet(activators, load_ms=100)
    d = deployment("llama", replicas=pods, gpus=0, load_ms=100,
                   annotations={"thaw.dev/max-concurrency": str(concurrency),
                                "thaw.dev/min-scale": str(pods),
                                "thaw.dev/max-scale": str(pods)})
    # Each request holds its slot for 4 x 60 ms: the burst overlaps.
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "60"
    f.sim.create_deployment(d)

    def settled(t):
        m = next((x for x in t.status()["models"] if x["name"] == "llama"), None)
        return (m and sum(p["ready"] for p in m["pods"]) == pods
                and m.get("slots", {}).get("activators", activators) == activators)
    for t in f.thaws:
        wait_for(lambda t=t: settled(t), timeout=30, what="every pod ready on every activator")
    total = pods * concurrency
    wait_for(lambda: sum(next(x for x in t.status()["models"] if x["name"] == "llama")["slots"]
                         ["here"] for t in f.thaws) == total, what="the shares settled")
    per_activator = 3 * pods * concurrency
    res = []
    ths = [threading.Thread(target=lambda t=t: res.append(complete(t, timeout=90)))
           for t in f.thaws for _ in range(per_activator)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(90)
    stats = pod_stats(f.sim)
    peaks = {name: s["peak_active"] for name, s in stats.items()}
    assert max(peaks.values()) <= concurrency, peaks
    assert [r.status for r in res] == [200] * (per_activator * activators)
    assert sum(s["completions"] for s in stats.values()) == per_activator * activators
    # What each activator holds: dealt round-robin, totals within one of each
    # other, each pod's shares adding up to its limit.
    held = sorted((t.status()["models"][0]["slots"]["here"] for t in f.thaws), reverse=True)
    assert sum(held) == total and held[0] - held[-1] <= 1, held
    by_pod = {}
    for t in f.thaws:
        for p in next(x for x in t.status()["models"] if x["name"] == "llama")["pods"]:
            by_pod[p["name"]] = by_pod.get(p["name"], 0) + p["slots"]
    assert set(by_pod.values()) == {concurrency}, by_pod


def test_shares_move_when_an_activator_leaves(fleet):
    """Two activators share one pod's single slot; when the one holding it
    leaves thaw's Service, the other takes the slot and serves its held
    request."""
    f = fleet(2, load_ms=100)
    f.sim.create_deployment(deployment(
        "llama", replicas=1, gpus=0, load_ms=100,
        annotations={"thaw.dev/max-concurrency": "1", "thaw.dev/min-scale": "1",
                     "thaw.dev/max-scale": "1"}))

    def model(t):
        return next((x for x in t.status()["models"] if x["name"] == "llama"), None)
    for t in f.thaws:
        wait_for(lambda t=t: model(t) and model(t)["state"] == "ready", timeout=30,
                 what="pod ready")
    # A share that grows (this activator just placed among the two) is used
    # once the deal has settled.
    holder = wait_for(lambda: next((t for t in f.thaws if model(t)["slots"]["here"] == 1), None),
                      what="one activator holding the slot")
    other = next(t for t in f.thaws if t is not holder)
    assert model(other)["slots"]["here"] == 0
    res = []
    th = threading.Thread(target=lambda: res.append(complete(other, timeout=30)))
    th.start()
    wait_for(lambda: other.status()["queued"] == 1, what="held with share 0")
    time.sleep(0.5)
    assert other.status()["queued"] == 1 and not res
    # The holder leaves thaw's Service (scaled in, or its pod deleted).
    _, sl = f.sim.call("GET", "/apis/discovery.k8s.io/v1/namespaces/models/endpointslices/"
                              "thaw-abc")
    sl["endpoints"] = [e for e in sl["endpoints"] if e["addresses"][0] != holder.host]
    f.sim.call("PUT", "/apis/discovery.k8s.io/v1/namespaces/models/endpointslices/thaw-abc", sl)
    th.join(30)
    assert [r.status for r in res] == [200]
    assert model(other)["slots"] == {"activators": 1, "rank": 0, "placed": True, "here": 1}
    # The one that left the Service takes nothing more: the other holds it all.
    wait_for(lambda: not model(holder)["slots"]["placed"], what="holder unplaced")
    assert model(holder)["slots"]["here"] == 0


def llama_model(t):
    return next((x for x in t.status()["models"] if x["name"] == "llama"), None)


@pytest.mark.timer_heavy
@pytest.mark.parametrize("held_at", ["follower", "leader"])
def test_a_request_at_an_activator_with_no_share_gets_a_pod(fleet, held_at):
    """Two activators, a limit of 1, the model at zero, one request, held at
    the second activator (by address). One pod meets the demand the leader
    sums (1), but its only slot is dealt to the first activator: the leader
    asks for a second pod, whose slot is the second's, and the request is
    served (before, it waited beside the idle pod for its queue timeout),
    whether the second activator follows or leads. While it runs there, the
    second pod stays (a floor on queued requests alone let it go under it)."""
    f = fleet(2, load_ms=100)
    second = f.thaws[1]
    if (f.one_leader() is second) != (held_at == "leader"):
        hand_lease(f, second if held_at == "leader" else f.thaws[0])
    dep = deployment("llama", gpus=0, load_ms=100, annotations={"thaw.dev/max-concurrency": "1"})
    dep["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "3000"
    f.sim.create_deployment(dep)
    for t in f.thaws:
        wait_for(lambda t=t: llama_model(t), what="model seen")
    assert llama_model(second)["slots"]["rank"] == 1
    out = {}
    body = {"model": "x", "prompt": "hi"}  # the simulator's 4 tokens: about 12 s
    th = threading.Thread(target=lambda: out.setdefault("r", complete(second, body, timeout=60)))
    th.start()
    wait_for(lambda: llama_model(second)["inflight"] == 1, timeout=20, what="running")
    time.sleep(8)  # past the stable window (6 s), while it runs
    assert th.is_alive() and spec_replicas(f.sim) == 2, spec_replicas(f.sim)
    assert llama_model(second)["slots"]["here"] == 1
    th.join(30)
    assert "r" in out, "the request is still held at the activator with no share"
    assert out["r"].status == 200, out["r"].body
    log = [n for name, n in f.sim.state()["scale_log"] if name == "llama"]
    assert max(log) == 2, log  # one pod for the first activator, one for the second


def test_a_terminating_activator_keeps_its_share(fleet):
    """An activator listed terminating in thaw's EndpointSlice (its pod is
    being deleted: kube-proxy still sends it requests for a few seconds, and
    it drains what it holds) keeps its place in the deal until it leaves the
    Service: a request that reaches it is served at once (before, it was
    dealt no slot, held the request until its drain timeout, then answered
    503), and the other's share does not grow over its slot meanwhile."""
    f = fleet(2, load_ms=100)
    f.sim.create_deployment(deployment(
        "llama", replicas=1, gpus=0, load_ms=100,
        annotations={"thaw.dev/max-concurrency": "2", "thaw.dev/min-scale": "1",
                     "thaw.dev/max-scale": "1"}))
    for t in f.thaws:
        wait_for(lambda t=t: llama_model(t) and llama_model(t)["slots"]["here"] == 1,
                 timeout=30, what="the pod ready, one slot at each activator")
    leaving, staying = f.thaws[1], f.thaws[0]
    path = "/apis/discovery.k8s.io/v1/namespaces/models/endpointslices/thaw-abc"
    _, sl = f.sim.call("GET", path)
    for e in sl["endpoints"]:
        if e["addresses"][0] == leaving.host:
            e["conditions"] = {"ready": False, "serving": True, "terminating": True}
    f.sim.call("PUT", path, sl)
    wait_for(lambda: any(p.get("draining") for p in staying.status()["kubernetes"]["peers"]),
             what="the other activator seeing it terminating")
    wait_for(lambda: not any(p["self"] and not p.get("draining")
                             for p in leaving.status()["kubernetes"]["peers"]),
             what="the activator seeing itself terminating")
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", complete(leaving, timeout=60)))
    th.start()
    th.join(10)
    assert "r" in out, "the request is held at the terminating activator"
    assert out["r"].status == 200, out["r"].body
    assert llama_model(leaving)["slots"] == {"activators": 2, "rank": 1, "placed": True,
                                             "here": 1}
    assert llama_model(staying)["slots"]["here"] == 1
    # Gone from the Service: the other holds the pod's slots.
    _, sl = f.sim.call("GET", path)
    sl["endpoints"] = [e for e in sl["endpoints"] if e["addresses"][0] != leaving.host]
    f.sim.call("PUT", path, sl)
    wait_for(lambda: llama_model(staying)["slots"]["here"] == 2, timeout=5,
             what="the slots dealt to the one left")


def test_a_scale_up_under_load_keeps_the_serving_pods_shares(fleet):
    """Two activators, a limit of 1, two pods busy: a third pod added by a
    scale-up comes last in the deal, so the pods already serving keep their
    activator and none of them ever gets a second request."""
    f = fleet(2, load_ms=100)
    d = deployment("llama", replicas=2, gpus=0, load_ms=100,
                   annotations={"thaw.dev/max-concurrency": "1", "thaw.dev/min-scale": "2",
                                "thaw.dev/max-scale": "2"})
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "40"
    f.sim.create_deployment(d)

    def ready(t, n):
        m = next((x for x in t.status()["models"] if x["name"] == "llama"), None)
        return m and sum(p["ready"] for p in m["pods"]) == n
    for t in f.thaws:
        wait_for(lambda t=t: ready(t, 2), timeout=30, what="two pods ready")
    time.sleep(1.1)  # creationTimestamp has whole seconds: the new pod is younger
    stop = threading.Event()
    res = []

    def load(t):
        while not stop.is_set():
            res.append(complete(t, timeout=30).status)
    ths = [threading.Thread(target=load, args=(t,)) for t in f.thaws for _ in range(3)]
    for th in ths:
        th.start()
    time.sleep(0.5)
    f.sim.update("/apis/apps/v1/namespaces/models/deployments/llama",
                 lambda d: d["metadata"]["annotations"].update(
                     {"thaw.dev/min-scale": "3", "thaw.dev/max-scale": "3"}))
    try:
        for t in f.thaws:
            wait_for(lambda t=t: ready(t, 3), timeout=30, what="the third pod ready")
        time.sleep(1)
    finally:
        stop.set()
        for th in ths:
            th.join(30)
    peaks = {name: s["peak_active"] for name, s in pod_stats(f.sim).items()}
    assert len(peaks) == 3 and max(peaks.values()) <= 1, peaks
    assert res and set(res) == {200}


@pytest.mark.parametrize("pods", [3, 4])
def test_pods_ready_together_keep_their_limit_across_activators(fleet, pods):
    """A cold start to pods that get ready within the same moment, 8 requests
    per pod held on two activators: each activator sees the pods get ready in
    its own order, yet both deal every pod's single slot the same way, so no
    pod ever serves two requests at once and every request is served."""
    f = fleet(2, load_ms=100)
    d = deployment("llama", gpus=0, load_ms=600,
                   annotations={"thaw.dev/max-concurrency": "1",
                                "thaw.dev/activation-scale": str(pods),
                                "thaw.dev/max-scale": str(pods)})
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "30"
    f.sim.create_deployment(d)
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model discovered")
    res = []
    ths = [threading.Thread(target=lambda t=t: res.append(complete(t, timeout=30)))
           for t in f.thaws for _ in range(4 * pods)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(30)
    peaks = {name: s["peak_active"] for name, s in pod_stats(f.sim).items()}
    assert len(peaks) == pods and max(peaks.values()) <= 1, peaks
    assert [r.status for r in res] == [200] * (8 * pods)


def test_a_deleted_pod_moves_the_shares_without_overlap(fleet):
    """Two activators, a limit of 1, three pods busy. Deleting the oldest pod
    moves the other two up the deal, each to the other activator; the
    activator that gains a pod waits until the deal has settled, by when the
    one that lost it has let go (its request there finished), so no pod ever
    serves two at once."""
    f = fleet(2, load_ms=100)
    d = deployment("llama", replicas=3, gpus=0, load_ms=100,
                   annotations={"thaw.dev/max-concurrency": "1", "thaw.dev/min-scale": "3",
                                "thaw.dev/max-scale": "3"})
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "40"
    f.sim.create_deployment(d)

    def ready(t, n):
        m = next((x for x in t.status()["models"] if x["name"] == "llama"), None)
        return m and sum(p["ready"] for p in m["pods"]) == n
    for t in f.thaws:
        wait_for(lambda t=t: ready(t, 3), timeout=30, what="three pods ready")
    _, pods = f.sim.call("GET", "/api/v1/namespaces/models/pods?labelSelector=app%3Dllama")
    by_age = sorted(pods["items"], key=lambda p: (p["metadata"]["creationTimestamp"],
                                                  p["metadata"]["name"]))
    survivors = {p["metadata"]["name"]: p["status"]["podIP"] for p in by_age[1:]}
    stop = threading.Event()
    res = []

    def load(t):
        while not stop.is_set():
            res.append(complete(t, timeout=30).status)
    ths = [threading.Thread(target=load, args=(t,)) for t in f.thaws for _ in range(3)]
    for th in ths:
        th.start()
    try:
        time.sleep(0.5)
        f.sim.call("DELETE", f"/api/v1/namespaces/models/pods/{by_age[0]['metadata']['name']}")
        time.sleep(1.6)  # the deal settles (1 s) and the shares move
    finally:
        stop.set()
        for th in ths:
            th.join(30)
    peaks = {}
    for name, ip in survivors.items():
        st = httpc.request(ip, 8000, "GET", "/stats", {}, b"", timeout=5)
        peaks[name] = json.loads(st.body)["peak_active"]
    assert max(peaks.values()) <= 1, peaks
    # The deleted pod's server finishes what it holds on SIGTERM (as uvicorn
    # does): nothing fails.
    assert res and set(res) == {200}, set(res)


def test_a_followers_stream_on_a_terminating_pod_is_still_its_demand(fleet):
    """A follower streams on the model's pod when the pod is deleted: the
    server finishes the stream in its grace period, and the follower's
    /demand still counts it (before, it dropped out as the pod left routing,
    and the leader, seeing less load, could drain the next pod under its
    own streams)."""
    f = fleet(2)
    leader = f.one_leader()
    follower = next(t for t in f.thaws if t is not leader)
    d = deployment("llama", replicas=1, annotations={"thaw.dev/min-scale": "1"})
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "1500"
    f.sim.create_deployment(d)
    wait_for(lambda: any(m["name"] == "llama" and m["state"] == "ready"
                         for m in follower.status()["models"]), timeout=20 * SLOW,
             what="the pod ready at the follower")
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", complete(follower)))
    th.start()

    def demand():
        return json.loads(follower.admin("/demand")[1])["models"].get("models/llama", [0])[0]
    wait_for(lambda: demand() == 1, timeout=10 * SLOW, what="the stream under way")
    _, pods = f.sim.call("GET", "/api/v1/namespaces/models/pods")
    pod = next(p["metadata"]["name"] for p in pods["items"]
               if p["metadata"]["labels"].get("app") == "llama")
    f.sim.call("DELETE", f"/api/v1/namespaces/models/pods/{pod}")
    wait_for(lambda: all(p["name"] != pod or p["terminating"]
                         for m in follower.status()["models"] if m["name"] == "llama"
                         for p in m.get("pods", [])), timeout=10, what="the pod terminating")
    seen = []
    while th.is_alive():
        seen.append(demand())
        time.sleep(0.1)
    assert out["r"].status == 200, out["r"].body
    assert seen and min(seen[:-3] or seen) == 1, seen


@pytest.mark.timer_heavy
def test_a_leader_whose_renewal_hangs_stops_leading_at_its_deadline(fleet):
    """Every Lease PUT takes 4 s: the leader's renewal hangs. It stops leading
    renew_deadline_ms (2 s) after its last renewal, before the Lease expires
    (3 s) and another may take it (before, it led on until the PUT returned:
    4 s without a renewal, and beside the next leader for a while)."""
    f = fleet(2)
    leader = f.one_leader()
    f.sim.call("POST", "/_sim/faults", {"delay_ms": 4000, "delay_methods": ["PUT"]})
    t0 = time.monotonic()
    led_again = []
    try:
        wait_for(lambda: leader.metric("thaw_leader") == 0, timeout=10, interval=0.05,
                 what="the old leader stepping down")
        took = time.monotonic() - t0
        # A renewal answered after the deadline (each takes 4 s now) does not
        # make it lead again: its deadline counts from when it was sent, and
        # the others may take the Lease from then on (before, the renewal sent
        # just before or after the fault made it lead again when answered).
        while time.monotonic() - t0 < 6:
            if leader.metric("thaw_leader") == 1:
                led_again.append(round(time.monotonic() - t0, 1))
            time.sleep(0.1)
    finally:
        f.sim.call("POST", "/_sim/faults", {"delay_ms": 0})
    # Its last renewal was at most renew_interval_ms (0.3 s) before the fault.
    assert took < 2.3 * SLOW, f"led {took:.1f}s into a hung renewal"
    assert not led_again, f"led again at {led_again} s, on renewals answered late"
    assert "could not renew within renew_deadline_ms" in leader.logs()
