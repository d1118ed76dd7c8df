"""End-to-end: a cluster model with revisions (several Deployments with the
same thaw.dev/model and each a thaw.dev/revision) against the API simulator:
each revision is scaled from zero on its own, a tag reaches one, a bad split
is an error, and a rollout's steps, rollback and promotion are written to
the Deployments so a restarted activator continues from them."""

import time

import pytest

import httpc
from conftest import wait_for
from test_ha import fleet  # noqa: F401  (a fixture)
from test_kubernetes import (SLOW, cluster, deployment, events_by_reason,  # noqa: F401
                             pki, start_thaw, urllib_status)


def revision(rev, percent=None, annotations=None, pod_annotations=None, load_ms=200):
    anns = dict(annotations or {})
    if percent is not None:
        anns["thaw.dev/traffic-percent"] = str(percent)
    d = deployment(f"llama-{rev}", gpus=0, annotations=anns, load_ms=load_ms,
                   model_label="llama")
    d["metadata"]["labels"]["thaw.dev/revision"] = rev
    d["spec"]["template"]["metadata"]["annotations"].update(pod_annotations or {})
    return d


def start(cluster, thaw_factory, tmp_path, *deployments, **sim_kw):
    sim = cluster(**sim_kw)
    for d in deployments:
        sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    wait_for(lambda: any(m["name"] == "llama" for m in t.status()["models"]),
             what="the model with revisions")
    return sim, t


def complete(t, headers=None):
    # (an activator of a fleet listens on its own loopback address)
    return httpc.request(t.host, t.port, "POST", "/v1/completions",
                         {"Host": "llama.models", **(headers or {})},
                         b'{"model": "llama", "prompt": "hi"}', timeout=60)


def replicas(sim, name):
    _, d = sim.call("GET", f"/apis/apps/v1/namespaces/models/deployments/{name}")
    return d["spec"].get("replicas", 0)


def annotations(sim, name):
    _, d = sim.call("GET", f"/apis/apps/v1/namespaces/models/deployments/{name}")
    return d["metadata"].get("annotations") or {}


def served(t, rev):
    return t.metric("thaw_requests_total", model="llama", namespace="models", revision=rev,
                    code="200")


def status_of(t, name="llama"):
    return next(m for m in t.status()["models"] if m["name"] == name)


