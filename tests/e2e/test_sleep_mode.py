"""End-to-end: sleep mode (vLLM's --enable-sleep-mode) in the process backend.

A sleep-capable replica that is idle, or whose GPU memory another model's
start needs, is asked to POST /sleep: it keeps running, keeps its GPU slice,
and its memory is free in thaw's accounting. A request for it is held while
POST /wake_up brings it back (a short wake, not a cold start). Failures of
either call fall back to stopping the replica, or to a cold start.
"""

import json
import threading
import time
import urllib.request

import pytest

import httpc

from conftest import wait_for
from test_process import SIM, SLOW, complete, model_status, pid_alive, sim_model
from test_upstream_faults import counterpart_model

GB = 1 << 30


def sleepy(name="llama", load_ms=1000, wake_ms=50, extra=(), idle_before_sleep_ms=300, **kw):
    kw.setdefault("gpu_memory_bytes", 10 * GB)
    m = sim_model(name, load_ms=load_ms, extra=("--wake-ms", str(wake_ms), *extra),
                  gpu_slices=1, **kw)
    m["sleep"] = {"enabled": True, "idle_before_sleep_ms": idle_before_sleep_ms,
                  "timeout_ms": 5000}
    return m


def gpu(t):
    return t.status()["gpus"][0]


def replica_stats(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        return json.load(r)


def timed_complete(t, name="llama"):
    t0 = time.monotonic()
    r = complete(t, name)
    return r, time.monotonic() - t0


def listed_state(t, name="llama"):
    r = httpc.request(t.host, t.port, "GET", "/v1/models", {}, b"", timeout=10)
    return next(m["state"] for m in json.loads(r.body)["data"] if m["id"] == name)


def sleep_events(t, name, event):
    return t.metric("thaw_sleep_events_total", model=name, event=event)


def test_idle_replica_sleeps_and_a_request_wakes_it(thaw_factory):
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "models": [sleepy(load_ms=1000, wake_ms=50)]})
    r, cold = timed_complete(t)
    assert r.status == 200 and cold >= 1.0
    proc = model_status(t)["processes"][0]
    assert gpu(t)["memory_used"] == 10 * GB

    wait_for(lambda: model_status(t)["state"] == "sleeping", timeout=5, what="asleep")
    st = model_status(t)
    assert st["replicas_sleeping"] == 1 and st["processes"][0]["state"] == "sleeping"
    assert gpu(t)["memory_used"] == 0  # its memory is free for others
    assert gpu(t)["used"] == 1  # its slice is not
    assert pid_alive(proc["pid"])
    assert replica_stats(proc["port"])["sleeping"] is True
    wait_for(lambda: listed_state(t) == "sleeping", timeout=2, what="/v1/models says sleeping")

    r, woke = timed_complete(t)
    assert r.status == 200, r.body
    assert woke < 0.8 * SLOW, f"a wake from sleep took {woke:.2f}s, no faster than a cold start"
    st = model_status(t)
    assert st["processes"][0]["pid"] == proc["pid"] and st["starts"] == 1
    assert gpu(t)["memory_used"] == 10 * GB
    assert sleep_events(t, "llama", "sleep") == 1 and sleep_events(t, "llama", "wake") == 1
    assert t.metric("thaw_wake_from_sleep_seconds_count", model="llama") == 1
    assert t.metric("thaw_cold_start_seconds_count", model="llama") == 1
    t.assert_reconciled()


