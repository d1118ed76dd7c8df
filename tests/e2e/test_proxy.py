"""End-to-end: the request path of static models, through real sockets."""

import json
import shutil
import socket
import subprocess
import threading
import time

import pytest

import httpc
from conftest import free_port, wait_for


def model(upstream, **kw):
    m = {"name": "llama", "namespace": "models", "hosts": ["llm.example.com"],
         "aliases": ["meta-llama/Llama-3-8B"], "endpoints": [upstream.address],
         "max_concurrency": 8}
    m.update(kw)
    return m


@pytest.fixture
def thaw(thaw_factory, upstream):
    return thaw_factory({"models": [model(upstream)]})


def get(t, path, host="thaw.test", **kw):
    return httpc.request(t.host, t.port, path=path, headers={"Host": host, **kw.pop("headers", {})},
                         **kw)


# --- routing ---------------------------------------------------------------

@pytest.mark.parametrize("host", ["llama", "llama.models", "llama.models.svc",
                                  "llama.models.svc.cluster.local", "LLAMA.models.svc:8080",
                                  "llm.example.com", "llama.models.svc.cluster.local."])
def test_routes_by_host(thaw, host):
    r = get(thaw, "/echo?x=1", host=host)
    assert r.status == 200, r.body
    assert r.json()["path"] == "/echo?x=1"


def test_host_in_another_namespace_does_not_match(thaw):
    r = get(thaw, "/echo", host="llama.other.svc.cluster.local")
    assert r.status == 404
    assert r.json()["error"]["code"] == "model_not_found"


def test_routes_by_path_prefix_and_strips_it(thaw):
    assert get(thaw, "/models/llama/echo?q=2").json()["path"] == "/echo?q=2"
    assert get(thaw, "/models/llama").json()["path"] == "/"
    assert get(thaw, "/models/llama?z=1").json()["path"] == "/?z=1"


def test_routes_by_openai_model_field(thaw):
    body = json.dumps({"model": "meta-llama/Llama-3-8B", "messages": []})
    r = httpc.request(thaw.host, thaw.port, "POST", "/v1/chat/completions",
                      {"Content-Type": "application/json"}, body.encode())
    assert r.status == 200
    echoed = r.json()
    assert echoed["path"] == "/v1/chat/completions"
    assert echoed["body"] == body  # forwarded unchanged
    for path in ("/v1/completions", "/v1/embeddings"):
        r = httpc.request(thaw.host, thaw.port, "POST", path, {}, b'{"model":"llama"}')
        assert r.status == 200 and r.json()["path"] == path


def test_a_name_another_model_holds_stays_with_it_and_the_warning_names_it(
        thaw_factory, upstream, upstream2):
    # An earlier model's alias is a later model's own name: the first keeps
    # it (as documented), and the warning says which names were not taken.
    t = thaw_factory({"models": [
        {"name": "first", "aliases": ["second", "shared"], "endpoints": [upstream.address]},
        {"name": "second", "aliases": ["shared", "own"], "endpoints": [upstream2.address]}]})
    for name, reached in (("second", upstream), ("shared", upstream), ("own", upstream2)):
        before = (upstream.requests, upstream2.requests)
        r = httpc.request(t.host, t.port, "POST", "/v1/completions", {},
                          json.dumps({"model": name}).encode())
        assert r.status == 200, r.body
        after = (upstream.requests, upstream2.requests)
        assert after[0 if reached is upstream else 1] == before[0 if reached is upstream else 1] + 1
    warning = [line for line in t.logs().splitlines() if "already taken" in line]
    assert len(warning) == 1, t.logs()
    assert "model=second" in warning[0] and 'names="second, shared"' in warning[0], warning[0]


