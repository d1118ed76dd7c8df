"""End-to-end: the process backend (scale from zero on one machine)."""

import json
import os
import signal
import threading
import time

import pytest

import httpc
from conftest import ROOT, Thaw, wait_for

SIM = os.environ.get("THAW_SIM_BIN", os.path.join(ROOT, "build", "thaw-model-sim"))
# Sanitized builds start and run slower; deadlines in these tests stretch.
SLOW = 3 if os.environ.get("THAW_SANITIZED") else 1


def sim_model(name="llama", load_ms=400, token_ms=5, tokens=4, extra=(), **kw):
    m = {"name": name,
         "command": [SIM, "--port", "{port}", "--model", name, "--load-ms", str(load_ms),
                     "--token-ms", str(token_ms), "--tokens", str(tokens), *extra],
         "idle_timeout_ms": 60000, "startup_timeout_ms": 20000 * SLOW, "stop_grace_ms": 2000}
    m.update(kw)
    return m


def complete(t, model="llama", stream=False, headers=None, max_tokens=None):
    body = {"model": model, "prompt": "hi", "stream": stream}
    if max_tokens:
        body["max_tokens"] = max_tokens
    return httpc.request(t.host, t.port, "POST", "/v1/completions",
                         {"Content-Type": "application/json", **(headers or {})},
                         json.dumps(body).encode(), timeout=60)


def model_status(t, name="llama"):
    return next(m for m in t.status()["models"] if m["name"] == name)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False  # reaped between the two looks


def parallel(n, fn):
    out = [None] * n

    def run(i):
        out[i] = fn(i)
    ths = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(120)
    return out


def test_cold_start_50_concurrent_requests_start_one_process(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=500, max_concurrency=64)]})
    assert model_status(t)["state"] == "scaled_to_zero"
    res = parallel(50, lambda i: complete(t))
    assert [r.status for r in res] == [200] * 50
    st = model_status(t)
    assert st["starts"] == 1 and st["replicas_ready"] == 1
    assert st["cold_start_ms"] >= 500
    t.assert_reconciled()
    assert t.metric("thaw_cold_start_seconds_count", model="llama") == 1


@pytest.mark.parametrize("mode", ["listen-late", "503"])
def test_both_kinds_of_loading_server(thaw_factory, mode):
    t = thaw_factory({"models": [sim_model(load_ms=300, extra=("--load-mode", mode))]})
    start = time.monotonic()
    r = complete(t)
    assert r.status == 200 and r.json()["object"] == "text_completion"
    assert time.monotonic() - start >= 0.3


def test_streaming_during_and_after_cold_start(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=300, token_ms=60, tokens=5)]})
    for _ in range(2):  # cold, then warm
        s = t.connect()
        httpc.send(s, "POST", "/v1/completions", {"Content-Type": "application/json"},
                   json.dumps({"model": "llama", "stream": True}).encode())
        r = httpc.Reader(s).response()
        s.close()
        assert r.status == 200 and r.header("content-type") == "text/event-stream"
        events = [e for e in r.body.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and len(events) == 6
        times = [c[0] for c in r.chunks]
        assert times[-1] - times[0] > 0.2  # tokens arrived one by one
    assert model_status(t)["starts"] == 1


def test_held_requests_flush_in_priority_order(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=800 * SLOW, max_concurrency=1)]})
    res = {}
    ths = []
    for tier in ("batch", "standard", "critical"):
        th = threading.Thread(target=lambda tier=tier: res.__setitem__(
            tier, complete(t, headers={"thaw-priority": tier})))
        th.start()
        ths.append(th)
        wait_for(lambda tier=tier: model_status(t)["queue"][tier] == 1, what=f"{tier} held")
    for th in ths:
        th.join(60)
    ids = {tier: r.json()["id"] for tier, r in res.items()}
    assert ids == {"critical": "cmpl-1", "standard": "cmpl-2", "batch": "cmpl-3"}