def test_split_90_10_each_revision_scales_from_zero_on_its_own(cluster, thaw_factory, tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1", 90), revision("v2", 10))
    for _ in range(5):  # weighted round robin: the sixth is the first for v2
        assert complete(t).status == 200
    assert replicas(sim, "llama-v1") == 1 and replicas(sim, "llama-v2") == 0
    assert complete(t).status == 200
    assert replicas(sim, "llama-v2") == 1
    for _ in range(14):
        assert complete(t).status == 200
    assert served(t, "v1") == 18 and served(t, "v2") == 2
    st = status_of(t)
    assert [(r["name"], r["percent"]) for r in st["revisions"]] == [("v1", 90), ("v2", 10)]
    # Listed one after the other at start, the two are one valid split: v1
    # alone (90) is no error to report.
    assert "InvalidTrafficSplit" not in events_by_reason(sim)
    assert "invalid traffic split" not in t.logs() and st.get("split_error") is None
    t.assert_reconciled()


def test_a_bad_split_listed_at_start_is_reported_once(cluster, thaw_factory, tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1", 90), revision("v2", 20))
    wait_for(lambda: "InvalidTrafficSplit" in events_by_reason(sim), timeout=5 * SLOW,
             what="the Warning Event")
    time.sleep(0.5)
    evs = events_by_reason(sim)["InvalidTrafficSplit"]
    assert sorted(e["involvedObject"]["name"] for e in evs) == ["llama-v1", "llama-v2"]
    assert all("add up to 110" in e["message"] and e.get("count", 1) == 1 for e in evs), evs
    assert t.logs().count("invalid traffic split") == 1
    assert "add up to 110" in status_of(t)["split_error"]


def test_tag_reaches_the_canary_and_a_bad_split_is_an_error(cluster, thaw_factory, tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path,
                   revision("v1", 100, {"thaw.dev/aliases": "meta-llama/Llama-3.1-8B"}),
                   revision("v2", 0, {"thaw.dev/aliases": "llama-8b"}))
    assert complete(t, {"thaw-revision": "v2"}).status == 200
    assert httpc.request(t.host, t.port, "POST", "/v1/completions", {"Host": "v2-llama.models"},
                         b'{"prompt": "hi"}', timeout=60).status == 200
    assert served(t, "v2") == 2 and replicas(sim, "llama-v1") == 0
    # The revisions' aliases name the model (the split picks the revision).
    for alias in ("meta-llama/Llama-3.1-8B", "llama-8b"):
        r = httpc.request(t.host, t.port, "POST", "/v1/completions", {"Host": "thaw"},
                          b'{"model": "%s", "prompt": "hi"}' % alias.encode(), timeout=60)
        assert r.status == 200
    assert served(t, "v1") == 2 and served(t, "v2") == 2
    # 100 + 30: not a guess; the split in force stays and the Deployments say why.
    sim.call("PATCH", "/apis/apps/v1/namespaces/models/deployments/llama-v2",
             {"metadata": {"annotations": {"thaw.dev/traffic-percent": "30"}}},
             ctype="application/merge-patch+json")
    wait_for(lambda: "InvalidTrafficSplit" in events_by_reason(sim), timeout=5 * SLOW,
             what="the Warning Event")
    assert "add up to 130" in status_of(t)["split_error"]
    assert "invalid traffic split" in t.logs()
    assert complete(t).status == 200 and served(t, "v1") == 3


def rollout_annotations(**kw):
    # The latency rule is left to the unit tests (a stall on a loaded machine).
    a = {"thaw.dev/rollout": "true", "thaw.dev/rollout-step-percent": "30",
         "thaw.dev/rollout-step-interval": "300ms", "thaw.dev/rollout-min-requests": "3",
         "thaw.dev/rollout-max-ttfb-p99-ratio-percent": "10000",
         "thaw.dev/rollout-ttfb-p99-tolerance": "10m"}
    a.update(kw)
    return a


def drive(t, until, timeout):
    codes = []
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        codes.append(complete(t).status)
    return codes


def test_failing_canary_is_rolled_back_with_an_event(cluster, thaw_factory, tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1"),
                   revision("v2", 20, rollout_annotations(),
                            pod_annotations={"sim.thaw.dev/error-pct": "50"}))
    rolled_back = lambda: status_of(t)["rollout"]["stage"] == "rolled_back"
    codes = drive(t, rolled_back, 20 * SLOW)
    assert rolled_back(), codes
    assert set(codes) <= {200, 500}
    wait_for(lambda: annotations(sim, "llama-v2").get("thaw.dev/rollout-stage") == "rolled_back",
             timeout=5 * SLOW, what="the rollback written to the canary")
    assert annotations(sim, "llama-v2")["thaw.dev/traffic-percent"] == "0"
    wait_for(lambda: annotations(sim, "llama-v1").get("thaw.dev/traffic-percent") == "100",
             timeout=5 * SLOW, what="the stable revision's share written")
    ev = events_by_reason(sim)["CanaryRolledBack"][0]
    assert ev["type"] == "Warning" and "error rate" in ev["message"]
    assert ev["involvedObject"]["name"] == "llama-v2"
    before = served(t, "v2")
    for _ in range(10):
        assert complete(t).status == 200
    assert served(t, "v2") == before


def test_a_step_is_not_undone_by_an_event_older_than_its_write(cluster, thaw_factory,
                                                                 tmp_path):
    """The leader steps the canary and writes the step; before the write lands
    the Deployment changes for another reason (its scale, someone's
    annotation), and that event still carries the step before. The split in force
    stays the one decided."""
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1"),
                   revision("v2", 10, rollout_annotations()))
    written = lambda pct: annotations(sim, "llama-v2").get("thaw.dev/traffic-percent") == pct
    assert set(drive(t, lambda: written("40"), 20 * SLOW)) == {200}
    sim.call("POST", "/_sim/faults", {"delay_ms": 2000, "delay_methods": ["PATCH"]})
    stepped = lambda: status_of(t)["rollout"]["canary_percent"] == 70
    assert set(drive(t, stepped, 20 * SLOW)) == {200}
    assert written("40")  # the next step is still being written
    sim.update("/apis/apps/v1/namespaces/models/deployments/llama-v2",
               lambda d: d["metadata"]["annotations"].update({"thaw.dev/idle-timeout": "10m"}))
    seen = set()
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        st = status_of(t)
        seen.add((st["rollout"]["canary_percent"],
                  tuple(r["percent"] for r in st["revisions"])))
        time.sleep(0.02)
    assert seen == {(70, (30, 70))}, seen
    sim.call("POST", "/_sim/faults", {"delay_ms": 0})
    wait_for(lambda: written("70"), timeout=10, what="the step written")
    assert status_of(t)["rollout"]["canary_percent"] == 70


def test_a_step_whose_write_failed_gives_way_to_the_cluster(cluster, thaw_factory, tmp_path):
    """The leader steps the canary and its write is refused: the step is not in
    the cluster, so the cluster's state (the step before) holds again at the
    next Deployment event, and the leader takes the step again and writes it.
    Were the refused step held for its echo's wait (30 s), the leader would go
    on from it (to promotion) and the cluster would never show it."""
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1"),
                   revision("v2", 10, rollout_annotations()))
    written = lambda pct: annotations(sim, "llama-v2").get("thaw.dev/traffic-percent") == pct
    assert set(drive(t, lambda: written("40"), 20 * SLOW)) == {200}
    refused = sim.state()["counters"].get("injected_500", 0)
    sim.faults(fail_next=1, fail_matching="thaw.dev/rollout-stage")
    stepped = lambda: status_of(t)["rollout"]["canary_percent"] == 70
    assert set(drive(t, stepped, 20 * SLOW)) == {200}
    wait_for(lambda: sim.state()["counters"].get("injected_500", 0) > refused, timeout=5 * SLOW,
             what="the step's write refused")
    sim.update("/apis/apps/v1/namespaces/models/deployments/llama-v2",
               lambda d: d["metadata"]["annotations"].update({"thaw.dev/idle-timeout": "10m"}))
    assert set(drive(t, lambda: written("70"), 20 * SLOW)) <= {200}
    assert written("70"), annotations(sim, "llama-v2")


