"""End-to-end: tenants (API keys, the gateway header, tier ceiling, caps, fair
share inside a tier, metrics, reload), through real sockets."""

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest

import httpc
from conftest import THAW_BIN, wait_for

KEYS = {"big": "sk-big-0123456789", "small": "sk-small-0123456789",
        "capped": "sk-capped-0123456789", "low": "sk-low-0123456789"}


def digest(key):
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def tenant(name, **kw):
    t = {"name": name, "api_keys": [digest(KEYS[name])]}
    t.update(kw)
    return t


def model(upstream, **kw):
    m = {"name": "llama", "endpoints": [upstream.address], "max_concurrency": 8}
    m.update(kw)
    return m


def get(t, path, key=None, headers=None, timeout=30):
    h = {"Host": "llama"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    return httpc.request(t.host, t.port, path=path, headers=h, timeout=timeout)


def in_background(fn):
    out = {}
    th = threading.Thread(target=lambda: out.__setitem__("r", fn()), daemon=True)
    th.start()
    return th, out


def error_reason(r):
    """The reason thaw names in an error body: {"error": {"message", "type",
    "code", ...}} carries it in "type" or, in OpenAI's shape, in "code"."""
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert "type" in err and "code" in err
    return err["code"] if isinstance(err["code"], str) else err["type"]


def queued(t, tier=None):
    m = t.status()["models"][0]
    return m["queue"][tier] if tier else t.status()["queued"]


async def _one(host, port, path, key):
    r, w = await asyncio.open_connection(host, port)
    w.write((f"GET {path} HTTP/1.1\r\nHost: llama\r\nAuthorization: Bearer {key}\r\n"
             "thaw-priority: batch\r\nConnection: close\r\n\r\n").encode())
    await w.drain()
    data = await r.read()
    w.close()
    return int(data.split(b" ", 2)[1])


def test_fair_share_small_tenant_is_not_starved_by_a_burst(thaw_factory, upstream):
    """1,000 batch requests of one tenant, then 10 of another: the 10 go out
    within the first few dozen dispatches (round robin), not after the 1,000."""
    t = thaw_factory({"limits": {"max_queue_per_model": 2000},
                      "tenants": {"list": [tenant("big"), tenant("small")]},
                      "models": [model(upstream, max_concurrency=2, priority="batch")]})
    n_big, n_small = 1000, 10
    # Two requests of the default tenant hold both slots while the rest queue.
    blockers = [in_background(lambda: get(t, "/sleep?ms=6000&t=blocker")) for _ in range(2)]
    wait_for(lambda: upstream.active == 2, what="both slots taken")

    async def run():
        big = [asyncio.ensure_future(_one(t.host, t.port, f"/sleep?ms=2&t=big&i={i}", KEYS["big"]))
               for i in range(n_big)]
        deadline = time.monotonic() + 30
        while queued(t) < n_big:
            assert time.monotonic() < deadline, "the burst did not queue"
            await asyncio.sleep(0.05)
        small = [asyncio.ensure_future(
            _one(t.host, t.port, f"/sleep?ms=2&t=small&i={i}", KEYS["small"]))
            for i in range(n_small)]
        while queued(t) < n_big + n_small:
            assert time.monotonic() < deadline, "the small tenant did not queue"
            await asyncio.sleep(0.02)
        assert upstream.active == 2, "the blockers ended before everything queued"
        return await asyncio.gather(*big), await asyncio.gather(*small)

    big, small = asyncio.run(run())
    for th, _ in blockers:
        th.join(30)
    assert all(s == 200 for s in big + small)
    order = [p for p in upstream.paths if "t=big" in p or "t=small" in p]
    assert len(order) == n_big + n_small
    small_at = [i for i, p in enumerate(order) if "t=small" in p]
    # The two tenants alternate: the small one's 10 are all out within its
    # first ~20 dispatches, not after the big one's 1,000.
    assert small_at[-1] < 2 * n_small + 2, small_at
    assert t.metric("thaw_tenant_requests_total", tenant="big") == n_big
    assert t.metric("thaw_tenant_requests_total", tenant="small") == n_small
    assert t.metric("thaw_tenant_queue_wait_seconds_count", tenant="small") == n_small
    t.assert_reconciled()


@pytest.mark.timer_heavy
def test_a_reload_at_the_tenant_limits_does_not_stall_the_loop(thaw_factory, upstream):
    """1000 tenants of 64 keys each (the documented limits): a reload checks
    their keys are unique without comparing every pair (that took 10 s here,
    with nothing proxied and /healthz silent meanwhile)."""
    def tenants(gen):
        return {"required": True, "list": [
            {"name": f"t{i}", "api_keys": [digest(f"key-{gen}-{i}-{k}") for k in range(64)]}
            for i in range(1000)]}
    t = thaw_factory({"tenants": tenants(0), "models": [model(upstream)]})
    cfg = json.load(open(t.config_path))
    cfg["tenants"] = tenants(1)
    with open(t.config_path, "w") as f:
        json.dump(cfg, f)
    t.proc.send_signal(signal.SIGHUP)
    start = time.monotonic()
    r = get(t, "/echo", key="key-1-999-63")
    waited = time.monotonic() - start
    if r.status == 401:  # asked before the reload was read: ask again once it is
        wait_for(lambda: t.metric("thaw_config_reloads_total", result="success") == 1,
                 timeout=30, what="reloaded")
        r = get(t, "/echo", key="key-1-999-63")
    assert r.status == 200, r.body
    assert waited < 3, waited


@pytest.mark.timer_heavy
def test_a_reload_past_the_tenant_name_limit_fails_whole(thaw_factory, upstream):
    """Tenant names are capped at 4096 over a process's life (they are metric
    labels). A reload that would pass the cap is a failed reload, counted and
    said so, with nothing of it applied (it was logged a success, with the
    file's models applied and its tenants not)."""
    def write(gen, extra_model=False):
        cfg = json.load(open(t.config_path))
        cfg["tenants"] = {"required": True, "list": [
            {"name": f"g{gen}-{i}", "api_keys": [digest(f"key-{gen}-{i}")]} for i in range(1000)]}
        cfg["models"] = [model(upstream)] + ([model(upstream, name="extra")] if extra_model else [])
        with open(t.config_path, "w") as f:
            json.dump(cfg, f)

    def hup(result):
        before = t.metric("thaw_config_reloads_total", result=result)
        t.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: t.metric("thaw_config_reloads_total", result=result) == before + 1,
                 timeout=20, what=f"reload {result}")

    t = thaw_factory({"tenants": {"required": True, "list": [
        {"name": f"g0-{i}", "api_keys": [digest(f"key-0-{i}")]} for i in range(1000)]},
        "models": [model(upstream)]})
    for gen in (1, 2, 3):
        write(gen)
        hup("success")
    write(4, extra_model=True)
    hup("failure")
    cfg = t.status()["config"]
    assert cfg["last_reload"] == "failure"
    assert "tenants.list[95].name: one tenant name too many" in cfg["last_error"], cfg
    assert get(t, "/echo", key="key-3-999").status == 200  # the running tenants stay
    assert get(t, "/echo", key="key-4-0").status == 401
    assert not any(m["name"] == "extra" for m in t.status()["models"])  # nothing applied