def test_client_leaving_while_held_does_not_stop_the_load(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=600)]})
    s = t.connect()
    httpc.send(s, "POST", "/v1/completions", {}, b'{"model":"llama"}')
    wait_for(lambda: t.status()["queued"] == 1, what="held")
    s.close()
    wait_for(lambda: t.status()["queued"] == 0, what="removed from the queue")
    wait_for(lambda: model_status(t)["state"] == "ready", timeout=10 * SLOW, what="loaded")
    t.assert_reconciled()
    assert t.metric("thaw_aborts_total", reason="client_closed") == 1
    assert complete(t).status == 200


def test_failed_start_answers_held_requests_503_and_backs_off(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=200, extra=("--fail-start",))]})
    start = time.monotonic()
    res = parallel(5, lambda i: complete(t))
    assert time.monotonic() - start < 5 * SLOW
    for r in res:
        assert r.status == 503
        err = r.json()["error"]
        assert err["code"] == "start_failed" and "exited with status 1" in err["message"]
        assert "CUDA" not in r.body.decode()  # the model's log stays in thaw's log
    logs = t.logs()
    assert "CUDA out of memory" in logs and 'msg="replica failed to start"' in logs
    # While backing off, new requests fail fast with a Retry-After.
    r = complete(t)
    assert r.status == 503 and int(r.header("retry-after")) >= 1
    st = model_status(t)
    assert st["start_failures"] == 1 and st["state"] == "start_failed"
    assert st["last_error"].startswith("exited with status 1")
    t.assert_reconciled()


def test_min_replicas_starts_back_off_too(thaw_factory):
    """A min_replicas model whose server cannot start: its starts back off
    1 s, 2 s, 4 s as a request's would. Before, min_replicas asked for one
    again at once: thousands of starts a second."""
    t = thaw_factory({"autoscaler": {"tick_ms": 200},
                      "models": [sim_model(load_ms=50, min_replicas=1,
                                           extra=("--fail-start",))]})
    time.sleep(3.5)  # starts at 0, ~1 s and ~3 s
    st = model_status(t)
    assert 2 <= st["starts"] <= 3 and st["start_failures"] >= 2, st["starts"]
    assert "retry_in_ms=2000" in t.logs()


def test_startup_timeout_answers_503_and_kills_the_process(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=30000, startup_timeout_ms=300)]})
    start = time.monotonic()
    r = complete(t)
    assert r.status == 503 and "startup_timeout_ms=300" in r.json()["error"]["message"]
    assert time.monotonic() - start < 3 * SLOW
    wait_for(lambda: not model_status(t)["processes"], timeout=10, what="process reaped")
    t.assert_reconciled()


@pytest.mark.timer_heavy
def test_a_server_that_crashes_soon_after_ready_is_restarted_with_backoff(thaw_factory):
    """Each replica crashes in its first request (within 10 s of ready): a crash
    loop. Starts back off (1 s, 2 s, ...) instead of one per request, and
    requests meanwhile get 503 saying why."""
    t = thaw_factory({"models": [sim_model(load_ms=50, extra=("--crash-after", "1"))]})
    codes = []
    end = time.monotonic() + 3
    while time.monotonic() < end:
        codes.append(complete(t).status)
        time.sleep(0.05)
    starts = model_status(t)["starts"]
    assert starts <= 3, (starts, codes)
    # Each replica took one request and crashed in it (the last may be starting still).
    assert 503 in codes and starts - 1 <= codes.count(502) <= starts, (starts, codes)
    assert "restart_in_ms=1000" in t.logs()
    t.assert_reconciled()