def test_healthy_canary_is_promoted_and_a_restart_continues(cluster, thaw_factory, tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1"),
                   revision("v2", 10, rollout_annotations()))
    stepped = lambda: status_of(t)["rollout"]["canary_percent"] >= 40
    assert set(drive(t, stepped, 20 * SLOW)) == {200}
    wait_for(lambda: annotations(sim, "llama-v2").get("thaw.dev/traffic-percent") in ("40", "70"),
             timeout=5 * SLOW, what="the step written to the canary")
    written = int(annotations(sim, "llama-v2")["thaw.dev/traffic-percent"])
    assert annotations(sim, "llama-v2")["thaw.dev/rollout-stage"] == "progressing"
    t.stop()
    # A new activator continues from the annotations, not from 10%.
    t2 = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t2, "/readyz") == 200, what="informers synced")
    wait_for(lambda: any(m["name"] == "llama" for m in t2.status()["models"]),
             what="the model with revisions")
    ro = status_of(t2)["rollout"]
    assert ro["stage"] == "progressing" and ro["canary_percent"] == written
    promoted = lambda: status_of(t2)["rollout"]["stage"] == "promoted"
    assert set(drive(t2, promoted, 20 * SLOW)) == {200}, status_of(t2)["rollout"]
    st = status_of(t2)
    assert [(r["name"], r["percent"], r["stable"]) for r in st["revisions"]] == \
        [("v1", 0, False), ("v2", 100, True)]
    wait_for(lambda: annotations(sim, "llama-v2").get("thaw.dev/rollout-stage") == "promoted",
             timeout=5 * SLOW, what="the promotion written")
    assert "CanaryPromoted" in events_by_reason(sim)


