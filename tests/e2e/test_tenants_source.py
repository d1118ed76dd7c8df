"""End-to-end: tenants from a Kubernetes Secret or ConfigMap (tenants.source),
watched and applied live, against the API simulator."""

import base64
import json
import signal
import time

from conftest import wait_for
from test_kubernetes import KubeSim, cluster, start_thaw  # noqa: F401  (fixtures)
from test_kubernetes import pki  # noqa: F401
from test_tenants import KEYS, digest, error_reason, get, in_background, model, tenant

SECRETS = "/api/v1/namespaces/models/secrets"
CONFIGMAPS = "/api/v1/namespaces/models/configmaps"


def secret(doc, name="thaw-tenants"):
    text = doc if isinstance(doc, str) else json.dumps(doc, indent=1)
    return {"metadata": {"name": name, "namespace": "models"},
            "data": {"tenants.json": base64.b64encode(text.encode()).decode()}}


def put_secret(sim, doc):
    _, cur = sim.call("GET", f"{SECRETS}/thaw-tenants")
    new = secret(doc)
    new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
    status, body = sim.call("PUT", f"{SECRETS}/thaw-tenants", new)
    assert status == 200, body


def source(t):
    return t.status()["kubernetes"].get("tenants_source", {})


def thaw_with_source(thaw_factory, sim, tmp_path, upstream, kind="secret", name="thaw-tenants"):
    return start_thaw(thaw_factory, sim, tmp_path, extra={
        "tenants": {"required": True, "source": {"kind": kind, "name": name}},
        "models": [model(upstream)]})


def test_secret_tenants_apply_live_and_keys_stay_out_of_the_log(cluster, thaw_factory,  # noqa
                                                                  tmp_path, upstream):
    sim = cluster()
    sim.call("POST", SECRETS, secret({"required": True,
                                      "list": [tenant("small", tier="batch")]}))
    t = thaw_with_source(thaw_factory, sim, tmp_path, upstream)
    wait_for(lambda: source(t).get("state") == "loaded", what="tenants loaded")
    assert get(t, "/echo", key=KEYS["small"]).status == 200
    assert get(t, "/echo", key=KEYS["big"]).status == 401
    small = next(x for x in t.status()["tenants"] if x["name"] == "small")
    assert small["tier"] == "batch" and small["requests"] == 1
    # A request in flight while the Secret changes finishes.
    th, slow = in_background(lambda: get(t, "/sleep?ms=800", key=KEYS["small"]))
    wait_for(lambda: upstream.active == 1, what="request in flight")
    put_secret(sim, {"required": True, "list": [tenant("big", tier="standard")]})
    start = time.monotonic()
    wait_for(lambda: get(t, "/echo", key=KEYS["big"]).status == 200, timeout=5,
             what="the new key accepted")
    took = time.monotonic() - start
    assert took < 1.0, took
    assert get(t, "/echo", key=KEYS["small"]).status == 401
    th.join(10)
    assert slow["r"].status == 200
    st = source(t)
    assert st["applied"] == 2 and st["rejected"] == 0 and st["last_error"] == ""
    assert t.metric("thaw_tenants_source_loaded") == 1
    logs = t.logs()
    assert "tenants loaded from the cluster" in logs and "source=Secret/models/thaw-tenants" in logs
    for secret_text in (KEYS["small"], KEYS["big"], digest(KEYS["small"])[7:],
                        digest(KEYS["big"])[7:]):
        assert secret_text not in logs


def test_a_broken_document_keeps_the_tenants_and_is_reported(cluster, thaw_factory,  # noqa
                                                             tmp_path, upstream):
    sim = cluster()
    sim.call("POST", SECRETS, secret({"required": True, "list": [tenant("small")]}))
    t = thaw_with_source(thaw_factory, sim, tmp_path, upstream)
    wait_for(lambda: source(t).get("state") == "loaded", what="tenants loaded")
    bad = {"required": True, "list": [tenant("big", tier="urgent")]}
    put_secret(sim, bad)
    wait_for(lambda: source(t).get("state") == "error", what="the bad version reported")
    err = source(t)["last_error"]
    assert "Secret models/thaw-tenants key tenants.json:" in err
    assert ":9: tenants.list[0].tier:" in err, err  # the line of "tier" in the document
    assert get(t, "/echo", key=KEYS["small"]).status == 200  # the tenants in force stay
    assert get(t, "/echo", key=KEYS["big"]).status == 401
    assert t.metric("thaw_tenants_source_error") == 1
    assert t.metric("thaw_tenants_source_updates_total", result="rejected") == 1
    assert "tenants source rejected: keeping the tenants in force" in t.logs()
    wait_for(lambda: any(e.get("reason") == "InvalidTenants" and
                         e["involvedObject"]["kind"] == "Secret"
                         for e in sim.call("GET", "/api/v1/namespaces/models/events")[1]["items"]),
             what="a Warning Event on the Secret")
    put_secret(sim, "{not json")
    wait_for(lambda: "(syntax)" in source(t)["last_error"], what="a syntax error reported")
    put_secret(sim, {"required": True, "list": [tenant("big")]})
    wait_for(lambda: source(t).get("state") == "loaded", what="fixed")
    assert get(t, "/echo", key=KEYS["big"]).status == 200
    assert KEYS["big"] not in t.logs()


def test_required_tenants_answer_503_until_the_configmap_is_loaded(cluster, thaw_factory,  # noqa
                                                                   tmp_path, upstream):
    sim = cluster()
    t = thaw_with_source(thaw_factory, sim, tmp_path, upstream, kind="configmap")
    wait_for(lambda: "not found" in source(t).get("last_error", ""), what="missing reported")
    r = get(t, "/echo", key=KEYS["small"])
    assert r.status == 503 and error_reason(r) == "tenants_not_loaded"
    assert r.json()["error"]["type"] == "server_error" and r.header("retry-after")
    assert upstream.requests == 0
    doc = json.dumps({"required": True, "list": [tenant("small")]})
    sim.call("POST", CONFIGMAPS, {"metadata": {"name": "thaw-tenants", "namespace": "models"},
                                  "data": {"tenants.json": doc}})
    wait_for(lambda: get(t, "/echo", key=KEYS["small"]).status == 200, timeout=5,
             what="served once loaded")
    assert get(t, "/echo", key=KEYS["big"]).status == 401
    assert source(t)["kind"] == "configmap" and source(t)["namespace"] == "models"
    # A reload of the file keeps the tenants the source gave.
    before = t.metric("thaw_config_reloads_total", result="success")
    t.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: t.metric("thaw_config_reloads_total", result="success") == before + 1,
             what="reload")
    assert get(t, "/echo", key=KEYS["small"]).status == 200


def test_config_rejects_a_source_beside_a_list(tmp_path):
    import subprocess
    from conftest import THAW_BIN
    path = tmp_path / "thaw.json"
    path.write_text(json.dumps({"kubernetes": {}, "tenants": {
        "source": {"kind": "secret", "name": "t"}, "list": [tenant("small")]}}))
    r = subprocess.run([THAW_BIN, "--check-config", str(path)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode != 0
    assert "tenants.list: comes from the document tenants.source names" in r.stderr + r.stdout
