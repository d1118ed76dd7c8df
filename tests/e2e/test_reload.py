"""End-to-end: SIGHUP reloads the configuration file without dropping work."""

import json
import os
import signal
import threading
import time

import pytest

import httpc
from conftest import wait_for
from test_process import SLOW, complete, model_status, pid_alive, sim_model


def static_model(upstream, name="llama", **kw):
    m = {"name": name, "endpoints": [upstream.address], "max_concurrency": 8}
    m.update(kw)
    return m


def write_config(t, config):
    cfg = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0"}
    cfg.update(config)
    with open(t.config_path + ".tmp", "w") as f:
        json.dump(cfg, f, indent=2)
    os.replace(t.config_path + ".tmp", t.config_path)


def reloads(t, result):
    return t.metric("thaw_config_reloads_total", result=result)


def hup(t, expect="success"):
    """Sends SIGHUP and waits until thaw counted the reload's outcome."""
    before = reloads(t, expect)
    t.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: reloads(t, expect) == before + 1, timeout=10 * SLOW,
             what=f"reload counted as {expect}")
    assert t.proc.poll() is None, t.logs()


def get(t, path, host="thaw.test", timeout=30):
    return httpc.request(t.host, t.port, path=path, headers={"Host": host}, timeout=timeout)


class Background:
    """A request running in a thread; .result is its response (or exception)."""

    def __init__(self, fn):
        self.result = None
        self.th = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.th.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.result = e

    def join(self, timeout=60):
        self.th.join(timeout)
        return self.result


def sse_chunks(r):
    return r.body.count(b"data: ")


def test_sighup_with_the_same_file_keeps_serving_a_stream_in_flight(thaw_factory, upstream):
    t = thaw_factory({"models": [static_model(upstream)]})
    stream = Background(lambda: get(t, "/models/llama/sse?n=20&ms=50"))
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="llama") == 1, what="stream started")
    hup(t)
    r = stream.join()
    assert not isinstance(r, Exception), r
    assert r.status == 200
    assert sse_chunks(r) == 21  # 20 chunks and [DONE]
    assert get(t, "/models/llama/echo").status == 200
    assert t.metric("thaw_config_last_reload_successful") == 1
    m = t.metrics()
    assert not any(k[0] == "thaw_requests_total" and ("code", "502") in k[1] for k in m)
    assert t.metric("thaw_requests_total", model="llama", code="200") == 2
    assert "configuration reloaded" in t.logs()
    assert upstream.connections >= 1
    t.assert_reconciled()


def test_bad_file_is_refused_with_its_line_and_the_old_config_keeps_serving(thaw_factory,
                                                                            upstream, upstream2):
    t = thaw_factory({"models": [static_model(upstream)]})
    started = t.metric("thaw_config_last_reload_success_timestamp_seconds")
    assert started > 0
    with open(t.config_path, "w") as f:
        f.write('{\n  "listen": "127.0.0.1:0",\n  "models": [ {"name": "x",, } ]\n}\n')
    hup(t, "failure")
    assert "configuration reload failed" in t.logs()
    assert "config.json:3:" in t.logs()
    assert t.metric("thaw_config_last_reload_successful") == 0
    st = t.status()["config"]
    assert st["file"] == t.config_path
    assert st["last_reload"] == "failure" and "config.json:3:" in st["last_error"]
    assert st["reloads_failed"] == 1
    assert get(t, "/models/llama/echo").status == 200
    # A semantic error names its key; still nothing changes.
    write_config(t, {"models": [static_model(upstream2, max_concurrency=0)]})
    hup(t, "failure")
    assert "models[0].max_concurrency" in t.status()["config"]["last_error"]
    assert get(t, "/models/llama/echo").status == 200
    assert upstream2.requests == 0
    # A key that is not UTF-8 is not JSON (RFC 8259); /status stays UTF-8.
    with open(t.config_path, "wb") as f:
        f.write(b'{"x\xff\xfe": 1}\n')
    hup(t, "failure")
    assert "invalid UTF-8 in a string at byte 3" in t.status()["config"]["last_error"]
    # Fixed: the next reload succeeds and the gauge and timestamp move.
    time.sleep(0.01)
    write_config(t, {"models": [static_model(upstream)]})
    hup(t)
    assert t.metric("thaw_config_last_reload_successful") == 1
    assert t.metric("thaw_config_last_reload_success_timestamp_seconds") > started
    assert t.status()["config"]["last_reload"] == "success"
    assert reloads(t, "failure") == 3 and reloads(t, "success") == 1