def test_crash_mid_stream_aborts_it_and_held_requests_get_the_next_replica(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=200, token_ms=50, tokens=10,
                                           extra=("--crash-after", "1"), max_concurrency=1)]})
    s = t.connect()
    httpc.send(s, "POST", "/v1/completions", {}, b'{"model":"llama","stream":true}')
    rd = httpc.Reader(s)
    res = {}
    wait_for(lambda: model_status(t)["inflight"] == 1, timeout=10 * SLOW, what="streaming")
    th = threading.Thread(target=lambda: res.__setitem__("held", complete(t)))
    th.start()
    wait_for(lambda: t.status()["queued"] == 1, what="second request held")
    with pytest.raises(EOFError):
        rd.response()  # the stream is cut when the replica dies
    th.join(30)
    # The next replica crashes too (--crash-after counts per process): the held
    # request got a response or a clean error, never silence.
    assert res["held"].status in (200, 502)
    # The crash is counted when the process is reaped, which may come after
    # the held request's answer (a 502 from the dead replica's refused port).
    wait_for(lambda: model_status(t)["crashes"] >= 1 and model_status(t)["starts"] >= 2,
             timeout=10 * SLOW, what="the crash counted and a replica started again")
    t.assert_reconciled()
    assert "replica crashed while serving" in t.logs()


def test_idle_scale_to_zero_then_cold_start_again(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=200, idle_timeout_ms=400)]})
    assert complete(t).status == 200
    pid = model_status(t)["processes"][0]["pid"]
    wait_for(lambda: model_status(t)["state"] == "scaled_to_zero", timeout=10, what="to zero")
    wait_for(lambda: not pid_alive(pid), what="process gone")
    assert complete(t).status == 200
    assert model_status(t)["starts"] == 2


def test_min_replicas_start_at_once_and_stay(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=100, min_replicas=1, idle_timeout_ms=100)]})
    wait_for(lambda: model_status(t)["state"] == "ready", timeout=10, what="warm at start")
    time.sleep(0.5)
    assert model_status(t)["replicas_ready"] == 1


def environ_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(kv.split("=", 1) for kv in f.read().decode().split("\0") if "=" in kv)


def test_gpu_slices_exhausted_waits_then_runs(thaw_factory):
    t = thaw_factory({
        "gpus": [{"id": 3, "slices": 2}],
        "models": [sim_model("a", load_ms=100, gpu_slices=2, idle_timeout_ms=700),
                   sim_model("b", load_ms=100, gpu_slices=2, env={"WHICH": "b-on-{gpu}"})]})
    assert complete(t, "a").status == 200
    a_pid = model_status(t, "a")["processes"][0]["pid"]
    assert environ_of(a_pid)["CUDA_VISIBLE_DEVICES"] == "3"
    res = {}
    th = threading.Thread(target=lambda: res.__setitem__("b", complete(t, "b")))
    th.start()
    wait_for(lambda: model_status(t, "b")["state"] == "waiting_for_capacity",
             what="b waiting for capacity")
    assert t.status()["gpus"][0]["used"] == 2
    th.join(30)
    assert res["b"].status == 200  # ran once a's idle replica stopped
    b_pid = model_status(t, "b")["processes"][0]["pid"]
    env = environ_of(b_pid)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["WHICH"] == "b-on-3"
    assert not pid_alive(a_pid)


def test_mps_share_in_environment(thaw_factory):
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4, "sharing": "mps"}],
                      "models": [sim_model(load_ms=50, gpu_slices=1)]})
    assert complete(t).status == 200
    env = environ_of(model_status(t)["processes"][0]["pid"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_retry_after_uses_measured_cold_start(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=1500, idle_timeout_ms=200, max_queue=1)]})
    assert complete(t).status == 200
    cold = model_status(t)["cold_start_ms"]
    wait_for(lambda: model_status(t)["state"] == "scaled_to_zero", timeout=10, what="to zero")
    th = threading.Thread(target=lambda: complete(t))
    th.start()
    wait_for(lambda: t.status()["queued"] == 1, what="one held")
    r = complete(t)
    assert r.status == 503 and r.json()["error"]["code"] == "queue_full"
    assert int(r.header("retry-after")) == (cold + 999) // 1000
    th.join(30)


