"""The data path under replica faults: requests re-queued after a failed
connect, pooled connections the replica closed or reset, replicas killed
mid-stream, broken responses. Fault injection comes from the independent
counterparts in tests/counterparts (a scriptable raw upstream, an asyncio
model server, a real uvicorn app)."""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import httpc
from conftest import free_port, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "counterparts"))


def get(t, path, host, **kw):
    return httpc.request(t.host, t.port, "GET", path, headers={"Host": host}, **kw)


def test_requeued_request_keeps_its_full_queue_deadline(thaw_factory, upstream):
    """Sent straight to a replica that refuses, then put back in the queue
    while the other replica is busy: the request waits for that replica
    (within its 60 s queue timeout) instead of answering 504 at once."""
    dead = f"127.0.0.1:{free_port()}"
    t = thaw_factory({"models": [{"name": "llama", "endpoints": [upstream.address, dead],
                                  "max_concurrency": 1, "queue_timeout_ms": 60000}]})
    results = {}

    def busy():
        results["a"] = get(t, "/sleep?ms=1200", host="llama")

    a = threading.Thread(target=busy)
    a.start()
    time.sleep(0.3)  # A holds the only working replica's one slot
    start = time.monotonic()
    b = get(t, "/echo", host="llama")
    waited = time.monotonic() - start
    a.join()
    assert results["a"].status == 200
    assert b.status == 200, b.body
    assert waited > 0.5  # it waited for A's slot
    assert t.metric("thaw_upstream_connect_failures_total") >= 1
    t.assert_reconciled()


COUNTERPARTS = Path(__file__).resolve().parents[1] / "counterparts"
PY = "/usr/bin/python3"


def counterpart_model(server, name="llama", *args, **kw):
    """A process-backend model run by an independent model server:
    asyncio_server.py (its own HTTP/1.1 code) or uvicorn_app.py (uvicorn)."""
    m = {"name": name,
         "command": [PY, str(COUNTERPARTS / server), "--port", "{port}", "--model", name, *args],
         "idle_timeout_ms": 60000, "startup_timeout_ms": 30000, "stop_grace_ms": 2000}
    m.update(kw)
    return m


def completion(t, model="llama", stream=False, sock=None, max_tokens=None):
    req = {"model": model, "prompt": "hi", "stream": stream}
    if max_tokens:
        req["max_tokens"] = max_tokens
    body = json.dumps(req).encode()
    hdrs = {"Content-Type": "application/json"}
    if sock is None:
        return httpc.request(t.host, t.port, "POST", "/v1/completions", hdrs, body, timeout=60)
    httpc.send(sock, "POST", "/v1/completions", hdrs, body)
    return None


def model_pid(t, name="llama"):
    m = next(m for m in t.status()["models"] if m["name"] == name)
    procs = m["processes"]
    return procs[0]["pid"] if procs else None


@pytest.mark.parametrize("run", range(5))
def test_replica_killed_mid_stream_does_not_fail_held_requests(thaw_factory, run):
    """A model server is SIGKILLed while it streams, with idle pooled
    connections to it and three requests arriving at that moment. Requests
    that go out on a pooled connection the dead server had closed are sent
    again on a new connection (here: the next replica), never answered 502.
    thaw is paused (SIGSTOP) across the kill so the requests are read before
    the pooled connections' close is seen, the race a busy loop runs into."""
    t = thaw_factory({"models": [counterpart_model("asyncio_server.py", "llama", "--token-delay-ms", "100",
                                               "--tokens", "4", max_concurrency=8)]})
    # Three requests at once leave three pooled connections to the replica.
    out = [None] * 3
    ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, completion(t)))
           for i in range(3)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    assert [r.status for r in out] == [200, 200, 200]
    clients = [t.connect(timeout=60) for _ in range(3)]
    stream = t.connect(timeout=60)
    completion(t, stream=True, sock=stream)
    rd = httpc.Reader(stream)
    assert rd.readline().startswith(b"HTTP/1.1 200")
    pid = model_pid(t)
    os.kill(t.proc.pid, signal.SIGSTOP)
    try:
        for s in clients:
            completion(t, sock=s)
        time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    finally:
        os.kill(t.proc.pid, signal.SIGCONT)
    statuses = [httpc.Reader(s).response().status for s in clients]
    assert statuses == [200, 200, 200], statuses
    t.assert_reconciled()
    assert stale(t) >= 1
    # Failures on the gone replica's connections still name its model.
    lines = [ln for ln in t.logs().splitlines() if 'msg="upstream' in ln]
    assert lines and not [ln for ln in lines if " model=- " in ln], lines