@pytest.mark.timer_heavy  # mostly the lease's election
def test_with_several_activators_the_leader_runs_the_rollout(fleet):
    f = fleet(2, load_ms=200)
    leader = f.one_leader()
    follower = next(t for t in f.thaws if t is not leader)
    f.sim.create_deployment(revision("v1"))
    f.sim.create_deployment(revision("v2", 10, rollout_annotations()))
    for t in f.thaws:
        wait_for(lambda t=t: any(m["name"] == "llama" for m in t.status()["models"]),
                 what="the model with revisions")
    # Traffic through the follower alone: it serves the split, decides nothing.
    for _ in range(30):
        assert complete(follower).status == 200
    time.sleep(0.5)
    assert status_of(follower)["rollout"]["canary_percent"] == 10
    assert follower.metric("thaw_kubernetes_rollout_writes_total") == 0
    # Through the leader: it steps the canary up and writes it; the follower
    # takes the new split from the Deployment.
    drive(leader, lambda: status_of(leader)["rollout"]["canary_percent"] >= 40, 20 * SLOW)
    pct = status_of(leader)["rollout"]["canary_percent"]
    assert pct >= 40
    wait_for(lambda: status_of(follower)["rollout"]["canary_percent"] >= 40, timeout=5 * SLOW,
             what="the follower following the leader's step")
    # One write to each Deployment per step (the stable one's may land last).
    wait_for(lambda: leader.metric("thaw_kubernetes_rollout_writes_total") >= 2,
             timeout=5 * SLOW, what="the leader's writes")
    assert leader.metric("thaw_kubernetes_rollout_write_errors_total") == 0
    assert follower.metric("thaw_kubernetes_rollout_writes_total") == 0


def test_a_model_that_gains_a_revision_label_becomes_a_model_with_revisions(cluster, thaw_factory,
                                                                            tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path,
                   deployment("llama", gpus=0, load_ms=100))
    assert complete(t).status == 200
    assert "revisions" not in status_of(t)
    sim.call("PATCH", "/apis/apps/v1/namespaces/models/deployments/llama",
             {"metadata": {"labels": {"thaw.dev/revision": "v1"}}},
             ctype="application/merge-patch+json")
    wait_for(lambda: [r["name"] for r in status_of(t).get("revisions", [])] == ["v1"],
             timeout=5 * SLOW, what="the model with one revision")
    assert status_of(t)["revisions"][0]["percent"] == 100
    assert complete(t).status == 200
    assert served(t, "v1") == 1
    t.assert_reconciled()


def named(d, name):
    d["metadata"]["name"] = name
    return d


def traffic_percents(t):
    return [(r["name"], r["percent"]) for r in status_of(t)["revisions"]]


def test_a_revisions_tag_host_is_made_of_every_revisions_hosts(cluster, thaw_factory, tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path,
                   revision("v1", 100, {"thaw.dev/hosts": "llama.example.com"}),
                   revision("v2", 0, {"thaw.dev/hosts": "canary.example.com"}))
    for host in ("v2-llama.example.com", "v2-canary.example.com"):
        r = httpc.request(t.host, t.port, "POST", "/v1/completions", {"Host": host},
                          b'{"prompt": "hi"}', timeout=60)
        assert r.status == 200, (host, r.status, r.body)
    r = httpc.request(t.host, t.port, "POST", "/v1/completions", {"Host": "v1-canary.example.com"},
                      b'{"prompt": "hi"}', timeout=60)
    assert r.status == 200
    assert served(t, "v2") == 2 and served(t, "v1") == 1