def test_unknown_key_is_401_in_openai_shape_when_required(thaw_factory, upstream):
    t = thaw_factory({"tenants": {"required": True, "list": [tenant("small")]},
                      "models": [model(upstream)]})
    for headers in ({"Authorization": "Bearer sk-nobody"}, {"api-key": "sk-nobody"}, {},
                    {"Authorization": "Basic c2stc21hbGw="}):
        r = get(t, "/echo", headers=headers)
        assert r.status == 401, headers
        assert r.header("www-authenticate") == "Bearer"
        assert error_reason(r) == "invalid_api_key"
        assert "sk-nobody" not in r.body.decode()
    assert upstream.requests == 0
    assert get(t, "/echo", key=KEYS["small"]).status == 200
    assert get(t, "/echo", headers={"api-key": KEYS["small"]}).status == 200
    assert t.metric("thaw_rejections_total", reason="invalid_api_key") == 4
    t.assert_reconciled()


def test_unknown_key_is_the_default_tenant_when_not_required(thaw_factory, upstream):
    t = thaw_factory({"log": {"access_log": True},
                      "tenants": {"list": [tenant("small")]}, "models": [model(upstream)]})
    assert get(t, "/echo", key="sk-nobody").status == 200
    assert get(t, "/echo").status == 200
    assert get(t, "/echo", key=KEYS["small"]).status == 200
    assert t.metric("thaw_tenant_requests_total", tenant="default") == 2
    assert t.metric("thaw_tenant_requests_total", tenant="small") == 1
    wait_for(lambda: t.logs().count("tenant=default") == 2, what="access log lines")
    assert t.logs().count("tenant=small") == 1


