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
from test_upstream_faults import COUNTERPARTS, PY, counterpart_model

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


def complete_within(t, name, timeout):
    """A completion that gives up after timeout seconds (socket.timeout)."""
    return httpc.request(t.host, t.port, "POST", "/v1/completions",
                         {"Content-Type": "application/json"},
                         json.dumps({"model": name, "prompt": "hi"}).encode(), timeout=timeout)


def gpu_of(t, name):
    return model_status(t, name)["processes"][0]["gpu"]


def test_a_cold_start_replacing_a_wake_is_not_timed_out_at_once(thaw_factory):
    """s is asleep on one GPU, whose memory critical o has taken since (o
    cannot be put to sleep for s); p holds the other GPU. A request for s
    waits to wake; when p stops (its idle timeout), the planning tick stops
    s for a cold start on p's GPU. That start came after the tick had read
    its clock: the replica's age underflowed and it was killed in the same
    millisecond as "not ready within startup_timeout_ms" (503 start_failed).
    A large environment makes each start take more than a millisecond, so
    the clock always moves on in between."""
    pad = {f"PAD{i}": "x" * 100000 for i in range(8)}
    s = sleepy("s", load_ms=200, idle_before_sleep_ms=200, gpu_memory_bytes=7 * GB, env=pad)
    o = sim_model("o", load_ms=50, gpu_slices=1, gpu_memory_bytes=7 * GB, priority="critical")
    p = sim_model("p", load_ms=50, gpu_slices=1, gpu_memory_bytes=7 * GB, priority="critical",
                  idle_timeout_ms=1500)
    t = thaw_factory({"gpus": [{"id": 0, "slices": 2, "memory_bytes": 10 * GB},
                               {"id": 1, "slices": 2, "memory_bytes": 10 * GB}],
                      "autoscaler": {"tick_ms": 200}, "models": [s, o, p]})
    assert complete(t, "s").status == 200
    wait_for(lambda: model_status(t, "s")["state"] == "sleeping", timeout=5, what="s asleep")
    assert complete(t, "o").status == 200 and complete(t, "p").status == 200
    assert gpu_of(t, "o") == gpu_of(t, "s") != gpu_of(t, "p")
    r = complete_within(t, "s", 15)
    assert r.status == 200, r.body
    assert gpu_of(t, "s") != gpu_of(t, "o")  # a cold start where p was
    assert "startup_timeout_ms" not in t.logs()
    st = model_status(t, "s")
    assert st["starts"] == 2 and st["start_failures"] == 0
    t.assert_reconciled()


def vllm_like(tmp_path, name, ctl, load_ms=200, idle_before_sleep_ms=200, **kw):
    """A process model run by the counterpart vllm_sleep_server.py, its
    faults set by the control file ctl; its events are in tmp_path/rec."""
    ctl_file = tmp_path / f"{name}.ctl.json"
    ctl_file.write_text(json.dumps(ctl))
    m = {"name": name,
         "command": [PY, str(COUNTERPARTS / "vllm_sleep_server.py"), "--port", "{port}",
                     "--name", name, "--rec", str(tmp_path / "rec"), "--load-ms", str(load_ms),
                     "--ctl", str(ctl_file)],
         "gpu_slices": 1, "gpu_memory_bytes": 6 * GB, "idle_timeout_ms": 60000,
         "startup_timeout_ms": 20000 * SLOW, "stop_grace_ms": 2000,
         "sleep": {"enabled": True, "idle_before_sleep_ms": idle_before_sleep_ms}}
    m.update(kw)
    return m


def server_events(tmp_path, event):
    out = []
    for f in (tmp_path / "rec").glob("*.jsonl"):
        out += [e for e in map(json.loads, f.read_text().splitlines()) if e["ev"] == event]
    return out


ONE_GPU = [{"id": 0, "slices": 2, "memory_bytes": 10 * GB}]


def test_a_sleep_that_times_out_is_not_replaced_while_idle(thaw_factory):
    """A /sleep that does not answer within sleep.timeout_ms stops the idle
    replica; nothing asks for the model, so nothing starts. Before, a new
    replica started at once, was put to sleep, timed out, and so on (a cold
    start every second or so with no request). The next request starts one."""
    m = sleepy(load_ms=100, idle_before_sleep_ms=200, extra=("--sleep-ms", "3000"))
    m["sleep"]["timeout_ms"] = 500
    t = thaw_factory({"gpus": ONE_GPU, "autoscaler": {"tick_ms": 200},
                      "models": [m]})
    assert complete(t).status == 200
    wait_for(lambda: sleep_events(t, "llama", "sleep_failed") == 1, timeout=5,
             what="the /sleep timed out")
    wait_for(lambda: model_status(t)["state"] == "scaled_to_zero", timeout=5, what="stopped")
    time.sleep(3)
    st = model_status(t)
    assert st["starts"] == 1 and sleep_events(t, "llama", "sleep_failed") == 1
    assert "waiting for GPU capacity" not in t.logs()
    assert complete(t).status == 200
    assert model_status(t)["starts"] == 2
    t.assert_reconciled()