def test_unknown_model_is_404_json_and_lists_nothing(thaw):
    r = httpc.request(thaw.host, thaw.port, "POST", "/v1/completions", {},
                      b'{"model":"gpt-nope"}')
    assert r.status == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
    assert "llama" not in r.body.decode()
    # A name longer than any model's (256 bytes) is still named, by its start.
    r = httpc.request(thaw.host, thaw.port, "POST", "/v1/completions", {},
                      json.dumps({"model": "x" * 300}).encode())
    err = r.json()["error"]
    assert r.status == 404 and err["param"] == "model", err
    assert err["message"].startswith("The model `" + "x" * 64 + "...`"), err
    r = get(thaw, "/somewhere")
    assert r.status == 404 and r.header("content-type") == "application/json"


def test_bad_json_where_body_routes_is_400(thaw):
    r = httpc.request(thaw.host, thaw.port, "POST", "/v1/chat/completions", {}, b'{"model": ')
    assert r.status == 400 and r.json()["error"]["code"] == "bad_json"
    r = httpc.request(thaw.host, thaw.port, "POST", "/v1/chat/completions", {}, b'{"x": 1}')
    assert r.status == 400 and r.json()["error"]["code"] == "missing_model"
    thaw.assert_reconciled()


# --- headers ---------------------------------------------------------------

def test_forwarding_headers(thaw):
    r = get(thaw, "/echo", host="llama", headers={
        "Connection": "keep-alive, X-Hop", "X-Hop": "secret-hop", "Keep-Alive": "timeout=3",
        "X-Forwarded-For": "127.9.8.7", "thaw-priority": "batch", "X-Keep": "kept"})
    assert r.status == 200
    seen = {k.lower(): v for k, v in r.json()["headers"]}
    assert "x-hop" not in seen and "keep-alive" not in seen and "thaw-priority" not in seen
    assert seen.get("connection") is None
    assert seen["x-keep"] == "kept"
    # limits.trust_forwarded_headers is off by default: the client's own value is replaced.
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-proto"] == "http"
    assert seen["host"] == "llama"
    # Hop-by-hop response headers are dropped, the rest pass.
    assert r.header("keep-alive") is None and r.header("x-upstream") == "yes"


# --- keep-alive, pipelining, bodies ----------------------------------------

def test_keepalive_and_pipelining_in_order(thaw, upstream):
    s = thaw.connect()
    reqs = b"".join(
        f"GET /sleep?ms={ms} HTTP/1.1\r\nHost: llama\r\n\r\n".encode() for ms in (80, 10, 0))
    s.sendall(reqs)
    rd = httpc.Reader(s)
    order = [json.loads(rd.response().body)["slept_ms"] for _ in range(3)]
    assert order == [80, 10, 0]
    # Still open: one more request on the same connection.
    httpc.send(s, "GET", "/echo", host="llama")
    assert rd.response().status == 200
    s.close()
    thaw.assert_reconciled()


def test_upstream_connections_are_reused(thaw, upstream):
    for _ in range(10):
        assert get(thaw, "/echo", host="llama").status == 200
    assert upstream.connections == 1
    assert thaw.metric("thaw_upstream_reused_total") == 9


def test_chunked_request_body_is_forwarded_with_length(thaw):
    s = thaw.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: llama\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    r = httpc.Reader(s).response()
    echoed = r.json()
    assert echoed["body"] == "hello world"
    seen = {k.lower(): v for k, v in echoed["headers"]}
    assert seen["content-length"] == "11" and "transfer-encoding" not in seen


def test_expect_100_continue(thaw):
    s = thaw.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: llama\r\nContent-Length: 4\r\n"
              b"Expect: 100-continue\r\n\r\n")
    rd = httpc.Reader(s)
    interim = rd.response()
    assert interim.status == 100
    s.sendall(b"ping")
    r = rd.response()
    assert r.status == 200 and r.json()["body"] == "ping"


def test_unsupported_expectation_is_417(thaw):
    r = httpc.request(thaw.host, thaw.port, "POST", "/echo",
                      {"Host": "llama", "Expect": "something-else"}, b"abc")
    assert r.status == 417


# --- strict parsing and limits ----------------------------------------------