def test_max_connections_stays_within_the_descriptor_limit_across_reloads(thaw_factory,
                                                                           upstream):
    """limits.max_connections changes on a reload, never past what the descriptor limit
    allows; the warning comes when the figure changes, not at every reload."""
    from test_hostile import limit_fds
    t = thaw_factory({"limits": {"max_connections": 20}, "models": [static_model(upstream)]},
                     preexec_fn=limit_fds(128))
    assert t.metric("thaw_max_connections") == 20
    assert t.metric("thaw_max_fds") == 128
    allowed = t.status()["file_descriptors"]["allows_connections"]
    assert 20 < allowed < 64
    warning = "allows fewer client connections than configured"
    assert warning not in t.logs()
    write_config(t, {"limits": {"max_connections": 1000}, "models": [static_model(upstream)]})
    hup(t)
    assert t.metric("thaw_max_connections") == allowed
    assert t.logs().count(warning) == 1
    assert f"max_connections=1000 allowed={allowed} nofile=128" in t.logs()
    hup(t)  # the same file: said already
    assert t.logs().count(warning) == 1
    write_config(t, {"limits": {"max_connections": 5}, "models": [static_model(upstream)]})
    hup(t)
    assert t.metric("thaw_max_connections") == 5
    assert t.status()["max_connections"] == 5


def test_adding_a_model_makes_it_routable(thaw_factory, upstream, upstream2):
    t = thaw_factory({"models": [static_model(upstream)]})
    assert get(t, "/models/mistral/echo").status == 404
    write_config(t, {"models": [static_model(upstream),
                                static_model(upstream2, name="mistral", hosts=["m.example"])]})
    hup(t)
    assert get(t, "/models/mistral/echo").status == 200
    assert get(t, "/echo", host="m.example").status == 200
    assert upstream2.requests == 2
    assert get(t, "/models/llama/echo").status == 200
    assert "model added by reload" in t.logs()


def test_removed_model_finishes_its_stream_answers_its_queue_and_disappears(thaw_factory,
                                                                            upstream, upstream2):
    t = thaw_factory({"models": [static_model(upstream, max_concurrency=1),
                                 static_model(upstream2, name="mistral")]})
    stream = Background(lambda: get(t, "/models/llama/sse?n=20&ms=50"))
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="llama") == 1, what="stream started")
    queued = Background(lambda: get(t, "/models/llama/echo"))
    wait_for(lambda: t.metric("thaw_queue_depth_all") == 1, what="second request queued")
    write_config(t, {"models": [static_model(upstream2, name="mistral")]})
    hup(t)
    q = queued.join()
    assert q.status == 503, q.body
    assert q.json()["error"]["code"] == "model_removed"
    # New requests no longer find the model.
    r = get(t, "/models/llama/echo")
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found"
    s = stream.join()
    assert not isinstance(s, Exception), s
    assert s.status == 200 and sse_chunks(s) == 21
    assert get(t, "/models/mistral/echo").status == 200
    assert [m["name"] for m in t.status()["models"]] == ["mistral"]
    assert t.metric("thaw_rejections_total", reason="model_removed") == 1
    t.assert_reconciled()


def test_changing_max_concurrency_takes_effect(thaw_factory, upstream):
    t = thaw_factory({"models": [static_model(upstream, max_concurrency=1)]})

    def burst():
        rs = [Background(lambda: get(t, "/models/llama/sleep?ms=300")) for _ in range(3)]
        return [b.join().status for b in rs]

    assert burst() == [200] * 3
    assert upstream.peak == 1
    write_config(t, {"models": [static_model(upstream, max_concurrency=3)]})
    hup(t)
    upstream.peak = 0
    assert burst() == [200] * 3
    assert upstream.peak == 3
    assert "model changed by reload" in t.logs()