def test_sigterm_stops_and_reaps_every_child(thaw_factory):
    t = thaw_factory({"models": [sim_model("a", load_ms=50), sim_model("b", load_ms=50)]})
    assert complete(t, "a").status == 200 and complete(t, "b").status == 200
    pids = [p["pid"] for m in t.status()["models"] for p in m["processes"]]
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)
    assert t.stop() == 0
    assert not any(pid_alive(p) for p in pids)


def test_at_exit_a_replica_that_ignores_sigterm_gets_its_own_models_grace(thaw_factory):
    """One model's server ignores SIGTERM (stop_grace_ms 1 s); another's has a
    long grace but exits at once: thaw exits after about 1 s, not 20."""
    stubborn = {"name": "stubborn", "min_replicas": 1, "stop_grace_ms": 1000,
                "startup_timeout_ms": 600000,
                "command": ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"]}
    t = thaw_factory({"models": [stubborn, sim_model("quick", load_ms=50, min_replicas=1,
                                                     stop_grace_ms=20000)]})
    wait_for(lambda: len(model_status(t, "stubborn")["processes"]) == 1
             and model_status(t, "quick")["state"] == "ready", what="both running")
    began = time.monotonic()
    assert t.stop() == 0
    took = time.monotonic() - began
    assert took < 8, took
    assert "replica ignored SIGTERM at exit: SIGKILL" in t.logs()


def test_no_model_server_is_started_while_thaw_drains_to_exit(thaw_factory):
    """SIGTERM while a stream keeps the drain going; another model's replica
    (min_replicas 1) dies meanwhile: it is not started again by a process
    that is exiting."""
    t = thaw_factory({"limits": {"drain_timeout_ms": 10000},
                      "models": [sim_model("a", load_ms=50, tokens=40, token_ms=50),
                                 sim_model("b", load_ms=50, min_replicas=1)]})
    wait_for(lambda: model_status(t, "b")["state"] == "ready", what="b ready")
    b_pid = model_status(t, "b")["processes"][0]["pid"]
    out = {}
    stream = threading.Thread(target=lambda: out.update(r=complete(t, "a", stream=True)))
    stream.start()
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="a") == 1, what="stream going")
    t.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    os.kill(b_pid, signal.SIGKILL)
    stream.join(30)
    assert t.proc.wait(30) == 0
    assert out["r"].status == 200
    assert t.logs().count('msg="starting replica" model=b ') == 1, t.logs()


def test_children_die_with_thaw_even_on_sigkill():
    t = Thaw({"models": [sim_model(load_ms=50)]})
    try:
        assert complete(t).status == 200
        pid = model_status(t)["processes"][0]["pid"]
        t.proc.send_signal(signal.SIGKILL)
        t.proc.wait(10)
        wait_for(lambda: not pid_alive(pid), timeout=10, what="orphan gone")
    finally:
        t.stop()