def test_memory_needed_by_another_model_puts_an_idle_replica_to_sleep(thaw_factory):
    # Two models of 14 GB on one 24 GB GPU: each start or wake puts the other,
    # idle, to sleep instead of waiting for its idle timeout.
    models = [sleepy(n, load_ms=300, idle_before_sleep_ms=0, gpu_memory_bytes=14 * GB)
              for n in ("a", "b")]
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "models": models})
    assert complete(t, "a").status == 200
    a_pid = model_status(t, "a")["processes"][0]["pid"]
    assert complete(t, "b").status == 200
    assert model_status(t, "a")["state"] == "sleeping" and pid_alive(a_pid)
    assert gpu(t)["memory_used"] == 14 * GB and gpu(t)["used"] == 2

    r, woke = timed_complete(t, "a")
    assert r.status == 200, r.body
    assert model_status(t, "a")["processes"][0]["pid"] == a_pid
    assert model_status(t, "b")["state"] == "sleeping"
    assert gpu(t)["memory_used"] == 14 * GB
    assert sleep_events(t, "a", "wake") == 1 and sleep_events(t, "b", "sleep") == 1
    assert model_status(t, "a")["starts"] == 1
    t.assert_reconciled()


def test_a_wake_waits_for_the_busy_replica_holding_its_memory(thaw_factory):
    # As above, but b is streaming when a request for asleep a comes: a is not
    # stopped for a cold start (no other GPU has room); it waits until b is
    # idle and asleep, then wakes (a wake, not a second cold start).
    models = [sleepy("a", load_ms=300, idle_before_sleep_ms=0, gpu_memory_bytes=14 * GB),
              sleepy("b", load_ms=300, idle_before_sleep_ms=0, gpu_memory_bytes=14 * GB,
                     tokens=30, token_ms=50)]
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "models": models})
    assert complete(t, "a").status == 200
    a_pid = model_status(t, "a")["processes"][0]["pid"]
    out = {}
    stream = threading.Thread(target=lambda: out.update(r=complete(t, "b", stream=True)))
    stream.start()
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="b") == 1, what="b streaming")
    assert model_status(t, "a")["state"] == "sleeping"
    r = complete(t, "a")
    stream.join(30)
    assert r.status == 200 and out["r"].status == 200
    assert model_status(t, "a")["processes"][0]["pid"] == a_pid
    assert model_status(t, "a")["starts"] == 1
    assert sleep_events(t, "a", "wake") == 1
    assert "stopping the replica for a cold start" not in t.logs()
    t.assert_reconciled()


def test_failed_wake_falls_back_to_a_cold_start(thaw_factory):
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "models": [sleepy(load_ms=200, extra=("--fail-wake",))]})
    assert complete(t).status == 200
    pid = model_status(t)["processes"][0]["pid"]
    wait_for(lambda: model_status(t)["state"] == "sleeping", timeout=5, what="asleep")
    r = complete(t)
    assert r.status == 200, r.body  # held through the failure, served by a new process
    assert sleep_events(t, "llama", "wake_failed") == 1
    assert model_status(t)["starts"] == 2
    wait_for(lambda: not pid_alive(pid), timeout=5, what="the replica that did not wake stopped")
    t.assert_reconciled()


def test_refused_idle_sleep_leaves_the_replica_serving(thaw_factory):
    """A server that answers /sleep with an error is still serving: back into
    routing, not asked again when idle, no cold start for the next request."""
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "models": [sleepy(load_ms=100, idle_before_sleep_ms=100,
                                        extra=("--fail-sleep",))]})
    assert complete(t).status == 200
    pid = model_status(t)["processes"][0]["pid"]
    wait_for(lambda: sleep_events(t, "llama", "sleep_failed") == 1, timeout=5,
             what="the refused sleep counted")
    wait_for(lambda: model_status(t)["state"] == "ready", timeout=5, what="back in routing")
    time.sleep(0.4)
    assert sleep_events(t, "llama", "sleep_failed") == 1  # not asked again
    assert complete(t).status == 200
    st = model_status(t)
    assert st["starts"] == 1 and st["processes"][0]["pid"] == pid
    assert gpu(t)["memory_used"] == 10 * GB