def test_a_shorter_queue_timeout_applies_to_requests_queued_before_and_after(thaw_factory,
                                                                           upstream):
    t = thaw_factory({"models": [static_model(upstream, max_concurrency=1,
                                              queue_timeout_ms=8000)]})
    busy = Background(lambda: get(t, "/models/llama/sleep?ms=6000"))
    wait_for(lambda: upstream.active == 1, what="the slot taken")
    before = Background(lambda: get(t, "/models/llama/echo"))
    wait_for(lambda: t.status()["queued"] == 1, what="one queued")
    time.sleep(1.2)  # longer than the new timeout
    write_config(t, {"models": [static_model(upstream, max_concurrency=1,
                                             queue_timeout_ms=1000)]})
    hup(t)
    start = time.monotonic()
    after = Background(lambda: get(t, "/models/llama/echo"))
    r = before.join(10)
    assert r.status == 504 and r.json()["error"]["code"] == "queue_timeout"
    r = after.join(10)
    waited = time.monotonic() - start
    assert r.status == 504 and r.json()["error"]["code"] == "queue_timeout"
    assert 0.9 < waited < 3, waited  # its own 1 s, not the 8 s of the one queued before
    assert busy.join().status == 200


def test_process_model_with_a_new_command_gets_a_new_replica_after_the_old_drains(thaw_factory):
    old = sim_model(tokens=20, token_ms=50, min_replicas=1)
    t = thaw_factory({"models": [old]})
    wait_for(lambda: model_status(t)["replicas_ready"] == 1, timeout=20 * SLOW, what="ready")
    old_pid = model_status(t)["processes"][0]["pid"]
    stream = Background(lambda: complete(t, stream=True))
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="llama") == 1, what="stream started")
    write_config(t, {"models": [sim_model(tokens=3, token_ms=5, min_replicas=1)]})
    hup(t)
    # The old process drains its stream; a new one serves the new command.
    r = complete(t)
    assert r.status == 200, r.body
    assert r.json()["usage"]["completion_tokens"] == 3
    s = stream.join()
    assert not isinstance(s, Exception), s
    assert s.status == 200 and s.body.count(b"data: ") == 21  # 20 tokens and [DONE]
    wait_for(lambda: not pid_alive(old_pid), timeout=10 * SLOW, what="old process stopped")
    # thaw reaps it on SIGCHLD, a moment after it is gone.
    procs = wait_for(lambda: (lambda ps: ps if [p["state"] for p in ps] == ["ready"] else None)(
        model_status(t)["processes"]), timeout=5 * SLOW, what="only the new process left")
    assert procs[0]["pid"] != old_pid
    assert "draining replica" in t.logs()
    t.assert_reconciled()


def test_a_second_reload_leaves_a_draining_replicas_stream_alone(thaw_factory, upstream):
    """The first reload replaces the model's process (it drains a stream); a
    second one changes the command again, then a third removes the model: the
    stream on the draining process runs to its end. The server is the asyncio
    counterpart, which stops at once on SIGTERM."""
    from test_upstream_faults import counterpart_model

    def model(tokens, delay_ms):
        return counterpart_model("asyncio_server.py", "llama", "--tokens", str(tokens),
                                 "--token-delay-ms", str(delay_ms), min_replicas=1)
    t = thaw_factory({"models": [model(30, 50), static_model(upstream, name="static")]})
    wait_for(lambda: model_status(t)["replicas_ready"] == 1, timeout=20 * SLOW, what="ready")
    stream = Background(lambda: complete(t, stream=True))
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="llama") == 1, what="stream started")
    for tokens in (3, 4):
        write_config(t, {"models": [model(tokens, 1), static_model(upstream, name="static")]})
        hup(t)
        time.sleep(0.2)
    write_config(t, {"models": [static_model(upstream, name="static")]})
    hup(t)
    s = stream.join()
    assert not isinstance(s, Exception), s
    assert s.status == 200 and s.body.rstrip().endswith(b"data: [DONE]"), s.body[-200:]
    t.assert_reconciled()


