"""End-to-end: a cluster model's settings from its Deployment's annotations (thaw's and
Knative's, on the Deployment or its pod template), long cold starts, loading heartbeats,
and names (marker labels, one name in two namespaces), against the API simulator."""

import json
import time

import pytest

import httpc
from conftest import wait_for
from test_kubernetes import (SLOW, cluster, complete, deployment, events_by_reason,  # noqa: F401
                             kmodel, parallel, pki, start_thaw, synced_llama, urllib_status)

NEVER = 600000  # a load that does not finish within a test


def settings(t, name="llama", namespace=None):
    return model(t, name, namespace)["settings"]


def model(t, name="llama", namespace=None):
    return next(m for m in t.status()["models"]
                if m["name"] == name and (namespace is None or m["namespace"] == namespace))


def replicas(sim, name="llama", ns="models"):
    return sim.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")[1]["spec"].get(
        "replicas", 0)


def create(sim, dep):
    ns = dep["metadata"]["namespace"]
    status, body = sim.call("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", dep)
    assert status == 201, body


def stream(t, host="llama.models", timeout=60):
    s = t.connect(timeout=timeout)
    httpc.send(s, "POST", "/v1/chat/completions",
               {"Content-Type": "application/json", "Host": host},
               json.dumps({"model": "llama", "stream": True, "messages": []}).encode())
    start = time.monotonic()
    r = httpc.Reader(s).response()
    s.close()
    return start, r


# --- A: every per-model setting from an annotation --------------------------------

def test_every_setting_from_annotations_applies_and_shows_in_status(cluster, thaw_factory,
                                                                   tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, deploy_kw=dict(load_ms=NEVER),
                          annotations={"thaw.dev/queue-timeout": "1500ms",
                                       "thaw.dev/max-queue": "1",
                                       "thaw.dev/connect-timeout": "3s",
                                       "thaw.dev/first-byte-timeout": "2m",
                                       "thaw.dev/upstream-idle-timeout": "10m",
                                       "thaw.dev/loading-heartbeat": "0s",
                                       "thaw.dev/startup-timeout": "30m"})
    # The queue holds one; the next is refused; the held one times out at 1.5 s.
    start = time.monotonic()
    first, second = parallel(2, lambda: complete(t, timeout=20))
    codes = sorted([first.status, second.status])
    assert codes == [503, 504], codes
    timed_out = first if first.status == 504 else second
    assert timed_out.json()["error"]["code"] == "queue_timeout"
    full = second if timed_out is first else first
    assert full.json()["error"]["code"] == "queue_full"
    assert 1.3 < time.monotonic() - start < 6 * SLOW
    st = settings(t)
    assert st["queue_timeout_ms"] == 1500 and st["max_queue"] == 1
    assert st["connect_timeout_ms"] == 3000 and st["first_byte_timeout_ms"] == 120000
    assert st["upstream_idle_timeout_ms"] == 600000 and st["loading_heartbeat_ms"] == 0
    assert st["startup_timeout_ms"] == 1800000
    assert "annotation_errors" not in model(t)


def logfmt(line):
    """A strict logfmt reading: key=value, key="quoted \\"value\\"", space-separated."""
    out, i = {}, 0
    while i < len(line):
        eq = line.index("=", i)
        key = line[i:eq]
        assert key and " " not in key and '"' not in key, (key, line)
        i = eq + 1
        if line.startswith('"', i):
            j, val = i + 1, []
            while line[j] != '"':
                if line[j] == "\\":
                    j += 1
                val.append(line[j])
                j += 1
            out[key], i = "".join(val), j + 1
        else:
            j = line.find(" ", i)
            j = len(line) if j < 0 else j
            out[key], i = line[i:j], j
        assert i == len(line) or line[i] == " ", ("garbage after a value", line[i:], line)
        i += 1
    return out