def test_tier_ceiling_the_header_may_lower_not_raise(thaw_factory, upstream):
    """A batch tenant asking for critical waits behind a standard request."""
    t = thaw_factory({"tenants": {"list": [tenant("low", tier="batch"), tenant("small")]},
                      "models": [model(upstream, max_concurrency=1)]})
    blocker, _ = in_background(lambda: get(t, "/sleep?ms=600", key=KEYS["small"]))
    wait_for(lambda: upstream.active == 1, what="slot taken")
    low, low_r = in_background(lambda: get(t, "/echo?who=low", key=KEYS["low"],
                                           headers={"thaw-priority": "critical"}))
    wait_for(lambda: queued(t, "batch") == 1, what="the critical ask queued as batch")
    std, std_r = in_background(lambda: get(t, "/echo?who=std", key=KEYS["small"],
                                           headers={"thaw-priority": "standard"}))
    wait_for(lambda: queued(t, "standard") == 1, what="standard queued")
    for th in (blocker, low, std):
        th.join(30)
    served = [p for p in upstream.paths if p.startswith("/echo?who=")]
    assert served == ["/echo?who=std", "/echo?who=low"]
    assert low_r["r"].status == 200 and std_r["r"].status == 200


def test_tenant_queue_cap_is_429(thaw_factory, upstream):
    t = thaw_factory({"tenants": {"list": [tenant("capped", max_queue=1), tenant("small")]},
                      "models": [model(upstream, max_concurrency=1)]})
    blocker, _ = in_background(lambda: get(t, "/sleep?ms=600", key=KEYS["small"]))
    wait_for(lambda: upstream.active == 1, what="slot taken")
    waiting, _ = in_background(lambda: get(t, "/echo", key=KEYS["capped"]))
    wait_for(lambda: queued(t) == 1, what="one queued")
    r = get(t, "/echo", key=KEYS["capped"])
    assert r.status == 429 and r.header("retry-after")
    assert error_reason(r) == "tenant_queue_full"
    # Another tenant still queues.
    other, other_r = in_background(lambda: get(t, "/echo", key=KEYS["small"]))
    wait_for(lambda: queued(t) == 2, what="the other tenant queued")
    for th in (blocker, waiting, other):
        th.join(30)
    assert other_r["r"].status == 200
    assert t.metric("thaw_tenant_rejections_total", tenant="capped",
                    reason="tenant_queue_full") == 1
    t.assert_reconciled()


def count_concurrency(upstream, marker):
    """Wraps the upstream's responder to count concurrent requests whose
    target holds marker; returns the dict it keeps {"active", "peak"}."""
    seen = {"active": 0, "peak": 0}
    respond = upstream._respond

    async def counting(w, method, target, headers, body):
        mine = marker in target
        if mine:
            seen["active"] += 1
            seen["peak"] = max(seen["peak"], seen["active"])
        try:
            return await respond(w, method, target, headers, body)
        finally:
            if mine:
                seen["active"] -= 1

    upstream._respond = counting
    return seen


def test_tenant_concurrency_cap_holds_and_others_pass(thaw_factory, upstream):
    t = thaw_factory({"tenants": {"list": [tenant("capped", max_concurrency=2),
                                           tenant("small")]},
                      "models": [model(upstream, max_concurrency=8)]})
    capped = count_concurrency(upstream, "capped=")
    threads = [in_background(lambda i=i: get(t, f"/sleep?ms=200&capped={i}", key=KEYS["capped"]))
               for i in range(8)]
    # While the capped tenant's requests wait, the replica has free slots:
    # another tenant's request goes straight through.
    wait_for(lambda: queued(t) >= 5, what="capped requests waiting")
    st = t.status()
    at_model = st["models"][0]["queue"]["tenants"]["capped"]
    assert at_model["running"] == 2 and at_model["waiting"] >= 5
    assert {"name": "capped", "tier": "critical", "weight": 1, "max_concurrency": 2,
            "removed": False, "requests": 0} in st["tenants"]
    start = time.monotonic()
    r = get(t, "/echo", key=KEYS["small"])
    assert r.status == 200 and time.monotonic() - start < 0.15
    for th, _ in threads:
        th.join(30)
    assert capped["peak"] == 2
    assert all(o["r"].status == 200 for _, o in threads)
    t.assert_reconciled()


def test_per_model_cap_overrides_the_tenants(thaw_factory, upstream):
    t = thaw_factory({"tenants": {"list": [tenant("capped", max_concurrency=4,
                                                  models={"llama": {"max_concurrency": 1}})]},
                      "models": [model(upstream, max_concurrency=8)]})
    threads = [in_background(lambda i=i: get(t, f"/sleep?ms=100&i={i}", key=KEYS["capped"]))
               for i in range(4)]
    for th, _ in threads:
        th.join(30)
    assert upstream.peak == 1
    assert all(o["r"].status == 200 for _, o in threads)