def test_config_errors_for_process_models(tmp_path):
    import subprocess
    from conftest import THAW_BIN
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": [{"name": "x", "command": [SIM], "gpu_slices": 8}],
                               "gpus": [{"id": 0, "slices": 4}]}))
    r = subprocess.run([THAW_BIN, "--check-config", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "gpu_slices: 8 slices do not fit" in r.stderr
    bad.write_text(json.dumps({"models": [{"name": "x", "command": [SIM],
                                           "endpoints": ["127.0.0.1:1"]}]}))
    r = subprocess.run([THAW_BIN, "--check-config", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "choose one" in r.stderr


def stream_request(t, body):
    s = t.connect()
    httpc.send(s, "POST", "/v1/chat/completions", {"Content-Type": "application/json"},
               json.dumps(body).encode())
    start = time.monotonic()
    r = httpc.Reader(s).response()
    s.close()
    return start, r


def test_loading_heartbeats_keep_a_streaming_client_company(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=700, token_ms=10, tokens=3,
                                           loading_heartbeat_ms=100)]})
    start, r = stream_request(t, {"model": "llama", "stream": True, "messages": []})
    assert r.status == 200 and r.header("content-type") == "text/event-stream"
    events = [e for e in r.body.decode().split("\n\n") if e]
    beats = [e for e in events if e.startswith(": loading phase=")]
    assert len(beats) >= 4  # one at once, then every 100 ms of a 700 ms load
    assert r.chunks[0][0] - start < 0.3  # the first heartbeat came at once
    data = [e for e in events if e.startswith("data: ")]
    assert data[-1] == "data: [DONE]" and len(data) == 4
    # Warm now: no heartbeats, the replica's own head.
    _, r = stream_request(t, {"model": "llama", "stream": True, "messages": []})
    assert ": loading" not in r.body.decode() and r.header("x-thaw-cold-start") is None
    # Non-streaming requests never get heartbeats.
    assert complete(t).status == 200
    t.assert_reconciled()


def test_a_heartbeat_stream_waiting_for_a_slot_after_the_load_says_queued(thaw_factory):
    """Two streams held through a load, one slot: the second waits for the
    first to end after the model is ready, and its comments say `: queued`
    then, not `: loading` with no phase."""
    t = thaw_factory({"models": [sim_model(load_ms=300, token_ms=100, tokens=8,
                                           loading_heartbeat_ms=100, max_concurrency=1)]})
    out = [None, None]

    def one(i):
        out[i] = stream_request(t, {"model": "llama", "stream": True, "messages": []})[1]
    ths = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    comments = sorted(([e for e in r.body.decode().split("\n\n") if e.startswith(":")]
                       for r in out), key=len)
    assert all(c.startswith(": loading phase=") or c == ": queued" for c in comments[1])
    assert comments[1].count(": queued") >= 4, comments[1]  # ~800 ms behind the first
    assert ": queued" not in comments[0]
    t.assert_reconciled()


def test_failed_start_ends_a_heartbeat_stream_with_an_error_event(thaw_factory):
    t = thaw_factory({"models": [sim_model(load_ms=300, extra=("--fail-start",),
                                           loading_heartbeat_ms=100)]})
    _, r = stream_request(t, {"model": "llama", "stream": True, "messages": []})
    assert r.status == 200
    events = [e for e in r.body.decode().split("\n\n") if e]
    assert events[0].startswith(": loading phase=load ")
    # One SSE error event with the status, never raw JSON in the stream.
    assert events[-1].startswith("event: error\ndata: {")
    err = json.loads(events[-1][len("event: error\ndata: "):])["error"]
    assert err["code"] == "start_failed" and err["status"] == 503
    assert err["type"] == "server_error" and "llama" in err["message"]
    t.assert_reconciled()
    assert t.metric("thaw_rejections_total", reason="start_failed") == 1


def test_critical_request_evicts_an_idle_warm_batch_replica(thaw_factory):
    """4 slices, all held by idle batch replicas kept warm; a critical model wakes."""
    t = thaw_factory({
        "gpus": [{"id": 0, "slices": 4}],
        "warm_pool": {"budget_slices": 4},
        "autoscaler": {"tick_ms": 200},
        "models": [sim_model("batch-a", load_ms=50, gpu_slices=2, priority="batch",
                             idle_timeout_ms=300),
                   sim_model("batch-b", load_ms=50, gpu_slices=2, priority="batch",
                             idle_timeout_ms=300),
                   sim_model("crit", load_ms=50, gpu_slices=2, priority="critical",
                             idle_timeout_ms=300),
                   sim_model("std", load_ms=50, gpu_slices=2, priority="standard",
                             idle_timeout_ms=300)]})
    assert complete(t, "batch-a").status == 200 and complete(t, "batch-b").status == 200
    # Past their grace, idle: kept warm because the budget has room.
    wait_for(lambda: model_status(t, "batch-a")["pool"].get("last_decision") == "keep_warm" and
             model_status(t, "batch-b")["pool"].get("last_decision") == "keep_warm",
             timeout=10, what="batch replicas kept warm")
    assert t.status()["gpus"][0]["used"] == 4
    start = time.monotonic()
    r = complete(t, "crit", headers={"thaw-priority": "critical"})
    assert r.status == 200
    assert time.monotonic() - start < 5
    evicted = [m for m in ("batch-a", "batch-b")
               if model_status(t, m)["pool"].get("last_decision") == "evict"]
    assert len(evicted) == 1
    assert "evicted for crit" in model_status(t, evicted[0])["pool"]["reason"]
    assert t.metric("thaw_pool_decisions_total", model=evicted[0], action="evict") >= 1
    assert "action=evict" in t.logs()


def test_burst_scales_out_and_back(thaw_factory):
    t = thaw_factory({
        "autoscaler": {"tick_ms": 200, "stable_window_ms": 6000},
        "models": [sim_model(load_ms=100, token_ms=100, tokens=8, max_concurrency=1,
                             max_replicas=4, idle_timeout_ms=1000, target=1)]})
    assert complete(t).status == 200
    res = parallel(12, lambda i: complete(t))
    assert all(r.status == 200 for r in res)
    assert model_status(t)["starts"] >= 3  # scaled out for the burst...
    wait_for(lambda: model_status(t)["replicas_ready"] + model_status(t)["replicas_starting"]
             == 0, timeout=30, what="back to zero")  # ...and back
    t.assert_reconciled()


def test_preempted_batch_replica_finishes_its_stream_first(thaw_factory):
    """The only GPU is busy with a batch stream when a critical model wakes:
    the batch replica is preempted, but leaves routing and finishes the
    stream before it is stopped; then the critical model runs."""
    t = thaw_factory({
        "gpus": [{"id": 0, "slices": 2}],
        "autoscaler": {"tick_ms": 100},
        "models": [sim_model("batch", load_ms=50, token_ms=100, tokens=15, gpu_slices=2,
                             priority="batch", max_concurrency=1),
                   sim_model("crit", load_ms=50, gpu_slices=2, priority="critical")]})
    s = t.connect()
    httpc.send(s, "POST", "/v1/completions", {}, b'{"model":"batch","stream":true}')
    rd = httpc.Reader(s)
    wait_for(lambda: model_status(t, "batch")["inflight"] == 1, timeout=10 * SLOW,
             what="batch streaming")
    res = {}
    th = threading.Thread(target=lambda: res.__setitem__("crit", complete(t, "crit")))
    th.start()
    wait_for(lambda: "draining replica" in t.logs(), timeout=10,
             what="batch replica draining")
    r = rd.response()  # the whole stream, not cut
    assert r.status == 200
    assert r.body.rstrip().endswith(b"data: [DONE]")
    th.join(30)
    assert res["crit"].status == 200
    assert t.metric("thaw_pool_decisions_total", model="batch", action="preempt") >= 1
    assert model_status(t, "batch")["inflight"] == 0  # nothing left counted on the model
    t.assert_reconciled()
    assert t.metric("thaw_aborts_total", reason="upstream_closed") == 0


def test_capacity_slices_hold_while_preempted_replicas_drain(thaw_factory):
    """A GPU of 4 slices capped at 2 by warm_pool.capacity_slices, both taken
    by busy replicas of a standard model when a critical one wakes: the
    preempted replicas keep their slices while they drain, so the critical
    one starts as they exit, never beside them over the cap."""
    t = thaw_factory({
        "gpus": [{"id": 0, "slices": 4}],
        "warm_pool": {"capacity_slices": 2},
        "autoscaler": {"tick_ms": 100},
        "models": [sim_model("std", load_ms=50, token_ms=200, tokens=6, gpu_slices=1,
                             max_replicas=2, max_concurrency=1, target=1),
                   sim_model("crit", load_ms=50, gpu_slices=1, priority="critical",
                             max_concurrency=1)]})
    busy = threading.Thread(target=lambda: parallel(2, lambda i: complete(t, "std")))
    busy.start()
    wait_for(lambda: model_status(t, "std")["replicas_ready"] == 2 and
             model_status(t, "std")["inflight"] == 2, timeout=10 * SLOW, what="std on 2 slices")
    res = {}
    th = threading.Thread(target=lambda: res.__setitem__("crit", complete(t, "crit")))
    th.start()
    worst = 0
    while th.is_alive():
        st = t.status()
        live = sum(len(m["processes"]) for m in st["models"])
        worst = max(worst, st["gpus"][0]["used"], live)
        time.sleep(0.02)
    assert res["crit"].status == 200
    busy.join(30)
    assert worst <= 2, worst
    t.assert_reconciled()


def test_preemption_frees_room_on_one_gpu(thaw_factory):
    """Two GPUs of 2 slices: a standard replica and a batch one on gpu0, two
    batch replicas on gpu1. A critical replica of 2 slices fits only where
    both batch replicas of one GPU go: preempting one batch replica on each
    GPU would free 2 slices that no replica can use."""
    t = thaw_factory({
        "gpus": [{"id": 0, "slices": 2}, {"id": 1, "slices": 2}],
        "autoscaler": {"tick_ms": 100},
        "models": [sim_model("std", load_ms=50, gpu_slices=1, min_replicas=1),
                   sim_model("bat", load_ms=50, token_ms=100, tokens=5, gpu_slices=1,
                             priority="batch", max_replicas=3, max_concurrency=1, target=1,
                             stop_drain_ms=5000),
                   sim_model("crit", load_ms=50, gpu_slices=2, priority="critical",
                             queue_timeout_ms=10000)]})
    stop = time.monotonic() + 6

    def load(i):
        while time.monotonic() < stop:
            complete(t, "bat")
    busy = threading.Thread(target=lambda: parallel(3, load))
    busy.start()
    wait_for(lambda: model_status(t, "bat")["replicas_ready"] == 3, timeout=10 * SLOW,
             what="3 batch replicas")
    start = time.monotonic()
    r = complete(t, "crit")
    assert r.status == 200, r.body
    assert time.monotonic() - start < 3  # the batch replicas' streams are short
    gpus = {p["gpu"] for p in model_status(t, "crit")["processes"]}
    assert len(gpus) == 1
    busy.join(30)
    t.assert_reconciled()


def test_forecast_modes_reach_each_model(thaw_factory):
    """autoscaler.prewarm is the default; a model's own prewarm wins; off keeps no profile."""
    t = thaw_factory({
        "autoscaler": {"tick_ms": 100, "prewarm": "shadow"},
        "models": [sim_model("a", load_ms=50),
                   sim_model("b", load_ms=50, prewarm="on"),
                   sim_model("c", load_ms=50, prewarm="off")]})
    for name in ("a", "b", "c"):
        assert complete(t, name).status == 200
    wait_for(lambda: "forecast" in model_status(t, "a")["autoscaler"], what="a forecast")
    wait_for(lambda: "forecast" in model_status(t, "b")["autoscaler"], what="b forecast")
    assert model_status(t, "a")["autoscaler"]["forecast"]["mode"] == "shadow"
    fb = model_status(t, "b")["autoscaler"]["forecast"]
    assert fb["mode"] == "on" and fb["horizon_s"] >= 60 and fb["due"] is False
    assert "forecast" not in model_status(t, "c")["autoscaler"]


def three_streams_on_three_replicas(thaw_factory, tokens):
    """Three replicas (min_replicas 3) of the asyncio counterpart, target 2.8
    (max_concurrency 4 at 70%), and a stream on each of tokens x 100 ms."""
    from test_upstream_faults import counterpart_model

    def cfg(min_replicas):
        return {"autoscaler": {"tick_ms": 200, "stable_window_ms": 6000},
                "models": [counterpart_model("asyncio_server.py", "llama", "--tokens",
                                             str(tokens), "--token-delay-ms", "100",
                                             max_concurrency=4, max_replicas=3,
                                             min_replicas=min_replicas)]}
    t = thaw_factory(cfg(3))
    wait_for(lambda: model_status(t)["replicas_ready"] == 3, timeout=20 * SLOW, what="3 ready")
    out = {}
    ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, complete(t, stream=True)))
           for i in range(3)]
    for th in ths:
        th.start()
    wait_for(lambda: sorted(r["inflight"] for r in model_status(t)["replicas"]) == [1, 1, 1],
             timeout=10 * SLOW, what="a stream on each replica")
    return t, cfg, ths, out