def raw_exchange(t, data):
    s = t.connect()
    s.sendall(data)
    r = httpc.Reader(s).response()
    s.close()
    return r


@pytest.mark.parametrize("data,status,kind", [
    (b"POST /echo HTTP/1.1\r\nHost: llama\r\nContent-Length: 3\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400, "bad_length"),
    (b"POST /echo HTTP/1.1\r\nHost: llama\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
     400, "bad_length"),
    (b"POST /echo HTTP/1.1\r\nHost: llama\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
     400, "bad_chunk"),
    (b"GET /echo HTTP/1.1\r\n\r\n", 400, "bad_request"),
    (b"GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "bad_request"),
    (b"GARBAGE\r\n\r\n", 400, "bad_request"),
    (b"CONNECT llama:443 HTTP/1.1\r\nHost: llama:443\r\n\r\n", 405, "method_not_allowed"),
])
def test_bad_requests_are_rejected(thaw, data, status, kind):
    r = raw_exchange(thaw, data)
    assert r.status == status
    assert r.json()["error"]["code"] == kind
    assert r.header("content-type") == "application/json"
    thaw.assert_reconciled()
    assert thaw.metric("thaw_rejections_total", reason=kind) == 1


def test_header_limits(thaw_factory, upstream):
    t = thaw_factory({"log": {"level": "info"},
                      "limits": {"max_header_bytes": 2048, "max_headers": 10},
                      "models": [model(upstream)]})
    # A request line longer than the limit (its target cut off), first on a
    # fresh thaw: 431 too, and the log line that names the refusal reads no
    # target it did not keep.
    for target in ("/" + "a" * 3000, "/x?" + "q" * 3000, "http://llama/" + "a" * 3000):
        r = raw_exchange(t, f"GET {target} HTTP/1.1\r\nHost: llama\r\n\r\n".encode())
        assert r.status == 431 and r.json()["error"]["code"] == "header_too_large"
    assert t.proc.poll() is None
    big = "a" * 3000
    r = raw_exchange(t, f"GET /echo HTTP/1.1\r\nHost: llama\r\nX-Big: {big}\r\n\r\n".encode())
    assert r.status == 431 and r.json()["error"]["code"] == "header_too_large"
    many = "".join(f"X-H{i}: v\r\n" for i in range(11))
    r = raw_exchange(t, f"GET /echo HTTP/1.1\r\nHost: llama\r\n{many}\r\n".encode())
    assert r.status == 431 and r.json()["error"]["code"] == "too_many_headers"
    ok = "".join(f"X-H{i}: v\r\n" for i in range(9))
    r = raw_exchange(t, f"GET /echo HTTP/1.1\r\nHost: llama\r\n{ok}\r\n".encode())
    assert r.status == 200
    t.assert_reconciled()


def test_default_limits_hold(thaw):
    # 64 KiB header block and 100 headers by default.
    r = raw_exchange(thaw, b"GET /echo HTTP/1.1\r\nHost: llama\r\nX-Big: " + b"a" * 60000 +
                     b"\r\n\r\n")
    assert r.status == 200
    r = raw_exchange(thaw, b"GET /echo HTTP/1.1\r\nHost: llama\r\nX-Big: " + b"a" * 70000 +
                     b"\r\n\r\n")
    assert r.status == 431
    many = "".join(f"X-H{i}: v\r\n" for i in range(100))
    r = raw_exchange(thaw, f"GET /echo HTTP/1.1\r\nHost: llama\r\n{many}\r\n".encode())
    assert r.status == 431  # Host + 100 = 101 headers


def test_body_limit(thaw_factory, upstream):
    t = thaw_factory({"limits": {"max_body_bytes": 1000}, "models": [model(upstream)]})
    # Announced too large: refused before the body is read.
    s = t.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: llama\r\nContent-Length: 5000\r\n"
              b"Expect: 100-continue\r\n\r\n")
    r = httpc.Reader(s).response()
    assert r.status == 413 and r.json()["error"]["code"] == "body_too_large"
    assert r.header("connection") == "close"
    s.close()
    # Chunked, grows past the limit.
    s = t.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: llama\r\nTransfer-Encoding: chunked\r\n\r\n" +
              (b"200\r\n" + b"z" * 512 + b"\r\n") * 3)
    r = httpc.Reader(s).response()
    assert r.status == 413
    s.close()
    assert httpc.request(t.host, t.port, "POST", "/echo", {"Host": "llama"},
                         b"q" * 1000).status == 200
    t.assert_reconciled()