def test_knative_camel_case_annotations_of_a_migrated_service_apply(cluster, thaw_factory,
                                                                     tmp_path):
    """An InferenceService migrated with its annotations as Knative's docs and
    older releases write them (minScale, decimal percentages): they apply, as
    Knative applies them, and none is reported."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50),
                          annotations={"autoscaling.knative.dev/minScale": "1",
                                       "autoscaling.knative.dev/maxScale": "3",
                                       "autoscaling.knative.dev/panicWindowPercentage": "20.0",
                                       "autoscaling.knative.dev/panicThresholdPercentage":
                                           "150.0"})
    m = model(t)
    assert not m.get("annotation_errors"), m["annotation_errors"]
    wait_for(lambda: replicas(sim) == 1, what="minScale keeps a replica")
    time.sleep(3)
    assert replicas(sim) == 1
    s = settings(t)
    assert s["panic_window_pct"] == 20 and s["panic_threshold_pct"] == 150 and s["max_scale"] == 3, s


def test_bad_and_unknown_annotations_are_logged_and_posted_as_an_event(cluster, thaw_factory,
                                                                       tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/queue-timeout": "soon",
                                       "thaw.dev/idle-timout": "5m",
                                       "autoscaling.knative.dev/metric": "rps",
                                       "autoscaling.knative.dev/minscale": "1"})
    m = model(t)
    for key in ("thaw.dev/queue-timeout", "thaw.dev/idle-timout",
                "autoscaling.knative.dev/metric", "autoscaling.knative.dev/minscale"):
        assert key in m["annotation_errors"]
    assert m["settings"]["queue_timeout_ms"] == 960000  # the default kept
    # One warning names the Deployment, each annotation and its value.
    line = next(ln for ln in t.logs().splitlines() if "bad annotations" in ln)
    fields = logfmt(line)  # the values quote '"soon"': escaped, one logfmt line
    assert fields["deployment"] == "models/llama"
    assert 'thaw.dev/queue-timeout: "soon" is not a duration' in fields["errors"]
    assert 'thaw.dev/idle-timout: "5m"' in fields["errors"]
    for ln in t.logs().splitlines():
        logfmt(ln)  # every line, the informers' names too
    wait_for(lambda: "InvalidAnnotations" in events_by_reason(sim), what="event")
    ev = events_by_reason(sim)["InvalidAnnotations"][0]
    assert ev["type"] == "Warning" and ev["involvedObject"]["name"] == "llama"
    assert 'thaw.dev/idle-timout: "5m" is not an annotation thaw knows' in ev["message"]
    assert 'autoscaling.knative.dev/metric: "rps" is not supported' in ev["message"]
    assert complete(t).status == 200  # served with the defaults


# --- B: a long cold start is served -------------------------------------------------

def test_defaults_hold_a_request_through_the_whole_startup_timeout(cluster, thaw_factory,
                                                                   tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path)
    st = settings(t)
    # The chart's startup probe allows 15 minutes; a held request waits that and a minute.
    assert st["startup_timeout_ms"] == 900000
    assert st["queue_timeout_ms"] == 960000


def test_batch_model_waits_an_hour_and_goes_to_zero_after_30s(cluster, thaw_factory, tmp_path):
    """A batch model's defaults: its requests wait an hour for GPU slices the interactive
    tiers leave free (rather than five minutes), and it gives its slices back 30 s after
    its last request; annotations still win."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path,
                          annotations={"thaw.dev/priority": "batch"})
    st = settings(t)
    assert st["queue_timeout_ms"] == 3600000
    assert st["idle_timeout_ms"] == 30000
    (tmp_path / "set").mkdir()
    sim2, t2 = synced_llama(cluster, thaw_factory, tmp_path / "set",
                            annotations={"thaw.dev/priority": "batch",
                                         "thaw.dev/queue-timeout": "2m",
                                         "thaw.dev/idle-timeout": "10m"})
    assert settings(t2)["queue_timeout_ms"] == 120000
    assert settings(t2)["idle_timeout_ms"] == 600000


