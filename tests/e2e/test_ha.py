"""End-to-end: several activators against the API simulator: one leader via a
Lease, one scale-up when several poke at zero, failover, shared demand,
stale peers dropped."""

import json
import os
import signal
import threading
import time

import pytest

import httpc
from conftest import Thaw, free_port, wait_for
from test_kubernetes import KubeSim, deployment, pki  # noqa: F401  (pki is a fixture)

LEASE = {"lease_duration_ms": 3000, "renew_interval_ms": 300, "renew_deadline_ms": 2000}


class Fleet:
    """N activators on 127.0.0.11.., one admin port, listed in thaw's own Service."""

    def __init__(self, sim, tmp_path, n, autoscaler=None):
        self.sim = sim
        self.admin_port = free_port()
        self.ips = [f"127.0.0.{11 + i}" for i in range(n)]
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
                                  "peers_poll_ms": 200, "peers_timeout_ms": 1200, **LEASE}}
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

    def make(n, **sim_kw):
        sim = KubeSim(pki, str(tmp_path), **sim_kw)
        f = Fleet(sim, tmp_path, n)
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


def test_two_activators_poking_at_zero_scale_up_once(fleet):
    f = fleet(2, load_ms=800)
    f.one_leader()
    f.sim.call("POST", "/apis/apps/v1/namespaces/models/deployments",
               deployment("llama", annotations={"thaw.dev/target": "100"}))
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
    assert f.sim.state()["counters"]["scale_writes"] == 1
    for t in f.thaws:
        t.assert_reconciled()


def test_leader_killed_during_a_cold_start(fleet):
    f = fleet(3, load_ms=2500)
    leader = f.one_leader()
    f.sim.call("POST", "/apis/apps/v1/namespaces/models/deployments",
               deployment("llama", annotations={"thaw.dev/target": "100"}))
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


def test_demand_split_across_activators_scales_like_one(fleet):
    f = fleet(2, load_ms=300)
    f.one_leader()
    f.sim.call("POST", "/apis/apps/v1/namespaces/models/deployments", deployment(
        "llama", gpus=0, annotations={"thaw.dev/target": "1", "thaw.dev/max-concurrency": "1",
                                      "thaw.dev/max-scale": "8"},
        load_ms=300))
    # Each request holds its replica's only slot for ~4 s.
    _, d = f.sim.call("GET", "/apis/apps/v1/namespaces/models/deployments/llama")
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "1000"
    f.sim.call("PUT", "/apis/apps/v1/namespaces/models/deployments/llama", d)
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
    f.sim.call("POST", "/apis/apps/v1/namespaces/models/deployments", deployment(
        "llama", annotations={"thaw.dev/target": "100", "thaw.dev/idle-timeout": idle_timeout}))
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="model seen")


def stays_up(sim, until, step=0.2):
    while time.monotonic() < until:
        assert spec_replicas(sim) >= 1, "scaled to zero too early"
        time.sleep(step)


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