def test_gateway_header_names_the_tenant(thaw_factory, upstream):
    t = thaw_factory({"log": {"access_log": True},
                      "tenants": {"required": True, "header": "x-tenant",
                                  "list": [{"name": "team-a"}, tenant("small")]},
                      "models": [model(upstream)]})
    assert get(t, "/echo", headers={"X-Tenant": "team-a"}).status == 200
    assert get(t, "/echo", headers={"X-Tenant": "team-b"}).status == 401
    # Without the header, the key decides.
    assert get(t, "/echo", key=KEYS["small"]).status == 200
    assert t.metric("thaw_tenant_requests_total", tenant="team-a") == 1
    assert t.metric("thaw_tenant_requests_total", tenant="small") == 1


def test_keys_never_appear_in_the_log(thaw_factory, upstream):
    t = thaw_factory({"log": {"access_log": True, "level": "debug"},
                      "tenants": {"required": True, "list": [tenant("small")]},
                      "models": [model(upstream)]}, extra_args=("--log-level", "debug"))
    assert get(t, "/echo?x=1", key=KEYS["small"]).status == 200
    assert get(t, "/echo?x=2", key="sk-wrong-secret-42").status == 401
    assert get(t, "/echo?x=3", headers={"api-key": "sk-other-secret-43"}).status == 401
    wait_for(lambda: t.logs().count("outcome=") >= 3, what="access log lines")
    logs = t.logs()
    for secret in (KEYS["small"], "sk-wrong-secret-42", "sk-other-secret-43",
                   digest(KEYS["small"])[7:]):
        assert secret not in logs
    assert "tenant=small" in logs


def test_metrics_have_bounded_tenant_labels(thaw_factory, upstream):
    t = thaw_factory({"tenants": {"list": [tenant("small")]}, "models": [model(upstream)]})
    for i in range(20):
        assert get(t, "/echo", key=f"sk-random-{i}").status == 200
    m = t.metrics()
    tenants = {dict(labels).get("tenant") for (name, labels) in m
               if name.startswith("thaw_tenant_")}
    assert tenants == {"default", "small"}
    assert m[("thaw_tenant_requests_total", frozenset({("tenant", "default")}))] == 20


def test_reload_applies_new_and_removed_keys(thaw_factory, upstream):
    cfg = {"tenants": {"required": True, "list": [tenant("small")]},
           "models": [model(upstream)]}
    t = thaw_factory(cfg)
    assert get(t, "/echo", key=KEYS["small"]).status == 200
    assert get(t, "/echo", key=KEYS["big"]).status == 401
    cfg2 = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
            "tenants": {"required": True, "list": [tenant("big")]},
            "models": [model(upstream)]}
    with open(t.config_path + ".tmp", "w") as f:
        json.dump(cfg2, f)
    os.replace(t.config_path + ".tmp", t.config_path)
    before = t.metric("thaw_config_reloads_total", result="success")
    t.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: t.metric("thaw_config_reloads_total", result="success") == before + 1,
             what="reload")
    assert get(t, "/echo", key=KEYS["big"]).status == 200
    assert get(t, "/echo", key=KEYS["small"]).status == 401
    assert t.metric("thaw_tenant_requests_total", tenant="big") == 1


def test_reload_raising_a_cap_releases_waiting_requests(thaw_factory, upstream):
    cfg = {"tenants": {"list": [tenant("capped", max_concurrency=1)]},
           "models": [model(upstream, max_concurrency=8)]}
    t = thaw_factory(cfg)
    hold, _ = in_background(lambda: get(t, "/sleep?ms=3000", key=KEYS["capped"]))
    wait_for(lambda: upstream.active == 1, what="the capped tenant's one slot")
    waiting, w_r = in_background(lambda: get(t, "/echo?waiting", key=KEYS["capped"]))
    wait_for(lambda: queued(t) == 1, what="second request waits for its tenant's slot")
    cfg2 = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
            "tenants": {"list": [tenant("capped", max_concurrency=2)]},
            "models": [model(upstream, max_concurrency=8)]}
    with open(t.config_path + ".tmp", "w") as f:
        json.dump(cfg2, f)
    os.replace(t.config_path + ".tmp", t.config_path)
    t.proc.send_signal(signal.SIGHUP)
    waiting.join(2)
    assert not waiting.is_alive(), "the raised cap did not release the waiting request"
    assert w_r["r"].status == 200
    hold.join(10)


def test_config_errors_name_file_line_and_key(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"tenants": {"list": [{"name": "a", "api_keys": ["sk-plain"]}]}},
                               indent=1))
    r = subprocess.run([THAW_BIN, "--check-config", str(path)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{path}:" in r.stderr and "tenants.list[0].api_keys[0]" in r.stderr
    assert "sk-plain" not in r.stderr


def test_hash_key_subcommand():
    r = subprocess.run([THAW_BIN, "hash-key"], input="sk-abc\n", capture_output=True, text=True)
    assert r.returncode == 0
    assert r.stdout.strip() == digest("sk-abc")