def test_removed_process_model_stops_its_process_after_draining(thaw_factory, upstream):
    t = thaw_factory({"models": [sim_model(tokens=20, token_ms=50, min_replicas=1),
                                 static_model(upstream, name="static")]})
    wait_for(lambda: model_status(t)["replicas_ready"] == 1, timeout=20 * SLOW, what="ready")
    pid = model_status(t)["processes"][0]["pid"]
    stream = Background(lambda: complete(t, stream=True))
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="llama") == 1, what="stream started")
    write_config(t, {"models": [static_model(upstream, name="static")]})
    hup(t)
    assert pid_alive(pid)  # still serving the stream
    s = stream.join()
    assert not isinstance(s, Exception), s
    assert s.status == 200 and s.body.count(b"data: ") == 21
    wait_for(lambda: not pid_alive(pid), timeout=10 * SLOW, what="removed model's process stopped")
    assert complete(t).status == 404
    t.assert_reconciled()


def test_settings_that_need_a_restart_are_reported_and_kept(thaw_factory, upstream):
    t = thaw_factory({"models": [static_model(upstream)]})
    write_config(t, {"listen": "127.0.0.1:1", "models": [static_model(upstream)]})
    hup(t)
    assert "needs a restart" in t.logs() and "key=listen" in t.logs()
    assert t.status()["config"]["restart_needed"] == 1
    assert t.status()["config"]["restart_needed_keys"] == ["listen"]
    assert get(t, "/models/llama/echo").status == 200
    # A model that would switch from endpoints to a command keeps running as
    # it is, and the key names the model.
    write_config(t, {"listen": "127.0.0.1:1", "models": [sim_model(name="llama")]})
    hup(t)
    assert t.status()["config"]["restart_needed_keys"] == ["listen", "models[0].command"]
    assert get(t, "/models/llama/echo").status == 200
    write_config(t, {"models": [static_model(upstream)]})
    hup(t)
    assert t.status()["config"]["restart_needed"] == 0
    assert t.status()["config"]["restart_needed_keys"] == []


def test_unchanged_models_keep_their_held_requests_and_processes(thaw_factory, upstream,
                                                                  upstream2):
    proc = sim_model(name="proc", min_replicas=1)
    t = thaw_factory({"models": [static_model(upstream, max_concurrency=1), proc]})
    wait_for(lambda: model_status(t, "proc")["replicas_ready"] == 1, timeout=20 * SLOW,
             what="ready")
    pid = model_status(t, "proc")["processes"][0]["pid"]
    busy = Background(lambda: get(t, "/models/llama/sleep?ms=600"))
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="llama") == 1, what="in flight")
    held = Background(lambda: get(t, "/models/llama/echo"))
    wait_for(lambda: t.metric("thaw_queue_depth_all") == 1, what="held")
    # Only the process model's concurrency changes, and a model is added.
    changed = dict(proc, max_concurrency=16)
    write_config(t, {"models": [static_model(upstream, max_concurrency=1), changed,
                                static_model(upstream2, name="mistral")]})
    hup(t)
    assert busy.join().status == 200
    assert held.join().status == 200
    assert complete(t, model="proc").status == 200
    assert model_status(t, "proc")["processes"][0]["pid"] == pid
    assert "draining replica" not in t.logs()
    t.assert_reconciled()


def test_changed_endpoints_and_hosts(thaw_factory, upstream, upstream2):
    t = thaw_factory({"models": [static_model(upstream, hosts=["a.example"])]})
    stream = Background(lambda: get(t, "/models/llama/sse?n=20&ms=50"))
    wait_for(lambda: t.metric("thaw_upstream_inflight", model="llama") == 1, what="stream started")
    write_config(t, {"models": [static_model(upstream2, hosts=["b.example"])]})
    hup(t)
    # The old endpoint takes no new requests but finishes its stream.
    assert get(t, "/echo", host="b.example").status == 200
    assert get(t, "/echo", host="a.example").status == 404
    assert upstream2.requests == 1
    s = stream.join()
    assert not isinstance(s, Exception), s
    assert s.status == 200 and sse_chunks(s) == 21
    assert upstream.requests == 1
    reps = t.status()["models"][0]["replicas"]
    assert [r["id"] for r in reps] == [upstream2.address]
    t.assert_reconciled()