def test_requests_queued_behind_a_replica_that_dies_wait_for_the_next_one(thaw_factory):
    """One slot (max_concurrency 1), a stream on it, three requests queued
    behind it, and the server SIGKILLed (the OOM killer): the stream is cut,
    and the queued requests go to the next replica. Before, the first one
    was sent into the dying server as the stream's slot freed (its listen
    queue still took the connection) and answered 502."""
    t = thaw_factory({"models": [counterpart_model(
        "asyncio_server.py", "llama", "--token-delay-ms", "100", "--tokens", "20",
        max_concurrency=1)]})
    for trial in range(5):
        assert completion(t, max_tokens=2).status == 200
        stream = t.connect(timeout=60)
        completion(t, stream=True, sock=stream)
        assert httpc.Reader(stream).readline().startswith(b"HTTP/1.1 200")
        clients = [t.connect(timeout=60) for _ in range(3)]
        for s in clients:
            completion(t, sock=s, max_tokens=2)
        wait_for(lambda: t.metric("thaw_queue_depth", model="llama", tier="standard") == 3, timeout=10,
                 what="three requests queued")
        os.kill(model_pid(t), signal.SIGKILL)
        statuses = [httpc.Reader(s).response().status for s in clients]
        assert statuses == [200, 200, 200], (trial, statuses)
        for s in clients + [stream]:
            s.close()
    assert t.metric("thaw_upstream_break_holds_total") >= 5
    t.assert_reconciled()


def test_a_replica_alive_after_a_reset_takes_the_next_request_at_once(thaw_factory):
    """A server that resets one stream and lives on is held back only until
    its health check answers: the request queued behind the reset one is
    served within milliseconds, not after upstream.eject_ms (2 s), and the
    process is not restarted."""
    t = thaw_factory({"models": [counterpart_model("asyncio_server.py", "llama",
                                                   max_concurrency=1)]})
    assert completion(t).status == 200
    broken = t.connect(timeout=60)
    httpc.send(broken, "GET", "/fault/reset-mid?events=2", host="llama")
    waiting = t.connect(timeout=60)
    time.sleep(0.02)  # behind the reset one in the queue
    start = time.monotonic()
    completion(t, sock=waiting)
    r = httpc.Reader(waiting).response()
    took = time.monotonic() - start
    assert r.status == 200 and took < 1.0, (r.status, took)
    assert t.metric("thaw_upstream_break_holds_total") == 1
    m = next(m for m in t.status()["models"] if m["name"] == "llama")
    assert m["starts"] == 1
    broken.close()
    waiting.close()
    t.assert_reconciled()


def test_each_broken_answer_holds_the_replica_again(thaw_factory, upstream):
    """A replica whose health check gets no HTTP answer (it answers garbage)
    stays held until eject_ms lapses; the next break holds it again and is
    counted. Before, the unanswered check left the hold's mark set: later
    breaks were not counted, and an accept check's answer could end an
    ejection that had nothing to do with the hold."""
    t = thaw_factory({"upstream": {"eject_ms": 200},
                      "models": [static_model(upstream, health_path="/garbage")]})
    for i in range(3):
        with pytest.raises(Exception):
            get(t, "/cut", host="llama")  # a head, half a body, then the close
        time.sleep(0.5)  # eject_ms lapses
        assert get(t, "/echo", host="llama").status == 200
    assert t.metric("thaw_upstream_break_holds_total") == 3
    t.assert_reconciled()


def stale(t):
    """Pooled connections the replica had closed: found closed when taken,
    or failing right after the request went out (then sent again)."""
    return (t.metric("thaw_upstream_stale_closed_total")
            + t.metric("thaw_upstream_stale_retries_total"))


def paused(t):
    """thaw stopped (SIGSTOP) for the duration: what happens meanwhile is
    seen by its loop in one batch, in the order it happened."""
    class Paused:
        def __enter__(self):
            os.kill(t.proc.pid, signal.SIGSTOP)

        def __exit__(self, *exc):
            os.kill(t.proc.pid, signal.SIGCONT)
    return Paused()


def test_post_on_a_connection_uvicorn_closed_idle_is_sent_again(thaw_factory):
    """uvicorn (vLLM's server) closes keep-alive connections idle for 5 s. A
    POST that goes out on such a pooled connection (thaw's loop busy, its
    pool timeout set long) is sent again on a new connection, never 502."""
    t = thaw_factory({"upstream": {"keepalive_timeout_ms": 60000},
                      "models": [counterpart_model("uvicorn_app.py")]})
    assert completion(t).status == 200
    client = t.connect(timeout=60)
    time.sleep(0.2)  # accepted before the pause
    with paused(t):
        completion(t, sock=client)  # read by thaw before it sees uvicorn's close
        time.sleep(5.8)             # uvicorn closes the idle pooled connection
    r = httpc.Reader(client).response()
    assert r.status == 200, r.body
    assert stale(t) == 1
    assert t.metric("thaw_upstream_connect_failures_total") == 0
    t.assert_reconciled()