def test_a_replica_that_dies_asleep_is_replaced_only_on_demand(thaw_factory, tmp_path):
    """The counterpart exits 200 ms after falling asleep. With nothing asking
    for the model, no replacement starts (before: one at once, which slept
    and died in turn, ten starts in ten seconds); a request starts one."""
    t = thaw_factory({"gpus": ONE_GPU, "autoscaler": {"tick_ms": 200},
                      "models": [vllm_like(tmp_path, "a", {"die_asleep_ms": 200})]})
    assert complete(t, "a").status == 200
    wait_for(lambda: server_events(tmp_path, "die_asleep"), timeout=5, what="died asleep")
    time.sleep(3)
    assert len(server_events(tmp_path, "start")) == 1
    assert model_status(t, "a")["crashes"] == 1
    assert complete(t, "a").status == 200
    assert len(server_events(tmp_path, "start")) == 2
    t.assert_reconciled()


def test_replicas_dying_asleep_back_off_as_a_crash_loop(thaw_factory, tmp_path):
    """min_replicas 1 asks for a replica that never serves: each dies 200 ms
    after falling asleep, within 10 s of becoming ready having finished no
    request, a crash loop, so the next starts after 1 s, then 2 s, 4 s ...
    (before: at once, every second)."""
    t = thaw_factory({"gpus": ONE_GPU, "autoscaler": {"tick_ms": 200},
                      "models": [vllm_like(tmp_path, "a", {"die_asleep_ms": 200},
                                           min_replicas=1)]})
    time.sleep(5)  # about 0.8 s from a start to its death: starts at 0, ~2 s and ~5 s
    starts = len(server_events(tmp_path, "start"))
    assert 2 <= starts <= 3, starts
    lines = [line for line in t.logs().splitlines() if "replica exited in sleep mode" in line]
    assert "restart_in_ms=1000" in lines[0] and "restart_in_ms=2000" in lines[1], lines


def test_a_start_waiting_for_memory_is_logged_once(thaw_factory):
    """A start that the plan admits but whose memory a draining replica still
    holds is tried at every planning step; its wait is logged when it begins,
    not at each step (before: an info line every 200 ms)."""
    b = sim_model("b", load_ms=50, tokens=10, token_ms=150, gpu_slices=1,
                  gpu_memory_bytes=6 * GB, priority="batch")
    c = sim_model("c", load_ms=50, gpu_slices=1, gpu_memory_bytes=6 * GB, priority="critical")
    t = thaw_factory({"gpus": ONE_GPU, "autoscaler": {"tick_ms": 200}, "models": [b, c]})
    out = {}
    th = threading.Thread(target=lambda: out.update(r=complete(t, "b")))
    th.start()
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="b") == 1, what="b busy")
    r = complete(t, "c")  # b is preempted and drains its request (1.5 s) first
    th.join(30)
    assert r.status == 200 and out["r"].status == 200
    waits = [line for line in t.logs().splitlines()
             if "waiting for GPU capacity" in line and "model=c" in line]
    assert len(waits) == 1, waits
    t.assert_reconciled()


def test_a_critical_wake_preempts_the_batch_replica_holding_its_memory(thaw_factory):
    """Critical c fell asleep and batch b took the memory it freed. A request
    for c wakes it: b, of a lower tier and without sleep mode, is preempted
    so that c wakes into its memory (a wake, not a cold start) instead of
    waiting for b's idle timeout (60 s)."""
    c = sleepy("c", load_ms=100, idle_before_sleep_ms=200, gpu_memory_bytes=6 * GB,
               priority="critical")
    b = sim_model("b", load_ms=50, gpu_slices=1, gpu_memory_bytes=6 * GB, priority="batch")
    t = thaw_factory({"gpus": ONE_GPU, "autoscaler": {"tick_ms": 200}, "models": [c, b]})
    assert complete(t, "c").status == 200
    wait_for(lambda: model_status(t, "c")["state"] == "sleeping", timeout=5, what="c asleep")
    assert complete(t, "b").status == 200
    r = complete_within(t, "c", 10)
    assert r.status == 200, r.body
    assert model_status(t, "c")["starts"] == 1 and sleep_events(t, "c", "wake") == 1
    assert t.metric("thaw_pool_decisions_total", model="b", action="preempt") == 1
    t.assert_reconciled()


def test_a_sleep_that_times_out_with_min_replicas_is_not_tried_every_cycle(thaw_factory):
    """min_replicas 1 and a server whose /sleep never answers in time: the
    replica is stopped and min_replicas starts another, which is then not put
    to sleep for idleness again (before: sleep, time out, stop, cold start, in
    a loop with no back-off, a cold start per idle_before_sleep_ms)."""
    m = sleepy(load_ms=100, idle_before_sleep_ms=200, extra=("--sleep-ms", "3000"))
    m["sleep"]["timeout_ms"] = 300
    m["min_replicas"] = 1
    t = thaw_factory({"gpus": ONE_GPU, "autoscaler": {"tick_ms": 200}, "models": [m]})
    wait_for(lambda: sleep_events(t, "llama", "sleep_failed") == 1, timeout=10,
             what="the first /sleep timed out")
    time.sleep(4)
    st = model_status(t)
    assert st["starts"] == 2 and sleep_events(t, "llama", "sleep_failed") == 1, st
    assert complete(t).status == 200
    t.assert_reconciled()