def test_header_timeout_is_408(thaw_factory, upstream):
    t = thaw_factory({"limits": {"header_timeout_ms": 200}, "models": [model(upstream)]})
    s = t.connect()
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: lla")
    start = time.monotonic()
    r = httpc.Reader(s).response()
    assert r.status == 408 and r.json()["error"]["code"] == "header_timeout"
    assert 0.15 < time.monotonic() - start < 5
    assert httpc.closed_by_peer(s)
    # A connection that sends nothing at all gets the same answer.
    s2 = t.connect()
    assert httpc.Reader(s2).response().status == 408
    t.assert_reconciled()


def test_keepalive_idle_timeout_closes_quietly(thaw_factory, upstream):
    t = thaw_factory({"limits": {"keepalive_timeout_ms": 150}, "models": [model(upstream)]})
    s = t.connect()
    httpc.send(s, "GET", "/echo", host="llama")
    assert httpc.Reader(s).response().status == 200
    s.settimeout(5)
    assert s.recv(100) == b""  # closed without a response


def test_too_many_connections_is_503(thaw_factory, upstream):
    t = thaw_factory({"limits": {"max_connections": 2}, "models": [model(upstream)]})
    a, b = t.connect(), t.connect()
    httpc.send(a, "GET", "/echo", host="llama")
    assert httpc.Reader(a).response().status == 200
    wait_for(lambda: t.metric("thaw_connections") == 2, what="two connections")
    c = t.connect()
    r = httpc.Reader(c).response()
    assert r.status == 503 and r.json()["error"]["code"] == "too_many_connections"
    assert r.header("retry-after")
    assert t.metric("thaw_connections_rejected_total") == 1
    a.close()
    b.close()
    wait_for(lambda: t.metric("thaw_connections") == 0, what="connections closed")
    assert get(t, "/echo", host="llama").status == 200


# --- responses -------------------------------------------------------------

def test_sse_stream_arrives_token_by_token(thaw):
    s = thaw.connect()
    httpc.send(s, "GET", "/sse?n=5&ms=150", host="llama")
    start = time.monotonic()
    r = httpc.Reader(s).response()
    assert r.status == 200 and r.header("content-type") == "text/event-stream"
    assert r.body.endswith(b"data: [DONE]\n\n")
    times = [t - start for t, _ in r.chunks]
    assert len(times) >= 5
    # The first token reached the client long before the stream ended.
    assert times[0] < 0.3 and times[-1] - times[0] > 0.45


def test_chunked_response_passes_through(thaw):
    r = get(thaw, "/chunked?n=4", host="llama")
    assert r.status == 200 and r.header("transfer-encoding") == "chunked"
    assert r.body == b"chunk0\nchunk1\nchunk2\nchunk3\n"


def test_bodiless_responses(thaw):
    s = thaw.connect()
    rd = httpc.Reader(s)
    httpc.send(s, "HEAD", "/echo", host="llama")
    r = rd.response("HEAD")
    assert r.status == 200 and int(r.header("content-length")) > 0
    httpc.send(s, "GET", "/status/204", host="llama")
    assert rd.response().status == 204
    httpc.send(s, "GET", "/status/304", host="llama")
    r = rd.response()
    assert r.status == 304 and r.header("etag") == '"x"'
    # The connection is still in sync.
    httpc.send(s, "GET", "/echo", host="llama")
    assert rd.response().json()["method"] == "GET"