def test_default_pool_timeout_closes_before_uvicorn_does(thaw_factory):
    """With the defaults, thaw gives up an idle pooled connection before
    uvicorn's 5 s: after 4.5 s idle the next request opens a new one rather
    than racing uvicorn's close."""
    t = thaw_factory({"models": [counterpart_model("uvicorn_app.py")]})
    assert completion(t).status == 200
    # The first request may go out on the readiness probe's connection.
    reused = t.metric("thaw_upstream_reused_total")
    time.sleep(4.5)
    assert completion(t).status == 200
    assert stale(t) == 0
    assert t.metric("thaw_upstream_reused_total") == reused
    t.assert_reconciled()


@pytest.fixture
def raw_upstream_factory():
    from raw_upstream import RawUpstream
    started = []

    def make(**kw):
        u = RawUpstream(**kw).start()
        started.append(u)
        return u
    yield make
    for u in started:
        u.stop()


def static_model(up, **kw):
    m = {"name": "llama", "endpoints": [f"127.0.0.1:{up.port}"], "max_concurrency": 8}
    m.update(kw)
    return m


def test_replica_that_resets_idle_connections_is_not_ejected(thaw_factory, raw_upstream_factory):
    """A model server that resets idle keep-alive connections: the request
    that meets the reset goes out again on a new connection. The replica is
    healthy and stays in rotation (no ejection, no 502/504, no stall)."""
    up = raw_upstream_factory(idle_close_ms=300, idle_close_mode="rst")
    t = thaw_factory({"upstream": {"keepalive_timeout_ms": 60000},
                      "models": [static_model(up)]})
    assert get(t, "/ok", host="llama").status == 200
    client = t.connect()
    time.sleep(0.2)  # accepted before the pause
    with paused(t):
        httpc.send(client, "GET", "/ok", host="llama")
        assert up.wait_until(lambda u: u.resets >= 1, timeout=5)
    start = time.monotonic()
    r = httpc.Reader(client).response()
    assert r.status == 200, r.body
    assert time.monotonic() - start < 1.0
    assert t.metric("thaw_upstream_connect_failures_total") == 0
    assert stale(t) == 1
    st = t.status()["models"][0]["replicas"][0]
    assert st["connect_failures"] == 0
    assert get(t, "/ok", host="llama").status == 200
    t.assert_reconciled()


def test_reset_on_a_fresh_connection_is_not_retried(thaw_factory, raw_upstream_factory):
    """Only a reused connection is retried: a reset on a new one may mean the
    replica read the request, so the client gets 502 and the replica saw it
    once."""
    up = raw_upstream_factory()
    t = thaw_factory({"models": [static_model(up)]})
    r = get(t, "/reset", host="llama")
    assert r.status == 502 and r.json()["error"]["code"] == "upstream_error"
    assert up.stats()["paths"].count("/reset") == 1
    t.assert_reconciled()


@pytest.mark.timer_heavy
def test_a_reset_right_behind_the_answers_first_bytes_ends_the_client_connection(
        thaw_factory, raw_upstream_factory):
    """The replica sends a head and 3 of 100 bytes and resets at once: thaw may
    learn of the bytes and the reset in one readiness report. Every client's
    connection still ends (a truncated body), within seconds, and nothing
    stays in flight."""
    up = raw_upstream_factory()
    t = thaw_factory({"models": [static_model(up, max_concurrency=64)]})
    socks = []
    for _ in range(40):
        s = t.connect(timeout=10)
        s.sendall(b"GET /reset-at-once HTTP/1.1\r\nHost: llama\r\n\r\n"
                  b"GET /ok HTTP/1.1\r\nHost: llama\r\n\r\n")
        socks.append(s)
        time.sleep(0.05)
    deadline = time.monotonic() + 6
    open_ones = list(socks)
    while open_ones and time.monotonic() < deadline:
        still = []
        for s in open_ones:
            s.setblocking(False)
            try:
                while s.recv(65536):
                    pass
            except BlockingIOError:
                still.append(s)
            except ConnectionResetError:
                pass
        open_ones = still
        time.sleep(0.1)
    for s in socks:
        s.close()
    assert not open_ones, f"{len(open_ones)} of {len(socks)} clients still wait for the body"
    wait_for(lambda: t.metric("thaw_requests_inflight") == 0, timeout=5, what="nothing in flight")
    assert t.metric("thaw_requests_aborted_total") == len(socks)
    t.assert_reconciled()