@pytest.mark.timer_heavy
def test_a_split_invalid_at_start_does_not_depend_on_the_deployments_names(cluster, thaw_factory,
                                                                          tmp_path):
    # The stable revision without a percent, the canary with 10: invalid, so
    # no split at first, whichever Deployment is listed first.
    for first, second in (("llama-a", "llama-b"), ("llama-b", "llama-a")):
        sim, t = start(cluster, thaw_factory, tmp_path, named(revision("v1"), first),
                       named(revision("v2", 10), second))
        wait_for(lambda: status_of(t).get("split_error"), timeout=5 * SLOW, what="split error")
        r = complete(t)
        assert r.status == 503 and b"no_replicas" in r.body, (first, r.status, r.body)
        t.stop()
        sim.stop()


def test_a_deleted_revision_leaves_the_split_and_a_duplicate_is_an_error(cluster, thaw_factory,
                                                                        tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1", 50), revision("v2", 30),
                   revision("v3", 20))
    assert traffic_percents(t) == [("v1", 50), ("v2", 30), ("v3", 20)]
    sim.call("DELETE", "/apis/apps/v1/namespaces/models/deployments/llama-v3")
    # 50 + 30 is no valid split: the one in force stays, less v3, whose share
    # goes to the others in proportion.
    wait_for(lambda: traffic_percents(t) == [("v1", 63), ("v2", 37)], timeout=5 * SLOW,
             what=f"v3 out of the split: {traffic_percents(t)}")
    assert "add up to 80" in status_of(t)["split_error"]
    _, body = t.admin("/metrics")
    assert not [ln for ln in body.splitlines()
                if ln.startswith("thaw_revision_traffic_percent") and 'revision="v3"' in ln]
    codes = [complete(t).status for _ in range(10)]
    assert codes == [200] * 10
    sim.call("DELETE", "/apis/apps/v1/namespaces/models/deployments/llama-v2")
    # A model's only revision takes all of it, whatever its percent.
    wait_for(lambda: traffic_percents(t) == [("v1", 100)], timeout=5 * SLOW,
             what=f"v1 alone: {traffic_percents(t)}")
    assert status_of(t).get("split_error") is None
    # Deployments naming revision v1 again (copied manifests): an error, said
    # on the Deployments, and none of them takes v1's traffic, whichever sorts first
    # (before, v1's requests went to a copy, which was woken for them).
    copies = ("llama-v1-copy", "llama-0-copy", "llama-zz-copy")
    for name in copies:
        sim.create_deployment(named(revision("v1", 50), name))
    wait_for(lambda: "named by two Deployments" in (status_of(t).get("split_error") or ""),
             timeout=5 * SLOW, what="the duplicate reported")
    evs = events_by_reason(sim).get("InvalidTrafficSplit", [])
    assert {"llama-v1", "llama-v1-copy"} <= {e["involvedObject"]["name"] for e in evs}
    _, body = t.admin("/metrics")
    assert body.count('thaw_revision_traffic_percent{model="llama"') == 1, body
    assert [complete(t).status for _ in range(5)] == [200] * 5
    assert [replicas(sim, name) for name in copies] == [0, 0, 0]
    t.assert_reconciled()


@pytest.mark.timer_heavy
def test_no_rollout_steps_while_the_split_is_invalid(cluster, thaw_factory, tmp_path):
    sim, t = start(cluster, thaw_factory, tmp_path, revision("v1", 80),
                   revision("v2", 10, rollout_annotations()), revision("v3", 10))
    wait_for(lambda: status_of(t).get("split_error"), timeout=5 * SLOW, what="split error")
    drive(t, lambda: False, 2.5 * SLOW)  # several step intervals with traffic
    assert "CanaryStepped" not in events_by_reason(sim)
    assert [annotations(sim, f"llama-{r}")["thaw.dev/traffic-percent"]
            for r in ("v1", "v2", "v3")] == ["80", "10", "10"]