def test_close_delimited_response_is_rechunked_for_http11(thaw):
    s = thaw.connect()
    httpc.send(s, "GET", "/close-delimited", host="llama")
    rd = httpc.Reader(s)
    r = rd.response()
    assert r.status == 200 and r.header("transfer-encoding") == "chunked"
    assert r.body == b"all of this until close\n" * 10
    httpc.send(s, "GET", "/echo", host="llama")  # keep-alive survived
    assert rd.response().status == 200


def test_http10_client_gets_close_delimited_body(thaw):
    s = thaw.connect()
    s.sendall(b"GET /chunked?n=2 HTTP/1.0\r\nHost: llama\r\n\r\n")
    r = httpc.Reader(s).response()
    assert r.status == 200 and r.header("transfer-encoding") is None
    assert r.body == b"chunk0\nchunk1\n"


def test_slow_client_does_not_make_thaw_buffer(thaw):
    """64 MiB through a client that reads slowly: thaw's memory stays flat."""
    def rss_kib():
        with open(f"/proc/{thaw.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    before = rss_kib()
    s = thaw.connect()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    total = 64 << 20
    httpc.send(s, "GET", f"/big?bytes={total}", host="llama")
    got = 0
    peak = before
    s.settimeout(30)
    while got < total:
        d = s.recv(65536)
        if not d:
            break
        got += len(d)
        if got % (4 << 20) < 65536:
            peak = max(peak, rss_kib())
            time.sleep(0.02)
    assert got >= total
    assert peak - before < 16 * 1024, f"RSS grew {peak - before} KiB"


# --- upstream failures -----------------------------------------------------

def test_connect_failure_tries_another_replica(thaw_factory, upstream):
    dead = f"127.0.0.1:{free_port()}"
    t = thaw_factory({"models": [model(upstream, endpoints=[dead, upstream.address])]})
    for _ in range(6):
        assert get(t, "/echo", host="llama").status == 200
    assert t.metric("thaw_upstream_connect_failures_total") >= 1
    st = t.status()["models"][0]["replicas"]
    assert any(r["connect_failures"] >= 1 for r in st)


def test_all_replicas_down_is_502(thaw_factory):
    t = thaw_factory({"models": [{"name": "gone", "endpoints": [f"127.0.0.1:{free_port()}"]}]})
    r = get(t, "/echo", host="gone")
    assert r.status == 502 and r.json()["error"]["code"] == "upstream_connect_failed"
    t.assert_reconciled()


def test_first_byte_timeout_is_504(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, first_byte_timeout_ms=200)]})
    r = get(t, "/hang", host="llama")
    assert r.status == 504 and r.json()["error"]["code"] == "upstream_timeout"
    t.assert_reconciled()


def test_silent_stream_is_cut_after_idle_timeout(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, upstream_idle_timeout_ms=300)]})
    s = t.connect()
    httpc.send(s, "GET", "/sse?n=3&ms=2000", host="llama")
    start = time.monotonic()
    with pytest.raises(EOFError):
        httpc.Reader(s).response()
    assert time.monotonic() - start < 1.5
    t.assert_reconciled()
    assert t.metric("thaw_aborts_total", reason="upstream_timeout") == 1


def test_body_timeout_is_408(thaw_factory, upstream):
    t = thaw_factory({"limits": {"body_timeout_ms": 200}, "models": [model(upstream)]})
    s = t.connect()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: llama\r\nContent-Length: 10\r\n\r\nabc")
    r = httpc.Reader(s).response()
    assert r.status == 408 and r.json()["error"]["code"] == "body_timeout"
    t.assert_reconciled()


def test_invalid_upstream_response_is_502(thaw):
    r = get(thaw, "/garbage", host="llama")
    assert r.status == 502 and r.json()["error"]["code"] == "upstream_error"
    thaw.assert_reconciled()