def test_bad_chunk_in_the_first_read_is_a_502(thaw_factory, raw_upstream_factory):
    """Broken framing in the replica's first bytes: nothing reached the
    client yet, so it gets a clean 502, not an empty close."""
    up = raw_upstream_factory()
    t = thaw_factory({"models": [static_model(up)]})
    r = get(t, "/bad-chunk", host="llama")
    assert r.status == 502 and r.json()["error"]["code"] == "upstream_error"
    t.assert_reconciled()


def test_unsolicited_101_is_a_502(thaw_factory, raw_upstream_factory):
    up = raw_upstream_factory()
    t = thaw_factory({"models": [static_model(up)]})
    s = t.connect()
    httpc.send(s, "GET", "/upgrade", host="llama")
    r = httpc.Reader(s).response()
    assert r.status == 502 and r.json()["error"]["code"] == "upstream_error"
    t.assert_reconciled()


def test_replica_keep_alive_timeout_is_learned(thaw_factory, raw_upstream_factory):
    """A replica that says `Keep-Alive: timeout=2` gets its idle pooled
    connection closed by thaw about a second before it would close it."""
    up = raw_upstream_factory(keepalive_header="2", idle_close_ms=2000)
    t = thaw_factory({"upstream": {"keepalive_timeout_ms": 60000},
                      "models": [static_model(up)]})
    assert get(t, "/ok", host="llama").status == 200
    assert up.wait_until(lambda u: u.open_connections == 0, timeout=1.8)
    assert up.idle_closes == 0  # thaw closed it first
    assert get(t, "/ok", host="llama").status == 200
    assert t.metric("thaw_upstream_reused_total") == 0


def close_without_answer(after_s):
    def route(conn, req, close):
        if after_s:
            conn.pause(after_s)
        conn.close()
        return False
    return route


def test_close_right_after_a_reused_request_is_sent_once_more(thaw_factory,
                                                              raw_upstream_factory):
    """The replica closes a reused connection as the request arrives (its
    idle close racing the request): sent once more on a new connection;
    closed there too, the client gets 502. Never more than twice."""
    up = raw_upstream_factory(routes={"/gone": close_without_answer(0)})
    t = thaw_factory({"models": [static_model(up)]})
    s = t.connect()
    httpc.send(s, "GET", "/ok", host="llama")
    rd = httpc.Reader(s)
    assert rd.response().status == 200
    httpc.send(s, "GET", "/gone", host="llama")
    r = rd.response()
    assert r.status == 502 and r.json()["error"]["code"] == "upstream_error"
    assert up.stats()["paths"].count("/gone") == 2
    assert t.metric("thaw_upstream_stale_retries_total") == 1
    t.assert_reconciled()


def test_close_after_the_replica_worked_on_a_request_is_not_retried(thaw_factory,
                                                                    raw_upstream_factory):
    """A reused connection closed half a second after the request went out:
    the replica may have acted on it (a POST that generated), so it is not
    sent again: 502, seen once."""
    up = raw_upstream_factory(routes={"/crash": close_without_answer(0.5)})
    t = thaw_factory({"models": [static_model(up)]})
    s = t.connect()
    httpc.send(s, "GET", "/ok", host="llama")
    rd = httpc.Reader(s)
    assert rd.response().status == 200
    httpc.send(s, "POST", "/crash", {"Content-Type": "application/json"}, b'{"model":"x"}',
               host="llama")
    r = rd.response()
    assert r.status == 502
    assert up.stats()["paths"].count("/crash") == 1
    assert t.metric("thaw_upstream_stale_retries_total") == 0
    t.assert_reconciled()


def test_a_health_check_answered_204_with_a_body_leaves_no_bytes_for_the_first_request(
        thaw_factory):
    """A health path answering 204 with a declared body (sent a moment later):
    the probe's connection, which carries the first held request, must not be
    kept, or the late body would be read as that request's answer (502)."""
    t = thaw_factory({"models": [{
        "name": "llama", "command": [PY, str(COUNTERPARTS / "raw_upstream.py"), "--port", "{port}"],
        "health_path": "/no-content-with-body?later_ms=50", "idle_timeout_ms": 60000,
        "startup_timeout_ms": 30000, "stop_grace_ms": 2000}]})
    r = get(t, "/ok", host="llama")
    assert r.status == 200, r.body
    t.assert_reconciled()