def test_repeated_reloads_under_traffic_lose_nothing(thaw_factory, upstream, upstream2):
    base = [static_model(upstream)]
    t = thaw_factory({"models": base})
    stop = threading.Event()
    statuses = []

    def traffic():
        while not stop.is_set():
            statuses.append(get(t, "/models/llama/sleep?ms=5").status)

    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        for i in range(10):
            extra = [static_model(upstream2, name="mistral", max_concurrency=1 + i)] if i % 2 else []
            write_config(t, {"models": base + extra})
            hup(t)
    finally:
        stop.set()
        for w in workers:
            w.join(30)
    assert statuses and set(statuses) == {200}
    assert reloads(t, "success") == 10
    t.assert_reconciled()


@pytest.mark.timer_heavy
def test_a_reload_that_replaces_an_idle_models_process_does_not_stop_thaw(thaw_factory):
    """A reload changes an idle model's command just past its idle timeout:
    the replacement is started and stopped in one turn, before its exec.
    The SIGTERM for that child ran thaw's own signal handler in it, which
    wrote to thaw's signal pipe: thaw drained and exited on a SIGHUP."""
    def cfg(i):
        return {"models": [sim_model(tokens=3 + i % 2, load_ms=50, idle_timeout_ms=1000,
                                     stop_grace_ms=300)]}
    t = thaw_factory(cfg(0))
    for i in range(6):
        assert complete(t).status == 200
        time.sleep(1.0 + 0.3 * i)  # past the idle timeout, the planning tick maybe not yet
        write_config(t, cfg(i + 1))
        hup(t)
        time.sleep(0.3)
        assert t.proc.poll() is None and "signal received" not in t.logs(), \
            f"thaw stopped itself on reload {i}"


def test_answers_for_a_model_a_reload_removes_are_counted_as_unrouted(thaw_factory):
    """A model's series leave with it: the 503 model_removed its held request
    gets, and the answer of a request that was at its replica, are counted
    in thaw_unrouted_responses_total (before, in the model's series, which no
    scrape saw again)."""
    def cfg(with_slow):
        models = [sim_model("keep", load_ms=50)]
        if with_slow:
            models += [sim_model("cold", load_ms=5000),
                       sim_model("busy", load_ms=50, token_ms=400, tokens=4, min_replicas=1)]
        return {"models": models}
    t = thaw_factory(cfg(True))
    wait_for(lambda: model_status(t, "busy")["replicas_ready"] == 1, timeout=20 * SLOW,
             what="busy ready")
    held = Background(lambda: complete(t, "cold"))
    at_replica = Background(lambda: complete(t, "busy"))
    wait_for(lambda: model_status(t, "busy")["inflight"] == 1 and
             model_status(t, "cold")["queue"]["standard"] == 1, timeout=10 * SLOW,
             what="both under way")
    write_config(t, cfg(False))
    hup(t)
    assert held.join().status == 503 and at_replica.join().status == 200
    assert t.metric("thaw_unrouted_responses_total", code="503") == 1
    assert t.metric("thaw_unrouted_responses_total", code="200") == 1


def logfmt_quoted(s):
    """s as thaw quotes a log value."""
    return '"' + "".join("\\\\" if c == "\\" else '\\"' if c == '"' else
                         f"\\x{ord(c):02x}" if ord(c) < 0x20 else c for c in s) + '"'


def test_file_and_command_values_in_log_lines_are_quoted(thaw_factory, upstream, tmp_path,
                                                         monkeypatch):
    """A config path (and a discovery command) with a space, a quote and a
    newline stays on one logfmt line, quoted (before: printed as it is, the
    newline broke the line in two)."""
    import tempfile
    weird = tmp_path / 'conf dir "q"\nx'
    weird.mkdir()
    smi = weird / "nvidia smi"
    smi.write_text("#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    discover = {"gpus": "discover", "gpu_discovery_command": [str(smi), "-L"]}
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix="": str(weird))
    t = thaw_factory({**discover, "models": [static_model(upstream)]})
    monkeypatch.undo()
    write_config(t, {**discover, "listen": "127.0.0.1:1", "models": [static_model(upstream)]})
    hup(t)  # needs a restart: listen
    write_config(t, {**discover, "models": [static_model(upstream), sim_model("small")]})
    hup(t, "failure")  # the discovery command fails
    lines = t.logs().splitlines()
    for line in lines:
        assert line.startswith("ts="), f"not a logfmt line: {line!r}"
    file_q = "file=" + logfmt_quoted(t.config_path)
    for msg in ("reloading configuration", "configuration change needs a restart",
                "configuration reloaded"):
        assert any(f'msg="{msg}' in line and file_q in line for line in lines), msg
    command_q = "command=" + logfmt_quoted(str(smi))
    assert any('msg="GPU discovery command failed"' in line and command_q in line
               for line in lines)