def test_response_cut_mid_body_aborts_client(thaw):
    s = thaw.connect()
    httpc.send(s, "GET", "/cut", host="llama")
    rd = httpc.Reader(s)
    with pytest.raises(EOFError):
        rd.response()
    thaw.assert_reconciled()
    assert thaw.metric("thaw_aborts_total", reason="upstream_closed") == 1


# --- queueing ----------------------------------------------------------------

def run_parallel(fns):
    results = [None] * len(fns)

    def run(i, fn):
        results[i] = fn()
    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return results


def test_concurrency_cap_queues_the_rest(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, max_concurrency=2)]})
    res = run_parallel([lambda: get(t, "/sleep?ms=150", host="llama") for _ in range(8)])
    assert all(r.status == 200 for r in res)
    assert upstream.peak == 2
    t.assert_reconciled()


def occupy(t, ms):
    """Starts a request that holds the single slot for ms; returns its thread."""
    th = threading.Thread(target=lambda: get(t, f"/sleep?ms={ms}", host="llama"))
    th.start()
    return th


def test_priority_order_with_one_slot(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, max_concurrency=1)]})
    blocker = occupy(t, 400)
    wait_for(lambda: upstream.active == 1, what="slot taken")
    results = {}
    threads = []
    for tier in ("batch", "standard", "critical"):
        th = threading.Thread(target=lambda tier=tier: results.__setitem__(
            tier, get(t, f"/echo?tier={tier}", host="llama", headers={"thaw-priority": tier})))
        th.start()
        threads.append(th)
        wait_for(lambda tier=tier: t.status()["models"][0]["queue"][tier] == 1, what="queued")
    blocker.join()
    for th in threads:
        th.join()
    served = [p.split("=")[1] for p in upstream.paths if p.startswith("/echo?tier=")]
    assert served == ["critical", "standard", "batch"]
    assert all(r.status == 200 for r in results.values())


def test_queue_full_is_503_with_retry_after(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, max_concurrency=1, max_queue=1)]})
    blocker = occupy(t, 500)
    wait_for(lambda: upstream.active == 1, what="slot taken")
    waiting = threading.Thread(target=lambda: get(t, "/echo", host="llama"))
    waiting.start()
    wait_for(lambda: t.status()["queued"] == 1, what="one queued")
    r = get(t, "/echo", host="llama")
    assert r.status == 503 and r.header("retry-after")
    assert r.json()["error"]["code"] == "queue_full"
    blocker.join()
    waiting.join()
    t.assert_reconciled()


def queue_two_batch(t, host, res):
    """Queues batch-old, then batch-new, for host; their answers land in res.
    Returns their threads."""
    ths = []
    for name in ("batch-old", "batch-new"):
        th = threading.Thread(target=lambda name=name: res.__setitem__(
            name, get(t, f"/echo?{name}", host=host, headers={"thaw-priority": "batch"})))
        th.start()
        ths.append(th)
        wait_for(lambda n=len(ths): t.status()["queued"] == n, what="queued")
    return ths


def two_busy_models(thaw_factory, upstream, upstream2, max_queue_total, ms):
    """llama and other, one slot each, both taken for ms; returns thaw and the two
    requests holding the slots."""
    t = thaw_factory({"limits": {"max_queue_total": max_queue_total},
                      "models": [model(upstream, max_concurrency=1),
                                 {"name": "other", "endpoints": [upstream2.address],
                                  "max_concurrency": 1}]})
    b1 = occupy(t, ms)
    b2 = threading.Thread(target=lambda: get(t, f"/sleep?ms={ms}", host="other"))
    b2.start()
    wait_for(lambda: upstream.active == 1 and upstream2.active == 1, what="slots taken")
    return t, b1, b2


def test_global_queue_bound(thaw_factory, upstream, upstream2):
    t, b1, b2 = two_busy_models(thaw_factory, upstream, upstream2, 1, 500)
    w = threading.Thread(target=lambda: get(t, "/echo", host="llama"))
    w.start()
    wait_for(lambda: t.status()["queued"] == 1, what="one queued")
    r = get(t, "/echo", host="other")
    assert r.status == 503 and r.json()["error"]["code"] == "queue_full"
    for th in (b1, b2, w):
        th.join()
    t.assert_reconciled()