def test_long_cold_start_is_served(cluster, thaw_factory, tmp_path):
    """The old defaults on a scaled-down timeline (startup-timeout 10 min -> 4 s, a 6-minute
    vLLM load -> 2.4 s, past where a queue timeout in the old proportion (5 min -> 2 s)
    would end it): the held request is served."""
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, deploy_kw=dict(load_ms=2400),
                          annotations={"thaw.dev/startup-timeout": "4s"})
    assert settings(t)["queue_timeout_ms"] >= 4000
    start = time.monotonic()
    r = complete(t, timeout=30)
    assert r.status == 200, r.body
    assert time.monotonic() - start > 2.4
    # An explicitly shorter queue timeout still wins.
    (tmp_path / "short").mkdir()
    sim2, t2 = synced_llama(cluster, thaw_factory, tmp_path / "short",
                            deploy_kw=dict(load_ms=2400),
                            annotations={"thaw.dev/startup-timeout": "4s",
                                         "thaw.dev/queue-timeout": "1s"})
    assert settings(t2)["queue_timeout_ms"] == 1000
    assert complete(t2, timeout=30).status == 504


# --- C: loading heartbeats for cluster models -----------------------------------------

def test_streaming_client_gets_loading_heartbeats_during_a_cluster_cold_start(
        cluster, thaw_factory, tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, deploy_kw=dict(load_ms=1500),
                          annotations={"thaw.dev/loading-heartbeat": "250ms"})
    start, r = stream(t)
    assert r.status == 200 and r.header("content-type") == "text/event-stream"
    assert r.header("x-thaw-cold-start") == "1"
    events = [e for e in r.body.decode().split("\n\n") if e]
    assert len([e for e in events if e.startswith(": loading ")]) >= 3
    assert r.chunks[0][0] - start < 0.5 * SLOW
    assert [e for e in events if e.startswith("data: ")][-1] == "data: [DONE]"
    # Warm: the replica's own stream, no heartbeats.
    _, r = stream(t)
    assert ": loading" not in r.body.decode()


def test_loading_heartbeats_are_on_by_default_for_cluster_models(cluster, thaw_factory,
                                                                  tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, deploy_kw=dict(load_ms=800))
    start, r = stream(t)
    assert r.status == 200 and r.body.decode().startswith(": loading phase=")
    assert r.chunks[0][0] - start < 0.5 * SLOW
    assert settings(t)["loading_heartbeat_ms"] == 15000


# --- D: names ----------------------------------------------------------------------------