def test_failed_sleep_for_memory_stops_the_replica(thaw_factory):
    """When another start needs the memory and /sleep fails, the replica is
    stopped instead: its memory and slice go to the waiting model."""
    a = sleepy("a", load_ms=100, idle_before_sleep_ms=0, gpu_memory_bytes=14 * GB,
               extra=("--fail-sleep",))
    b = sleepy("b", load_ms=100, idle_before_sleep_ms=0, gpu_memory_bytes=14 * GB)
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "models": [a, b]})
    assert complete(t, "a").status == 200
    a_pid = model_status(t, "a")["processes"][0]["pid"]
    assert complete(t, "b").status == 200
    assert sleep_events(t, "a", "sleep_failed") == 1
    wait_for(lambda: not pid_alive(a_pid), timeout=5, what="a stopped")
    assert gpu(t)["memory_used"] == 14 * GB
    t.assert_reconciled()


@pytest.mark.timer_heavy
def test_asleep_replica_stops_at_the_idle_timeout(thaw_factory):
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "models": [sleepy(load_ms=100, idle_before_sleep_ms=200,
                                        idle_timeout_ms=1200)]})
    assert complete(t).status == 200
    pid = model_status(t)["processes"][0]["pid"]
    wait_for(lambda: model_status(t)["state"] == "sleeping", timeout=5, what="asleep")
    wait_for(lambda: model_status(t)["state"] == "scaled_to_zero", timeout=10, what="stopped")
    wait_for(lambda: not pid_alive(pid), timeout=5, what="process gone")
    # Its slices are freed once thaw has reaped it, a moment after it exits.
    wait_for(lambda: gpu(t)["used"] == 0, timeout=5, what="slices freed")


def test_independent_server_sleeps_and_wakes(thaw_factory):
    """The asyncio counterpart (its own HTTP code, vLLM's documented sleep API)."""
    m = counterpart_model("asyncio_server.py", "llama", "--load-seconds", "0.8",
                          "--enable-sleep-mode", "--wake-seconds", "0.05")
    m["sleep"] = {"enabled": True, "idle_before_sleep_ms": 300, "level": 2}
    t = thaw_factory({"models": [m]})
    assert complete(t).status == 200
    port = model_status(t)["processes"][0]["port"]
    wait_for(lambda: model_status(t)["state"] == "sleeping", timeout=5, what="asleep")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_sleeping", timeout=5) as r:
        assert json.load(r) == {"is_sleeping": True}
    r, woke = timed_complete(t)
    assert r.status == 200, r.body
    assert woke < 0.6 * SLOW
    st = replica_stats(port)
    assert st["sleeps"] == 1 and st["wakes"] == 1 and st["by_path"].get("/v1/completions") == 2
    t.assert_reconciled()


def test_sleep_config_errors_name_the_key(tmp_path):
    import subprocess
    from conftest import THAW_BIN
    bad = tmp_path / "bad.json"
    for sleep, msg in [({"level": 3}, "models[0].sleep.level"),
                       ({"enabled": "yes"}, "models[0].sleep.enabled"),
                       ({"idle_before_sleep": 1}, "models[0].sleep.idle_before_sleep")]:
        bad.write_text(json.dumps({"models": [{"name": "x", "command": [SIM], "sleep": sleep}]}))
        r = subprocess.run([THAW_BIN, "--check-config", str(bad)], capture_output=True, text=True)
        assert r.returncode == 1 and msg in r.stderr and "bad.json" in r.stderr, r.stderr


def test_asleep_replica_is_kept_past_the_stable_window(thaw_factory):
    """An asleep replica is one the autoscaler keeps until the idle timeout
    (60 s here), not one it drops a stable window (6 s) after it fell asleep:
    the next request must find it to wake, not start it cold."""
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "memory_bytes": 24 * GB}],
                      "autoscaler": {"tick_ms": 200, "stable_window_ms": 6000},
                      "models": [sleepy(load_ms=100, idle_before_sleep_ms=200,
                                        idle_timeout_ms=60000)]})
    assert complete(t).status == 200
    pid = model_status(t)["processes"][0]["pid"]
    wait_for(lambda: model_status(t)["state"] == "sleeping", timeout=5, what="asleep")
    time.sleep(8)
    assert model_status(t)["state"] == "sleeping" and pid_alive(pid)
    r, took = timed_complete(t)
    assert r.status == 200 and sleep_events(t, "llama", "wake") == 1