def test_critical_at_global_bound_displaces_another_models_batch(thaw_factory, upstream,
                                                                  upstream2):
    """The global bound is full of one model's batch requests: a critical one for
    another model takes the newest of them, not a 503 of its own."""
    t, b1, b2 = two_busy_models(thaw_factory, upstream, upstream2, 2, 600)
    res = {}
    ths = queue_two_batch(t, "other", res)
    standard = get(t, "/echo?standard", host="llama")
    assert standard.status == 503 and standard.json()["error"]["code"] == "queue_full"
    critical = get(t, "/echo?critical", host="llama", headers={"thaw-priority": "critical"})
    for th in ths + [b1, b2]:
        th.join()
    assert critical.status == 200
    assert res["batch-new"].status == 503
    assert res["batch-new"].json()["error"]["code"] == "queue_displaced"
    assert res["batch-old"].status == 200
    t.assert_reconciled()


def test_critical_displaces_newest_batch(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, max_concurrency=1, max_queue=2)]})
    blocker = occupy(t, 500)
    wait_for(lambda: upstream.active == 1, what="slot taken")
    res = {}
    ths = queue_two_batch(t, "llama", res)
    r = {}
    th = threading.Thread(target=lambda: r.__setitem__("c", get(
        t, "/echo?critical", host="llama", headers={"thaw-priority": "critical"})))
    th.start()
    ths.append(th)
    for x in ths:
        x.join()
    blocker.join()
    assert res["batch-new"].status == 503
    assert res["batch-new"].json()["error"]["code"] == "queue_displaced"
    assert res["batch-old"].status == 200 and r["c"].status == 200
    t.assert_reconciled()


def test_queue_deadline_is_504(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, max_concurrency=1, queue_timeout_ms=200)]})
    blocker = occupy(t, 800)
    wait_for(lambda: upstream.active == 1, what="slot taken")
    start = time.monotonic()
    r = get(t, "/echo", host="llama")
    assert r.status == 504 and r.json()["error"]["code"] == "queue_timeout"
    assert 0.15 < time.monotonic() - start < 2
    blocker.join()
    t.assert_reconciled()


def test_bad_priority_header_is_400(thaw):
    r = get(thaw, "/echo", host="llama", headers={"thaw-priority": "urgent"})
    assert r.status == 400 and r.json()["error"]["code"] == "bad_priority"


def test_client_gone_while_queued_leaves_the_queue(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream, max_concurrency=1)]})
    blocker = occupy(t, 400)
    wait_for(lambda: upstream.active == 1, what="slot taken")
    s = t.connect()
    httpc.send(s, "GET", "/echo?abandoned", host="llama")
    wait_for(lambda: t.status()["queued"] == 1, what="queued")
    s.close()
    wait_for(lambda: t.status()["queued"] == 0, what="dequeued")
    blocker.join()
    t.assert_reconciled()
    assert t.metric("thaw_aborts_total", reason="client_closed") == 1
    assert not any("abandoned" in p for p in upstream.paths)


# --- admin and lifecycle -----------------------------------------------------

def test_client_leaving_mid_stream_is_an_abort_not_an_upstream_error(thaw):
    s = thaw.connect()
    httpc.send(s, "GET", "/sse?n=50&ms=20", host="llama")
    s.recv(100)
    s.close()
    thaw.assert_reconciled()
    assert thaw.metric("thaw_aborts_total", reason="client_closed") == 1
    assert thaw.metric("thaw_upstream_errors_total", model="llama") == 0