def watch_drains(t, ths):
    """Until the streams end: the replicas drained, and the model's in-flight
    count while all three streams ran."""
    draining, counted = set(), set()
    while any(th.is_alive() for th in ths):
        st = model_status(t)
        draining |= {p["id"] for p in st["processes"] if p["state"] == "draining"}
        if all(th.is_alive() for th in ths):
            counted.add(st["inflight"])
        time.sleep(0.1)
    return draining, counted


def whole_streams(out):
    return all(out[i].status == 200 and out[i].body.rstrip().endswith(b"data: [DONE]")
               for i in range(3))


@pytest.mark.timer_heavy
def test_streams_on_a_draining_replica_still_count_as_the_models_load(thaw_factory):
    """A stable window of three streams, one per replica; min_replicas drops
    to 0: the autoscaler drains one replica (ceil(3 / 2.8) = 2). Its stream
    is still the model's load, so no second replica is drained under its own
    stream (before, the drained one's stream dropped out of the count, the
    next stable window saw 2 and drained another, and so on)."""
    from test_reload import hup, write_config
    t, cfg, ths, out = three_streams_on_three_replicas(thaw_factory, tokens=200)
    time.sleep(7)  # a whole stable window at 3
    write_config(t, cfg(0))
    hup(t)
    draining, counted = watch_drains(t, ths)
    assert whole_streams(out), [out[i].body[-100:] for i in range(3)]
    assert len(draining) == 1, f"drained under their streams: {sorted(draining)}"
    assert counted == {3}, f"the model's in-flight requests read {sorted(counted)}"