def test_marker_label_names_models_after_their_deployments(cluster, thaw_factory, tmp_path):
    sim = cluster(load_ms=50)
    for name in ("alpha", "beta"):
        create(sim, deployment(name, model_label="true"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    assert {m["name"] for m in t.status()["models"]} == {"alpha", "beta"}
    assert complete(t, host="alpha.models").status == 200
    assert complete(t, host="beta", body={"model": "beta", "prompt": "x"}).status == 200
    # Each model has its own Deployment's pods, though all carry thaw.dev/model=true.
    for name in ("alpha", "beta"):
        pods = kmodel(t, name)["pods"]
        assert pods and all(p["name"].startswith(name + "-") for p in pods), pods


def test_overlapping_selectors_each_model_keeps_its_own_pods(cluster, thaw_factory, tmp_path):
    # Two Deployments select the same labels (the API warns against it) and
    # each has a Service selecting them all: a pod belongs to the Deployment
    # whose ReplicaSet controls it, whatever the Services' EndpointSlices say.
    sim = cluster(load_ms=50)
    for name in ("one", "two"):
        d = deployment(name, replicas=1, model_label="true")
        d["spec"]["selector"]["matchLabels"] = {"app": "shared"}
        d["spec"]["template"]["metadata"]["labels"] = {"app": "shared", "component": name}
        sim.create_deployment(d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    wait_for(lambda: all(len(kmodel(t, n)["replicas"]) == 1 for n in ("one", "two")),
             timeout=10 * SLOW, what="each model's pod ready")
    time.sleep(0.5)  # the EndpointSlices of both Services are in
    for name in ("one", "two"):
        m = kmodel(t, name)
        names = [p["name"] for p in m["pods"]] + [r["id"] for r in m["replicas"]]
        assert names and all(n.startswith(name + "-") for n in names), (name, names)


def test_a_model_label_given_a_new_value_renames_the_model_and_keeps_its_pods(
        cluster, thaw_factory, tmp_path):
    sim = cluster(load_ms=50)
    create(sim, deployment("llama", model_label="llama-a"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    assert complete(t, host="llama-a.models").status == 200  # woken: one pod
    writes = len(sim.state()["scale_log"])
    sim.call("PATCH", "/apis/apps/v1/namespaces/models/deployments/llama",
             {"metadata": {"labels": {"thaw.dev/model": "llama-b"}}},
             ctype="application/merge-patch+json")
    wait_for(lambda: {m["name"] for m in t.status()["models"]} == {"llama-b"},
             timeout=10, what="renamed")
    wait_for(lambda: len(kmodel(t, "llama-b")["replicas"]) == 1, timeout=10,
             what="its pod, ready, under the new name")
    assert complete(t, host="llama-b.models").status == 200
    assert complete(t, host="llama-a.models").status == 404
    assert len(sim.state()["scale_log"]) == writes  # the pod served on, no cold start


def test_a_rename_under_running_requests_keeps_their_pod(cluster, thaw_factory, tmp_path):
    """Requests of 6 s run on the model's pod when the Deployment is renamed
    (idle-timeout 2 s): they are the new model's load until they end, so
    its pod is not scaled away under them (before, the new model saw no
    demand, took itself for idle past its grace and went to zero: the
    requests were cut)."""
    import threading
    sim = cluster(load_ms=50)
    d = deployment("llama", model_label="llama-a", annotations={"thaw.dev/idle-timeout": "2s"})
    d["spec"]["template"]["metadata"]["annotations"]["sim.thaw.dev/token-ms"] = "1500"
    create(sim, d)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    out = []
    ths = [threading.Thread(target=lambda: out.append(complete(t, host="llama-a.models")))
           for _ in range(2)]
    for th in ths:
        th.start()
    wait_for(lambda: kmodel(t, "llama-a")["inflight"] == 2, timeout=10 * SLOW,
             what="both under way")
    sim.call("PATCH", "/apis/apps/v1/namespaces/models/deployments/llama",
             {"metadata": {"labels": {"thaw.dev/model": "llama-b"}}},
             ctype="application/merge-patch+json")
    for th in ths:
        th.join(30)
    assert [r.status for r in out] == [200, 200], [r.body for r in out]
    assert 0 not in [n for name, n in sim.state()["scale_log"] if name == "llama"]


def test_one_name_in_two_namespaces(cluster, thaw_factory, tmp_path):
    sim = cluster(load_ms=50)
    create(sim, deployment("llama"))
    other = deployment("llama")
    other["metadata"]["namespace"] = "team-b"
    create(sim, other)
    t = start_thaw(thaw_factory, sim, tmp_path, namespaces=["models", "team-b"])
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    wait_for(lambda: len(t.status()["models"]) == 2, what="both models")

    def ambiguous(r):
        assert r.status == 409, r.body
        err = r.json()["error"]
        assert err["code"] == "ambiguous_model" and err["type"] == "invalid_request_error"
        assert "models/llama" in err["message"] and "team-b/llama" in err["message"]

    ambiguous(complete(t, host="llama"))
    ambiguous(complete(t, host="thaw", body={"model": "llama", "prompt": "x"}))
    ambiguous(httpc.request(t.host, t.port, "POST", "/models/llama/v1/completions",
                            {"Host": "thaw"}, b'{"prompt":"x"}'))
    # Qualified names always work.
    assert complete(t, host="llama.team-b").status == 200
    assert complete(t, host="llama.models.svc.cluster.local").status == 200
    assert complete(t, host="thaw", body={"model": "team-b/llama", "prompt": "x"}).status == 200
    r = httpc.request(t.host, t.port, "POST", "/models/models/llama/v1/completions",
                      {"Host": "thaw"}, b'{"prompt":"x"}')
    assert r.status == 200
    # Their series are told apart by namespace.
    assert t.metric("thaw_replicas_ready", model="llama", namespace="team-b") == 1
    assert t.metric("thaw_replicas_ready", model="llama", namespace="models") == 1
    # With one left, the bare name is its own again.
    sim.call("DELETE", "/apis/apps/v1/namespaces/team-b/deployments/llama")
    wait_for(lambda: len(t.status()["models"]) == 1, what="one left")
    assert complete(t, host="llama").status == 200


# --- E: Knative's vocabulary ---------------------------------------------------------------

def test_knative_annotations_on_the_pod_template(cluster, thaw_factory, tmp_path):
    sim = cluster(load_ms=200)
    dep = deployment("llama", annotations={"autoscaling.knative.dev/max-scale": "3",
                                           "thaw.dev/max-concurrency": "10"})
    dep["spec"]["template"]["metadata"]["annotations"].update({
        "autoscaling.knative.dev/max-scale": "1",  # the Deployment's wins
        "autoscaling.knative.dev/activation-scale": "2",
        "autoscaling.knative.dev/target-utilization-percentage": "50",
        "autoscaling.knative.dev/scale-down-delay": "30s",
        "autoscaling.knative.dev/class": "kpa.autoscaling.knative.dev",
        "autoscaling.knative.dev/metric": "concurrency"})
    create(sim, dep)
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="synced")
    assert complete(t).status == 200
    assert replicas(sim) == 2  # woken to the activation scale
    m = model(t)
    assert "annotation_errors" not in m, m.get("annotation_errors")
    st = m["settings"]
    assert st["max_scale"] == 3 and st["activation_scale"] == 2
    assert st["target"] == 5 and st["scale_down_delay_ms"] == 30000


def test_initial_scale_starts_a_new_deployment_without_requests(cluster, thaw_factory,
                                                                tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=100),
                          annotations={"autoscaling.knative.dev/initial-scale": "1",
                                       "thaw.dev/idle-timeout": "3s"},
                          extra={"autoscaler": {"tick_ms": 250}})
    wait_for(lambda: replicas(sim) == 1, timeout=10, what="initial scale")
    wait_for(lambda: len(t.status()["models"][0]["replicas"]) == 1, timeout=20,
             what="pod ready")
    # Then the autoscaler decides: with no requests, back to zero after idle-timeout.
    wait_for(lambda: replicas(sim) == 0, timeout=20, what="back to zero")
    # Not again: the Deployment has changed since its creation.
    time.sleep(1)
    assert replicas(sim) == 0


@pytest.mark.timer_heavy
def test_scale_down_delay_keeps_the_model_past_its_idle_timeout(cluster, thaw_factory,
                                                                tmp_path):
    sim, t = synced_llama(cluster, thaw_factory, tmp_path, sim_kw=dict(load_ms=50),
                          annotations={"thaw.dev/idle-timeout": "1s",
                                       "autoscaling.knative.dev/scale-down-delay": "5s"},
                          extra={"autoscaler": {"tick_ms": 250}})
    assert complete(t).status == 200
    done = time.monotonic()
    wait_for(lambda: replicas(sim) == 0, timeout=30, what="to zero")
    assert time.monotonic() - done > 4.5


def test_two_deployments_naming_one_model_give_one_set_of_series(cluster, thaw_factory,
                                                                    tmp_path):
    """llama-a and llama-b in one namespace both say thaw.dev/model=llama:
    the first keeps the name, and /metrics carries its series once (before,
    every per-model series appeared twice with the same labels, which
    Prometheus drops as duplicates)."""
    sim = cluster()
    for name in ("llama-a", "llama-b"):
        sim.create_deployment(deployment(name, model_label="llama"))
    t = start_thaw(thaw_factory, sim, tmp_path)
    wait_for(lambda: urllib_status(t, "/readyz") == 200, what="informers synced")
    wait_for(lambda: len([m for m in t.status()["models"] if m["name"] == "llama"]) == 2,
             what="both Deployments seen")
    lines = [ln.rsplit(" ", 1)[0] for ln in t.admin("/metrics")[1].splitlines()
             if ln and not ln.startswith("#")]
    repeated = sorted({ln for ln in lines if lines.count(ln) > 1})
    assert not repeated, repeated[:5]
    assert 'thaw_replicas_ready{model="llama",namespace="models"}' in lines