def test_metrics_pass_promtool(thaw, tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed")
    get(thaw, "/echo", host="llama")
    get(thaw, "/nothing")
    _, text = thaw.admin("/metrics")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_admin_endpoints(thaw):
    assert thaw.admin("/healthz")[0] == 200
    assert thaw.admin("/readyz")[0] == 200
    get(thaw, "/echo", host="llama")
    st = thaw.status()
    m = st["models"][0]
    assert m["name"] == "llama" and m["replicas"][0]["requests"] == 1
    assert set(m["queue"]) >= {"critical", "standard", "batch"}
    assert thaw.metric("thaw_requests_total", model="llama", namespace="models", code="200") == 1


def test_sigterm_drains_in_flight_requests(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream)]})
    res = {}
    th = threading.Thread(target=lambda: res.__setitem__("r", get(t, "/sleep?ms=500",
                                                                  host="llama")))
    th.start()
    wait_for(lambda: upstream.active == 1, what="in flight")
    t.proc.send_signal(15)
    wait_for(lambda: t.admin("/status") and t.status()["draining"], what="draining")
    with pytest.raises(OSError):
        socket.create_connection((t.host, t.port), timeout=2).recv(1)
    th.join()
    assert res["r"].status == 200
    assert t.proc.wait(10) == 0


def test_drain_deadline_answers_every_request_not_yet_answered(thaw_factory, upstream):
    """One slot; at SIGTERM one request runs, two wait. The first ends and
    the next goes to the replica, which is still working on it at the drain
    deadline: it gets 503 shutting_down, as the one still queued does. Before,
    its connection was closed with no answer at all."""
    t = thaw_factory({"limits": {"drain_timeout_ms": 800},
                      "models": [model(upstream, max_concurrency=1)]})
    res = {}

    def run(key, ms):
        try:
            res[key] = get(t, f"/sleep?ms={ms}", host="llama")
        except Exception as e:  # noqa: BLE001 - reported by the test
            res[key] = e
    ths = [threading.Thread(target=run, args=("first", 300))]
    ths[0].start()
    wait_for(lambda: upstream.active == 1, what="the first in flight")
    for key in ("second", "third"):
        ths.append(threading.Thread(target=run, args=(key, 5000)))
        ths[-1].start()
    wait_for(lambda: t.metric("thaw_queue_depth_all") == 2, what="two queued")
    t.proc.send_signal(15)
    for th in ths:
        th.join(30)
    assert res["first"].status == 200
    for key in ("second", "third"):
        r = res[key]
        assert not isinstance(r, Exception), (key, r)
        assert r.status == 503 and r.json()["error"]["code"] == "shutting_down", (key, r.body)
    assert t.proc.wait(10) == 0


def test_access_log_has_no_query_or_body(thaw_factory, upstream):
    t = thaw_factory({"log": {"access_log": True}, "models": [model(upstream)]})
    httpc.request(t.host, t.port, "POST", "/echo?api_key=sk-SECRET", {"Host": "llama",
                  "Authorization": "Bearer sk-TOKEN"}, b'{"prompt":"private words"}')
    get(t, "/nowhere")
    wait_for(lambda: t.logs().count('msg="request"') >= 2, what="access log lines")
    logs = t.logs()
    assert 'path="/echo" status=200 outcome=proxied' in logs
    assert "status=404 outcome=rejected reason=model_not_found" in logs
    for secret in ("sk-SECRET", "sk-TOKEN", "private words"):
        assert secret not in logs


@pytest.mark.parametrize("policy,asked,got", [
    ("any", "critical", "critical"), ("any", "batch", "batch"),
    ("lower_only", "critical", "standard"), ("lower_only", "batch", "batch"),
    ("ignore", "critical", "standard"), ("ignore", "batch", "standard"),
])
def test_priority_header_policy(thaw_factory, upstream, policy, asked, got):
    t = thaw_factory({"log": {"access_log": True}, "limits": {"priority_header": policy},
                      "models": [model(upstream, priority="standard")]})
    assert get(t, "/echo", host="llama", headers={"thaw-priority": asked}).status == 200
    wait_for(lambda: 'msg="request"' in t.logs(), what="access log")
    assert f"tier={got} " in t.logs()