MIG_SMALL = "MIG-4c5f0a12-aaaa-5b6c-8d9e-222222222222"
MIG_BIG = "MIG-1f2e3d4c-cccc-5b6a-8978-444444444444"


def last_reload_line(t):
    return [line for line in t.logs().splitlines() if "configuration reloaded" in line][-1]


def test_a_reload_of_gpu_memory_bytes_replaces_the_process(thaw_factory):
    """A new gpu_memory_bytes is a new process definition (its MPS memory
    limit and its share of the GPU's memory): the replica is replaced.
    Before, the reload counted the model as unchanged and the running
    replica kept the old limit and accounting."""
    from test_process import environ_of
    gb = 1 << 30
    gpus = [{"id": 0, "slices": 2, "sharing": "mps", "memory_bytes": 8 * gb}]

    def cfg(mem):
        return {"gpus": gpus, "models": [sim_model(load_ms=50, gpu_slices=1,
                                                   gpu_memory_bytes=mem)]}
    t = thaw_factory(cfg(1 * gb))
    assert complete(t).status == 200
    old_pid = model_status(t)["processes"][0]["pid"]
    write_config(t, cfg(4 * gb))
    hup(t)
    assert "changed=1 unchanged=0" in last_reload_line(t)
    wait_for(lambda: not pid_alive(old_pid), timeout=10 * SLOW, what="old process stopped")
    assert complete(t).status == 200
    new = wait_for(lambda: [p for p in model_status(t)["processes"] if p["pid"] != old_pid
                            and p["state"] == "ready"], timeout=5 * SLOW, what="a new replica")
    assert environ_of(new[0]["pid"])["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    wait_for(lambda: t.status()["gpus"][0]["memory_used"] == 4 * gb, timeout=5 * SLOW,
             what="the new memory accounted")


@pytest.mark.parametrize("key,before,after", [
    ("stop_drain_ms", 30000, 0),
    ("prewarm", "off", "shadow"),
    ("mig_profile", "1g.5gb", "3g.20gb"),
])
def test_every_process_key_a_reload_changes_is_applied(thaw_factory, key, before, after):
    """Each key the process backend reads counts as a change on reload
    (before, stop_drain_ms, prewarm and mig_profile were compared by
    nothing: the reload was "unchanged" and the running values stayed)."""
    from test_process import environ_of
    gpus = [{"id": 0, "mig": MIG_SMALL, "profile": "1g.5gb"},
            {"id": 0, "mig": MIG_BIG, "profile": "3g.20gb"}]
    base = {"load_ms": 50, "mig_profile": "1g.5gb"}

    def cfg(value):
        return {"gpus": gpus, "models": [sim_model(**{**base, key: value})]}
    t = thaw_factory(cfg(before))
    assert complete(t).status == 200
    write_config(t, cfg(after))
    hup(t)
    assert "changed=1 unchanged=0" in last_reload_line(t), last_reload_line(t)
    assert "replicas=1" in [line for line in t.logs().splitlines()
                            if "model changed by reload" in line][-1]
    if key == "prewarm":
        wait_for(lambda: model_status(t)["autoscaler"].get("forecast", {}).get("mode")
                 == "shadow", timeout=5 * SLOW, what="the forecast in shadow mode")
    if key == "mig_profile":
        assert complete(t).status == 200
        wait_for(lambda: [p for p in model_status(t)["processes"] if p["state"] == "ready"
                          and environ_of(p["pid"])["CUDA_VISIBLE_DEVICES"] == MIG_BIG],
                 timeout=5 * SLOW, what="a replica on the 3g.20gb instance")