def test_a_plan_between_samples_sees_the_requests_in_flight(thaw_factory):
    """A reload lowers min_replicas right after the first requests began,
    before the autoscaler sampled them: the model is not idle, and its
    replicas are not all drained under their streams (before, the reload's
    plan took it for idle past the scale-to-zero grace and drained all 3)."""
    from test_reload import hup, write_config
    t, cfg, ths, out = three_streams_on_three_replicas(thaw_factory, tokens=30)
    write_config(t, cfg(0))
    hup(t)
    draining, _ = watch_drains(t, ths)
    assert whole_streams(out), [out[i].body[-100:] for i in range(3)]
    assert len(draining) < 3, "every replica drained while its stream ran"


def test_a_model_serving_short_requests_is_not_taken_for_idle(thaw_factory):
    """A request of about a millisecond every 300 ms, idle timeout 1.5 s: the
    replica serves them all (before, the autoscaler's samples, every 200 ms,
    all fell between requests, and the replica was stopped and cold-started
    again every idle timeout)."""
    t = thaw_factory({"autoscaler": {"tick_ms": 200},
                      "models": [sim_model(load_ms=50, token_ms=0, tokens=1,
                                           idle_timeout_ms=1500)]})
    end = time.monotonic() + 5
    while time.monotonic() < end:
        assert complete(t).status == 200
        time.sleep(0.3)
    assert model_status(t)["starts"] == 1, t.logs()
